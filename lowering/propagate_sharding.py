"""``propagate_sharding``: give tensors without a user-set mesh a mesh and parallelization.

First from producers, in definition order: a tensor takes its mesh from a
reference input (linear: weight, then bias, then input; matmul: rhs, then lhs;
other ops: the input with the most sharded axes) and copies the sharding parts
of every axis mapped to that input. Then from consumers, in reverse order, for
tensors still without a mesh. A user-set mesh is final. Afterwards every
tensor has a mesh or none does.
"""

from __future__ import annotations

import dataclasses
import math

from hostir import Linear, Matmul, ShardPart
from hostir.scalars import floordiv
from lowering.errors import LoweringError
from lowering.snapshot import AxisLayout, LoweringFusion, LoweringOp, LoweringTensor


def propagate_sharding(fusion: LoweringFusion) -> LoweringFusion:
    """Returns ``fusion`` with meshes and shardings propagated (see module docstring)."""
    tensors = {t.name: t for t in fusion.tensors}
    for op in fusion.ops:
        out = tensors[op.output]
        if out.mesh is None:
            reference = _reference_input(op, tensors)
            if reference is not None:
                tensors[op.output] = _inherit(out, reference, _pairs(op, reference.name))
    for op in reversed(fusion.ops):
        out = tensors[op.output]
        for name, pairs in op.axis_maps:
            producer = tensors[name]
            if producer.mesh is None and out.mesh is not None:
                flipped = tuple((i, o) for o, i in pairs)
                tensors[name] = _inherit(producer, out, flipped)
    without = [name for name, t in tensors.items() if t.mesh is None]
    if without and len(without) != len(tensors):
        raise LoweringError(
            f"tensors {', '.join(without)} have no device mesh and none could be propagated"
            " to them; set_device_mesh on them or on a connected tensor"
        )
    return dataclasses.replace(fusion, tensors=tuple(tensors[t.name] for t in fusion.tensors))


def _pairs(op: LoweringOp, name: str) -> tuple[tuple[int, int], ...]:
    return dict(op.axis_maps)[name]


def _reference_input(op: LoweringOp, tensors: dict[str, LoweringTensor]) -> LoweringTensor | None:
    instruction = op.instruction
    if isinstance(instruction, Linear):
        order = [instruction.weight, instruction.bias, instruction.input]
        names = [v.name for v in order if v is not None]
    elif isinstance(instruction, Matmul):
        names = [instruction.rhs.name, instruction.lhs.name]
    else:
        candidates = [tensors[n] for n in op.inputs if tensors[n].mesh is not None]
        if not candidates:
            return None
        # The most sharded input wins; ties go to the first operand.
        return max(candidates, key=lambda t: (_sharded_axes(t), -op.inputs.index(t.name)))
    for name in names:
        if tensors[name].mesh is not None:
            return tensors[name]
    return None


def _sharded_axes(tensor: LoweringTensor) -> int:
    return sum(1 for axis in tensor.axes if axis.mesh_axes())


def _inherit(
    target: LoweringTensor, source: LoweringTensor, pairs: tuple[tuple[int, int], ...]
) -> LoweringTensor:
    """``target`` placed on ``source``'s mesh, each axis paired (target, source) copying parts."""
    axes = list(target.axes)
    for target_index, source_index in pairs:
        axes[target_index] = _copy_parts(target.axes[target_index], source.axes[source_index], source)
    axes = [
        axis if axis.parts else dataclasses.replace(axis, parts=(ShardPart(axis=None, extent=axis.extent),))
        for axis in axes
    ]
    return dataclasses.replace(target, mesh=source.mesh, axes=tuple(axes))


def _copy_parts(target: AxisLayout, source: AxisLayout, owner: LoweringTensor) -> AxisLayout:
    if not source.mesh_axes():
        return dataclasses.replace(target, parts=(ShardPart(axis=None, extent=target.extent),))
    if source.extent == target.extent:
        return dataclasses.replace(target, parts=source.parts)
    block = all(p.axis is not None for p in source.parts[:-1]) and source.parts[-1].axis is None
    if not block:
        return dataclasses.replace(target, parts=(ShardPart(axis=None, extent=target.extent),))
    factor = math.prod(owner.mesh.axis_size(p.axis) for p in source.parts[:-1])
    local = ShardPart(axis=None, extent=floordiv(target.extent, factor))
    return dataclasses.replace(target, parts=source.parts[:-1] + (local,))
