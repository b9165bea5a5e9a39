"""What an AllToAllV step of a plan costs a rank: elements received and temporaries.

Both follow from the exchange pattern ``hostir.blocks.all_to_all_v_pieces``
computes at run time and its rounds (``hostir.blocks.exchange_rounds``): the
same pure functions, on the plan's concrete shape, maximised over the ranks of
the mesh. The temporaries are the handler's buffers in its largest round
(``hostir.blocks.call_buffers``), which the rounds keep within max(in, out).
"""

from __future__ import annotations

import functools

from hostir import Sharding
from hostir.blocks import (
    Operand,
    Pattern,
    all_to_all_v_pieces,
    block_box,
    call_buffers,
    exchange_rounds,
    intersect,
    volume,
)
from hostir.errors import HostIrError
from hostir.scalars import Const, Scalar, add, floordiv, mul, sub
from lowering.plan import Plan, Step, StepKind, local_elements


def _concrete(shape: tuple[Scalar, ...]) -> tuple[int, ...] | None:
    if all(isinstance(e, Const) for e in shape):
        return tuple(e.value for e in shape)
    return None


@functools.lru_cache(maxsize=256)
def _patterns(plan: Plan, k: int) -> tuple[tuple[int, Pattern], ...] | None:
    """(position in group, pattern) for every rank of the mesh; None if the shape is
    symbolic or the pattern cannot be formed. Cached: the planner's cost model, the
    memory model and ``explain`` all ask for the same step's patterns."""
    step: Step = plan.steps[k]
    shape = _concrete(plan.shape)
    if shape is None:
        return None
    before: Sharding = plan.steps[k - 1].after if k else plan.src
    src = Operand(name="src", sharding=before, shape=shape)
    out = Operand(name="out", sharding=step.after, shape=shape)
    found = []
    try:
        for rank in step.team.mesh.devices:
            group = tuple(step.team.group_of(rank))
            pattern = all_to_all_v_pieces(src, out, step.team, group, step.op is not None)
            found.append((group.index(rank), pattern))
    except HostIrError:
        return None
    return tuple(found)


def exchange_received(plan: Plan, k: int) -> Scalar | None:
    """The most elements any rank receives from other ranks in step ``k``."""
    patterns = _patterns(plan, k)
    if patterns is None:
        return None
    return Const(
        value=max(
            sum(volume(p.box) for p in pattern.pieces if p.destination == me and p.source != me)
            for me, pattern in patterns
        )
    )


def exchange_temporaries(plan: Plan, k: int) -> Scalar:
    """The most elements of packing and receive buffers any rank holds in one round of
    step ``k`` (``hostir.blocks.exchange_rounds``; the whole input and output when the
    pattern cannot be computed: symbolic shapes)."""
    patterns = _patterns(plan, k)
    if patterns is None:
        before = plan.steps[k - 1].after if k else plan.src
        return add(
            local_elements(before, plan.shape), local_elements(plan.steps[k].after, plan.shape)
        )
    reduced = plan.steps[k].op is not None
    worst = 0
    for me, pattern in patterns:
        for pieces in exchange_rounds(pattern, reduced):
            worst = max(worst, call_buffers(pattern, me, pieces, reduced))
    return Const(value=worst)


def exchange_round_count(plan: Plan, k: int) -> int | None:
    """How many alltoallv calls step ``k`` makes (the most over groups), None if symbolic."""
    patterns = _patterns(plan, k)
    if patterns is None:
        return None
    return max(len(exchange_rounds(p, plan.steps[k].op is not None)) for _, p in patterns)


def step_received(plan: Plan, k: int) -> Scalar:
    """Elements a rank receives in step ``k``: exact for an AllToAllV (the most over
    ranks), at the lower bound of what it lacks for the fixed-pattern collectives."""
    step = plan.steps[k]
    before = local_elements(plan.steps[k - 1].after if k else plan.src, plan.shape)
    after = local_elements(step.after, plan.shape)
    size = step.team.size if step.team is not None else 1
    kind = step.kind
    if kind is StepKind.ALL_TO_ALL_V:
        exact = exchange_received(plan, k)
        return exact if exact is not None else after
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
