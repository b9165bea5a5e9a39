"""Meshes and shardings: how a host IR tensor is spread over devices.

A :class:`Mesh` is an N-d arrangement of device ids (ranks). Its axes are named
from the innermost: ``x`` is the last axis, ``y`` the second to last, ``z`` the
third to last (nvFuser's DIDx/DIDy/DIDz).

A :class:`Sharding` says, for each logical dim of a tensor, how the dim's index
decomposes into *parts*, outer to inner (a mixed-radix number). A part is
either a mesh axis (the device's coordinate on that axis selects the digit) or
a local extent (the digit is kept in the local shard). Replicated dims have
local parts only. So ``[x, 4]`` is a block sharding of an 8-long dim over a
2-device axis, and ``[4, x]`` is a cyclic one. Partial axes (a sum not yet
reduced over a mesh axis) are listed separately.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from hostir.errors import EvaluationError, MeshError
from hostir.ir.mesh import Mesh, MeshAxis
from hostir.ir.scalars import Const, Scalar, evaluate_scalar, mul, print_scalar


class ReduceOp(enum.Enum):
    """How partial values combine."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardPart:
    """One digit of a dim's index: a mesh axis (``axis`` set) or a local extent."""

    axis: MeshAxis | None
    extent: Scalar


@dataclass(frozen=True, slots=True, kw_only=True)
class PartialAxis:
    """The tensor holds partial values that still need ``op`` over ``axis``."""

    axis: MeshAxis
    op: ReduceOp


@dataclass(frozen=True, slots=True, kw_only=True)
class Sharding:
    """How a tensor is spread over ``mesh``: parts per logical dim, partial axes."""

    mesh: Mesh
    dims: tuple[tuple[ShardPart, ...], ...]
    partial: tuple[PartialAxis, ...] = ()

    def mesh_axes_of(self, dim: int) -> tuple[MeshAxis, ...]:
        """The mesh axes sharding logical ``dim``, outer first."""
        return tuple(p.axis for p in self.dims[dim] if p.axis is not None)

    def shard_factor(self, dim: int) -> int:
        """By how much ``dim`` is divided: the product of its mesh axes' sizes."""
        return math.prod(self.mesh.axis_size(a) for a in self.mesh_axes_of(dim))

    def replicated_axes(self) -> tuple[MeshAxis, ...]:
        """The mesh axes that neither shard a dim nor hold partial sums."""
        used = {a for dim in range(len(self.dims)) for a in self.mesh_axes_of(dim)}
        used |= {p.axis for p in self.partial}
        return tuple(a for a in self.mesh.axes() if a not in used)

    def is_distributed(self) -> bool:
        """Whether any dim is sharded or any axis partial."""
        return bool(self.partial) or any(self.mesh_axes_of(d) for d in range(len(self.dims)))


def normalized(sharding: Sharding, shape: tuple[Scalar, ...]) -> Sharding:
    """``sharding`` with every dim that has no mesh axis written as one local part of the
    dim's extent, so equal layouts compare and print equal."""
    dims = tuple(
        parts if any(p.axis is not None for p in parts) else (ShardPart(axis=None, extent=extent),)
        for parts, extent in zip(sharding.dims, shape, strict=True)
    )
    return Sharding(mesh=sharding.mesh, dims=dims, partial=sharding.partial)


def replicated(mesh: Mesh, shape: tuple[Scalar, ...]) -> Sharding:
    """The sharding of a tensor every device of ``mesh`` holds whole."""
    return Sharding(mesh=mesh, dims=tuple((ShardPart(axis=None, extent=e),) for e in shape))


def print_sharding_dims(sharding: Sharding) -> str:
    """``[x, i0 // 2] [8]``-style text of the per-dim parts."""
    dims = []
    for parts in sharding.dims:
        dims.append(
            "[" + ", ".join(p.axis.value if p.axis else print_scalar(p.extent) for p in parts) + "]"
        )
    return " ".join(dims)


def part_extents(
    parts: tuple[ShardPart, ...], mesh: Mesh, env: Mapping[str, int | float | bool]
) -> list[int]:
    """The concrete extent of each part (mesh parts take the mesh axis size)."""
    return [
        mesh.axis_size(p.axis) if p.axis is not None else int(evaluate_scalar(p.extent, env))
        for p in parts
    ]


def local_extent(
    parts: tuple[ShardPart, ...], mesh: Mesh, env: Mapping[str, int | float | bool]
) -> int:
    """The size of the dim in one device's shard: the product of its local parts."""
    extents = part_extents(parts, mesh, env)
    return math.prod(e for p, e in zip(parts, extents, strict=True) if p.axis is None)


def slice_global_tensor(
    full: torch.Tensor,
    sharding: Sharding,
    device: int,
    env: Mapping[str, int | float | bool] | None = None,
) -> torch.Tensor | None:
    """The piece of the unsharded tensor ``full`` that ``device`` holds under ``sharding``.

    Returns None when ``device`` is not in the sharding's mesh. Part extents
    are evaluated in ``env`` (symbols of ``full``'s extents may be bound there).
    """
    coords = sharding.mesh.coordinates(device)
    if coords is None:
        return None
    env = dict(env or {})
    result = full
    for dim in reversed(range(len(sharding.dims))):
        result = _slice_dim(result, dim, sharding, coords, env)
    return result.contiguous()


def _slice_dim(
    t: torch.Tensor,
    dim: int,
    sharding: Sharding,
    coords: tuple[int, ...],
    env: Mapping[str, int | float | bool],
) -> torch.Tensor:
    parts = sharding.dims[dim]
    if all(p.axis is None for p in parts):
        return t
    extents = _sliced_part_extents(parts, sharding.mesh, env, t.shape[dim])
    if math.prod(extents) != t.shape[dim]:
        raise MeshError(
            f"dim {dim} of extent {t.shape[dim]} does not split into parts"
            f" {print_sharding_dims(sharding)} (sizes {extents})"
        )
    split = t.reshape(*t.shape[:dim], *extents, *t.shape[dim + 1 :])
    # Select mesh digits from the innermost part outwards so indices stay valid.
    for offset in reversed(range(len(parts))):
        axis = parts[offset].axis
        if axis is not None:
            split = split.select(dim + offset, coords[axis.dim(sharding.mesh.ndim)])
    local = math.prod(e for p, e in zip(parts, extents, strict=True) if p.axis is None)
    return split.reshape(*t.shape[:dim], local, *t.shape[dim + 1 :])


def _sliced_part_extents(
    parts: tuple[ShardPart, ...], mesh: Mesh, env: Mapping[str, int | float | bool], size: int
) -> list[int]:
    """:func:`part_extents` of a dim of ``size`` elements: a single local part whose extent
    ``env`` cannot give (an expression of symbols nothing binds, ``8 + i0`` of a ``cat``)
    takes what the other parts leave of ``size``."""
    extents: list[int | None] = []
    for part in parts:
        if part.axis is not None:
            extents.append(mesh.axis_size(part.axis))
            continue
        try:
            extents.append(int(evaluate_scalar(part.extent, env)))
        except EvaluationError:
            extents.append(None)
    unknown = [i for i, e in enumerate(extents) if e is None]
    known = math.prod(e for e in extents if e is not None)
    if len(unknown) != 1 or known == 0 or size % known:
        return part_extents(parts, mesh, env)  # evaluates (or raises) as before
    extents[unknown[0]] = size // known
    return [int(e) for e in extents if e is not None]


def canonical_parts(parts: list[ShardPart]) -> tuple[ShardPart, ...]:
    """Merges adjacent local parts and drops local parts of extent 1."""
    merged: list[ShardPart] = []
    for part in parts:
        if part.axis is None and part.extent == Const(value=1) and len(parts) > 1:
            continue
        if part.axis is None and merged and merged[-1].axis is None:
            merged[-1] = ShardPart(axis=None, extent=mul(merged[-1].extent, part.extent))
            continue
        merged.append(part)
    if not merged:
        merged.append(ShardPart(axis=None, extent=Const(value=1)))
    return tuple(merged)
