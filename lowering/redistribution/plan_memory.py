"""``plan_memory``: the temporaries a resharding plan holds per rank, step by step.

Intermediates between steps and the handlers' packing and receive buffers (as
each handler declares them, ``hostir.run.communication_handlers.handler_buffers``),
besides the input and the output, against SPEC §6's bound; the backend's own
staging apart. docs/design.md ("The memory bound of SPEC §6 ...") says why.
"""

from __future__ import annotations

from hostir import AllToAllV
from hostir.ir.scalars import Const, Scalar, add
from hostir.run.communication_handlers import gloo_staging, handler_buffers
from lowering.redistribution.exchange_cost import exchange_temporaries
from lowering.redistribution.plan import Plan, local_elements


def memory_bound(plan: Plan) -> Scalar:
    """SPEC §6's bound on the temporaries, in elements: max(local input, local output)."""
    a, b = local_elements(plan.src, plan.shape), local_elements(plan.dst, plan.shape)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(value=max(a.value, b.value))
    return a if a == b else b  # symbolic: the output (planner shapes divide evenly)


def step_temporaries(plan: Plan) -> list[Scalar]:
    """Per step, the elements of the plan's own temporaries held while it runs:
    intermediates and the handlers' buffers (see module docstring)."""
    head, end, last = plan.in_output_from(), plan.built_in(), len(plan.steps) - 1
    contiguous = _slot_contiguity(plan, head)
    result = []
    current = plan.src
    for k, step in enumerate(plan.steps):
        before = local_elements(current, plan.shape)
        after = local_elements(step.after, plan.shape)
        held: Scalar = Const(value=0)
        if k >= 1 and (k - 1 < head or k - 1 == end < last):  # an intermediate input
            held = add(held, before)
        if k < head or k == end < last:  # an intermediate output, not (a slot of) dst
            held = add(held, after)
        elif head <= k < end < last:  # a slot of step end's output, an intermediate
            held = add(held, local_elements(plan.steps[end].after, plan.shape))
        if step.kind is AllToAllV:
            staged = exchange_temporaries(plan, k)
        else:
            # Past the head, a step's input is the slot the step before wrote in the output.
            src_contiguous = k <= head or contiguous[k - 1]
            instruction = plan.instruction(k)
            staged = handler_buffers(instruction, before, after, src_contiguous, contiguous[k])
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
    output along dim 0 of a contiguous buffer is, and an in-place step's whole output;
    fresh intermediates are."""
    flags = [True] * len(plan.steps)
    for k in reversed(range(head, plan.built_in())):
        flags[k] = flags[k + 1] and (plan.in_place(k + 1) or plan.steps[k + 1].get("axis") == 0)
    return flags


def step_staging(plan: Plan) -> list[Scalar]:
    """Per step, the elements gloo stages inside the collective (not the plan's own; not in
    the bound; ``hostir.run.communication_handlers.gloo_staging``)."""
    return [
        gloo_staging(
            plan.instruction(k),
            local_elements(plan.before(k), plan.shape),
            local_elements(step.after, plan.shape),
        )
        for k, step in enumerate(plan.steps)
    ]
