"""DTensor placements and meshes as seen by a ``Distribution`` (SPEC §6).

DTensor mesh dim ``i`` of an n-d mesh is our ``MeshAxis`` whose
``axis.dim(n) == i`` (the last mesh dim is ``x``): ``mesh_axis_of_dim``.
``Shard(d)`` on mesh dims ``i < j`` nests ``[axis_i, axis_j]`` (DTensor's default
left-to-right shard order); other orders come as a ``shard_order`` (tensor dim ->
mesh dims, outer first) or as DTensor's ``_StridedShard`` placements, which is
also how ``placements_of`` writes them.

- ``axes_of_placements``: per tensor dim its mesh axes (outer first) and the
  partial axes of DTensor placements; ``Distribution.from_placements`` wraps it.
- ``placements_of``: DTensor placements of a shard order and partial axes;
  ``Distribution.to_placements`` wraps it.
- ``as_mesh``: our ``Mesh`` of a host IR mesh, a frontend ``DeviceMesh`` or a
  DTensor ``DeviceMesh``.

This module does not import ``lowering.redistribution.distribution``, which builds on it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from hostir import Mesh, MeshAxis, PartialAxis, ReduceOp
from lowering.errors import ReshardingError

_DTENSOR_OPS = {ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min"}
_DTENSOR_OPS_BACK = {
    "sum": ReduceOp.SUM,
    "max": ReduceOp.MAX,
    "min": ReduceOp.MIN,
}


@functools.cache
def _dtensor() -> SimpleNamespace:
    """DTensor's placement classes, imported when placements are first built or read:
    ``torch.distributed.tensor`` imports sympy, about a second of every process's start,
    and most programs never meet a DTensor placement."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return SimpleNamespace(
        Partial=Partial, Replicate=Replicate, Shard=Shard, StridedShard=_StridedShard
    )


def mesh_axis_of_dim(mesh: Mesh, dim: int) -> MeshAxis:
    """Our name of DTensor mesh dim ``dim`` (0 is the outermost; the last one is ``x``)."""
    if not 0 <= dim < mesh.ndim:
        raise ReshardingError(f"mesh dim {dim} does not exist in the {mesh.ndim}-d mesh {mesh}")
    return list(MeshAxis)[mesh.ndim - 1 - dim]


def as_mesh(mesh: Any) -> Mesh:
    """Our ``Mesh`` of a host IR mesh, a frontend ``DeviceMesh`` or a DTensor ``DeviceMesh``."""
    if isinstance(mesh, Mesh):
        return mesh
    if hasattr(mesh, "to_hostir"):
        return mesh.to_hostir()
    grid = getattr(mesh, "mesh", None)
    if grid is not None and hasattr(grid, "tolist"):  # torch.distributed DeviceMesh
        return Mesh(devices=tuple(int(d) for d in grid.flatten().tolist()), shape=tuple(grid.shape))
    raise ReshardingError(f"expected a mesh, got {mesh!r}")


def axes_of_placements(
    mesh: Mesh,
    placements: tuple[Any, ...],
    shard_order: Mapping[int, Sequence[int]] | None,
    ndim: int,
) -> tuple[tuple[tuple[MeshAxis, ...], ...], tuple[PartialAxis, ...]]:
    """Per dim of a ``ndim``-d DTensor with ``placements`` on ``mesh`` its mesh axes, outer
    first, and the partial axes. ``shard_order`` maps tensor dims to their mesh dims, outer
    first, for orders other than DTensor's default; ``_StridedShard`` placements are decoded
    into an order the same way."""
    if len(placements) != mesh.ndim:
        raise ReshardingError(
            f"{len(placements)} placements {placements} for the {mesh.ndim}-d mesh {mesh}:"
            " DTensor takes one placement per mesh dim"
        )
    sharded, split_factors, partial = _read_placements(mesh, placements, ndim)
    order = {dim: tuple(mesh_dims) for dim, mesh_dims in sharded.items()}
    if split_factors:
        if shard_order is not None:
            raise ReshardingError(
                "give the shard order either as _StridedShard placements or as shard_order,"
                f" not both: {placements}, {dict(shard_order)}"
            )
        order = {
            dim: _decode_strided(mesh, dim, mesh_dims, split_factors)
            for dim, mesh_dims in sharded.items()
        }
    if shard_order is not None:
        order = _with_shard_order(order, shard_order, placements, ndim)
    dims = tuple(tuple(mesh_axis_of_dim(mesh, m) for m in order.get(d, ())) for d in range(ndim))
    return dims, tuple(partial)


def placements_of(
    mesh: Mesh,
    shard_order: Mapping[int, Sequence[int]],
    partial: Sequence[PartialAxis],
) -> tuple[Any, ...]:
    """DTensor placements, one per mesh dim (outermost first), of the tensor sharded as
    ``shard_order`` (tensor dim -> mesh dims, outer first) and partial over ``partial``. A
    non-default shard order is written with ``_StridedShard`` as DTensor itself does.
    Raises for reduce ops DTensor's Partial does not have."""
    dt = _dtensor()
    placements: list[Any] = [dt.Replicate()] * mesh.ndim
    for p in partial:
        if p.op not in _DTENSOR_OPS:
            raise ReshardingError(
                f"partial {p.op.value} over {p.axis.value} has no DTensor placement"
                f" (Partial supports {sorted(_DTENSOR_OPS_BACK)})"
            )
        placements[p.axis.dim(mesh.ndim)] = dt.Partial(_DTENSOR_OPS[p.op])
    for dim, mesh_dims in shard_order.items():
        for index, mesh_dim in enumerate(mesh_dims):
            # DTensor's encoding: the product of the sizes of the mesh dims nested
            # outside this one that come after it in placement order.
            factor = math.prod(mesh.shape[m] for m in mesh_dims[:index] if m > mesh_dim)
            placements[mesh_dim] = (
                dt.Shard(dim) if factor == 1 else dt.StridedShard(dim, split_factor=factor)
            )
    return tuple(placements)


def _read_placements(
    mesh: Mesh, placements: tuple[Any, ...], ndim: int
) -> tuple[dict[int, list[int]], dict[int, int], list[PartialAxis]]:
    """Per tensor dim its mesh dims (placement order), the ``_StridedShard`` split factors
    by mesh dim, and the partial axes of DTensor ``placements``."""
    sharded: dict[int, list[int]] = {}
    split_factors: dict[int, int] = {}
    partial = []
    dt = _dtensor()
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, dt.Shard | dt.StridedShard):
            dim = placement.dim + ndim if placement.dim < 0 else placement.dim
            if not 0 <= dim < ndim:
                raise ReshardingError(
                    f"{placement} on mesh dim {mesh_dim} names no dim of a {ndim}-d tensor"
                )
            sharded.setdefault(dim, []).append(mesh_dim)
            if isinstance(placement, dt.StridedShard):
                split_factors[mesh_dim] = placement.split_factor
        elif isinstance(placement, dt.Partial):
            if type(placement) is not dt.Partial or placement.reduce_op not in _DTENSOR_OPS_BACK:
                raise ReshardingError(
                    f"{placement!r} on mesh dim {mesh_dim} is not supported: a Distribution"
                    f" has partial ops {sorted(_DTENSOR_OPS_BACK)}"
                )
            op = _DTENSOR_OPS_BACK[placement.reduce_op]
            partial.append(PartialAxis(axis=mesh_axis_of_dim(mesh, mesh_dim), op=op))
        elif not isinstance(placement, dt.Replicate):
            raise ReshardingError(
                f"placement {placement!r} on mesh dim {mesh_dim} is not supported"
                " (Shard, Replicate, Partial and _StridedShard are)"
            )
    return sharded, split_factors, partial


def _with_shard_order(
    order: dict[int, tuple[int, ...]],
    shard_order: Mapping[int, Sequence[int]],
    placements: tuple[Any, ...],
    ndim: int,
) -> dict[int, tuple[int, ...]]:
    """``order`` with the nesting orders ``shard_order`` gives (the same mesh dims per dim)."""
    order = dict(order)
    for dim, mesh_dims in dict(shard_order).items():
        dim = dim + ndim if dim < 0 else dim
        if sorted(mesh_dims) != sorted(order.get(dim, ())):
            raise ReshardingError(
                f"shard_order {dict(shard_order)} gives tensor dim {dim} the mesh dims"
                f" {tuple(mesh_dims)}, but the placements {placements} shard it over"
                f" {order.get(dim, ())}"
            )
        order[dim] = tuple(mesh_dims)
    return order


def _decode_strided(
    mesh: Mesh, dim: int, mesh_dims: Sequence[int], split_factors: Mapping[int, int]
) -> tuple[int, ...]:
    """The nesting order of ``dim``'s mesh dims that DTensor's ``_StridedShard`` split
    factors encode (the first such order, default order first)."""
    for order in itertools.permutations(sorted(mesh_dims)):
        if all(
            split_factors.get(m, 1) == math.prod(mesh.shape[o] for o in order[:index] if o > m)
            for index, m in enumerate(order)
        ):
            return tuple(order)
    factors = {m: split_factors.get(m, 1) for m in mesh_dims}
    raise ReshardingError(
        f"the _StridedShard split factors {factors} of tensor dim {dim} on mesh dims"
        f" {tuple(mesh_dims)} encode no nesting order of those mesh dims"
    )
