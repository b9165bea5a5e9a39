"""Run-time extents: ``to_host`` and ``RaggedAllToAll`` (hostir.ir.host_reads,
hostir.run.ragged_exchange) in hand-written programs: the text and JSON, the verifier's
refusals, runs at 1, 2 and 4 ranks against a torch reference over random counts (zeros
included, one evaluator for every call: no shape is kept from an earlier call), a bad count
named on every rank, and the CUDA-graph refusal.
"""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir import (
    HostIrEvaluator,
    LocalCommunicator,
    RaggedAllToAll,
    RunTimeExtentError,
    ToHost,
    VerifyError,
    parse,
    to_dot,
)
from hostir.analysis.traffic import count_traffic
from hostir.run.cuda_graph_checks import capture_problems

ROWS, WIDTH = 6, 3


def program_text(d: int, out_rows: str = "n0", counts: str = "int64[{d}, {d}]") -> str:
    """Rows of T0 go out by counts H0 (a ``[d, d]`` matrix every rank is given whole), are
    doubled where they land and come back by the transposed counts into T0's layout."""
    counts = counts.format(d=d)
    return (
        "%HostIrContainer {\n"
        f"  mesh M0 = [{d}] : [1]\n"
        f"  input T0 : float32[i0, {WIDTH}] @M0 {{0: [x, i0 // {d}]}}\n"
        f"  input T1 : {counts} @M0\n"
        "  H0 = to_host(T1)\n"
        f"  n0, T2 : float32[{out_rows}, {WIDTH}] @M0, R0 = RaggedAllToAll(T0, team=M0(x),"
        " counts=H0)\n"
        "  wait R0\n"
        f"  T3 : float32[n0, {WIDTH}] @M0 = mul(T2, 2.0)\n"
        f"  n1, T4 : float32[i0, {WIDTH}] @M0 {{0: [x, i0 // {d}]}}, R1 = RaggedAllToAll(T3,"
        " team=M0(x), counts=H0, transpose=true)\n"
        "  wait R1\n"
        "  output T2\n"
        "  output T4\n"
        "}\n"
    )


def random_counts(d: int, generator: torch.Generator) -> torch.Tensor:
    """``counts[p][q]``: rows rank p sends rank q, each row adding up to ROWS; zeros likely."""
    counts = torch.zeros(d, d, dtype=torch.int64)
    for p in range(d):
        cuts = torch.randint(0, ROWS + 1, (d - 1,), generator=generator).sort().values
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([ROWS])])
        counts[p] = edges[1:] - edges[:-1]
    return counts


def expected_received(data: torch.Tensor, counts: torch.Tensor, rank: int) -> torch.Tensor:
    """What ``rank`` receives: from each sender in order, the slice of its rows for ``rank``."""
    pieces = []
    for p in range(counts.shape[0]):
        start = int(counts[p, :rank].sum())
        pieces.append(data[p * ROWS : (p + 1) * ROWS][start : start + int(counts[p, rank])])
    return torch.cat(pieces)


def test_text_json_and_picture_hold_the_run_time_extent():
    program = parse(program_text(4))
    text = str(program)
    assert "H0 = to_host(T1)" in text
    assert "n0, T2 : float32[n0, 3] @M0, R0 = RaggedAllToAll(T0, team=M0(x), counts=H0" in text
    assert parse(text) == program
    assert hostir.HostIrContainer.from_json(program.to_json()) == program
    kinds = [type(i) for i in program.body]
    assert kinds.count(ToHost) == 1 and kinds.count(RaggedAllToAll) == 2
    dot = to_dot(program).source
    assert "invhouse" in dot and "device-to-host sync" in dot


@pytest.mark.parametrize(
    "text, message",
    [
        (program_text(2, counts="float32[{d}, {d}]"), "to_host reads an integer tensor"),
        (program_text(2, counts="int64[3, {d}]"), "whose local shape is not [2, 2]"),
        (program_text(2, out_rows="n0 * 2"), "dim 0 must be n0 itself"),
        (program_text(2).replace("n0, T2", "i0, T2").replace("[n0, 3]", "[i0, 3]"), "binds"),
        (program_text(2).replace("n1, T4", "n0, T4"), "n0 is defined twice"),
    ],
)
def test_the_verifier_refuses_what_cannot_run(text, message):
    with pytest.raises((VerifyError, hostir.ParseError), match=message.replace("[", r"\[")):
        parse(text)


def test_a_graph_cannot_hold_the_host_read():
    evaluator = HostIrEvaluator(parse(program_text(1)))
    problems = capture_problems(evaluator, [], LocalCommunicator())
    assert any("to_host reads T1 into H0" in p for p in problems), problems


def test_traffic_assumes_uniform_routing_and_takes_a_binding():
    traffic = count_traffic(parse(program_text(4)), 4, {"i0": 4 * 8, "n0": 8})
    # out: 8 rows of 3 float32 per rank, a quarter to each rank; back: n0 = 8 rows likewise
    assert [int(b) for b in traffic.received] == [2 * 3 * (8 * 3 * 4 // 4)] * 4


@pytest.mark.world_sizes(1, 2, 4)
def test_rows_go_by_run_time_counts_and_come_back(multidevice_test):
    """Eight calls of one evaluator with fresh counts each (zeros included): the rows each
    rank receives are the reference's, and the way back restores the sender's rows."""
    d, rank = multidevice_test.size, multidevice_test.rank
    evaluator = HostIrEvaluator(parse(program_text(d)))
    generator = torch.Generator().manual_seed(35)
    zeros = False
    for _ in range(8):
        counts = random_counts(d, generator)
        data = torch.randn(d * ROWS, WIDTH, generator=generator)
        mine = data[rank * ROWS : (rank + 1) * ROWS]
        received, back = evaluator.run([mine, counts])
        expected = expected_received(data, counts, rank)
        assert torch.equal(received, expected)
        assert torch.equal(back, mine * 2)
        zeros |= bool((counts == 0).any())
    assert d == 1 or zeros, "the draws include a rank sending another nothing"


@pytest.mark.world_sizes(2, 4)
@pytest.mark.parametrize("bad", ["negative", "short row"])
def test_a_bad_count_is_named_on_every_rank(multidevice_test, bad):
    """Every rank checks the whole matrix, so every rank raises the same error and none
    waits for a peer that gave up; the evaluator runs again afterwards."""
    d, rank = multidevice_test.size, multidevice_test.rank
    evaluator = HostIrEvaluator(parse(program_text(d)))
    counts = torch.zeros(d, d, dtype=torch.int64)
    counts[:, 0] = ROWS
    if bad == "negative":
        counts[d - 1, 0], counts[d - 1, 1] = ROWS + 2, -2
        expected = f"member {d - 1} sends -2 rows to member 1"
    else:
        counts[d - 1, 0] = ROWS - 1
        expected = f"member {d - 1} send {ROWS - 1} rows in all"
    mine = torch.randn(ROWS, WIDTH)
    with pytest.raises(RunTimeExtentError, match=expected):
        evaluator.run([mine, counts])
    counts[d - 1] = counts[0]
    received, back = evaluator.run([mine, counts])
    assert torch.equal(back, mine * 2)
    assert received.shape[0] == (d * ROWS if rank == 0 else 0)


def test_hostir_traffic_takes_a_binding_of_the_run_time_extent():
    """``hostir traffic --bind n0=8``: the run-time extent is a name it may bind."""
    from hostir.cli.arguments import parse_bindings
    from hostir.errors import SettingError

    program = parse(program_text(4))
    assert parse_bindings(["i0=32", "n0=8"], program) == {"i0": 32, "n0": 8}
    with pytest.raises(SettingError, match="n9 is not a symbolic extent"):
        parse_bindings(["n9=8"], program)
