"""Sharding queries on scheduled TensorViews, schedule validation, ``shard_tensor``.

A TensorView's distribution is read off its IterDomain graph: for each logical
axis, the leaves of its split tree (outer to inner) are its *parts*; a leaf
parallelized over a mesh axis is a mesh part, any other leaf a local extent.
Reduction axes with mesh parts make the tensor *partial* over those axes (combined by its
reduction's op), unless a data axis is sharded over the same mesh axis (reduce-scatter).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from frontend.arguments import check_rank, shown
from frontend.errors import ScheduleError
from frontend.iter_domain import IterDomain, Swizzle1D, transforms_of
from frontend.tensor_view import TensorView
from hostir import (
    Const,
    MeshError,
    PartialAxis,
    ReduceOp,
    Sharding,
    ShardPart,
    Symbol,
    TensorValue,
    slice_global_tensor,
)
from hostir.comm.world import current_rank
from hostir.ir.reductions import REDUCTION_OPS, ReductionOpKind
from hostir.ir.scalars import evaluate_scalar, print_scalar, symbols_of
from hostir.ir.sharding import canonical_parts

Env = Mapping[str, int | float | bool]


def axis_parts(tv: TensorView, axis: IterDomain) -> tuple[ShardPart, ...]:
    """The parts of logical ``axis`` of ``tv``: its split-tree leaves, outer to inner.

    A mesh part's extent is its mesh axis's size, as host IR text reads it back: a
    symbolic leaf extent (``i0 // 4`` after ``inner_split(a, 4)``) must equal that size,
    which ``validate_schedule`` checks at execute.
    """
    parts = []
    for leaf in axis.leaves():
        if leaf.is_device_dim():
            if isinstance(leaf.definition, Swizzle1D):
                raise ScheduleError(
                    f"{tv.name} axis {leaf} is the output of swizzle1d and cannot be"
                    f" parallelized over {leaf.parallel_type.name}; swizzle1d reorders a stream"
                    " axis"
                )
            extent = leaf.extent
            if tv.device_mesh is not None:
                extent = Const(value=tv.device_mesh.axis_size(leaf.parallel_type))
            parts.append(ShardPart(axis=leaf.parallel_type.mesh_axis(), extent=extent))
        else:
            parts.append(ShardPart(axis=None, extent=leaf.extent))
    return canonical_parts(parts)


def tensor_sharding(tv: TensorView) -> Sharding | None:
    """How ``tv`` is spread over its mesh, or None if it has no mesh."""
    if not isinstance(tv, TensorView):
        raise ScheduleError(f"tensor_sharding: expected a TensorView, got {shown(tv)}")
    tv.device_axes()  # raises if a mesh axis is used twice
    if tv.device_mesh is None:
        tv.check_mesh_axes()  # raises if an axis is device-parallel without a mesh
        return None
    tv.check_mesh_axes()
    dims = tuple(axis_parts(tv, axis) for axis in tv.shape_domain())
    return Sharding(mesh=tv.device_mesh.to_hostir(), dims=dims, partial=partial_axes(tv))


def partial_op(tv: TensorView) -> ReduceOp:
    """How partial results of ``tv`` combine: as its op's declaration says
    (``OpSharding.combine``: ``max`` combines with MAX, ``hostir.ir.reductions``), a sum
    for any other definition (``linear``, ``matmul``)."""
    decl = getattr(tv.definition, "decl", None)
    if decl is not None:
        return decl.sharding.combine or ReduceOp.SUM
    op = getattr(tv.definition, "op", None)
    if isinstance(op, ReductionOpKind):
        return REDUCTION_OPS[op.value].combine
    return ReduceOp.SUM


def partial_axes(tv: TensorView) -> tuple[PartialAxis, ...]:
    """The mesh axes over which ``tv`` holds partial results: those of its reduction axes,
    less any that also shards a data dim (nvFuser's reduce-scatter form: the reduction over
    that mesh axis is finished, its result scattered along the data dim)."""
    scattered = {
        part.axis for axis in tv.shape_domain() for part in axis_parts(tv, axis) if part.axis
    }
    op = partial_op(tv)
    return tuple(
        PartialAxis(axis=part.axis, op=op)
        for axis in tv.get_logical_domain()
        if axis.is_reduction()
        for part in axis_parts(tv, axis)
        if part.axis is not None and part.axis not in scattered
    )


def _try_evaluate(expr, env: Env) -> int | None:
    if symbols_of(expr) - set(env):
        return None
    return int(evaluate_scalar(expr, env))


def validate_schedule(tv: TensorView, env: Env) -> None:
    """Checks ``tv``'s splits divide and its device axes match the mesh, where extents
    are known in ``env``; raises ScheduleError naming tensor, axis, extent and factor."""
    tensor_sharding(tv)
    for transform in transforms_of(tv.get_logical_domain()):
        if isinstance(transform, Swizzle1D):
            _validate_swizzle(tv, transform, env)
            continue
        extent = _try_evaluate(transform.in_.extent, env)
        if extent is not None and extent % transform.factor != 0:
            kind = "inner_split" if transform.inner_split else "outer_split"
            raise ScheduleError(
                f"{tv.name}: {kind} of axis {transform.in_} with extent {extent}"
                f" ({print_scalar(transform.in_.extent)}) by factor {transform.factor}"
                " does not divide evenly (uneven shards are not supported)"
            )
    for axis in tv.device_loop_axes():
        parallel_type = axis.parallel_type
        extent = _try_evaluate(axis.extent, env)
        size = tv.device_mesh.axis_size(parallel_type)
        if extent is not None and extent != size:
            raise ScheduleError(
                f"{tv.name} axis {axis} has extent {extent} but is parallelized over"
                f" {parallel_type.name} of {tv.device_mesh!r}, which has {size} devices"
            )


def _validate_swizzle(tv: TensorView, swizzle: Swizzle1D, env: Env) -> None:
    """A swizzle rotates by a mesh coordinate: the axis must exist and match its size."""
    if tv.device_mesh is None:
        return
    size = tv.device_mesh.axis_size(swizzle.parallel_type)  # MeshError if the axis is missing
    extent = _try_evaluate(swizzle.in_.extent, env)
    if extent is not None and extent != size:
        raise ScheduleError(
            f"{tv.name}: swizzle1d of axis {swizzle.in_} with extent {extent} over"
            f" {swizzle.parallel_type.name} of {tv.device_mesh!r}, which has {size} devices;"
            " the extents must be equal"
        )


def bind_global_extents(tv: TensorView, shape: tuple[int, ...], env: dict) -> None:
    """Binds the symbolic extents of ``tv``'s data dims from the unsharded ``shape``."""
    for axis, size in zip(tv.shape_domain(), shape, strict=True):
        if isinstance(axis.extent, Symbol) and axis.extent.name not in env:
            env[axis.extent.name] = size


def shard_tensor(
    t: torch.Tensor, tv: TensorView | TensorValue, rank: int | None = None
) -> torch.Tensor | None:
    """The local piece of the unsharded tensor ``t`` that ``rank`` holds under ``tv``'s
    schedule; None if ``rank`` is outside ``tv``'s mesh. ``rank`` defaults to this
    process's rank (0 without torch.distributed).

    ``tv`` may also be a host IR ``TensorValue`` (e.g. ``fd.host_ir().outputs[0]``),
    whose sharding includes what lowering propagated to tensors the user did not
    schedule.
    """
    if rank is None:
        rank = current_rank()
    check_rank("shard_tensor: rank", rank)
    if not isinstance(t, torch.Tensor):
        raise ScheduleError(f"shard_tensor: expected a torch.Tensor to shard, got {shown(t)}")
    if not isinstance(tv, TensorView | TensorValue):
        raise ScheduleError(
            "shard_tensor: expected the TensorView (or host IR TensorValue) whose schedule"
            f" shards the tensor, got {shown(tv)}"
        )
    if isinstance(tv, TensorValue):
        return _shard_by_value(t, tv, rank)
    ndim = len(tv.shape_domain())
    if t.ndim != ndim:
        raise ScheduleError(f"shard_tensor: {tv.name} has {ndim} dims, the tensor has {t.ndim}")
    env: dict = {}
    bind_global_extents(tv, tuple(t.shape), env)
    for axis, size in zip(tv.shape_domain(), t.shape, strict=True):
        extent = _try_evaluate(axis.extent, env)
        if extent is not None and extent != size:
            raise ScheduleError(
                f"shard_tensor: {tv.name} dim {tv.shape_domain().index(axis)} has extent"
                f" {extent}, the tensor has {size}"
            )
    validate_schedule(tv, env)
    sharding = tensor_sharding(tv)
    if sharding is None:
        return t
    return _sliced(t, sharding, rank, env, tv.name)


def _shard_by_value(t: torch.Tensor, value: TensorValue, rank: int) -> torch.Tensor | None:
    if t.ndim != value.ndim:
        raise ScheduleError(
            f"shard_tensor: {value.name} has {value.ndim} dims, the tensor has {t.ndim}"
        )
    env: dict = {}
    for extent, size in zip(value.shape, t.shape, strict=True):
        if isinstance(extent, Symbol):
            env.setdefault(extent.name, size)
    if value.sharding is None:
        return t
    return _sliced(t, value.sharding, rank, env, value.name)


def _sliced(t: torch.Tensor, sharding: Sharding, rank: int, env: Env, name: str) -> torch.Tensor:
    """``slice_global_tensor``, with a refusal naming the tensor ``name``."""
    try:
        return slice_global_tensor(t, sharding, rank, env)
    except MeshError as error:
        raise MeshError(f"shard_tensor: {name} {error}") from None
