"""On large meshes the planner bounds an AllToAllV's buffers from block geometry
(``hostir.analysis.exchange_bound``) instead of listing every rank's pieces. The bound must
be at least every rank's exact buffers (``round_buffers`` of its own ``member_exchange``)
in every number of rounds, its received part exact, and it must raise where the exact
costing raises: checked on every rank of every exchange between the sweep's
distributions (those of ``test_exchange_profiles.py``, 4x4 apart). Plans made with the
bound alone (its threshold forced to 0) keep SPEC §6's memory bound, and what they
report is at least every rank's exact temporaries."""

from __future__ import annotations

import itertools
import math

import pytest

from hostir import AllToAllV, Mesh
from hostir.analysis import exchange_bound
from hostir.analysis.boxes import Operand, volume
from hostir.analysis.exchange_bound import bound_buffers, buffer_bounds, member_bound
from hostir.analysis.exchange_buffers import cut, round_buffers
from hostir.analysis.exchange_profiles import profile
from hostir.analysis.member_exchanges import member_exchange
from hostir.errors import HostIrError
from lowering.redistribution import exchange_cost
from lowering.redistribution.distribution import parse_notation
from lowering.redistribution.plan_memory import memory_bound, peak_temporaries
from lowering.redistribution.plan_resharding import plan_resharding
from tests.lowering.test_exchange_profiles import CASES, _teams, exchange_cases
from tests.lowering.test_redistribution_sweep import SHAPES, _mesh, _pairs, value

ROUNDS = (1, 2, 3, 5, 16)
SWEPT = {s: CASES[s] for s in ((2, 3), (2, 4), (3, 4), (2, 2, 2))}  # 4x4 adds nothing


def _exact_received(exchange) -> int:
    return sum(volume(p.box) for p in exchange.receives if p.source != p.destination)


@pytest.mark.parametrize("mesh_shape", SWEPT, ids=lambda s: "x".join(map(str, s)))
def test_bound_holds_every_rank_in_every_number_of_rounds(mesh_shape):
    mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    shape = SWEPT[mesh_shape]
    checked, problems = 0, []
    for pair, src, out in exchange_cases(mesh, shape):
        reduced = bool(src.sharding.partial)
        for team in _teams(mesh):
            case = f"{pair} over {team}"
            try:
                every = [member_exchange(src, out, team, r, reduced) for r in mesh.devices]
            except HostIrError:
                with pytest.raises(HostIrError):
                    buffer_bounds(src, out, team, reduced)
                continue
            checked += 1
            bounds = [member_bound(src, out, team, r, reduced) for r in mesh.devices]
            if buffer_bounds(src, out, team, reduced) != tuple(dict.fromkeys(bounds)):
                problems.append(f"{case}: the distinct bounds are not the ranks'")
            for rank, exchange, bound in zip(mesh.devices, every, bounds, strict=True):
                got = sum(math.prod(extents) * n for extents, n in bound.receives)
                if got != _exact_received(exchange):
                    problems.append(f"{case}, rank {rank}: receives {got}, not the exact")
                exact_profile = profile(exchange)  # once, not once per number of rounds
                for rounds in ROUNDS:
                    exact = round_buffers(exact_profile, rounds, reduced)
                    if bound_buffers(bound, rounds) < exact:
                        problems.append(f"{case}, rank {rank}, {rounds} rounds: below {exact}")
    assert checked > 200 and not problems, "\n".join(problems[:20])


def test_largest_part_grows_with_every_extent():
    """``bound_buffers`` bounds every piece's largest part by that of the widest extents:
    ``cut``'s largest part never shrinks as an extent grows."""

    def largest(extents, rounds):
        return max(volume(part) for part in cut(tuple((0, e) for e in extents), rounds))

    for extents in itertools.product(range(1, 7), repeat=3):
        for rounds in range(1, 20):
            for dim in range(3):
                wider = tuple(e + (d == dim) for d, e in enumerate(extents))
                assert largest(wider, rounds) >= largest(extents, rounds), (extents, rounds)


@pytest.mark.parametrize("name", ["2x3", "2x2x2"])
def test_plans_made_with_the_bound_keep_the_memory_bound(name, monkeypatch):
    """Every pair planned with bounds alone: peak temporaries within max(in, out), each
    AllToAllV's reported temporaries at least every rank's exact buffers in its rounds,
    and ``explain`` says they are a bound."""
    monkeypatch.setattr(exchange_bound, "PIECES_LIMIT", 0)
    exchange_cost._of_exchange.cache_clear()
    plan_resharding.cache_clear()
    mesh, shape = _mesh(name), SHAPES[name]
    exchanges, problems = 0, []
    try:
        for src_text, dst_text in _pairs(len(mesh.shape)):
            src, dst = (
                value(n, parse_notation(t, mesh), shape)
                for n, t in (("A", src_text), ("B", dst_text))
            )
            plan = plan_resharding(src, dst)
            case = f"{src_text} -> {dst_text}"
            if peak_temporaries(plan).value > memory_bound(plan).value:
                problems.append(f"{case}: peak over the bound\n{plan.explain()}")
            for k, step in enumerate(plan.steps):
                if step.kind is not AllToAllV:
                    continue
                exchanges += 1
                before, reduced = plan.before(k), step.get("op") is not None
                operands = (Operand("src", before, shape), Operand("out", step.after, shape))
                exact = max(
                    round_buffers(
                        profile(member_exchange(*operands, step.team, r, reduced)),
                        step.get("rounds") or 1,
                        reduced,
                    )
                    for r in mesh.devices
                )
                reported = exchange_cost.exchange_temporaries(plan, k).value
                if reported < exact or "temporaries at most" not in plan.explain():
                    problems.append(f"{case}: step {k + 1} reports {reported} < {exact}")
    finally:
        exchange_cost._of_exchange.cache_clear()
        plan_resharding.cache_clear()
    assert exchanges > 5 and not problems, "\n".join(problems[:10])
