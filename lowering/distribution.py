"""``Distribution``: how a tensor is spread over a mesh, independent of its extents (SPEC §6).

For each logical dim, the mesh axes sharding it in nesting order (outer
first), so ``[y, x]`` and ``[x, y]`` on one dim are different layouts; the
mesh axes over which the tensor is partial, with their reduce op; every other
mesh axis replicated. Only block layouts are distributions (a dim's mesh axes
come before its local data); the cyclic ones a ``Sharding`` can also describe
are refused.

Conversions:

- ``Distribution.from_sharding`` / ``to_sharding``: host IR shardings, e.g.
  read off a lowered program (``fd.host_ir().inputs[0].sharding``).
- ``Distribution.from_placements`` / ``to_placements``: DTensor placements.
  DTensor mesh dim ``i`` of an n-d mesh is our ``MeshAxis`` whose
  ``axis.dim(n) == i`` (the last mesh dim is ``x``). ``Shard(d)`` on mesh dims
  ``i < j`` nests ``[axis_i, axis_j]`` (DTensor's default left-to-right shard
  order); other orders come as a ``shard_order`` (tensor dim -> mesh dims,
  outer first) or as DTensor's ``_StridedShard`` placements, which is also how
  ``to_placements`` writes them.
- ``parse_notation`` / ``Distribution.notation``: one placement per mesh dim,
  outer mesh dim first: ``S<d>`` shards tensor dim ``d``, ``R`` replicates,
  ``P`` is partial (sum; ``P(max)``, ``P(min)``, ``P(prod)`` for the others).
  On a 2x2 mesh ``S0S0`` is ``(Shard(0), Shard(0))``: dim 0 over ``[y, x]``.
  A tensor dim sharded over several mesh dims in another order takes the
  order as a suffix of mesh dims, outer first: ``S0S0[1,0]`` is dim 0 over
  ``[x, y]``. (A mesh has at most 3 dims, so at most one tensor dim can be
  sharded more than once and the suffix is unambiguous.)

``fusion_for(src, dst, shape, dtype)`` builds the fusion that reshards one
tensor from ``src`` to ``dst``; ``program_for`` lowers it to the host IR
program that does only the resharding (see their docstrings for partial
sources).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, TensorView
from hostir import (
    Const,
    HostIrContainer,
    Mesh,
    MeshAxis,
    PartialAxis,
    ReduceOp,
    Sharding,
    ShardPart,
    Sum,
    TensorValue,
    slice_global_tensor,
)
from hostir.instructions import Deallocate
from hostir.scalars import Scalar, as_scalar, floordiv
from hostir.sharding import print_sharding_dims
from lowering.errors import ReshardingError

_DTENSOR_OPS = {ReduceOp.SUM: "sum", ReduceOp.MAX: "max", ReduceOp.MIN: "min"}
_DTENSOR_OPS_BACK = {
    "sum": ReduceOp.SUM,
    "max": ReduceOp.MAX,
    "min": ReduceOp.MIN,
}
_NOTATION = re.compile(r"S(\d+)|R|P(?:\((sum|max|min|prod)\))?")
_ORDER = re.compile(r"\[(\d+(?:,\d+)*)\]$")


def mesh_axis_of_dim(mesh: Mesh, dim: int) -> MeshAxis:
    """Our name of DTensor mesh dim ``dim`` (0 is the outermost; the last one is ``x``)."""
    if not 0 <= dim < mesh.ndim:
        raise ReshardingError(f"mesh dim {dim} does not exist in the {mesh.ndim}-d mesh {mesh}")
    return list(MeshAxis)[mesh.ndim - 1 - dim]


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
            axes = tuple(p.axis for p in parts if p.axis is not None)
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
        placements = tuple(placements)
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
        dims = tuple(
            tuple(mesh_axis_of_dim(mesh, m) for m in order.get(d, ())) for d in range(ndim)
        )
        return Distribution(mesh=mesh, dims=dims, partial=tuple(partial))

    def to_placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh dim (outermost first). A non-default shard order
        is written with ``_StridedShard`` as DTensor itself does; ``shard_order()`` gives it
        as a mapping. Raises for reduce ops DTensor's Partial does not have."""
        placements: list[Any] = [Replicate()] * self.mesh.ndim
        for p in self.partial:
            if p.op not in _DTENSOR_OPS:
                raise ReshardingError(
                    f"partial {p.op.value} over {p.axis.value} has no DTensor placement"
                    f" (Partial supports {sorted(_DTENSOR_OPS_BACK)})"
                )
            placements[p.axis.dim(self.mesh.ndim)] = Partial(_DTENSOR_OPS[p.op])
        for dim, mesh_dims in self.shard_order().items():
            for index, mesh_dim in enumerate(mesh_dims):
                # DTensor's encoding: the product of the sizes of the mesh dims nested
                # outside this one that come after it in placement order.
                factor = math.prod(self.mesh.shape[m] for m in mesh_dims[:index] if m > mesh_dim)
                placements[mesh_dim] = (
                    Shard(dim) if factor == 1 else _StridedShard(dim, split_factor=factor)
                )
        return tuple(placements)

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


def _read_placements(
    mesh: Mesh, placements: tuple[Any, ...], ndim: int
) -> tuple[dict[int, list[int]], dict[int, int], list[PartialAxis]]:
    """Per tensor dim its mesh dims (placement order), the ``_StridedShard`` split factors
    by mesh dim, and the partial axes of DTensor ``placements``."""
    sharded: dict[int, list[int]] = {}
    split_factors: dict[int, int] = {}
    partial = []
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard | _StridedShard):
            dim = placement.dim + ndim if placement.dim < 0 else placement.dim
            if not 0 <= dim < ndim:
                raise ReshardingError(
                    f"{placement} on mesh dim {mesh_dim} names no dim of a {ndim}-d tensor"
                )
            sharded.setdefault(dim, []).append(mesh_dim)
            if isinstance(placement, _StridedShard):
                split_factors[mesh_dim] = placement.split_factor
        elif isinstance(placement, Partial):
            if type(placement) is not Partial or placement.reduce_op not in _DTENSOR_OPS_BACK:
                raise ReshardingError(
                    f"{placement!r} on mesh dim {mesh_dim} is not supported: a Distribution"
                    f" has partial ops {sorted(_DTENSOR_OPS_BACK)}"
                )
            op = _DTENSOR_OPS_BACK[placement.reduce_op]
            partial.append(PartialAxis(axis=mesh_axis_of_dim(mesh, mesh_dim), op=op))
        elif not isinstance(placement, Replicate):
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


# ---------------------------------------------------------------------------
# Fusions and programs that reshard one tensor


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
    if not isinstance(first, Sum) or first.src.name != old_input.name:
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
