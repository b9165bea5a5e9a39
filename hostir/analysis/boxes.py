"""Block layouts as boxes of the global tensor.

A value is laid out in *blocks* when every sharded dim lists its mesh axes
first (outer first) and then its local extent (``{0: [y, x, 4]}``); a dim
without a mesh axis is whole. A rank's block is then a box of the global
tensor: per dim, ``offset = (linear index of the rank's coordinates over the
dim's mesh axes, outer first) * local extent`` and ``extent = local extent``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from hostir.errors import EvaluationError
from hostir.ir.mesh import Mesh, MeshAxis
from hostir.ir.scalars import Const
from hostir.ir.sharding import Sharding, print_sharding_dims

Box = tuple[tuple[int, int], ...]
"""Per dim ``(offset, extent)`` of a region of the global tensor."""


def block_box(sharding: Sharding, shape: Sequence[int], rank: int, *, name: str = "value") -> Box:
    """The box of the global tensor (of extents ``shape``) that ``rank`` holds.

    Raises :class:`EvaluationError` naming ``name`` when the layout is not in
    blocks (a cyclic ``[4, x]``), a dim does not divide evenly, or ``rank`` is
    not on the sharding's mesh.
    """
    mesh = sharding.mesh
    coords = mesh.coordinates(rank)
    if coords is None:
        raise EvaluationError(f"{name}: rank {rank} is not on its mesh {mesh}")
    return _box(_layout(Operand(name, sharding, tuple(shape)), mesh), coords)


def block_boxes(sharding: Sharding, shape: Sequence[int], *, name: str = "value") -> list[Box]:
    """Every rank's :func:`block_box`, in the order of the mesh's devices (the layout
    checked and cut once, not once per rank); raises what :func:`block_box` raises."""
    mesh = sharding.mesh
    return list(_boxes(_layout(Operand(name, sharding, tuple(shape)), mesh), mesh.shape))


def most_missing(src: Sharding | None, out: Sharding, shape: Sequence[int]) -> int:
    """The most elements of a rank's ``out`` block (of a tensor of extents ``shape``) that
    its ``src`` block does not already hold, at most over the ranks of ``out``'s mesh
    (``src`` on the same mesh); the whole block where ``src`` is None. From per-dim
    overlaps (:func:`least_kept`), no box per rank; raises what :func:`block_boxes`
    raises."""
    out_layout = _layout(Operand("value", out, tuple(shape)), out.mesh)
    whole = math.prod(blocks.local for blocks in out_layout)
    if src is None:
        return whole
    src_layout = _layout(Operand("value", src, tuple(shape)), src.mesh)
    return whole - least_kept(src_layout, out_layout, out.mesh.shape)[0]


def _block_axes(sharding: Sharding, dim: int, name: str) -> tuple[MeshAxis, ...]:
    """The mesh axes of ``dim`` after checking they all come before its local parts."""
    seen_local = False
    for part in sharding.dims[dim]:
        if part.axis is None:
            # A local part of extent 1 places nothing; any other one ends the mesh digits.
            seen_local |= part.extent != Const(value=1)
        elif seen_local:
            raise EvaluationError(
                f"{name}: dim {dim} is not laid out in blocks (its parts"
                f" {print_sharding_dims(sharding)} place mesh axis {part.axis.value} inside"
                " a local extent, a cyclic layout); AllToAllV needs mesh axes first, then"
                " one local extent"
            )
    return sharding.mesh_axes_of(dim)


def intersect(a: Box, b: Box) -> Box | None:
    """The common box of ``a`` and ``b``, or None if they do not overlap."""
    common = []
    for (a_offset, a_extent), (b_offset, b_extent) in zip(a, b, strict=True):
        start = max(a_offset, b_offset)
        stop = min(a_offset + a_extent, b_offset + b_extent)
        if stop <= start:
            return None
        common.append((start, stop - start))
    return tuple(common)


def volume(box: Box) -> int:
    """The number of elements in ``box``."""
    return math.prod(extent for _, extent in box)


def relative(box: Box, origin: Box) -> tuple[slice, ...]:
    """Slices selecting ``box`` inside a tensor holding the box ``origin``."""
    return tuple(
        slice(offset - start, offset - start + extent)
        for (offset, extent), (start, _) in zip(box, origin, strict=True)
    )


@dataclass(frozen=True, slots=True)
class Operand:
    """What the pattern needs of ``src`` or ``out``: its name (for messages), sharding
    and concrete global shape."""

    name: str
    sharding: Sharding
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _DimBlocks:
    """How one dim is cut into blocks: its mesh dims (outer first), their sizes, and the
    local extent of a block."""

    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    local: int

    def index(self, coords: Sequence[int]) -> int:
        """The block index of a member with mesh coordinates ``coords``."""
        index = 0
        for m, size in zip(self.dims, self.sizes, strict=True):
            index = index * size + coords[m]
        return index

    def overlapping(
        self, interval: tuple[int, int]
    ) -> list[tuple[tuple[int, ...], tuple[int, int]]]:
        """(coordinates on ``dims``, common interval) of each block overlapping ``interval``."""
        start, extent = interval
        found = []
        for index in range(start // self.local, (start + extent - 1) // self.local + 1):
            low = max(start, index * self.local)
            high = min(start + extent, (index + 1) * self.local)
            digits, rest = [], index
            for size in reversed(self.sizes):
                digits.append(rest % size)
                rest //= size
            found.append((tuple(reversed(digits)), (low, high - low)))
        return found


def _box(layout: tuple[_DimBlocks, ...], coords: Sequence[int]) -> Box:
    return tuple((blocks.index(coords) * blocks.local, blocks.local) for blocks in layout)


@lru_cache(maxsize=256)
def _boxes(layout: tuple[_DimBlocks, ...], shape: tuple[int, ...]) -> tuple[Box, ...]:
    """Every member's :func:`_box` on a mesh of ``shape``, in device order; cached: the
    planner walks a mesh's blocks several times per exchange. The offsets come from
    :func:`grid_starts` (one tensor per dim, not one index per member and dim)."""
    if not layout:
        return ((),) * math.prod(shape)
    per_dim = [
        [(offset, blocks.local) for offset in start.expand(shape).reshape(-1).tolist()]
        for start, blocks in zip(grid_starts(layout, shape), layout, strict=True)
    ]
    return tuple(zip(*per_dim, strict=True))


@lru_cache(maxsize=4096)
def _overlapping(blocks: _DimBlocks, interval: tuple[int, int]):
    """:meth:`_DimBlocks.overlapping`, cached: the members of a large mesh share a few
    intervals per dim."""
    return tuple(blocks.overlapping(interval))


def _cells(layout, box: Box, outside: tuple[int, ...], coords: tuple[int, ...]):
    """(block coordinates as (mesh dim, coordinate) pairs, common box) per combination of
    ``layout``'s blocks overlapping ``box`` whose coordinates on the ``outside`` mesh
    dims are ``coords``, in :func:`_overlaps`' order (its result with those dims fixed,
    as pairs to put into a member's coordinates). Each dim's blocks come from
    :func:`_dim_cells`, cached: the members of a large mesh share a few intervals per
    dim, and most often one block per dim overlaps."""
    per_dim, single = [], True
    for blocks, interval in zip(layout, box, strict=True):
        fixed = tuple((m, coords[m]) for m in blocks.dims if m in outside) if outside else ()
        options = _dim_cells(blocks, interval, fixed)
        single = single and len(options) == 1
        per_dim.append(options)
    if single:  # the usual case: one block per dim
        pairs, common = (), []
        for ((dim_pairs, interval),) in per_dim:
            pairs += dim_pairs
            common.append(interval)
        return ((pairs, tuple(common)),)
    # itertools.product's order (the first dim outermost), one dim at a time: joining
    # tuples per combination costs less than a generator per combination.
    found = [((), ())]
    for options in per_dim:
        found = [(pairs + p, common + (c,)) for pairs, common in found for p, c in options]
    return tuple(found)


@lru_cache(maxsize=8192)
def _dim_cells(blocks, interval: tuple[int, int], fixed: tuple[tuple[int, int], ...]):
    """(its blocks' (mesh dim, coordinate) pairs, common interval) per block of one dim
    overlapping ``interval`` whose coordinates agree with ``fixed``."""
    found = []
    for digits, common in blocks.overlapping(interval):
        pairs = tuple(zip(blocks.dims, digits, strict=True))
        if not fixed or all(dict(pairs)[m] == c for m, c in fixed):
            found.append((pairs, common))
    return tuple(found)


@lru_cache(maxsize=32)
def _members(mesh: Mesh) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(rank, coordinates) of every device of ``mesh``, in device order (row-major
    coordinates, as :attr:`Mesh.devices` lists them); cached as :func:`_boxes` is."""
    return tuple(zip(mesh.devices, itertools.product(*map(range, mesh.shape)), strict=True))


@lru_cache(maxsize=256)
def _layout(operand: Operand, mesh) -> tuple[_DimBlocks, ...]:
    """Per dim, its blocks (checked: a block layout that divides evenly)."""
    sharding, shape, name = operand.sharding, operand.shape, operand.name
    if len(shape) != len(sharding.dims):
        raise EvaluationError(
            f"{name}: its sharding has {len(sharding.dims)} dims, its shape {len(shape)}"
        )
    layout = []
    for dim, extent in enumerate(shape):
        axes = _block_axes(sharding, dim, name)
        sizes = tuple(mesh.axis_size(a) for a in axes)
        parts_count = math.prod(sizes)
        if extent % parts_count:
            raise EvaluationError(
                f"{name}: dim {dim} of extent {extent} does not split into {parts_count} blocks"
                f" over mesh axes ({', '.join(a.value for a in axes)})"
            )
        dims = tuple(a.dim(mesh.ndim) for a in axes)
        layout.append(_DimBlocks(dims, sizes, extent // parts_count))
    return tuple(layout)


def grid_starts(layout: tuple[_DimBlocks, ...], shape: tuple[int, ...]) -> list[torch.Tensor]:
    """Per dim, every member's block offset (:func:`_box`) as an int64 tensor that
    broadcasts over a mesh of ``shape``: of size 1 on the mesh dims that do not place
    the dim, so it is built from those that do (a few of the mesh's axes), not member
    by member."""
    starts = []
    for blocks in layout:
        index = torch.zeros((1,) * len(shape), dtype=torch.int64)
        for m, size in zip(blocks.dims, blocks.sizes, strict=True):
            view = [1] * len(shape)
            view[m] = size
            index = index * size + torch.arange(size, dtype=torch.int64).view(view)
        starts.append(index * blocks.local)
    return starts


def paired_starts(
    src_layout: tuple[_DimBlocks, ...], out_layout: tuple[_DimBlocks, ...], shape: tuple[int, ...]
) -> Iterator[tuple[_DimBlocks, _DimBlocks, torch.Tensor, torch.Tensor]]:
    """Per tensor dim, the two layouts' blocks and every member's offset in each
    (:func:`grid_starts`, broadcasting over a mesh of ``shape``): what the analyses that
    compare a member's two blocks over the whole mesh walk."""
    return zip(
        src_layout,
        out_layout,
        grid_starts(src_layout, shape),
        grid_starts(out_layout, shape),
        strict=True,
    )


@lru_cache(maxsize=256)
def least_kept(
    src_layout: tuple[_DimBlocks, ...], out_layout: tuple[_DimBlocks, ...], shape: tuple[int, ...]
) -> tuple[int, int]:
    """(the fewest elements of a member's ``out`` block that its ``src`` block holds, the
    position in device order of the first member with that few), on a mesh of ``shape``.
    The common box of two blocks is, per dim, the overlap of their intervals, and each
    dim's offsets depend only on the mesh dims placing it (:func:`grid_starts`): the
    per-dim overlaps are broadcast over the mesh and multiplied, a few tensor
    operations instead of a box per member (on 4096 devices, some 40 ms of Python).
    ``torch.argmin`` gives the first minimal position, as a walk in device order keeps
    the first. Cached: the planner asks for each exchange more than once."""
    kept = torch.ones((1,) * len(shape), dtype=torch.int64)
    for src_blocks, out_blocks, src_start, out_start in paired_starts(
        src_layout, out_layout, shape
    ):
        low = torch.maximum(src_start, out_start)
        high = torch.minimum(src_start + src_blocks.local, out_start + out_blocks.local)
        kept = kept * (high - low).clamp(min=0)
    kept = kept.expand(shape).reshape(-1)
    position = int(torch.argmin(kept))
    return int(kept[position]), position


def row_codes(columns: list[torch.Tensor]) -> torch.Tensor:
    """Per row of ``columns``, a number from 0 on, equal for equal rows and only for them:
    the columns' values as digits of one mixed-radix number (each digit its column less
    its least value), renumbered by ``torch.unique`` whenever the radix would pass int64
    (a sort of single numbers; ``unique`` of rows sorts tuples, several times slower)."""
    code, radix = torch.zeros_like(columns[0]), 1
    for column in columns:
        low, high = int(column.min()), int(column.max())
        if low == high:  # the same digit in every row: nothing to tell apart
            continue
        if radix * (high - low + 1) >= 2**62:
            code = torch.unique(code, return_inverse=True)[1]
            radix = int(code.max()) + 1
        code, radix = code * (high - low + 1) + (column - low), radix * (high - low + 1)
    return torch.unique(code, return_inverse=True)[1]


def first_positions(columns: list[torch.Tensor]) -> list[int]:
    """The position of the first row of each distinct row of ``columns`` (equal-length
    1-d int64 tensors, one field each), ascending: one member per class where the
    columns are a key's fields over a mesh in device order."""
    code = row_codes(columns)
    first = torch.full((int(code.max()) + 1,), code.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, code, torch.arange(code.numel()), reduce="amin")
    return sorted(first.tolist())


def print_box(box: Box) -> str:
    """``[0:4, 2:4]``: the box as Python slices of the global tensor."""
    return "[" + ", ".join(f"{o}:{o + e}" for o, e in box) + "]"
