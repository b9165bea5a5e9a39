"""``emit_resharding``: host IR instructions for a resharding plan.

Each step becomes one instruction whose output is an intermediate
(``<dst>_<k>``) with the step's sharding, the last one writing ``dst`` itself;
every communication is followed by its ``wait``. A plan's trailing Allgathers
(and a trailing Allreduce) are built inside the output, or the buffer a final
SendRecv sends, allocated first; the steps before write their slot of it through
``shard_by_stream`` aliases (docs/design.md, "Plans that end in gathers").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hostir import Set, ShardByStream, TensorValue
from hostir.ir.communications import Wait
from hostir.ir.instructions import Allocate, Instruction
from hostir.ir.scalars import Const
from hostir.ir.values import RequestValue
from lowering.redistribution.plan_resharding import Plan, Step


def emit_resharding(
    plan: Plan,
    src: TensorValue,
    dst: TensorValue,
    requests: Iterator[int],
    preallocated: bool = False,
) -> list[Instruction]:
    """The instructions that carry ``src`` to ``dst`` along ``plan``; ``requests`` numbers
    the request values (``R<n>``) program-wide. With ``preallocated``, ``dst`` exists
    already (a slice of a buffer) and the last step writes into it."""
    if not plan.steps:
        return [Set(out=dst, src=src, preallocated=preallocated)]
    instructions: list[Instruction] = []
    outs = _step_outputs(plan, dst)
    last, head, end = len(plan.steps) - 1, plan.in_output_from(), plan.built_in()
    in_output = head < end  # steps head..end write into outs[end] or slots of it
    if in_output:
        if end < last or not preallocated:
            instructions.append(Allocate(out=outs[end]))
        for k in reversed(range(head, end)):
            after = plan.steps[k + 1]  # an in-place step's slot is its whole output
            axis, index = (
                (0, Const(value=0))
                if plan.in_place(k + 1)
                else (after.get("axis"), after.team.my_position())
            )
            instructions.append(ShardByStream(out=outs[k], src=outs[k + 1], axis=axis, index=index))
    current = src
    for index, step in enumerate(plan.steps):
        emitted = _emit_step(step, current, outs[index], requests)
        writes_existing = (in_output and head <= index <= end) or (index == last and preallocated)
        if writes_existing:
            emitted[0] = dataclasses.replace(emitted[0], preallocated=True)
        instructions.extend(emitted)
        current = outs[index]
    return instructions


def _step_outputs(plan: Plan, dst: TensorValue) -> list[TensorValue]:
    """The value each step writes: ``<dst>_<k>`` for all but the last, ``dst``."""
    outs = [
        TensorValue(name=f"{dst.name}_{k}", dtype=dst.dtype, shape=dst.shape, sharding=s.after)
        for k, s in enumerate(plan.steps[:-1])
    ]
    return [*outs, dst]


def _emit_step(
    step: Step, src: TensorValue, out: TensorValue, requests: Iterator[int]
) -> list[Instruction]:
    if step.team is None:  # a local slice or copy
        return [step.instruction(src, out)]
    if step.team.size == 1:  # a one-device team: every collective is the identity
        return [Set(out=out, src=src)]
    request = RequestValue(name=f"R{next(requests)}")
    return [step.instruction(src, out, request), Wait(request=request)]
