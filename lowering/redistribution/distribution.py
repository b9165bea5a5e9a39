"""``Distribution``: how a tensor is spread over a mesh, independent of its extents (SPEC §6).

For each logical dim, the mesh axes sharding it in nesting order (outer first:
``[y, x]`` and ``[x, y]`` on one dim differ), and the partial axes with their
reduce op; every other mesh axis is replicated. Only block layouts are
distributions (cyclic ones are refused). It converts to and from host IR
shardings (``from_sharding``/``to_sharding``), DTensor placements
(``from_placements``/``to_placements``, in ``lowering.redistribution.dtensor_placements``,
re-exported with ``as_mesh`` and ``mesh_axis_of_dim``) and the compact
notation ``S0S1``, ``PS0``, ``S0S0[1,0]`` (``parse_notation``/``notation``:
one placement per mesh dim, outer first; docs/cli.md, ``hostir plan``). A mesh
has at most 3 dims, so at most one tensor dim is sharded more than once and
the order suffix is unambiguous.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hostir import Const, Mesh, MeshAxis, PartialAxis, ReduceOp, Sharding, ShardPart
from hostir.ir.scalars import Scalar, as_scalar, floordiv
from hostir.ir.sharding import print_sharding_dims
from lowering.errors import ReshardingError
from lowering.redistribution.dtensor_placements import (
    as_mesh,
    axes_of_placements,
    mesh_axis_of_dim,
    placements_of,
)

__all__ = [
    "Distribution",
    "as_mesh",
    "mesh_axis_of_dim",
    "parse_notation",
]

_NOTATION = re.compile(r"S(\d+)|R|P(?:\((sum|max|min|prod)\))?")
_ORDER = re.compile(r"\[(\d+(?:,\d+)*)\]$")


@dataclass(frozen=True)
class Distribution:
    """The per-dim nesting of mesh axes (outer first) and the partial axes of a tensor."""

    mesh: Mesh
    dims: tuple[tuple[MeshAxis, ...], ...]
    partial: tuple[PartialAxis, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(tuple(axes) for axes in self.dims))
        object.__setattr__(self, "partial", tuple(self.partial))
        used = [a for axes in self.dims for a in axes] + [p.axis for p in self.partial]
        for axis in used:
            if axis not in self.mesh.axes():
                raise ReshardingError(
                    f"mesh axis {axis.value} does not exist in the {self.mesh.ndim}-d mesh"
                    f" {self.mesh} (distribution {self._raw()})"
                )
        repeated = sorted({a.value for a in used if used.count(a) > 1})
        if repeated:
            raise ReshardingError(
                f"mesh axis {', '.join(repeated)} is used more than once in {self._raw()}: a mesh"
                " axis shards one dim or holds partial values, not both"
            )

    # ----- queries -----
    @property
    def ndim(self) -> int:
        """The tensor's rank."""
        return len(self.dims)

    def replicated_axes(self) -> tuple[MeshAxis, ...]:
        """The mesh axes that neither shard a dim nor hold partial values, outer first."""
        used = {a for axes in self.dims for a in axes} | {p.axis for p in self.partial}
        return tuple(a for a in self.mesh.axes() if a not in used)

    def shard_factor(self, dim: int) -> int:
        """By how much ``dim`` is divided: the product of its mesh axes' sizes."""
        return math.prod(self.mesh.axis_size(a) for a in self.dims[dim])

    def local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """One device's shard of a tensor of global ``shape`` (each dim must divide)."""
        if len(shape) != self.ndim:
            raise ReshardingError(f"{self} is for a {self.ndim}-d tensor, got shape {shape}")
        local = []
        for dim, extent in enumerate(shape):
            factor = self.shard_factor(dim)
            if extent % factor:
                raise ReshardingError(
                    f"dim {dim} of extent {extent} does not divide over {factor} devices ({self})"
                )
            local.append(extent // factor)
        return tuple(local)

    def shard_order(self) -> dict[int, tuple[int, ...]]:
        """Tensor dim -> the DTensor mesh dims sharding it, outer first (sharded dims only)."""
        return {
            dim: tuple(a.dim(self.mesh.ndim) for a in axes)
            for dim, axes in enumerate(self.dims)
            if axes
        }

    def with_dim(self, dim: int, axes: tuple[MeshAxis, ...]) -> Distribution:
        """This distribution with ``dim`` sharded over ``axes`` (outer first) instead."""
        return dataclasses.replace(self, dims=(*self.dims[:dim], axes, *self.dims[dim + 1 :]))

    def dim_of(self, axis: MeshAxis) -> int | None:
        """The dim sharded over mesh axis ``axis``, if any."""
        return next((dim for dim, axes in enumerate(self.dims) if axis in axes), None)

    def has_default_order(self) -> bool:
        """Whether every dim nests its mesh axes outer mesh dim first (DTensor's default)."""
        return all(list(dims) == sorted(dims) for dims in self.shard_order().values())

    def _raw(self) -> str:
        """The fields as text (``__str__`` needs a valid distribution)."""
        dims = ", ".join(
            f"{d}: [{', '.join(a.value for a in axes)}]" for d, axes in enumerate(self.dims) if axes
        )
        partial = ", ".join(f"{p.axis.value}: {p.op.value}" for p in self.partial)
        return "{" + dims + "}" + (" partial{" + partial + "}" if partial else "")

    def __str__(self) -> str:
        return f"{self.notation()} (a {self.ndim}-d tensor on {self.mesh})"

    # ----- host IR shardings -----
    @staticmethod
    def from_sharding(sharding: Sharding) -> Distribution:
        """The distribution of a block ``sharding``; ReshardingError for a cyclic dim."""
        dims = []
        for dim, parts in enumerate(sharding.dims):
            axes = sharding.mesh_axes_of(dim)
            if any(p.axis is None for p in parts[: len(axes)]):
                raise ReshardingError(
                    f"dim {dim} of the sharding {print_sharding_dims(sharding)} is not laid out"
                    " in blocks (a local part comes before a mesh axis: a cyclic layout);"
                    " a Distribution describes block layouts only"
                )
            dims.append(axes)
        return Distribution(mesh=sharding.mesh, dims=tuple(dims), partial=sharding.partial)

    def to_sharding(self, shape: Sequence[Scalar | int]) -> Sharding:
        """The block ``Sharding`` of a tensor of global ``shape``: per sharded dim its mesh
        axes (parts of their sizes), then one local part ``extent // product`` (left out
        when it is the constant 1); an unsharded dim is one local part of its extent."""
        if len(shape) != self.ndim:
            raise ReshardingError(f"{self} is for a {self.ndim}-d tensor, got shape {shape}")
        dims = []
        for axes, extent in zip(self.dims, shape, strict=True):
            extent = as_scalar(extent)
            parts = [ShardPart(axis=a, extent=Const(value=self.mesh.axis_size(a))) for a in axes]
            local = floordiv(extent, math.prod(self.mesh.axis_size(a) for a in axes))
            if not (axes and local == Const(value=1)):
                parts.append(ShardPart(axis=None, extent=local))
            dims.append(tuple(parts))
        return Sharding(mesh=self.mesh, dims=tuple(dims), partial=self.partial)

    # ----- DTensor placements -----
    @staticmethod
    def from_placements(
        mesh: Any,
        placements: Sequence[Any],
        shard_order: Mapping[int, Sequence[int]] | None = None,
        *,
        ndim: int,
    ) -> Distribution:
        """The distribution of a ``ndim``-d DTensor with ``placements`` on ``mesh`` (ours or
        DTensor's DeviceMesh). ``shard_order`` maps tensor dims to their mesh dims, outer
        first, for orders other than DTensor's default; ``_StridedShard`` placements are
        decoded into an order the same way."""
        mesh = as_mesh(mesh)
        dims, partial = axes_of_placements(mesh, tuple(placements), shard_order, ndim)
        return Distribution(mesh=mesh, dims=dims, partial=partial)

    def to_placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh dim (outermost first). A non-default shard order
        is written with ``_StridedShard`` as DTensor itself does; ``shard_order()`` gives it
        as a mapping. Raises for reduce ops DTensor's Partial does not have."""
        return placements_of(self.mesh, self.shard_order(), self.partial)

    # ----- compact notation -----
    def notation(self) -> str:
        """The compact notation (see the module docstring), e.g. ``PS0`` or ``S0S0[1,0]``."""
        letters = ["R"] * self.mesh.ndim
        for p in self.partial:
            letters[p.axis.dim(self.mesh.ndim)] = (
                "P" if p.op is ReduceOp.SUM else f"P({p.op.value})"
            )
        for dim, mesh_dims in self.shard_order().items():
            for m in mesh_dims:
                letters[m] = f"S{dim}"
        text = "".join(letters)
        if not self.has_default_order():
            (mesh_dims,) = [m for m in self.shard_order().values() if list(m) != sorted(m)]
            text += "[" + ",".join(str(m) for m in mesh_dims) + "]"
        return text


def parse_notation(text: str, mesh: Any, ndim: int = 2) -> Distribution:
    """The distribution written ``text`` (e.g. ``S0S1``, ``PS0``, ``S0S0[1,0]``) on ``mesh``
    for a ``ndim``-d tensor (default 2: a matrix)."""
    mesh = as_mesh(mesh)
    body, order = text.strip(), None
    match = _ORDER.search(body)
    if match:
        order = tuple(int(m) for m in match.group(1).split(","))
        body = body[: match.start()]
    tokens = []
    position = 0
    while position < len(body):
        token = _NOTATION.match(body, position)
        if token is None:
            raise ReshardingError(
                f"cannot read the distribution {text!r} at {body[position:]!r}: expected one of"
                " S<dim>, R, P, P(max), P(min), P(prod) per mesh dim"
            )
        tokens.append(token)
        position = token.end()
    if len(tokens) != mesh.ndim:
        raise ReshardingError(
            f"the distribution {text!r} has {len(tokens)} placements for the {mesh.ndim}-d mesh"
            f" {mesh}: write one per mesh dim"
        )
    dims: list[list[MeshAxis]] = [[] for _ in range(ndim)]
    partial = []
    for mesh_dim, token in enumerate(tokens):
        axis = mesh_axis_of_dim(mesh, mesh_dim)
        if token.group(0).startswith("S"):
            dim = int(token.group(1))
            if dim >= ndim:
                raise ReshardingError(
                    f"{token.group(0)} in {text!r} names dim {dim} of a {ndim}-d tensor"
                )
            dims[dim].append(axis)
        elif token.group(0).startswith("P"):
            partial.append(PartialAxis(axis=axis, op=ReduceOp(token.group(2) or "sum")))
    if order is not None:
        multiple = [d for d, axes in enumerate(dims) if len(axes) > 1]
        wanted = sorted(a.dim(mesh.ndim) for a in dims[multiple[0]]) if multiple else []
        if sorted(order) != wanted:
            raise ReshardingError(
                f"the order suffix [{','.join(map(str, order))}] of {text!r} must list the mesh"
                f" dims of the one tensor dim sharded more than once ({wanted or 'none'})"
            )
        dims[multiple[0]] = [mesh_axis_of_dim(mesh, m) for m in order]
    return Distribution(mesh=mesh, dims=tuple(tuple(a) for a in dims), partial=tuple(partial))
