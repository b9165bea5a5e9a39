"""What an AllToAllV step of a plan costs a rank: elements received and temporaries.

Both follow from each rank's part of the exchange, as
``hostir.blocks.member_exchange`` computes it at run time, and its rounds
(``hostir.blocks.exchange_rounds``): the same pure functions, on the plan's
concrete shape, maximised over the ranks of the mesh. The temporaries are the
handler's buffers in its largest round (``hostir.blocks.call_buffers``), which
the rounds keep within max(in, out).
"""

from __future__ import annotations

import functools

from hostir import Sharding
from hostir.blocks import (
    ROUNDS_LIMIT,
    Exchange,
    Operand,
    block_box,
    intersect,
    member_profiles,
    most_received,
    round_buffers,
    rounds_needed,
    volume,
)
from hostir.errors import HostIrError
from hostir.scalars import Const, Scalar, add, floordiv, mul, sub
from hostir.team import Team
from lowering.plan import Plan, StepKind, local_elements


def _concrete(shape: tuple[Scalar, ...]) -> tuple[int, ...] | None:
    if all(isinstance(e, Const) for e in shape):
        return tuple(e.value for e in shape)
    return None


@functools.lru_cache(maxsize=512)
def _of_exchange(
    measure, before: Sharding, after: Sharding, team: Team, shape: tuple[Scalar, ...], reduced: bool
):
    """``measure`` (``hostir.blocks.member_profiles``: the distinct rank profiles, each
    computed once; ``most_received``: from block boxes alone) of the AllToAllV from
    ``before`` to ``after``; None if the shape is symbolic or the exchange cannot be
    formed. Cached: the rounds, the cost and memory models and ``explain`` ask alike."""
    concrete = _concrete(shape)
    try:
        src, out = Operand("src", before, concrete), Operand("out", after, concrete)
        return None if concrete is None else measure(src, out, team, reduced)
    except HostIrError:
        return None


def _profiles(*key) -> tuple[Exchange, ...] | None:
    return _of_exchange(member_profiles, *key)


def _received(*key) -> int | None:
    return _of_exchange(most_received, *key)


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
    buffers pass ``allowance`` elements (``hostir.blocks.rounds_needed``); None for one
    call (or a symbolic shape). Not ``exact``: the fewest it can be, computing no rank's
    pieces (partial sums always arrive in a buffer, so a reducing exchange needs at
    least the most received over the allowance)."""
    if not isinstance(allowance, Const):
        return None
    if exact:
        profiles = _profiles(before, after, team, shape, reduced)
        rounds = None if profiles is None else rounds_needed(profiles, reduced, allowance.value)
    else:
        received = _received(before, after, team, shape, reduced)
        if not reduced or received is None:
            return None
        rounds = min(-(-received // max(allowance.value, 1)), ROUNDS_LIMIT)
    return rounds if rounds is not None and rounds > 1 else None


def _step_profiles(plan: Plan, k: int) -> tuple[Exchange, ...] | None:
    step = plan.steps[k]
    return _profiles(plan.before(k), step.after, step.team, plan.shape, step.op is not None)


def exchange_temporaries(plan: Plan, k: int) -> Scalar:
    """The most elements of packing and receive buffers any rank holds in one round of
    step ``k`` (``hostir.blocks.exchange_rounds``; the whole input and output when the
    exchange cannot be computed: symbolic shapes)."""
    profiles = _step_profiles(plan, k)
    step = plan.steps[k]
    if profiles is None:
        return add(
            local_elements(plan.before(k), plan.shape), local_elements(step.after, plan.shape)
        )
    reduced = step.op is not None
    return Const(value=max(round_buffers(e, step.rounds or 1, reduced) for e in profiles))


def step_received(plan: Plan, k: int) -> Scalar:
    """Elements a rank receives in step ``k``: exact for an AllToAllV (the most over
    ranks), at the lower bound of what it lacks for the fixed-pattern collectives."""
    step = plan.steps[k]
    before = local_elements(plan.before(k), plan.shape)
    after = local_elements(step.after, plan.shape)
    size = step.team.size if step.team is not None else 1
    kind = step.kind
    if kind is StepKind.ALL_TO_ALL_V:
        received = _received(plan.before(k), step.after, step.team, plan.shape, step.op is not None)
        return Const(value=received) if received is not None else after
    if kind in (StepKind.ALLGATHER, StepKind.GATHER):
        return sub(after, before)
    if kind is StepKind.REDUCE_SCATTER:
        return sub(before, after)
    if kind is StepKind.ALLREDUCE:  # a reduce-scatter and an all-gather (the ring)
        return floordiv(mul(before, 2 * (size - 1)), size)
    if kind in (StepKind.ALL_TO_ALL, StepKind.REDUCE):
        return floordiv(mul(before, size - 1), size)
    if kind in (StepKind.LOCAL_SHARD, StepKind.COPY):
        return Const(value=0)
    return after


def received_in_all(plan: Plan) -> Scalar:
    """Elements the busiest rank receives over the whole plan (each step's most, summed)."""
    total: Scalar = Const(value=0)
    for k in range(len(plan.steps)):
        total = add(total, step_received(plan, k))
    return total


def received_lower_bound(plan: Plan) -> int | None:
    """The fewest elements the busiest rank can receive: the part of its target block that
    it does not already hold in final form (nothing, for a source of partial sums); None
    for symbolic shapes."""
    shape = _concrete(plan.shape)
    if shape is None:
        return None
    worst = 0
    for rank in plan.dst.mesh.devices:
        out = block_box(plan.dst, shape, rank)
        held = None
        if not plan.src.partial and plan.src.mesh == plan.dst.mesh:
            held = intersect(block_box(plan.src, shape, rank), out)
        worst = max(worst, volume(out) - (volume(held) if held is not None else 0))
    return worst
