"""Fusions and host IR programs that reshard one tensor between two ``Distribution``s.

- ``fusion_for(src, dst, shape, dtype)``: the fusion that reshards a tensor of
  global ``shape`` from ``src`` to ``dst`` (a ``set``, or a ``sum`` over an extra
  leading dim for a partial source).
- ``program_for``: the host IR program of that fusion that does only the
  resharding (see their docstrings for partial sources).
- ``reference_local``: one rank's piece of the unsharded tensor, the
  single-device reference of a resharding's output.

Only tests and benchmarks use them, so they live outside the library packages.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, TensorView
from hostir import (
    HostIrContainer,
    Mesh,
    MeshAxis,
    Reduction,
    TensorValue,
    slice_global_tensor,
)
from hostir.ir.instructions import Deallocate
from lowering.errors import ReshardingError

if TYPE_CHECKING:
    from lowering.redistribution.distribution import Distribution


def fusion_for(
    src: Distribution,
    dst: Distribution,
    shape: Sequence[int],
    dtype: Any = None,
) -> FusionDefinition:
    """The fusion that reshards a tensor of global ``shape`` from ``src`` to ``dst``.

    Without partial axes in ``src`` it is one ``set``: the input scheduled as
    ``src``, the output as ``dst`` (per dim, one ``outer_split`` and
    ``parallelize`` per mesh axis, outer first). A partial source cannot be a
    fusion input, so the fusion is a ``sum`` over an extra leading dim: the
    input is ``[P, *shape]``, ``P`` the product of the partial axes' sizes,
    with dim 0 sharded over the partial axes and the rest as ``src``; each rank
    holds ``[1, *local]``, its partial value (what DTensor's ``Partial`` local
    tensor is), and lowering makes the sum a local partial sum followed by the
    resharding. The output is scheduled as ``dst``; a partial ``dst`` (only
    axes already partial in ``src``) leaves those axes unreduced.
    ``program_for`` lowers this and drops the local sum.
    """
    if src.ndim != dst.ndim or len(shape) != src.ndim:
        raise ReshardingError(
            f"src {src} and dst {dst} must both describe the {len(shape)}-d tensor of shape"
            f" {tuple(shape)}"
        )
    src.local_shape(shape)
    dst.local_shape(shape)
    extra = {p.axis for p in dst.partial} - {p.axis for p in src.partial}
    if extra or any(p not in src.partial for p in dst.partial):
        raise ReshardingError(
            f"cannot reshard {src} to {dst}: the target holds partial values the source does"
            " not (a resharding can reduce partial values but not create them)"
        )
    dtype = DataType.of(dtype if dtype is not None else torch.float32)
    with FusionDefinition() as fd:
        if src.partial:
            parts = math.prod(src.mesh.axis_size(p.axis) for p in src.partial)
            x = fd.define_tensor((parts, *shape), dtype=dtype)
            y = fd.ops.sum(x, [0])
        else:
            x = fd.define_tensor(tuple(shape), dtype=dtype)
            y = fd.ops.set(x)
        fd.add_output(y)
    offset = 1 if src.partial else 0
    _schedule(x, src.mesh, src.dims, offset)
    if src.partial:
        _schedule_dim(x, src.mesh, 0, tuple(p.axis for p in src.partial))
    _schedule(y, dst.mesh, dst.dims, offset)
    if dst.partial:
        _schedule_dim(y, dst.mesh, 0, tuple(p.axis for p in dst.partial))
    return fd


def program_for(
    src: Distribution, dst: Distribution, shape: Sequence[int], dtype: Any = None
) -> HostIrContainer:
    """The host IR program of ``fusion_for(src, dst, shape, dtype)`` that only reshards.

    For a partial source, the fusion's leading local ``sum`` (a copy of each rank's
    partial value) is dropped and its partial result becomes the program's input,
    so the program takes each rank's partial value of shape ``local`` directly, as
    DTensor's ``redistribute`` does.
    """
    program = fusion_for(src, dst, shape, dtype).host_ir()
    if not src.partial:
        return program
    first = program.body[0]
    (old_input,) = program.inputs
    if not isinstance(first, Reduction) or first.src.name != old_input.name:
        raise ReshardingError(f"expected the program to start with the local sum:\n{program}")
    body = tuple(
        i
        for i in program.body[1:]
        if not (isinstance(i, Deallocate) and i.tensor.name == old_input.name)
    )
    new_input: TensorValue = first.out
    return dataclasses.replace(program, inputs=(new_input,), body=body)


def _schedule(tv: TensorView, mesh: Mesh, dims: Sequence[Sequence[MeshAxis]], offset: int) -> None:
    """Places ``tv`` on ``mesh`` and shards data dim ``d`` (loop axis ``offset + d``) over
    ``dims[d]``; the last dims first, so earlier loop indices stay put."""
    tv.set_device_mesh(DeviceMesh.from_hostir(mesh))
    for dim in reversed(range(len(dims))):
        _schedule_dim(tv, mesh, offset + dim, tuple(dims[dim]))


def _schedule_dim(tv: TensorView, mesh: Mesh, index: int, axes: tuple[MeshAxis, ...]) -> None:
    """Splits loop axis ``index`` of ``tv`` over ``axes``, outer first."""
    types = {
        MeshAxis.X: ParallelType.mesh_x,
        MeshAxis.Y: ParallelType.mesh_y,
        MeshAxis.Z: ParallelType.mesh_z,
    }
    for position, axis in enumerate(axes):
        tv.outer_split(index + position, mesh.axis_size(axis))
        tv.axis(index + position).parallelize(types[axis])


def reference_local(full: torch.Tensor, distribution: Distribution, rank: int) -> torch.Tensor:
    """``rank``'s piece of the unsharded, reduced tensor ``full`` under ``distribution``
    without its partial axes (the single-device reference of a resharding's output)."""
    plain = dataclasses.replace(distribution, partial=())
    piece = slice_global_tensor(full, plain.to_sharding(tuple(full.shape)), rank)
    if piece is None:
        raise ReshardingError(f"rank {rank} is not in the mesh {distribution.mesh}")
    return piece
