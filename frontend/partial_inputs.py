"""Partial DTensor inputs of ``execute_with_dtensors``, reduced by hostir before the fusion.

A fusion input holds whole values, so a ``Partial`` DTensor is first reduced by a small
resharding program of our own (not by DTensor's ``redistribute``): a fusion whose input is
the partial tensor with an extra leading dim of size ``P`` (the product of the partial
mesh axes' sizes) sharded over those axes, each rank holding ``[1, *local]`` (its partial
value, DTensor's local tensor), and whose output is the reduction over that dim, scheduled
as the layout the user's fusion needs. Lowering makes it a local reduction of one element
(a copy) and the collectives the planner picks for the change (an Allreduce to
``Replicate``, a ReduceScatter to ``Shard``, ...). The same construction as the tests'
``tests/redistribution_programs.fusion_for``.

The reduction fusions are kept per (source, target, global shape, dtype), so a second call
with the same kind of input neither builds nor lowers again (``fd.execute`` keeps the
lowered program per signature).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from frontend.errors import InputError
from frontend.fusion_definition import FusionDefinition
from frontend.mesh import DeviceMesh
from frontend.tensor_view import TensorView
from frontend.types import DataType, ParallelType
from hostir import MeshAxis, ReduceOp

_PARALLEL_TYPES = {
    MeshAxis.X: ParallelType.mesh_x,
    MeshAxis.Y: ParallelType.mesh_y,
    MeshAxis.Z: ParallelType.mesh_z,
}
# The reduction op of the fusion that finishes partial values combined by each op: its
# declaration's ``combine`` (hostir.ir.reductions) is that op, so the partial sharding it
# leaves, and the collectives lowering plans from it, combine the same way.
_REDUCTIONS = {ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min"}


@functools.lru_cache(maxsize=64)
def reduction_fusion(
    src: Any, dst: Any, shape: tuple[int, ...], dtype: torch.dtype
) -> FusionDefinition:
    """The fusion that reduces a tensor of global ``shape`` and ``dtype`` held partial as
    ``Distribution`` ``src`` into ``dst`` (no partial axes): its input is ``[P, *shape]``
    (dim 0 sharded over ``src``'s partial axes, outer first, the rest as ``src``), its
    output the reduction over dim 0 (cast back to ``dtype`` where the reduction widens it),
    scheduled as ``dst``. Kept per arguments (64 most recent)."""
    (op,) = {p.op for p in src.partial}  # one op: checked by reduce_partial_input
    parts = math.prod(src.mesh.axis_size(p.axis) for p in src.partial)
    with FusionDefinition() as fd:
        x = fd.define_tensor((parts, *shape), dtype=DataType.of(dtype))
        y = getattr(fd.ops, _REDUCTIONS[op])(x, [0])
        if y.dtype != x.dtype:  # an integer sum is int64
            y = fd.ops.cast(y, x.dtype)
        fd.add_output(y)
    _schedule(x, src.mesh, src.dims, offset=1)
    _schedule_dim(x, src.mesh, 0, tuple(p.axis for p in src.partial))
    # The reduction's output keeps the reduced dim as its first (reduction) axis; a cast's
    # output has none.
    _schedule(y, dst.mesh, dst.dims, offset=len(y.get_logical_domain()) - len(shape))
    return fd


def check_reducible(index: int, tv: TensorView, src: Any) -> None:
    """InputError naming input ``index`` of the fusion (its ``tv``), a DTensor held
    partial as ``Distribution`` ``src``, if its partial values combine by more than one op (their
    order matters, and one reduction cannot say it) or by one we have no reduction for."""
    ops = {p.op for p in src.partial}
    if len(ops) > 1 or not ops <= set(_REDUCTIONS):
        raise InputError(
            f"execute_with_dtensors: input {index} ({tv.name}) is partial with"
            f" {src.notation()} ({src}): a partial input is taken with one reduce op on all"
            f" its partial mesh dims, one of {sorted(_REDUCTIONS.values())}; redistribute it"
            " first (dt.redistribute(mesh, placements without Partial))"
        )


def reduce_partial_input(index: int, tv: TensorView, given: Any, src: Any, dst: Any) -> Any:
    """This rank's shard, laid out as ``dst``, of the reduced value of DTensor ``given``
    (input ``index`` of the fusion, its ``tv``), held partial as ``src``; InputError as
    ``check_reducible`` says."""
    check_reducible(index, tv, src)
    fd = reduction_fusion(src, dst, tuple(given.shape), given.dtype)
    (out,) = fd.execute([given.to_local().unsqueeze(0)])
    return out


def _schedule(tv: TensorView, mesh: Any, dims: Any, offset: int) -> None:
    """Places ``tv`` on host IR ``mesh`` and shards data dim ``d`` (loop axis ``offset +
    d``) over ``dims[d]``; the last dims first, so earlier loop indices stay put."""
    tv.set_device_mesh(DeviceMesh.from_hostir(mesh))
    for dim in reversed(range(len(dims))):
        _schedule_dim(tv, mesh, offset + dim, tuple(dims[dim]))


def _schedule_dim(tv: TensorView, mesh: Any, index: int, axes: tuple[MeshAxis, ...]) -> None:
    """Splits loop axis ``index`` of ``tv`` over mesh ``axes``, outer first, parallelized."""
    for position, axis in enumerate(axes):
        tv.outer_split(index + position, mesh.axis_size(axis))
        tv.axis(index + position).parallelize(_PARALLEL_TYPES[axis])
