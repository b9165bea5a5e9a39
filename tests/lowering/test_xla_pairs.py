"""The three 2x2x2 pairs XLA's SPMD partitioner planned in fewer collectives than hostir
(issue 36): ``S0S0S1 -> RS1R``, ``S0S1S0 -> RRS1`` and ``S1S0S0 -> RRS1``, each now one
CollectivePermute that relabels two mesh axes and then one Allgather over a flattened
team, receiving the byte lower bound (the permute-then-rules candidate,
lowering/redistribution/same_mesh_permutes.py). Golden plans, ``hostir plan --explain``
as docs/cli.md shows it, and the three programs run on 8 gloo ranks against the
single-device reference. The sweep over every 2x2x2 pair (never more collectives than
before) is in tests/lowering/test_redistribution_sweep.py."""

from __future__ import annotations

import pathlib

import pytest

from hostir import Mesh, cli
from lowering.commands import plan_text
from lowering.redistribution.same_mesh_permutes import relabellings
from tests.lowering.test_redistribution_sweep import _check_every, _lowered, _mesh
from tests.test_docs import Fence, parse_markdown

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# pair -> (the CollectivePermute's relabelling, the Allgather's team); the rest of the
# golden text is the same for the three (an 8x8x8 float32 tensor: 1024 B blocks).
PAIRS = {
    ("S0S0S1", "RS1R"): ("y->x, x->y", "z, x"),
    ("S0S1S0", "RRS1"): ("y->x, x->y", "z, y"),
    ("S1S0S0", "RRS1"): ("z->x, x->z", "y, z"),
}

GOLDEN = """\
1. CollectivePermute over M0(z, y, x): receives 256 B per rank, temporaries 0 B -- relabel\
 mesh axes {swaps} first (each rank sends its block to the rank that holds it after the\
 relabelling): the rules then need fewer collectives
2. Allgather over M0({team}): receives 768 B per rank, temporaries 0 B (gloo stages 1024 B)\
 -- dim 0 is no longer split over ({team})
2 collective(s), 2 step(s), peak temporaries 0 B (bound max(in, out) = 1024 B); backend\
 staging apart: 1024 B (gloo)
receives 1024 B per rank in all (lower bound: the target block less what the rank holds,\
 1024 B)
note: permute then gather: CollectivePermute + Allgather over ({team}) instead of 3\
 collective(s)
note: not fused: CollectivePermute over (z, y, x) and Allgather over ({team}) are different\
 collectives
meshes: M0 = [2, 2, 2] : [4, 2, 1]"""


@pytest.mark.parametrize("pair", PAIRS, ids="->".join)
def test_the_pair_plans_a_permute_then_one_gather_at_the_lower_bound(pair):
    """Golden plan: a CollectivePermute (256 B) and one fused Allgather (768 B) receive
    1024 B, the lower bound, in 2 collectives where the rules took 3."""
    swaps, team = PAIRS[pair]
    _, *lines = plan_text("2x2x2", "8x8x8", *pair).splitlines()
    assert "\n".join(lines) == GOLDEN.format(swaps=swaps, team=team)


def test_a_reduced_last_plan_that_starts_with_a_permute_keeps_its_note():
    """The note names the candidate that won, not the kind of its first step: moving the
    unreduced sums by a CollectivePermute and then an Allreduce is "reduced last", as before
    the permute candidates existed."""
    text = plan_text("2x2x2", "8x8", "RS0P", "S0RR")
    assert "note: reduced last: CollectivePermute + Allreduce over (x)" in text, text
    assert "permute then" not in text


def test_plan_explain_shows_the_comparison_as_docs_cli_shows_it(capsys):
    """``hostir plan --explain`` prints the candidates compared, the chosen one and why,
    exactly as docs/cli.md shows; without ``--explain`` none of it."""
    command = "hostir plan --mesh 2x2x2 --shape 8x8x8 --from S1S0S0 --to RRS1 --explain"
    items = parse_markdown(REPO_ROOT / "docs" / "cli.md")
    index = next(
        k for k, f in enumerate(items) if isinstance(f, Fence) and f.text.strip() == command
    )
    shown = next(f for f in items[index + 1 :] if isinstance(f, Fence))
    assert cli.main(command.split()[1:]) == 0
    out = capsys.readouterr().out
    assert out == shown.text
    assert "candidates: why: permute (z->x, x->z) then the rules takes fewer collective" in out
    assert cli.main(command.split()[1:-1]) == 0
    assert "candidates:" not in capsys.readouterr().out


def test_explain_says_when_no_relabelling_helps():
    """On 2x2x4 the axes that trade places (x and y) differ in size: no relabelling
    applies, the rules' 3 collectives stay, and ``--explain`` says why."""
    text = plan_text("2x2x4", "16x16", "S0S0S1", "RS1R", explain=True)
    assert "3 collective(s)" in text and "CollectivePermute" not in text
    assert (
        "candidates: S0S0S1 -> RS1R: the rules take 3 collectives; no relabelling of"
        " equal-size mesh axes lets them take fewer"
    ) in text.splitlines()


def test_a_3d_mesh_tries_at_most_five_relabellings():
    """On 2x2x2 every non-identity bijection of the axes (3! - 1), swaps first, a partial
    axis fixed; on 2x2x4 only the swap of the two equal axes."""
    mesh = _mesh("2x2x2")
    sigmas = list(relabellings(mesh, set()))
    assert len(sigmas) == 5 and len({tuple(s.items()) for s in sigmas}) == 5
    assert [sum(a != b for a, b in s.items()) for s in sigmas] == [2, 2, 2, 3, 3]
    z, y, x = mesh.axes()
    assert list(relabellings(mesh, {z})) == [{z: z, y: x, x: y}]
    z, y, x = (mesh := Mesh(devices=tuple(range(16)), shape=(2, 2, 4))).axes()
    assert list(relabellings(mesh, set())) == [{z: y, y: z, x: x}]


@pytest.fixture
def xla_programs() -> tuple[str, list]:
    """The three pairs' programs (8x8 on 2x2x2), lowered in the pytest process; each is
    checked to be exactly a CollectivePermute and one Allgather (the host IR text)."""
    name, programs = _lowered("2x2x2", list(PAIRS))
    for src_text, dst_text, program in programs:
        text = str(program)
        kinds = [k for k in ("CollectivePermute", "Allgather", "AllToAll") if k in text]
        assert kinds == ["CollectivePermute", "Allgather"], f"{src_text} -> {dst_text}:\n{text}"
        assert text.count("Allgather(") == 1 and text.count("CollectivePermute(") == 1, text
    return name, programs


@pytest.mark.world_sizes(8)
def test_the_three_pairs_run_on_8_ranks(multidevice_test, xla_programs):
    """Each plan's program on 8 gloo ranks equals the single-device reference (random
    integer-valued data, exact)."""
    _check_every(multidevice_test, xla_programs)
