"""``propagate_sharding``: give tensors without a user-set mesh a mesh and parallelization.

First from producers, in definition order: a tensor takes its mesh from the
first input in priority order (linear: weight, then bias, then input; matmul:
rhs, then lhs; other ops: inputs with more sharded axes first), then each
input in that order lends its sharding parts to the mapped axes that are not
sharded yet, skipping mesh axes the tensor already uses, and its stream split
(so consecutive ops share one stream loop). Then from consumers, in reverse order, for
tensors still without a mesh; the two passes repeat while they place more tensors (a
producer placed by its consumer passes its mesh on to its other consumers). A
user-set mesh is final. Afterwards every tensor has a mesh or none does. Then, in
reverse order, a tensor neither scheduled by the user nor a fusion input takes its
consumers' splits of data axes it leaves unsplit (nvFuser's back-propagation).

Stream splits spread from producers on their own, whether or not a mesh does: an
op's output without a stream split of its own takes its inputs' (same priority
order), so consecutive ops over the same chunks share one loop, with or without a
device mesh, as nvFuser propagates a stream schedule from its reference tensor.

Last, a split must divide the extent of its dim wherever a constant fixes that extent:
mapped dims and dims of one symbol are equal at run time, so a symbolic dim tied
through an op to a constant dim (a linear's bias of size [2]) has that constant
extent. A split of it by a factor that does not divide the constant (over 8 devices:
2 // 8 = 0 rows each) is refused here by name, as the frontend refuses a split of a
constant extent of the tensor's own, instead of lowering parts that do not make up
the extent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from hostir import Const, Symbol
from hostir.ir.opdecl import op_decl
from hostir.ir.scalars import print_scalar, symbols_of
from hostir.ir.sharding import part_extents
from lowering.errors import LoweringError
from lowering.layouts import copy_parts, local_parts
from lowering.op_layouts import takes_no_stream, whole_axes
from lowering.shape_ops import with_blocks, with_layout_pairs
from lowering.snapshot import LoweringFusion, LoweringOp, LoweringTensor


def propagate_sharding(fusion: LoweringFusion) -> LoweringFusion:
    """Returns ``fusion`` with meshes and shardings propagated (see module docstring)."""
    tensors = {t.name: t for t in fusion.tensors}
    without = [name for name, t in tensors.items() if t.mesh is None]
    # Repeat while the passes place more tensors: a producer placed by one consumer
    # passes its mesh on to its other consumers in the next round.
    while without:
        _from_producers(fusion, tensors)
        _from_consumers(fusion, tensors)
        before, without = without, [name for name, t in tensors.items() if t.mesh is None]
        if without == before:
            break
    if without and len(without) != len(tensors):
        raise LoweringError(
            f"tensors {', '.join(without)} have no device mesh and none could be propagated"
            " to them; set_device_mesh on them or on a connected tensor"
        )
    _splits_from_consumers(fusion, tensors)
    _streams_from_producers(fusion, tensors)
    result = dataclasses.replace(fusion, tensors=tuple(tensors[t.name] for t in fusion.tensors))
    check_tied_extents(result)
    return result


def _from_producers(fusion: LoweringFusion, tensors: dict[str, LoweringTensor]) -> None:
    for op in fusion.ops:
        out = tensors[op.output]
        if out.mesh is None:
            references = _reference_inputs(op, tensors)
            if references:
                sharded_op = with_layout_pairs(op, tensors)  # a reshape's kept blocks too
                inherited = _inherit_all(out, references, sharded_op)
                tensors[op.output] = with_blocks(sharded_op, inherited, tensors)


def _streams_from_producers(fusion: LoweringFusion, tensors: dict[str, LoweringTensor]) -> None:
    """An op's output without a stream split of its own takes its inputs' (in the same
    priority order), whether the tensors have a mesh or not."""
    for op in fusion.ops:
        for reference in _reference_inputs(op, tensors, placed=False):
            pairs = _pairs(op, reference.name)
            tensors[op.output] = _inherit_stream(op, tensors[op.output], reference, pairs)


def _from_consumers(fusion: LoweringFusion, tensors: dict[str, LoweringTensor]) -> None:
    for op in reversed(fusion.ops):
        out = tensors[op.output]
        for name, pairs in op.axis_maps:
            producer = tensors[name]
            if producer.mesh is None and out.mesh is not None:
                flipped = tuple((i, o) for o, i in pairs)
                tensors[name] = _inherit(producer, out, flipped)


def _splits_from_consumers(fusion: LoweringFusion, tensors: dict[str, LoweringTensor]) -> None:
    """Back-propagation of device splits, as nvFuser's ``PropagateShardingsPass``: in
    reverse order, a tensor neither scheduled by the user nor a fusion input takes its
    consumer's split of each mapped data axis it does not split yet, over mesh axes its
    data axes do not use yet. So a linear whose sum a sequence-split ``add`` reads next
    computes its rows sequence-split, its partial sums reduced by one ReduceScatter
    instead of an Allreduce (nvFuser's sequence-parallel transformer)."""
    inputs = set(fusion.inputs)
    for op in reversed(fusion.ops):
        out = tensors[op.output]
        if out.mesh is None:
            continue
        for name, pairs in op.axis_maps:
            producer = tensors[name]
            if producer.mesh_from_user or name in inputs or producer.mesh != out.mesh:
                continue
            used = {m for axis in producer.axes if not axis.reduction for m in axis.mesh_axes()}
            axes = list(producer.axes)
            for o, i in pairs:
                source, target = out.axes[o], axes[i]
                if source.reduction or target.reduction or target.mesh_axes():
                    continue
                if not source.mesh_axes() or set(source.mesh_axes()) & used:
                    continue
                copied = copy_parts(target, source, out.mesh)
                axes[i] = copied
                used |= set(copied.mesh_axes())
            tensors[name] = dataclasses.replace(producer, axes=tuple(axes))


def _pairs(op: LoweringOp, name: str) -> tuple[tuple[int, int], ...]:
    return dict(op.axis_maps)[name]


def _reference_inputs(
    op: LoweringOp, tensors: dict[str, LoweringTensor], placed: bool = True
) -> list[LoweringTensor]:
    """The inputs with a mesh (all, unless ``placed``), in the order they lend their
    sharding to the output."""
    instruction = op.instruction
    decl = op_decl(instruction)
    # The operands its declaration names lend theirs first (an instruction of no op: none).
    priority = decl.sharding.mesh_priority if decl is not None else ()
    if priority:
        order = [getattr(instruction, field) for field in priority]
        names = [v.name for v in order if v is not None]
    else:
        # More sharded inputs first; ties keep operand order (sorted is stable).
        names = sorted(op.inputs, key=lambda n: -_sharded_axes(tensors[n]))
    return [tensors[n] for n in dict.fromkeys(names) if tensors[n].mesh is not None or not placed]


def _inherit_all(
    out: LoweringTensor, references: list[LoweringTensor], op: LoweringOp
) -> LoweringTensor:
    """``out`` on the first reference's mesh, sharded by each reference in turn."""
    result = _inherit(out, references[0], _pairs(op, references[0].name))
    for reference in references[1:]:
        if reference.mesh != result.mesh:
            continue
        used = {a for axis in result.axes for a in axis.mesh_axes()}
        pairs = tuple(
            (o, i)
            for o, i in _pairs(op, reference.name)
            if not result.axes[o].mesh_axes() and not set(reference.axes[i].mesh_axes()) & used
        )
        axes = list(result.axes)
        for o, i in pairs:
            if not axes[o].reduction:
                axes[o] = copy_parts(result.axes[o], reference.axes[i], reference.mesh)
        result = dataclasses.replace(result, axes=tuple(axes))
    return result


def _sharded_axes(tensor: LoweringTensor) -> int:
    return sum(1 for axis in tensor.axes if axis.mesh_axes())


def _inherit(
    target: LoweringTensor, source: LoweringTensor, pairs: tuple[tuple[int, int], ...]
) -> LoweringTensor:
    """``target`` placed on ``source``'s mesh, each axis paired (target, source) copying parts.

    Reduction axes stay unsharded: a partial result is an intermediate that
    decompose_resharding creates, never a propagated tensor.
    """
    axes = [local_parts(axis) for axis in target.axes]
    for target_index, source_index in pairs:
        if not target.axes[target_index].reduction:
            axes[target_index] = copy_parts(
                target.axes[target_index], source.axes[source_index], source.mesh
            )
    return dataclasses.replace(target, mesh=source.mesh, axes=tuple(axes))


def _inherit_stream(
    op: LoweringOp,
    target: LoweringTensor,
    source: LoweringTensor,
    pairs: tuple[tuple[int, int], ...],
) -> LoweringTensor:
    """``target`` (``op``'s output) with the stream split of ``source``'s mapped axis, if
    it has none yet: consecutive ops on mapped stream axes then share one stream loop.

    The split stops before an op that needs the axis whole: never onto a reduction axis,
    nor onto an axis the op computes whole (attention's sequence, a cumsum's dim:
    ``lowering.op_layouts.whole_axes``), nor onto any axis of attention with dropout. The
    loop then ends before the op, which reads the loop's buffer whole, as a user's ``set``
    would have it (issue 34: a gathered sequence split propagated into ``sdpfa_fwd``).
    Nor onto an axis laid out over other mesh axes than ``source``'s: chunk ``j`` of the
    two would hold other indices (a gathered, unsharded sequence feeding a linear whose
    sums are reduce-scattered over it), so that loop ends there too."""
    if any(axis.stream is not None for axis in target.axes) or takes_no_stream(op):
        return target
    if all(source.axes[i].stream is None for _, i in pairs):
        return target  # the common case: nothing to inherit, no declaration to infer
    whole = whole_axes(op)
    axes = list(target.axes)
    for o, i in pairs:
        source_axis = source.axes[i]
        if source_axis.stream is None or axes[o].reduction or o in whole:
            continue
        if _same_chunks(source, i, target, o):
            axes[o] = dataclasses.replace(
                axes[o], stream=source_axis.stream, swizzle=source_axis.swizzle
            )
            return dataclasses.replace(target, axes=tuple(axes))
    return target


def _same_chunks(source: LoweringTensor, i: int, target: LoweringTensor, o: int) -> bool:
    """Whether chunk ``j`` of ``source``'s axis ``i`` and of ``target``'s axis ``o`` hold
    the same indices: both laid out over the same mesh axes, of the same sizes."""
    mine, theirs = source.axes[i].layout(), target.axes[o].layout()
    if mine != theirs:
        return False
    if not any(mine) or source.mesh is None or target.mesh is None:
        return True
    return all(source.mesh.axis_size(a) == target.mesh.axis_size(a) for a in mine if a is not None)


# ---------------------------------------------------------------------------
# Splits of extents that a constant fixes


def check_tied_extents(fusion: LoweringFusion) -> None:
    """Raises LoweringError if a sharded axis's parts do not make up its extent where a
    constant fixes it (see the module docstring), naming the axis, its split, the mesh
    and the constant; a user-scheduled tensor's split is named before one propagated
    from it."""
    find = _tie_axes(fusion)
    known: dict[object, tuple[int, LoweringTensor, int]] = {}
    for tensor in fusion.tensors:
        for index, axis in enumerate(tensor.axes):
            if isinstance(axis.extent, Const):
                root = find((tensor.name, index))
                known.setdefault(root, (int(axis.extent.value), tensor, index))
    env = {name: known[find(name)][0] for name in _symbols(fusion) if find(name) in known}
    for tensor in sorted(fusion.tensors, key=lambda t: not t.mesh_from_user):  # stable
        for index in range(len(tensor.axes)):
            root = find((tensor.name, index))
            if tensor.mesh is not None and root in known:
                _check_axis(tensor, index, known[root], env)


def _tie_axes(fusion: LoweringFusion) -> Callable[[object], object]:
    """The find function of a union-find over axes (tensor name, index) and symbol names:
    mapped axes, and axes whose extent is one symbol, have equal extents at run time."""
    parent: dict[object, object] = {}

    def find(key: object) -> object:
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for op in fusion.ops:
        for name, pairs in op.axis_maps:
            for o, i in pairs:
                parent[find((op.output, o))] = find((name, i))
    for tensor in fusion.tensors:
        for index, axis in enumerate(tensor.axes):
            if isinstance(axis.extent, Symbol):
                parent[find((tensor.name, index))] = find(axis.extent.name)
    return find


def _symbols(fusion: LoweringFusion) -> set[str]:
    return {name for t in fusion.tensors for axis in t.axes for name in symbols_of(axis.extent)}


def _check_axis(
    tensor: LoweringTensor, index: int, known: tuple[int, LoweringTensor, int], env: dict
) -> None:
    axis = tensor.axes[index]
    if not axis.mesh_axes():
        return  # replicated: a local split does not change the layout
    if any(symbols_of(p.extent) - env.keys() for p in axis.parts):
        return  # a part depends on an extent that no constant fixes: checked when bound
    value, source, source_index = known
    extents = part_extents(axis.parts, tensor.mesh, env)
    if math.prod(extents) == value:
        return
    shown = ", ".join(p.axis.value if p.axis else print_scalar(p.extent) for p in axis.parts)
    sizes = ", ".join(f"{a.value}: {tensor.mesh.axis_size(a)}" for a in axis.mesh_axes())
    symbolic = "" if isinstance(axis.extent, Const) else f" (extent {print_scalar(axis.extent)})"
    fixed = f"{value}"
    if symbolic:  # a constant extent of its own needs no source
        fixed += f" (fixed by {_axis_name(source, source_index)}, a constant extent mapped to it)"
    raise LoweringError(
        f"{_axis_name(tensor, index)}{symbolic} is split [{shown}]"
        f" on mesh {tensor.mesh} ({sizes} devices), which does not divide its extent {fixed}:"
        f" the parts would be {extents} (uneven shards are not supported); split it by a"
        f" factor that divides {value}, or leave it unsplit"
    )


def _axis_name(tensor: LoweringTensor, index: int) -> str:
    """``T2 dim 0`` (the index among data dims), or ``T4 reduction axis 2`` (logical)."""
    if tensor.axes[index].reduction:
        return f"{tensor.name} reduction axis {index}"
    dim = sum(1 for axis in tensor.axes[:index] if not axis.reduction)
    return f"{tensor.name} dim {dim}"
