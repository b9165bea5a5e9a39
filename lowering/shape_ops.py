"""How the shape ops shard: which sharded dims stay sharded through them, by the rules of
scheduling splits.

A fusion expression's ``axis_map`` pairs dims that iterate over the same index. A reshape
also splits and merges dims (``reshape_groups``): ``[b, s, 3e] -> [b, s, h, 3e/h]`` splits
``3e`` into ``h`` and ``3e/h``. If the group's outermost input dim is sharded in blocks
(mesh axes outermost, ``D`` devices in all) and the group's outermost output dim divides
into ``D`` blocks (its extent a multiple of ``D``, or of the input dim's extent), each
rank's shard is one contiguous block of the group's elements on both sides: the rank
reshapes its own shard, and the output dim is sharded like the input dim
(:func:`with_layout_pairs` adds that pair for propagation and decomposition). Any other
sharded dim of a group is not paired, so ``decompose_resharding`` gathers it before the
reshape (a ``set``), as it does for a dim that a slice, pad or cat changes. The op's
declaration says whether it keeps blocks so (``OpSharding.keeps_blocks``).

A dim such an op creates or changes is computed whole on each rank: its declaration marks
it (``ResultAxis.whole``, read by ``lowering.op_layouts``), so a sharded output dim there
is sliced by the ``set`` after the op; a kept block is laid out as its input dim's
(:func:`compute_layout`).
"""

from __future__ import annotations

import dataclasses
import math

from hostir.ir.catalog import keyword
from hostir.ir.extents import divides, normal_form
from hostir.ir.opdecl import op_decl
from hostir.ir.reshape_groups import reshape_groups
from hostir.ir.scalars import floordiv
from hostir.ir.sharding import ShardPart, canonical_parts
from lowering.errors import LoweringError
from lowering.snapshot import AxisLayout, LoweringOp, LoweringTensor


def keeps_blocks(op: LoweringOp) -> bool:
    """Whether ``op`` keeps a sharded dim's blocks through a split or merge (its
    declaration's ``OpSharding.keeps_blocks``: a reshape)."""
    decl = op_decl(op.instruction)
    return decl is not None and decl.sharding.keeps_blocks


def with_layout_pairs(op: LoweringOp, tensors: dict[str, LoweringTensor]) -> LoweringOp:
    """``op`` with a reshape's sharded group pairs added to its axis map (see the module
    docstring); any other op unchanged."""
    if not keeps_blocks(op) or len(op.axis_maps) != 1:
        return op
    ((name, pairs),) = op.axis_maps
    extra = block_pairs(tensors[name], tensors[op.output])
    added = tuple(pair for pair in extra if pair not in pairs)
    if not added:
        return op
    return dataclasses.replace(op, axis_maps=((name, pairs + added),))


def block_pairs(source: LoweringTensor, out: LoweringTensor) -> tuple[tuple[int, int], ...]:
    """(output axis, input axis) of each reshape group whose outermost input dim is sharded
    in blocks that stay blocks of its outermost output dim (logical axis indices)."""
    data_in = [i for i, axis in enumerate(source.axes) if not axis.reduction]
    data_out = [o for o, axis in enumerate(out.axes) if not axis.reduction]
    groups = reshape_groups(
        tuple(source.axes[i].extent for i in data_in), tuple(out.axes[o].extent for o in data_out)
    )
    found = []
    for ins, outs in groups:
        if len(ins) == 1 and len(outs) == 1 or not ins or not outs:
            continue  # one to one (already mapped), or a lone dim of extent 1
        axis = source.axes[data_in[ins[0]]]
        if _keeps_blocks(axis, out.axes[data_out[outs[0]]], source):
            found.append((data_out[outs[0]], data_in[ins[0]]))
    return tuple(found)


def _keeps_blocks(axis: AxisLayout, target: AxisLayout, source: LoweringTensor) -> bool:
    """Whether ``axis``, sharded in blocks, stays in blocks as ``target`` (the outermost
    output dim of its group)."""
    parts = axis.parts
    if not any(p.axis is not None for p in parts) or source.mesh is None:
        return False
    if axis.stream is not None or target.stream is not None:
        return False  # stream chunks of a split dim would not be the output's chunks
    if any(p.axis is None for p in parts[:-1]):
        return False  # not in blocks: a local part outside a mesh axis
    devices = math.prod(source.mesh.axis_size(p.axis) for p in parts if p.axis is not None)
    wanted = normal_form(target.extent)
    if wanted[0].denominator == 1 and wanted[0].numerator % devices == 0:
        return True  # a multiple of the devices, whatever its symbols
    return divides(normal_form(axis.extent), wanted) is not None  # a multiple of the input dim


def with_blocks(
    op: LoweringOp, out: LoweringTensor, tensors: dict[str, LoweringTensor]
) -> LoweringTensor:
    """``out`` (a reshape's output, or its compute layout) with the outermost output dim of
    each kept block laid out as the input dim's blocks: its mesh parts, then the local part
    ``extent / devices`` (the generic copy of parts keeps a lone mesh part, ``[x]``, which
    is right only between equal extents); any other op's output unchanged."""
    if not keeps_blocks(op) or len(op.axis_maps) != 1:
        return out
    source = tensors[op.axis_maps[0][0]]
    if source.mesh is None or out.mesh != source.mesh:
        return out
    axes = list(out.axes)
    for o, i in block_pairs(source, out):
        mesh_parts = tuple(p for p in source.axes[i].parts if p.axis is not None)
        devices = math.prod(source.mesh.axis_size(p.axis) for p in mesh_parts)
        local = ShardPart(axis=None, extent=floordiv(out.axes[o].extent, devices))
        axes[o] = dataclasses.replace(axes[o], parts=canonical_parts([*mesh_parts, local]))
    return dataclasses.replace(out, axes=tuple(axes))


def compute_layout(
    op: LoweringOp, compute: LoweringTensor, tensors: dict[str, LoweringTensor]
) -> LoweringTensor:
    """The compute layout of ``op`` (its output dims computed whole already unsharded,
    ``lowering.op_layouts``): kept blocks laid out as :func:`with_blocks` says; a stream
    split of a dim the op creates or changes refused by name."""
    names = (op.output, *(name for name, _ in op.axis_maps))
    if any(axis.stream is not None for n in names for axis in tensors[n].axes) and changed_dims(op):
        _refuse_changed_stream_dims(op, tensors)
    return with_blocks(op, compute, tensors)


def changed_dims(op: LoweringOp) -> tuple[int, ...]:
    """The output axes ``op`` creates or changes: computed whole from no operand axis (its
    declaration's ``ResultAxis``: ``whole`` and without sources)."""
    decl = op_decl(op.instruction)
    inferred = decl.infer_of(op.instruction) if decl is not None else ()
    if isinstance(inferred, str) or not inferred:
        return ()
    axes = inferred[op.result].axes
    return tuple(i for i, axis in enumerate(axes) if axis.whole and not axis.sources)


def keep_blocks(
    op: LoweringOp, name: str, wanted: LoweringTensor, tensors: dict[str, LoweringTensor]
) -> LoweringTensor:
    """The layout a reshape reads its input ``name`` in (``wanted``), with the input dims
    whose blocks it keeps as they are (the generic copy would rewrite their parts from the
    output dim's, whose extent differs); any other op's ``wanted`` unchanged."""
    if not keeps_blocks(op) or wanted.mesh != tensors[name].mesh:
        return wanted
    source = tensors[name]
    axes = list(wanted.axes)
    for _, i in block_pairs(source, tensors[op.output]):
        axes[i] = source.axes[i]
    return dataclasses.replace(wanted, axes=tuple(axes))


def is_kept_block(op: LoweringOp, name: str, pair: tuple[int, int], tensors: dict) -> bool:
    """Whether ``pair`` (output axis, input axis) of a reshape reading ``name`` is a kept
    block: both axes sharded in blocks over the same mesh axes (their local parts differ
    with their extents, so their layouts compare unequal)."""
    if not keeps_blocks(op):
        return False
    source, out = tensors[name], tensors[op.output]
    o, i = pair
    if pair not in block_pairs(source, out) or source.mesh != out.mesh:
        return False
    return out.axes[o].parts == with_blocks(op, out, tensors).axes[o].parts and (
        out.axes[o].mesh_axes() == source.axes[i].mesh_axes()
    )


def _refuse_changed_stream_dims(op: LoweringOp, tensors: dict[str, LoweringTensor]) -> None:
    """A stream loop runs an op chunk by chunk along dims that iterate together; a dim an
    op creates or changes (and an operand dim it reads whole: one its axis map leaves out)
    has no such partner, so a stream split of it is refused by name (split a dim the op
    keeps instead)."""
    mapped_out = {o for _, pairs in op.axis_maps for o, _ in pairs}
    sides = [(op.output, tensors[op.output], mapped_out)]
    sides += [(name, tensors[name], {i for _, i in pairs}) for name, pairs in op.axis_maps]
    for name, tensor, mapped in sides:
        for index, axis in enumerate(tensor.axes):
            if axis.stream is not None and index not in mapped and not axis.reduction:
                raise LoweringError(
                    f"{name} dim {index} is split into {axis.stream} stream chunks, but"
                    f" {keyword(op.instruction)} defining {op.output} changes that dim (it is"
                    " not the same dim on both sides), so a stream loop cannot run it chunk"
                    " by chunk; split a dim the op keeps, or none"
                )
