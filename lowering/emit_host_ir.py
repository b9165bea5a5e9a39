"""``emit_host_ir``: host IR instructions for every op of a decomposed fusion.

Compute ops become one compute instruction each. A ``set`` between two
different shardings becomes the instructions of its resharding plan.
"""

from __future__ import annotations

import dataclasses
import itertools

from hostir import HostIrContainer, Set, TensorValue
from hostir.instructions import Instruction
from lowering.emit_resharding import emit_resharding
from lowering.plan_resharding import plan_resharding
from lowering.snapshot import LoweringFusion


def bind_values(instruction: Instruction, values: dict[str, TensorValue]) -> Instruction:
    """``instruction`` with every tensor field replaced by the final value of that name."""
    changes = {
        field.name: values[getattr(instruction, field.name).name]
        for field in dataclasses.fields(instruction)
        if isinstance(getattr(instruction, field.name), TensorValue)
    }
    return dataclasses.replace(instruction, **changes)


def _layout(value: TensorValue) -> object:
    sharding = value.sharding
    if sharding is None:
        return None
    return (
        sharding.mesh,
        tuple(tuple(p.axis for p in parts) for parts in sharding.dims),
        sharding.partial,
    )


def emit_host_ir(fusion: LoweringFusion) -> HostIrContainer:
    """The host IR program computing ``fusion`` (inputs in definition order)."""
    values = {tensor.name: tensor.value() for tensor in fusion.tensors}
    scalars = {s.name: s for s in fusion.scalar_inputs}
    inputs = tuple(scalars.get(name) or values[name] for name in fusion.inputs)
    requests = itertools.count()
    body: list[Instruction] = []
    for op in fusion.ops:
        instruction = bind_values(op.instruction, values)
        if isinstance(instruction, Set) and _layout(instruction.src) != _layout(instruction.out):
            plan = plan_resharding(instruction.src, instruction.out)
            body.extend(emit_resharding(plan, instruction.src, instruction.out, requests))
        else:
            body.append(instruction)
    outputs = tuple(values[name] for name in fusion.outputs)
    return HostIrContainer(inputs=inputs, outputs=outputs, body=tuple(body))
