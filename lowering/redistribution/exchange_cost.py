"""What an AllToAllV step of a plan costs a rank: elements received and temporaries.

Both follow from each rank's part of the exchange, as
``hostir.analysis.member_exchanges.member_exchange`` computes it at run time, and its rounds
(``hostir.analysis.exchange_buffers.exchange_rounds``): the same pure functions, on the
plan's concrete shape, maximised over the ranks of the mesh. The temporaries are the
handler's buffers in its largest round (``hostir.analysis.exchange_buffers.call_buffers``),
which the rounds keep within max(in, out).
"""

from __future__ import annotations

import functools

from hostir import AllToAllV, CollectivePermute, Sharding
from hostir.analysis.boxes import Operand, most_missing
from hostir.analysis.exchange_bound import buffers_in, busiest_costs, is_bound, member_costs
from hostir.analysis.exchange_buffers import ROUNDS_LIMIT, rounds_needed
from hostir.analysis.exchange_profiles import most_received
from hostir.analysis.exchanges import busiest_received, member_at
from hostir.analysis.exchanges import local_elements as exchanges_local_elements
from hostir.check.collector import collector_paused
from hostir.errors import HostIrError
from hostir.ir.scalars import Const, Scalar, add
from hostir.ir.team import Team
from lowering.redistribution.plan import Plan, local_elements


def _concrete(shape: tuple[Scalar, ...]) -> tuple[int, ...] | None:
    if all(isinstance(e, Const) for e in shape):
        return tuple(e.value for e in shape)
    return None


@functools.lru_cache(maxsize=512)
def _of_exchange(
    measure, before: Sharding, after: Sharding, team: Team, shape: tuple[Scalar, ...], reduced: bool
):
    """``measure`` (``hostir.analysis.exchange_bound.member_costs``: the distinct rank
    profiles, each computed once, or bounds on a large mesh; ``most_received``: from block
    boxes alone) of the AllToAllV from
    ``before`` to ``after``; None if the shape is symbolic or the exchange cannot be
    formed. Cached: the rounds, the cost and memory models and ``explain`` ask alike."""
    concrete = _concrete(shape)
    try:
        src, out = Operand("src", before, concrete), Operand("out", after, concrete)
        if concrete is None:
            return None
        with collector_paused():  # every member's pieces: many small objects, no cycles
            return measure(src, out, team, reduced)
    except HostIrError:
        return None


def exchange_rounds_for(
    before: Sharding,
    after: Sharding,
    team: Team,
    shape: tuple[Scalar, ...],
    reduced: bool,
    allowance: Scalar,
    exact: bool = True,
) -> int | None:
    """The ``rounds`` an AllToAllV from ``before`` to ``after`` needs so that no rank's
    buffers pass ``allowance`` elements
    (``hostir.analysis.exchange_buffers.rounds_needed``); None for one call (or a symbolic
    shape). Where the ranks' buffers are bounded rather than listed
    (``hostir.analysis.exchange_bound``), enough rounds for the bounds: no rank passes
    ``allowance``, perhaps in more rounds than needed. Not ``exact``: no more than it is,
    from one rank's pieces (``busiest_costs``: one call where that rank has too many), or,
    for a reducing exchange, none (partial sums always arrive in a buffer: at least the most
    received over the allowance)."""
    if not isinstance(allowance, Const):
        return None
    if exact or not reduced:  # every rank's profile, or the busiest rank's (a lower bound)
        measure = member_costs if exact else busiest_costs
        costs = _of_exchange(measure, before, after, team, shape, reduced)
        rounds = (
            None
            if costs is None
            else rounds_needed(costs, reduced, allowance.value, buffers=buffers_in)
        )
    else:
        received = _of_exchange(most_received, before, after, team, shape, reduced)
        if received is None:
            return None
        rounds = min(-(-received // max(allowance.value, 1)), ROUNDS_LIMIT)
    return rounds if rounds is not None and rounds > 1 else None


def exchange_temporaries(plan: Plan, k: int) -> Scalar:
    """The most elements of packing and receive buffers any rank holds in one round of step
    ``k`` (``hostir.analysis.exchange_buffers.exchange_rounds``; the whole input and output
    when the exchange cannot be computed: symbolic shapes). On a large mesh, an upper bound
    (:func:`temporaries_bounded` says when)."""
    step, reduced = plan.steps[k], plan.steps[k].get("op") is not None
    costs = _of_exchange(member_costs, *_exchange_key(plan, k))
    if costs is None:
        return add(
            local_elements(plan.before(k), plan.shape), local_elements(step.after, plan.shape)
        )
    rounds = step.get("rounds") or 1
    return Const(value=max(buffers_in(e, rounds, reduced) for e in costs))


def temporaries_bounded(plan: Plan, k: int) -> bool:
    """Whether :func:`exchange_temporaries` of step ``k`` (an AllToAllV) is an upper bound
    (``hostir.analysis.exchange_bound``: too many pieces to list) rather than exact."""
    costs = _of_exchange(member_costs, *_exchange_key(plan, k))
    return costs is not None and is_bound(costs)


def _exchange_key(plan: Plan, k: int) -> tuple:
    step = plan.steps[k]
    return (plan.before(k), step.after, step.team, plan.shape, step.get("op") is not None)


def step_received(plan: Plan, k: int) -> int | None:
    """Elements the busiest rank receives in step ``k``, from the exchange function of its
    instruction (``hostir.analysis.exchanges``) in one group of its team (the planner's groups are
    alike); for an AllToAllV, from block boxes alone (``most_received``: the pieces its
    exchange function lists, not listed). None for symbolic extents."""
    step = plan.steps[k]
    if step.team is None:  # a local slice or copy
        return 0
    if step.kind is AllToAllV:
        return _of_exchange(most_received, *_exchange_key(plan, k))
    mesh = step.team.mesh  # not every group: one is alike (its first device: no listing)
    group = step.team.group_of(mesh.device((0,) * len(mesh.shape)))
    if step.kind is CollectivePermute:
        return _permute_received(plan.instruction(k), group)
    return busiest_received(plan.instruction(k), group, {})


def _permute_received(instruction: CollectivePermute, group: tuple[int, ...]) -> int | None:
    """``busiest_received`` of a planned CollectivePermute: its block if some member sends
    it to another, else nothing. The planner's permutes relabel mesh axes (their peers
    are positions in a team over the permuted axes), so every member receives exactly one
    block, and the first member found that moves settles it; ``busiest_received`` would
    evaluate every member's peer (on 4096 devices, some 12,000 scalar evaluations).
    ``tests/lowering/test_plan_classes.py`` checks the two agree on the sweep's permutes."""
    size = exchanges_local_elements(instruction.src, {})
    if size is None:
        return None
    for member in group:
        if member_at(instruction.send_peer, member, {}, group) != member:
            return size
    return 0


def received_in_all(plan: Plan) -> int | None:
    """Elements the busiest rank receives over the whole plan (each step's most, summed);
    None for symbolic extents."""
    received = [step_received(plan, k) for k in range(len(plan.steps))]
    return None if None in received else sum(received)


def received_lower_bound(plan: Plan) -> int | None:
    """The fewest elements the busiest rank can receive: the part of its target block that
    it does not already hold in final form (nothing, for a source of partial sums); None
    for symbolic shapes."""
    shape = _concrete(plan.shape)
    if shape is None:
        return None
    keeps = not plan.src.partial and plan.src.mesh == plan.dst.mesh
    return most_missing(plan.src if keeps else None, plan.dst, shape)
