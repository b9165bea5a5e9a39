"""``emit_host_ir``: one host IR instruction per fusion expression."""

from __future__ import annotations

import dataclasses

from hostir import HostIrContainer, TensorValue
from hostir.instructions import Instruction
from lowering.snapshot import LoweringFusion


def bind_values(instruction: Instruction, values: dict[str, TensorValue]) -> Instruction:
    """``instruction`` with every tensor field replaced by the final value of that name."""
    changes = {
        field.name: values[getattr(instruction, field.name).name]
        for field in dataclasses.fields(instruction)
        if isinstance(getattr(instruction, field.name), TensorValue)
    }
    return dataclasses.replace(instruction, **changes)


def emit_host_ir(fusion: LoweringFusion) -> HostIrContainer:
    """The host IR program computing ``fusion`` (inputs in definition order)."""
    values = {tensor.name: tensor.value() for tensor in fusion.tensors}
    scalars = {s.name: s for s in fusion.scalar_inputs}
    inputs = tuple(scalars.get(name) or values[name] for name in fusion.inputs)
    body = tuple(bind_values(op.instruction, values) for op in fusion.ops)
    outputs = tuple(values[name] for name in fusion.outputs)
    return HostIrContainer(inputs=inputs, outputs=outputs, body=body)
