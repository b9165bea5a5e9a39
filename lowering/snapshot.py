"""``snapshot_fusion``: the frozen form of a scheduled fusion that passes transform.

The frontend's fusion is a mutable graph; lowering passes are pure functions,
so the first step copies what lowering needs into immutable data:

- each tensor as a :class:`LoweringTensor`: dtype, mesh, and per logical axis
  (reductions included) its extent and sharding parts;
- each expression as a :class:`LoweringOp`: the host IR compute instruction
  it becomes (with unsharded placeholder values) and its axis maps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from frontend import exprs as fe
from frontend.fusion import Fusion
from frontend.iter_domain import IterDomain, Swizzle1D
from frontend.recording import placeholder
from frontend.sharding import axis_parts, partial_op, tensor_sharding
from frontend.tensor_view import TensorView
from hostir import (
    Const,
    DType,
    Mesh,
    MeshAxis,
    PartialAxis,
    ReduceOp,
    Scalar,
    ScalarInput,
    Sharding,
    ShardPart,
    TensorValue,
)
from hostir.ir.instructions import Instruction
from hostir.ir.requirements import Requirement
from hostir.ir.sharding import normalized
from lowering.errors import LoweringError


@dataclass(frozen=True, slots=True, kw_only=True)
class AxisLayout:
    """One logical axis: extent, whether it is reduced, its sharding parts, and whether
    its local data is split into ``stream`` chunks run by a stream loop (the chunk of
    iteration ``i`` rotated by this rank's coordinate on ``swizzle`` if set)."""

    extent: Scalar
    reduction: bool
    parts: tuple[ShardPart, ...]
    stream: int | None = None
    swizzle: MeshAxis | None = None
    stream_blocks: int = 1
    """How many equal blocks of the axis one stream chunk spans: 1, chunk ``j`` is the
    ``j``-th slice of the local data; ``b > 1``, chunk ``j`` is the ``j``-th slice of each
    of ``b`` blocks, joined in block order. A partial sum computed whole over an axis
    that its reduced result shards as ``[x, stream]`` is chunked so (``d`` blocks: chunk
    ``j`` is what the ``d`` ranks' chunks ``j`` are reduce-scattered from)."""

    def mesh_axes(self) -> tuple:
        """The mesh axes sharding this axis, outer first."""
        return tuple(p.axis for p in self.parts if p.axis is not None)

    def layout(self) -> tuple:
        """The mesh axis of each part in order, None for a local part: what two axes must
        share to meet without communication (extents aside)."""
        return tuple(p.axis for p in self.parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoweringTensor:
    """A tensor of the fusion as lowering sees it."""

    name: str
    dtype: DType
    axes: tuple[AxisLayout, ...]
    mesh: Mesh | None
    mesh_from_user: bool
    partial_op: ReduceOp = ReduceOp.SUM
    """How partial results over a sharded reduction axis combine: the reduction's op
    (``max``: MAX), a sum for ``linear`` and ``matmul``."""
    made_for: str = ""
    """For a tensor the lowering made (not in the user's fusion): which user's tensor it
    was made for and why, as error messages show it (:meth:`shown`); empty otherwise."""

    def value(self) -> TensorValue:
        """The host IR value: data dims and the sharding (partial over reduced mesh axes)."""
        data = [a for a in self.axes if not a.reduction]
        sharding = None
        if self.mesh is not None:
            partial = tuple(
                PartialAxis(axis=axis, op=self.partial_op)
                for a in self.axes
                if a.reduction
                for axis in a.mesh_axes()
            )
            sharding = normalized(
                Sharding(mesh=self.mesh, dims=tuple(a.parts for a in data), partial=partial),
                tuple(a.extent for a in data),
            )
        return TensorValue(
            name=self.name, dtype=self.dtype, shape=tuple(a.extent for a in data), sharding=sharding
        )


AxisPairs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoweringOp:
    """An expression: its compute instruction and, per tensor input, axis index pairs
    (output logical axis, input logical axis).

    An op of several results (``topk``, ``sdpfa_fwd``, ``sdpfa_bwd``) is one LoweringOp per
    result, consecutive, each holding the whole instruction: the passes see one output per
    op, and the op's ``group`` (shared by its results) lets them keep it together:
    ``drop_dead_ops`` keeps every result of a group one of whose results is live,
    ``decompose_resharding`` decides the group's compute layout once, and emission makes
    one instruction of it (``lowering.emitter``, ``lowering.stream_loops``)."""

    instruction: Instruction
    output: str
    inputs: tuple[str, ...]
    axis_maps: tuple[tuple[str, AxisPairs], ...]
    group: int | None = None
    """The number of the op of several results this is a result of (None: an op of one)."""
    result: int = 0
    """Which result of the instruction ``output`` is (its index in ``OUTS``)."""


def op_units(ops: tuple[LoweringOp, ...] | list[LoweringOp]) -> list[list[LoweringOp]]:
    """``ops`` in the units the passes keep together: an op alone, or the consecutive
    results of one op of several (one ``group``)."""
    units: list[list[LoweringOp]] = []
    for op in ops:
        if op.group is not None and units and units[-1][0].group == op.group:
            units[-1].append(op)
        else:
            units.append([op])
    return units


@dataclass(frozen=True, slots=True, kw_only=True)
class LoweringFusion:
    """The whole fusion, frozen: tensors by name, inputs, outputs, ops in order."""

    tensors: tuple[LoweringTensor, ...]
    inputs: tuple[str, ...]  # tensor and scalar inputs, in definition order
    scalar_inputs: tuple[ScalarInput, ...]
    outputs: tuple[str, ...]
    ops: tuple[LoweringOp, ...]
    requires: tuple[Requirement, ...] = ()  # what the bound values must satisfy

    def tensor(self, name: str) -> LoweringTensor:
        """The tensor called ``name``."""
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        raise KeyError(name)


def _stream_split(tv: TensorView, axis: IterDomain) -> tuple[int | None, MeshAxis | None]:
    """(chunk count, swizzle axis) of a logical axis whose loop axes include a stream one.

    The stream axis must come right after the axis's mesh axes (it splits this
    rank's local data into equal chunks), have a constant extent, and be the
    only stream axis of the tensor.
    """
    leaves = axis.leaves()
    streams = [leaf for leaf in leaves if leaf.is_stream()]
    for leaf in leaves:
        if isinstance(leaf.definition, Swizzle1D) and not leaf.is_stream():
            raise LoweringError(
                f"{tv.name} axis {leaf} is swizzled but not stream-parallel; swizzle1d"
                " reorders the iterations of a stream loop"
            )
    if not streams:
        return None, None
    stream = streams[0]
    if axis.is_reduction():
        raise LoweringError(f"{tv.name}: the reduction axis {axis} cannot be stream-parallel")
    before = leaves[: leaves.index(stream)]
    if len(streams) > 1 or not all(leaf.is_device_dim() for leaf in before):
        raise LoweringError(
            f"{tv.name}: stream axis {stream} must be the outermost non-device loop axis"
            f" derived from {axis}, and the only one; got {leaves}"
        )
    if not isinstance(stream.extent, Const):
        raise LoweringError(
            f"{tv.name}: stream axis {stream} needs a constant extent (the number of chunks)"
        )
    swizzle = (
        stream.definition.parallel_type.mesh_axis()
        if isinstance(stream.definition, Swizzle1D)
        else None
    )
    return int(stream.extent.value), swizzle


def snapshot_tensor(tv: TensorView) -> LoweringTensor:
    """The frozen form of ``tv`` (its schedule is validated on the way)."""
    tensor_sharding(tv)
    axes = []
    for axis in tv.get_logical_domain():
        stream, swizzle = _stream_split(tv, axis)
        axes.append(
            AxisLayout(
                extent=axis.extent,
                reduction=axis.is_reduction(),
                parts=axis_parts(tv, axis) if tv.device_mesh is not None else (),
                stream=stream,
                swizzle=swizzle,
            )
        )
    if sum(1 for axis in axes if axis.stream is not None) > 1:
        raise LoweringError(f"{tv.name} has more than one stream-parallel axis")
    axes = _finish_scattered_reductions(tv, tuple(axes))
    mesh = tv.device_mesh.to_hostir() if tv.device_mesh is not None else None
    return LoweringTensor(
        name=tv.name,
        dtype=tv.dtype.to_hostir(),
        axes=axes,
        mesh=mesh,
        mesh_from_user=tv.mesh_set_by_user,
        partial_op=partial_op(tv),
    )


def _finish_scattered_reductions(
    tv: TensorView, axes: tuple[AxisLayout, ...]
) -> tuple[AxisLayout, ...]:
    """``axes`` with each reduction axis sharded over a mesh axis that also shards a data
    axis made local: nvFuser's reduce-scatter form, where that reduction is finished (its
    result scattered along the data axis), so the tensor holds no partial results over it.
    Lowering computes the reduction where its inputs are (partial over the mesh axis) and
    reduces into this layout with one ReduceScatter."""
    scattered = {m for axis in axes if not axis.reduction for m in axis.mesh_axes()}
    finished = []
    for index, axis in enumerate(axes):
        shared = set(axis.mesh_axes()) & scattered if axis.reduction else set()
        if shared and set(axis.mesh_axes()) != shared:
            raise LoweringError(
                f"{tv.name}: reduction axis {index} is sharded over"
                f" {[m.value for m in axis.mesh_axes()]}, of which only"
                f" {sorted(m.value for m in shared)} also shard a data axis (a reduce-scatter);"
                " shard a reduction axis over scattered mesh axes only, or over none of them"
            )
        finished.append(
            dataclasses.replace(axis, parts=(ShardPart(axis=None, extent=axis.extent),))
            if shared
            else axis
        )
    return tuple(finished)


def snapshot_op(expr: fe.FusionOp, group: int | None = None) -> tuple[LoweringOp, ...]:
    """The frozen form of ``expr``: its op's recorded instruction (its output re-bound
    where ``rfactor`` gave the expression another); one LoweringOp per result, numbered
    ``group`` where there are several."""
    outputs = expr.outputs()
    instruction = expr.instruction
    field = expr.decl.results[0].field
    out = placeholder(expr.output)
    if len(outputs) == 1 and getattr(instruction, field) != out:
        instruction = dataclasses.replace(instruction, **{field: out})
    inputs = tuple(tv.name for tv in expr.tensor_inputs())
    ops = []
    for index, (output, axis_map) in enumerate(zip(outputs, expr.output_axis_maps(), strict=True)):
        out_axes = output.get_logical_domain()
        axis_maps = []
        for producer, pairs in axis_map.items():
            in_axes = producer.get_logical_domain()
            indexed = tuple((out_axes.index(o), in_axes.index(i)) for o, i in pairs)
            axis_maps.append((producer.name, indexed))
        ops.append(
            LoweringOp(
                instruction=instruction,
                output=output.name,
                inputs=inputs,
                axis_maps=tuple(axis_maps),
                group=group if len(outputs) > 1 else None,
                result=index,
            )
        )
    return tuple(ops)


def snapshot_fusion(fusion: Fusion) -> LoweringFusion:
    """The frozen form of ``fusion`` (its dead ops are dropped later, after sharding
    propagation: ``lowering.dead_ops``)."""
    inputs = fusion.inputs()
    return LoweringFusion(
        tensors=tuple(snapshot_tensor(tv) for tv in fusion.tensors()),
        inputs=tuple(v.name for v in inputs),
        scalar_inputs=tuple(
            ScalarInput(name=v.name, dtype=v.dtype.to_hostir())
            for v in inputs
            if isinstance(v, fe.ScalarVal)
        ),
        outputs=tuple(tv.name for tv in fusion.outputs()),
        ops=tuple(op for k, expr in enumerate(fusion.exprs()) for op in snapshot_op(expr, k)),
        requires=tuple(fusion.requires()),
    )
