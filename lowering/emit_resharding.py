"""``emit_resharding``: host IR instructions for a resharding plan.

Each step becomes one instruction whose output is a fresh intermediate
(``<dst>_<k>``) with the step's sharding, the last one writing ``dst`` itself.
Every communication is followed by its ``wait``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from hostir import (
    Allgather,
    Allreduce,
    AllToAll,
    Broadcast,
    CollectivePermute,
    Const,
    Gather,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
    Set,
    TensorValue,
)
from hostir.communications import LocalShard, Wait
from hostir.instructions import Instruction
from hostir.values import RequestValue
from lowering.plan_resharding import Plan, Step, StepKind


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
    current = src
    for index, step in enumerate(plan.steps):
        last = index == len(plan.steps) - 1
        out = dst
        if not last:
            out = TensorValue(
                name=f"{dst.name}_{index}", dtype=dst.dtype, shape=dst.shape, sharding=step.after
            )
        emitted = _emit_step(step, current, out, requests)
        if last and preallocated:
            emitted[0] = dataclasses.replace(emitted[0], preallocated=True)
        instructions.extend(emitted)
        current = out
    return instructions


def _emit_step(
    step: Step, src: TensorValue, out: TensorValue, requests: Iterator[int]
) -> list[Instruction]:
    if step.kind is StepKind.LOCAL_SHARD:
        return [LocalShard(out=out, src=src, axis=step.axis, mesh_axis=step.mesh_axis)]
    if step.kind is StepKind.COPY:
        return [Set(out=out, src=src)]
    request = RequestValue(name=f"R{next(requests)}")
    common = {"out": out, "src": src, "team": step.team, "request": request}
    root = Const(value=step.root) if step.root is not None else None
    builders = {
        StepKind.ALLGATHER: lambda: Allgather(**common, axis=step.axis),
        StepKind.REDUCE_SCATTER: lambda: ReduceScatter(**common, axis=step.axis, op=step.op),
        StepKind.ALLREDUCE: lambda: Allreduce(**common, op=step.op),
        StepKind.ALL_TO_ALL: lambda: AllToAll(
            **common, split_axis=step.axis, concat_axis=step.concat_axis
        ),
        StepKind.BROADCAST: lambda: Broadcast(**common, root=root),
        StepKind.SCATTER: lambda: Scatter(**common, root=root, axis=step.axis),
        StepKind.GATHER: lambda: Gather(**common, root=root, axis=step.axis),
        StepKind.REDUCE: lambda: Reduce(**common, root=root, op=step.op),
        StepKind.SEND_RECV: lambda: SendRecv(
            **common, sender=Const(value=0), receiver=Const(value=1)
        ),
        StepKind.PERMUTE: lambda: CollectivePermute(
            **common, send_peer=step.send_peer, recv_peer=step.recv_peer
        ),
    }
    return [builders[step.kind](), Wait(request=request)]
