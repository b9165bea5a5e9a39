"""``plan_memory``: the temporaries a resharding plan holds per rank, step by step.

The model follows the program ``emit_resharding`` writes and the handlers that
run it, and counts what a rank holds besides its input (the caller's) and its
output (the result): the plan's own temporaries are the intermediates between
steps and the packing and receive buffers of the handlers
(:func:`step_temporaries`); SPEC §6 bounds them by ``max(local input, local
output)`` (:func:`memory_bound`). What the backend stages inside a collective
is reported apart (:func:`step_staging`), for gloo, the larger of the two: its
all-gather stages the whole output in a flat buffer of its own, and its
reduce-scatter all-reduces a copy of the whole input (NCCL needs neither).
``benchmarks/redistribute_vs_dtensor.py`` measures both with the profiler.
"""

from __future__ import annotations

from hostir.scalars import Const, Scalar, add
from lowering.exchange_cost import exchange_temporaries
from lowering.plan import Plan, Step, StepKind, local_elements


def memory_bound(plan: Plan) -> Scalar:
    """SPEC §6's bound on the temporaries, in elements: max(local input, local output)."""
    a, b = local_elements(plan.src, plan.shape), local_elements(plan.dst, plan.shape)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(value=max(a.value, b.value))
    return a if a == b else b  # symbolic: the output (planner shapes divide evenly)


def step_temporaries(plan: Plan) -> list[Scalar]:
    """Per step, the elements of the plan's own temporaries held while it runs:
    intermediates and the handlers' buffers (see module docstring)."""
    head = plan.in_output_from()
    contiguous = _slot_contiguity(plan, head)
    result = []
    current = plan.src
    for k, step in enumerate(plan.steps):
        before = local_elements(current, plan.shape)
        after = local_elements(step.after, plan.shape)
        held: Scalar = Const(value=0)
        if k >= 1 and k - 1 < head:  # the input is an intermediate, not the caller's
            held = add(held, before)
        if k < head:  # the output is an intermediate, not (a slot of) the result
            held = add(held, after)
        if step.kind is StepKind.ALL_TO_ALL_V:
            staged = exchange_temporaries(plan, k)
        else:
            # Past the head, a step's input is the slot the step before wrote in the output.
            src_contiguous = k <= head or contiguous[k - 1]
            staged = _handler(step, before, after, contiguous[k], src_contiguous)
        result.append(add(held, staged))
        current = step.after
    return result


def peak_temporaries(plan: Plan) -> Scalar:
    """The largest of :func:`step_temporaries` (see :func:`peak_of`)."""
    return peak_of(step_temporaries(plan))


def peak_of(steps: list[Scalar]) -> Scalar:
    """The largest of per-step temporaries (0 for no steps); when symbolic steps cannot be
    compared, the last step's."""
    if not steps:
        return Const(value=0)
    if all(isinstance(s, Const) for s in steps):
        return Const(value=max(s.value for s in steps))
    return steps[-1]


def _slot_contiguity(plan: Plan, head: int) -> list[bool]:
    """Whether each step's output buffer is contiguous: the result is; a slot of a gather's
    output along dim 0 of a contiguous buffer is; fresh intermediates are."""
    flags = [True] * len(plan.steps)
    for k in reversed(range(head, len(plan.steps) - 1)):
        flags[k] = flags[k + 1] and plan.steps[k + 1].axis == 0
    return flags


def _handler(
    step: Step, before: Scalar, after: Scalar, contiguous: bool, src_contiguous: bool = True
) -> Scalar:
    """Packing and receive buffers of one step's handler (``hostir.communication_handlers``);
    ``contiguous``: whether the step's output buffer is, ``src_contiguous``: its input."""
    zero = Const(value=0)
    kind = step.kind
    if kind is StepKind.ALLGATHER:
        # The backend sends from a contiguous input: a strided slot of the output (where
        # this gather or a later one runs along an inner dim) is copied first. The chunks
        # land in out (strided views of it where its strides allow, else a landing copy).
        copied = zero if src_contiguous else before
        return add(copied, zero if contiguous else after)
    if kind in (StepKind.REDUCE_SCATTER, StepKind.ALLREDUCE):
        return zero if contiguous else after  # chunks are views of out, else a landing copy
    if kind is StepKind.ALL_TO_ALL:
        packing = zero if step.axis == 0 else before
        receiving = zero if step.concat_axis == 0 and contiguous else after
        return add(packing, receiving)
    if kind in (StepKind.REDUCE, StepKind.SCATTER):
        return before
    if kind in (StepKind.GATHER, StepKind.SEND_RECV):
        return after
    return zero  # permute (sent and received in place), local slices, copies


def step_staging(plan: Plan) -> list[Scalar]:
    """Per step, the elements gloo stages inside the collective (not the plan's own; not in
    the bound): a flat copy of an all-gather's whole output, of a reduce-scatter's input."""
    result: list[Scalar] = []
    current = plan.src
    for step in plan.steps:
        if step.kind is StepKind.ALLGATHER:
            result.append(local_elements(step.after, plan.shape))
        elif step.kind is StepKind.REDUCE_SCATTER:
            result.append(local_elements(current, plan.shape))
        else:
            result.append(Const(value=0))
        current = step.after
    return result
