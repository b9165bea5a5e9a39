"""Block layouts as boxes of the global tensor, and the piece pattern of an AllToAllV.

A value is laid out in *blocks* when every sharded dim lists its mesh axes
first (outer first) and then its local extent (``{0: [y, x, 4]}``); a dim
without a mesh axis is whole. A rank's block is then a box of the global
tensor: per dim, ``offset = (linear index of the rank's coordinates over the
dim's mesh axes, outer first) * local extent`` and ``extent = local extent``.

:func:`all_to_all_v_pieces` is the exchange an ``AllToAllV`` performs: which
member sends which box to which member. It is a pure function of the two
shardings, the two global shapes, the team and the group, so every member
computes the same pattern, and it needs neither torch nor a running world
(the traffic picture in :mod:`hostir.traffic_dot` draws it too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from hostir.errors import EvaluationError
from hostir.mesh import MeshAxis
from hostir.scalars import Const
from hostir.sharding import Sharding, print_sharding_dims
from hostir.team import Team

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
    if len(shape) != len(sharding.dims):
        raise EvaluationError(
            f"{name}: its sharding has {len(sharding.dims)} dims, its shape {len(shape)}"
        )
    box = []
    for dim, extent in enumerate(shape):
        axes = _block_axes(sharding, dim, name)
        parts_count = math.prod(mesh.axis_size(a) for a in axes)
        if extent % parts_count:
            raise EvaluationError(
                f"{name}: dim {dim} of extent {extent} does not split into {parts_count} blocks"
                f" over mesh axes ({', '.join(a.value for a in axes)})"
            )
        index = 0
        for axis in axes:
            index = index * mesh.axis_size(axis) + coords[axis.dim(mesh.ndim)]
        local = extent // parts_count
        box.append((index * local, local))
    return tuple(box)


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
class Piece:
    """``box`` of the global tensor moves from member ``source`` to member ``destination``
    (positions in the group)."""

    source: int
    destination: int
    box: Box


@dataclass(frozen=True, slots=True)
class Pattern:
    """An AllToAllV's exchange within one group: its pieces in (source, destination)
    order, and each member's ``src`` and ``out`` boxes."""

    group: tuple[int, ...]
    pieces: tuple[Piece, ...]
    src_boxes: tuple[Box, ...]
    out_boxes: tuple[Box, ...]

    @property
    def communicates(self) -> bool:
        """Whether any piece moves between two different members."""
        return any(p.source != p.destination for p in self.pieces)


@dataclass(frozen=True, slots=True)
class Operand:
    """What the pattern needs of ``src`` or ``out``: its name (for messages), sharding
    and concrete global shape."""

    name: str
    sharding: Sharding
    shape: tuple[int, ...]


@lru_cache(maxsize=256)
def all_to_all_v_pieces(
    src: Operand, out: Operand, team: Team, group: tuple[int, ...], reduced: bool
) -> Pattern:
    """The pieces of an AllToAllV from ``src`` to ``out`` within ``group`` of ``team``.

    Members with the same coordinates on the team axes that shard ``src``, are
    *reduced* partial axes (``src`` partial, ``out`` not) or stay partial form a
    *cell*: they hold the same values. The piece from a cell to member d is
    ``box(src, cell) ∩ box(out, d)`` when it is not empty (and, on axes that
    stay partial, the cell agrees with d); it comes from d itself when d is in
    the cell, else from the cell's members in turn, destinations in order, so
    replicas share the sending. So each piece comes from exactly one member per
    coordinate of the reduced axes.
    ``reduced`` says whether the instruction has an ``op`` to reduce with.

    Raises :class:`EvaluationError` when the layouts are not blocks, ``out`` is
    partial where ``src`` is not, partial sums would be left unreduced, or some
    ``out`` box is not covered exactly once per reduced-axes coordinate.
    """
    mesh = team.mesh
    for operand in (src, out):
        if operand.sharding.mesh != mesh:
            raise EvaluationError(
                f"AllToAllV: {operand.name} lives on mesh {operand.sharding.mesh}, but the"
                f" team {team} is on mesh {mesh}; AllToAllV moves data within one mesh"
            )
    reduced_axes = _reduced_axes(src, out, team, reduced)
    sharding_axes = {a for d in range(len(src.shape)) for a in src.sharding.mesh_axes_of(d)}
    # A source's cell: its coordinates on the team axes that shard src or are reduced.
    # Members of one cell hold the same values (replicas, differing on the other axes).
    kept = {p.axis for p in out.sharding.partial}  # still partial: sources must agree
    keyed = [a.dim(mesh.ndim) for a in team.axes if a in sharding_axes | reduced_axes | kept]
    agree = [
        i
        for i, a in enumerate(a for a in team.axes if a in sharding_axes | reduced_axes | kept)
        if a in kept
    ]
    coords = [mesh.coordinates(rank) for rank in group]
    src_boxes = tuple(block_box(src.sharding, src.shape, r, name=src.name) for r in group)
    out_boxes = tuple(block_box(out.sharding, out.shape, r, name=out.name) for r in group)
    cells: dict[tuple[int, ...], list[int]] = {}
    for s in range(len(group)):
        cells.setdefault(tuple(coords[s][m] for m in keyed), []).append(s)
    # Each destination takes a cell's piece from itself when it holds a replica; otherwise
    # the replicas take turns (in destination order), so no replica sends far more than
    # the others.
    turns = dict.fromkeys(cells, 0)
    pieces = []
    for d in range(len(group)):
        mine = tuple(coords[d][m] for m in keyed)
        for key, holders in cells.items():
            if any(key[i] != mine[i] for i in agree):
                continue
            box = intersect(src_boxes[holders[0]], out_boxes[d])
            if box is None:
                continue
            if d in holders:
                source = d
            else:
                source = holders[turns[key] % len(holders)]
                turns[key] += 1
            pieces.append(Piece(source, d, box))
    pieces.sort(key=lambda p: (p.source, p.destination))
    pattern = Pattern(tuple(group), tuple(pieces), src_boxes, out_boxes)
    _check_coverage(pattern, src, out, team, [a.dim(mesh.ndim) for a in reduced_axes])
    return pattern


def _reduced_axes(src: Operand, out: Operand, team: Team, reduced: bool) -> set[MeshAxis]:
    """The partial axes of ``src`` this AllToAllV reduces (``out`` is not partial there)."""
    src_partial = {p.axis: p.op for p in src.sharding.partial}
    out_partial = {p.axis: p.op for p in out.sharding.partial}
    for axis, op in out_partial.items():
        if src_partial.get(axis) != op:
            raise EvaluationError(
                f"AllToAllV: {out.name} is partial over {axis.value} ({op.value}) but"
                f" {src.name} is not; an AllToAllV cannot create partial values"
            )
    axes = {axis for axis in src_partial if axis not in out_partial}
    outside = sorted(a.value for a in axes if a not in team.axes)
    if outside:
        raise EvaluationError(
            f"AllToAllV: {src.name} is partial over mesh axis {', '.join(outside)}, which the"
            f" team {team} does not span, and {out.name} is not partial there"
        )
    if axes and not reduced:
        raise EvaluationError(
            f"AllToAllV: {src.name} is partial over {', '.join(sorted(a.value for a in axes))}"
            f" and {out.name} is not; the instruction needs an op to reduce them"
        )
    return axes


def _check_coverage(
    pattern: Pattern, src: Operand, out: Operand, team: Team, reduced_dims: list[int]
) -> None:
    """Every ``out`` box is tiled by its pieces once per coordinate of the reduced axes."""
    mesh = team.mesh
    copies = math.prod(mesh.shape[d] for d in reduced_dims)
    for d, out_box in enumerate(pattern.out_boxes):
        covered: dict[tuple[int, ...], int] = {}
        for piece in pattern.pieces:
            if piece.destination == d:
                coords = mesh.coordinates(pattern.group[piece.source])
                key = tuple(coords[m] for m in reduced_dims)
                covered[key] = covered.get(key, 0) + volume(piece.box)
        need = volume(out_box)
        if len(covered) != copies or any(total != need for total in covered.values()):
            got = sorted(covered.values()) or [0]
            each = f" from each of {copies} partial copies" if copies > 1 else ""
            raise EvaluationError(
                f"AllToAllV over team {team}: the {out.name} block {print_box(out_box)} of rank"
                f" {pattern.group[d]} needs {need} elements{each}, but the {src.name} blocks"
                f" ({print_sharding_dims(src.sharding)}) of the team's members supply"
                f" {', '.join(map(str, got))}: the pair of layouts needs a larger team"
            )


def print_box(box: Box) -> str:
    """``[0:4, 2:4]``: the box as Python slices of the global tensor."""
    return "[" + ", ".join(f"{o}:{o + e}" for o, e in box) + "]"


# ----- buffers and rounds: the memory an AllToAllV holds besides src and out -----
def box_range(box: Box, block: Box) -> tuple[int, int] | None:
    """``box``'s [start, stop) in ``block``'s row-major storage if it is one contiguous
    range, else None: every dim after the last one where it is narrower than the block is
    whole (by definition of "last"), and every dim before it has extent 1."""
    narrower = [i for i, ((_, e), (_, f)) in enumerate(zip(box, block, strict=True)) if e != f]
    if narrower and any(e != 1 for _, e in box[: narrower[-1]]):
        return None
    start, stride = 0, 1
    for (offset, _), (block_offset, full) in reversed(list(zip(box, block, strict=True))):
        start += (offset - block_offset) * stride
        stride *= full
    return start, start + volume(box)


def consecutive(boxes: Sequence[Box], block: Box) -> bool:
    """Whether ``boxes``, in order, are back-to-back contiguous ranges of ``block``'s
    row-major storage (so one flat view of the block holds them all)."""
    position = None
    for box in boxes:
        span = box_range(box, block)
        if span is None or (position is not None and span[0] != position):
            return False
        position = span[1]
    return True


def call_buffers(pattern: Pattern, member: int, pieces: Sequence[Piece], reduced: bool) -> int:
    """Elements of the packing and receive buffers ``member`` holds in one alltoallv call
    moving ``pieces``: a packing buffer unless what it sends, in destination order, is one
    run of its ``src`` block, and a receive buffer unless (without a reduction) what it
    receives, in source order, is one run of its ``out`` block. The piece it keeps goes
    through the call where that saves a buffer (:func:`keeps_through`). The handler
    (``hostir.all_to_all_v``) allocates exactly these."""
    return _buffers(
        pattern, member, pieces, reduced, keeps_through(pattern, member, pieces, reduced)
    )


def keeps_through(pattern: Pattern, member: int, pieces: Sequence[Piece], reduced: bool) -> bool:
    """Whether ``member``'s kept piece should pass through the alltoallv (the backend copies
    it) rather than be copied beside it: when that makes a buffer a plain view (a kept row
    slab between two sent ones). Never with a reduction: kept partial sums are combined."""
    if reduced or not any(p.source == p.destination == member for p in pieces):
        return False
    return _buffers(pattern, member, pieces, reduced, True) < _buffers(
        pattern, member, pieces, reduced, False
    )


def _buffers(
    pattern: Pattern, member: int, pieces: Sequence[Piece], reduced: bool, through: bool
) -> int:
    moving = [p for p in pieces if through or p.source != p.destination]
    sends = sorted((p for p in moving if p.source == member), key=lambda p: p.destination)
    receives = sorted((p for p in moving if p.destination == member), key=lambda p: p.source)
    packing = 0 if consecutive([p.box for p in sends], pattern.src_boxes[member]) else _sum(sends)
    direct = not reduced and consecutive([p.box for p in receives], pattern.out_boxes[member])
    return packing + (0 if direct else _sum(receives))


def budget(pattern: Pattern, member: int) -> int:
    """SPEC §6's bound on what ``member`` may hold besides ``src`` and ``out``: the larger
    of its two blocks."""
    return max(volume(pattern.src_boxes[member]), volume(pattern.out_boxes[member]))


@lru_cache(maxsize=256)
def exchange_rounds(pattern: Pattern, reduced: bool) -> tuple[tuple[Piece, ...], ...]:
    """The pattern's pieces split into the rounds (alltoallv calls) of an AllToAllV, so
    that no member's buffers in a round exceed its :func:`budget`.

    One round when one call fits. Otherwise the pieces, in (source, destination) order,
    go first-fit into rounds where neither end's sent plus received elements pass its
    budget (an upper bound on the round's buffers); a piece alone always fits, since it
    is part of its source's src block and of its destination's out block. A piece's
    round is never earlier than that of a piece from a lower source to the same
    destination (the kept piece included), so combining partial sums round by round, in
    source order, combines each region in source order: replicas stay bitwise equal.
    A pure function of the pattern: every member computes the same rounds.
    """
    members = range(len(pattern.group))
    if all(
        call_buffers(pattern, m, pattern.pieces, reduced) <= budget(pattern, m) for m in members
    ):
        return (pattern.pieces,)
    rounds: list[list[Piece]] = []
    load: list[dict[int, int]] = []  # per round: elements sent plus received per member
    earliest = dict.fromkeys(members, 0)  # per destination: the round of its last piece
    for piece in pattern.pieces:
        size = 0 if piece.source == piece.destination else volume(piece.box)
        ends = {piece.source, piece.destination}
        r = earliest[piece.destination]
        while r < len(rounds) and any(load[r].get(m, 0) + size > budget(pattern, m) for m in ends):
            r += 1
        if r == len(rounds):
            rounds.append([])
            load.append({})
        rounds[r].append(piece)
        for m in ends:
            load[r][m] = load[r].get(m, 0) + size
        earliest[piece.destination] = r
    return tuple(tuple(pieces) for pieces in rounds)


def _sum(pieces: Sequence[Piece]) -> int:
    return sum(volume(p.box) for p in pieces)
