"""Block layouts as boxes of the global tensor, and the piece pattern of an AllToAllV.

A value is laid out in *blocks* when every sharded dim lists its mesh axes
first (outer first) and then its local extent (``{0: [y, x, 4]}``); a dim
without a mesh axis is whole. A rank's block is then a box of the global
tensor: per dim, ``offset = (linear index of the rank's coordinates over the
dim's mesh axes, outer first) * local extent`` and ``extent = local extent``.

:func:`member_exchange` is one member's part of the exchange an ``AllToAllV``
performs: which boxes it sends to which member and receives from which. It is
a pure function of the two shardings, the two global shapes, the team and the
member's own coordinates (SPMD: linear in its own pieces, not in the group),
and every member applies the same rule, so a sender and its receiver agree on
every piece; it needs neither torch nor a running world (:func:`group_pieces`
gathers a group's pieces for the traffic picture and static traffic).
:func:`exchange_rounds` cuts the exchange into ``rounds`` calls, and
:func:`rounds_needed` finds the fewest that keep every member's buffers within
its bound.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hostir.errors import EvaluationError
from hostir.ir.mesh import Mesh, MeshAxis
from hostir.ir.scalars import Const
from hostir.ir.sharding import Sharding, print_sharding_dims
from hostir.ir.team import Team

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
class Exchange:
    """One member's part of an AllToAllV: its ``src`` and ``out`` boxes, the pieces it
    sends (in destination order) and receives (in source order). The piece it keeps
    (source and destination itself) is in both. ``communicates`` says whether any
    member of the group moves data (the same on every member)."""

    member: int
    group_size: int
    src_box: Box
    out_box: Box
    sends: tuple[Piece, ...]
    receives: tuple[Piece, ...]
    communicates: bool


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


@dataclass(frozen=True)
class _Roles:
    """The parts every member of an exchange plays alike: per dim, the mesh dims (outer
    first) and local extent of ``src``'s and ``out``'s blocks; the team's mesh dims
    (in team order: a member's position is its linear index over them), those that
    key a source *cell* (shard ``src``, are reduced or stay partial: the members of a
    cell hold the same values), the *free* ones (the others: replicas differ there),
    the reduced ones, the ones that stay partial, and those outside the team; the
    group's size, the number of replicas of a cell (members differing on the free
    axes) and the number of partial copies reduced."""

    src_layout: tuple[_DimBlocks, ...]
    out_layout: tuple[_DimBlocks, ...]
    team: tuple[int, ...]
    keyed: tuple[int, ...]
    free: tuple[int, ...]
    reduced: tuple[int, ...]
    kept: tuple[int, ...]
    outside: tuple[int, ...]
    communicates: bool
    uncoverable: bool
    group_size: int
    free_count: int
    reduced_count: int


def member_exchange(src: Operand, out: Operand, team: Team, rank: int, reduced: bool) -> Exchange:
    """What ``rank`` sends and receives in an AllToAllV from ``src`` to ``out`` over
    ``team``, computed from its own coordinates alone (the work is linear in its own
    pieces, not in the group's size).

    Members with the same coordinates on the *keyed* team axes (those that shard
    ``src``, are reduced, or stay partial) form a *cell* and hold the same values. The
    piece from a cell to member d is ``box(src, cell) ∩ box(out, d)`` when not empty
    (on axes that stay partial, the cell agrees with d). It comes from d itself when d
    is in the cell; otherwise from the replica whose linear index on the free team axes
    is (d's index there + d's index on the keyed axes) mod their size, so destinations
    spread over the replicas. Every member computes the same rule, so a sender and its
    receiver agree on every piece. ``reduced``: the instruction has an ``op``.

    Raises :class:`EvaluationError` when the layouts are not blocks, ``out`` is partial
    where ``src`` is not, partial sums would be left unreduced, or the team cannot
    cover some member's ``out`` block (every member raises alike).
    """
    roles = _roles(src, out, team, reduced)
    if team.mesh.coordinates(rank) is None:
        raise EvaluationError(f"AllToAllV: rank {rank} is not on the team's mesh {team.mesh}")
    if roles.uncoverable:
        _check_coverage(src, out, team, rank, roles)
    return _member_exchange(src, out, team, rank, roles)


@lru_cache(maxsize=8192)
def _member_exchange(src: Operand, out: Operand, team: Team, rank: int, roles: _Roles) -> Exchange:
    mesh = team.mesh
    coords = mesh.coordinates(rank)
    member = _linear(coords, roles.team, mesh.shape)
    src_box = _box(roles.src_layout, coords)
    out_box = _box(roles.out_layout, coords)
    receives = sorted(_receives(roles, team, coords, out_box, member), key=lambda p: p.source)
    sends = sorted(_sends(roles, team, coords, src_box, member), key=lambda p: p.destination)
    return Exchange(
        member,
        roles.group_size,
        src_box,
        out_box,
        tuple(sends),
        tuple(receives),
        roles.communicates,
    )


def _box(layout: tuple[_DimBlocks, ...], coords: Sequence[int]) -> Box:
    return tuple((blocks.index(coords) * blocks.local, blocks.local) for blocks in layout)


@lru_cache(maxsize=256)
def _boxes(layout: tuple[_DimBlocks, ...], shape: tuple[int, ...]) -> tuple[Box, ...]:
    """Every member's :func:`_box` on a mesh of ``shape``, in device order; cached: the
    planner walks a mesh's blocks several times per exchange."""
    return tuple(_box(layout, coords) for coords in itertools.product(*map(range, shape)))


@lru_cache(maxsize=32)
def _members(mesh: Mesh) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(rank, coordinates) of every device of ``mesh``, in device order (row-major
    coordinates, as :attr:`Mesh.devices` lists them); cached as :func:`_boxes` is."""
    return tuple(zip(mesh.devices, itertools.product(*map(range, mesh.shape)), strict=True))


def _linear(coords: Sequence[int], dims: Sequence[int], shape: Sequence[int]) -> int:
    index = 0
    for m in dims:
        index = index * shape[m] + coords[m]
    return index


def _unlinear(index: int, dims: Sequence[int], shape: Sequence[int]) -> dict[int, int]:
    found = {}
    for m in reversed(dims):
        found[m] = index % shape[m]
        index //= shape[m]
    return found


def _replica(
    roles: _Roles, shape: Sequence[int], free_of: Sequence[int], receiver: Sequence[int], sign: int
) -> dict[int, int]:
    """The replica rule, both ways. A receiver outside a cell takes the cell's piece from
    the replica whose free-axes index is the receiver's own shifted by the receiver's
    keyed index (so receivers spread over the replicas). With ``sign`` +1 and
    ``free_of`` the receiver: the sender's free coordinates; with -1 and ``free_of``
    the sender: the free coordinates of the receivers it serves."""
    shift = _linear(receiver, roles.keyed, shape)
    index = (_linear(free_of, roles.free, shape) + sign * shift) % roles.free_count
    return _unlinear(index, roles.free, shape)


def _overlaps(layout, box: Box, coords: Sequence[int], fixed: set[int]):
    """Per combination of blocks of ``layout`` overlapping ``box`` (one per dim, only
    those agreeing with ``coords`` on the mesh dims in ``fixed``): ``coords`` with the
    blocks' mesh coordinates put in, and the common box."""
    per_dim = []
    for blocks, interval in zip(layout, box, strict=True):
        options = []
        checked = not fixed.isdisjoint(blocks.dims)  # most often none of its dims is fixed
        for digits, common in blocks.overlapping(interval):
            pairs = tuple(zip(blocks.dims, digits, strict=True))
            if not checked or all(coords[m] == c for m, c in pairs if m in fixed):
                options.append((pairs, common))
        per_dim.append(options)
    for combo in itertools.product(*per_dim):
        placed = list(coords)
        for pairs, _ in combo:
            for m, c in pairs:
                placed[m] = c
        yield placed, tuple(common for _, common in combo)


def _receives(roles: _Roles, team: Team, coords: tuple[int, ...], out_box: Box, member: int):
    """The pieces the member at ``coords`` receives: one per source block overlapping its
    out block (members of a group share the coordinates outside the team) and per
    coordinate of the reduced axes."""
    shape = team.mesh.shape
    for holder, box in _sources(roles, shape, coords, out_box):
        yield Piece(_linear(holder, roles.team, shape), member, box)


def _sources(roles: _Roles, shape: Sequence[int], coords: tuple[int, ...], out_box: Box):
    """(coordinates of the member it comes from, box) per piece the member at ``coords``
    receives (:func:`_receives`); ``coords`` itself for the piece it keeps."""
    reduced_values = list(itertools.product(*(range(shape[m]) for m in roles.reduced)))
    replica = _replica(roles, shape, coords, coords, +1).items()
    for cell, box in _overlaps(roles.src_layout, out_box, coords, set(roles.outside)):
        for values in reduced_values:
            for m, c in zip(roles.reduced, values, strict=True):
                cell[m] = c
            if all(cell[m] == coords[m] for m in roles.keyed):
                yield coords, box
                continue
            holder = list(cell)
            for m, c in replica:
                holder[m] = c
            yield tuple(holder), box


def _sends(roles: _Roles, team: Team, coords: tuple[int, ...], src_box: Box, member: int):
    """The pieces the member at ``coords`` sends: to each member whose out block overlaps
    its src block and that takes this cell's piece from it (itself, or by the rule of
    :func:`_replica`)."""
    mesh = team.mesh
    shape = mesh.shape
    fixed = set(roles.outside) | set(roles.kept)  # a receiver agrees with its source there
    out_dims = {m for blocks in roles.out_layout for m in blocks.dims}
    open_dims = [m for m in roles.keyed if m not in out_dims and m not in fixed]
    open_values = list(itertools.product(*(range(shape[m]) for m in open_dims)))
    for base, box in _overlaps(roles.out_layout, src_box, coords, fixed):
        for values in open_values:
            destination = list(base)
            for m, c in zip(open_dims, values, strict=True):
                destination[m] = c
            if all(destination[m] == coords[m] for m in roles.keyed):
                if destination == list(coords):  # in this cell: only itself takes from it
                    yield Piece(member, member, box)
                continue
            # The receiver's free coordinates that make this member its replica.
            wanted = _replica(roles, shape, coords, destination, -1)
            if any(m in out_dims and destination[m] != c for m, c in wanted.items()):
                continue
            for m, c in wanted.items():
                destination[m] = c
            yield Piece(member, _linear(destination, roles.team, shape), box)


@lru_cache(maxsize=256)
def _roles(src: Operand, out: Operand, team: Team, reduced: bool) -> _Roles:
    """The roles of the mesh's axes in an exchange; raises what every member would."""
    mesh = team.mesh
    for operand in (src, out):
        if operand.sharding.mesh != mesh:
            raise EvaluationError(
                f"AllToAllV: {operand.name} lives on mesh {operand.sharding.mesh}, but the"
                f" team {team} is on mesh {mesh}; AllToAllV moves data within one mesh"
            )
    reduced_axes = _reduced_axes(src, out, team, reduced)
    src_layout, out_layout = _layout(src, mesh), _layout(out, mesh)
    nd = mesh.ndim
    team_dims = [a.dim(nd) for a in team.axes]
    sharding = {m for blocks in src_layout for m in blocks.dims}
    reduced_dims = {a.dim(nd) for a in reduced_axes}
    kept = {p.axis.dim(nd) for p in out.sharding.partial}
    keyed = tuple(m for m in team_dims if m in sharding | reduced_dims | kept)
    outside = tuple(m for m in range(nd) if m not in team_dims)
    return _Roles(
        src_layout=src_layout,
        out_layout=out_layout,
        keyed=keyed,
        team=tuple(team_dims),
        free=tuple(m for m in team_dims if m not in keyed),
        reduced=tuple(m for m in team_dims if m in reduced_dims),
        kept=tuple(m for m in team_dims if m in kept),
        outside=outside,
        communicates=_moves(src_layout, out_layout, mesh.shape, reduced_dims),
        uncoverable=_uncoverable(src_layout, out_layout, mesh.shape, outside),
        group_size=math.prod(mesh.shape[m] for m in team_dims),
        free_count=math.prod(mesh.shape[m] for m in team_dims if m not in keyed),
        reduced_count=math.prod(mesh.shape[m] for m in team_dims if m in reduced_dims),
    )


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


def _moves(src_layout, out_layout, shape, reduced_dims) -> bool:
    """Whether any member receives from another: a reduced axis of more than one member,
    or a dim whose ``out`` blocks are not inside the same member's ``src`` blocks (its
    ``src`` axes, ignoring axes of size 1, are not a prefix of its ``out`` axes)."""
    if any(shape[m] > 1 for m in reduced_dims):
        return True
    for a, b in zip(src_layout, out_layout, strict=True):
        have = [m for m in a.dims if shape[m] > 1]
        want = [m for m in b.dims if shape[m] > 1]
        if want[: len(have)] != have:
            return True
    return False


def _received_volume(roles: _Roles, team: Team, rank: int) -> tuple[Box, int]:
    coords = team.mesh.coordinates(rank)
    out_box = _box(roles.out_layout, coords)
    return out_box, sum(volume(p.box) for p in _receives(roles, team, coords, out_box, 0))


def _check_coverage(src: Operand, out: Operand, team: Team, rank: int, roles: _Roles) -> None:
    """Raises, naming the first member of ``rank``'s group whose out block its sources do
    not tile once per reduced coordinate (all members of a group raise alike; groups
    are independent)."""
    copies = math.prod(team.mesh.shape[m] for m in roles.reduced)
    for member in team.group_of(rank):
        out_box, got = _received_volume(roles, team, member)
        need = volume(out_box)
        if got != copies * need:
            each = f" from each of {copies} partial copies" if copies > 1 else ""
            raise EvaluationError(
                f"AllToAllV over team {team}: the {out.name} block {print_box(out_box)} of"
                f" rank {member} needs {need} elements{each}, but the {src.name} blocks"
                f" ({print_sharding_dims(src.sharding)}) of the team's members supply"
                f" {got // copies}: the pair of layouts needs a larger team"
            )


def _uncoverable(src_layout, out_layout, shape, outside) -> bool:
    """Whether some out block may lack sources: a mesh axis outside the team (of more
    than one member) shards a ``src`` dim whose ``out`` axes do not start with the same
    axes up to it (ignoring axes of size 1); otherwise every block is covered."""
    for a, b in zip(src_layout, out_layout, strict=True):
        have = [m for m in a.dims if shape[m] > 1]
        want = [m for m in b.dims if shape[m] > 1]
        for position, m in enumerate(have):
            if m in outside and want[: position + 1] != have[: position + 1]:
                return True
    return False


def group_pieces(
    src: Operand, out: Operand, team: Team, group: Sequence[int], reduced: bool
) -> tuple[Piece, ...]:
    """Every piece of one group's exchange, in (source, destination) order: each member's
    sends (linear in the group's pieces; for pictures and static traffic)."""
    return tuple(p for rank in group for p in member_exchange(src, out, team, rank, reduced).sends)


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


def print_box(box: Box) -> str:
    """``[0:4, 2:4]``: the box as Python slices of the global tensor."""
    return "[" + ", ".join(f"{o}:{o + e}" for o, e in box) + "]"


# ----- buffers and rounds: the memory an AllToAllV holds besides src and out -----
def box_range(box: Box, block: Box) -> tuple[int, int] | None:
    """``box``'s [start, stop) in ``block``'s row-major storage if it is one contiguous
    range, else None: every dim after the last one where it is narrower than the block is
    whole (by definition of "last"), and every dim before it has extent 1."""
    # whole: the dims walked so far (the inner ones) span the block's
    start, stride, size, whole = 0, 1, 1, True
    for (offset, extent), (block_offset, full) in zip(reversed(box), reversed(block), strict=True):
        if not whole and extent != 1:
            return None
        start += (offset - block_offset) * stride
        stride, size = stride * full, size * extent
        whole = whole and extent == full
    return start, start + size


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


def call_buffers(
    exchange: Exchange, sends: Sequence[Piece], receives: Sequence[Piece], reduced: bool
) -> int:
    """Elements of the packing and receive buffers the member holds in one alltoallv call
    sending ``sends`` and receiving ``receives``: a packing buffer unless what it sends,
    in destination order, is one run of its ``src`` block, and a receive buffer unless
    (without a reduction) what it receives, in source order, is one run of its ``out``
    block. The piece it keeps goes through the call where that saves a buffer
    (:func:`keeps_through`). The handler (``hostir.run.all_to_all_v``) allocates exactly
    these."""
    return _call_buffers(exchange, _marked(sends), _marked(receives), reduced)


def keeps_through(
    exchange: Exchange, sends: Sequence[Piece], receives: Sequence[Piece], reduced: bool
) -> bool:
    """Whether the kept piece should pass through the alltoallv (the backend copies it)
    rather than be copied beside it: when that makes a buffer a plain view (a kept row
    slab between two sent ones). Never with a reduction: kept partial sums are combined."""
    return _keeps_through(exchange, _marked(sends), _marked(receives), reduced)


Marked = Sequence[tuple[bool, Box, int]]
"""Pieces as (kept: from the member to itself, box, its volume): all the buffers depend
on (the volume computed once: the planner sums it over many rounds)."""


def _marked(pieces: Sequence[Piece]) -> list[tuple[bool, Box, int]]:
    return [(p.source == p.destination, p.box, volume(p.box)) for p in pieces]


def _call_buffers(exchange: Exchange, sends: Marked, receives: Marked, reduced: bool) -> int:
    # The kept piece goes through the call where that holds less (_keeps_through).
    beside = _buffers(exchange, sends, receives, reduced, False)
    if reduced or not any(kept for kept, _, _ in sends):
        return beside
    return min(beside, _buffers(exchange, sends, receives, reduced, True))


def _keeps_through(exchange: Exchange, sends: Marked, receives: Marked, reduced: bool) -> bool:
    if reduced or not any(kept for kept, _, _ in sends):
        return False
    return _buffers(exchange, sends, receives, reduced, True) < _buffers(
        exchange, sends, receives, reduced, False
    )


def _buffers(
    exchange: Exchange, sends: Marked, receives: Marked, reduced: bool, through: bool
) -> int:
    sent = [(box, size) for kept, box, size in sends if through or not kept]
    got = [(box, size) for kept, box, size in receives if through or not kept]
    packed = consecutive([box for box, _ in sent], exchange.src_box)
    packing = 0 if packed else sum(size for _, size in sent)
    direct = not reduced and consecutive([box for box, _ in got], exchange.out_box)
    return packing + (0 if direct else sum(size for _, size in got))


def budget(exchange: Exchange) -> int:
    """SPEC §6's bound on what the member may hold besides ``src`` and ``out``: the
    larger of its two blocks."""
    return max(volume(exchange.src_box), volume(exchange.out_box))


def profile(exchange: Exchange) -> Exchange:
    """``exchange`` with what its buffers do not depend on taken out: blocks at the
    origin, pieces relative to them, members reduced to "itself" (0) or "another" (1).
    Members with equal profiles hold equal buffers in every number of rounds, so the
    planner costs each profile once (on a regular mesh, few)."""
    sends = tuple(_relative_piece(p, exchange.member, exchange.src_box) for p in exchange.sends)
    receives = tuple(
        _relative_piece(p, exchange.member, exchange.out_box) for p in exchange.receives
    )
    origin_src = tuple((0, e) for _, e in exchange.src_box)
    origin_out = tuple((0, e) for _, e in exchange.out_box)
    return Exchange(0, 0, origin_src, origin_out, sends, receives, exchange.communicates)


def member_profiles(
    src: Operand, out: Operand, team: Team, reduced: bool, limit: int | None = None
) -> tuple[Exchange, ...] | None:
    """The distinct :func:`profile`s of the members of every group, in the order of the
    first member (by rank) that has each. Where few classes of members have equal
    profiles (:func:`_profile_key`, which costs no more than the member's coordinates),
    one member per class is computed, so the work is linear in the mesh plus the pieces
    of a few members; where every member is its own class, every member's part comes
    from :func:`_every_profile`, linear in the pieces of the whole mesh. None where that
    would list more than ``limit`` received pieces (counted from block geometry first:
    :func:`_received_count`). Raises what :func:`member_exchange` raises."""
    roles = _roles(src, out, team, reduced)
    mesh = team.mesh
    placed = {m for blocks in (*roles.src_layout, *roles.out_layout) for m in blocks.dims}
    # Where replicas take turns, which receivers a member serves depends on all of its
    # team coordinates; where an axis outside the team places blocks, so does the group
    # it is in: every member is then its own class.
    by_coordinates = roles.free_count > 1 or any(
        mesh.shape[m] > 1 and m in placed for m in roles.outside
    )
    out_boxes = _boxes(roles.out_layout, mesh.shape)
    if by_coordinates:
        if limit is not None and sum(_received_count(roles, b) for b in out_boxes) > limit:
            return None
        if roles.uncoverable:  # what the first member whose group lacks a source raises
            for rank in dict.fromkeys(min(team.group_of(r)) for r in mesh.devices):
                _check_coverage(src, out, team, rank, roles)
        return tuple(dict.fromkeys(_every_profile(roles, team)))
    out_dims = {m for blocks in roles.out_layout for m in blocks.dims}
    swept = sorted({*roles.reduced, *(m for m in roles.keyed if m not in out_dims)})
    first = {}  # one member per class, the first by rank: (rank, its out box)
    for (rank, coords), src_box, out_box in zip(
        _members(mesh), _boxes(roles.src_layout, mesh.shape), out_boxes, strict=True
    ):
        first.setdefault(_profile_key(roles, coords, src_box, out_box, swept), (rank, out_box))
    if limit is not None and sum(_received_count(roles, b) for _, b in first.values()) > limit:
        return None
    found = (profile(member_exchange(src, out, team, r, reduced)) for r, _ in first.values())
    return tuple(dict.fromkeys(found))


def _received_count(roles: _Roles, out_box: Box) -> int:
    """How many pieces the member whose out block is ``out_box`` receives
    (:func:`_sources`; where its group lacks a source, at least that many, and listing
    raises): per dim the src blocks its out interval overlaps, times the reduced copies;
    from geometry alone."""
    count = roles.reduced_count
    for blocks, (start, extent) in zip(roles.src_layout, out_box, strict=True):
        count *= (start + extent - 1) // blocks.local - start // blocks.local + 1
    return count


def _every_profile(roles: _Roles, team: Team) -> list[Exchange]:
    """Every member's :func:`profile` (that of its :func:`member_exchange`), in the mesh's
    device order, from the receiving side alone: each member's receives
    (:func:`_sources`) are linear in its own pieces, and its sends are the pieces the
    others receive from it, so the work is linear in the pieces of the whole mesh.
    :func:`_sends` instead tries every member whose out block overlaps the sender's src
    block and keeps those it serves: as many tries per member as there are replicas
    times its pieces. The two sides agree piece by piece (every member applies the rule
    of :func:`member_exchange`), and a member sends at most one piece to each destination
    (the pieces a destination receives come from distinct cells, so from distinct
    members), so sorting by destination gives the same order;
    ``tests/lowering/test_exchange_profiles.py`` checks the result against
    :func:`member_exchange` on every member of every exchange between the sweep's
    distributions. The pieces are made relative as :func:`profile` makes them, without
    the absolute exchange in between."""
    mesh, shape = team.mesh, team.mesh.shape
    everyone = [coords for _, coords in _members(mesh)]
    member_of = {coords: _linear(coords, roles.team, shape) for coords in everyone}
    src_of = dict(zip(everyone, _boxes(roles.src_layout, shape), strict=True))
    # (destination or source member, relative piece) per member, to sort by member
    sends: dict[tuple[int, ...], list[tuple[int, Piece]]] = {c: [] for c in everyone}
    receives = {}
    for coords, out_box in zip(everyone, _boxes(roles.out_layout, shape), strict=True):
        member = member_of[coords]
        got = []
        for holder, box in _sources(roles, shape, coords, out_box):
            source = member_of[holder]
            other = int(source != member)
            got.append((source, Piece(other, 0, _shifted(box, out_box))))
            sends[holder].append((member, Piece(0, other, _shifted(box, src_of[holder]))))
        receives[coords] = got
    origin_src = tuple((0, e) for _, e in src_of[everyone[0]])
    origin_out = tuple((0, e) for _, e in _box(roles.out_layout, everyone[0]))

    def in_order(pieces: list[tuple[int, Piece]]) -> tuple[Piece, ...]:
        return tuple(p for _, p in sorted(pieces, key=lambda mp: mp[0]))

    return [
        Exchange(
            0,
            0,
            origin_src,
            origin_out,
            in_order(sends[coords]),
            in_order(receives[coords]),
            roles.communicates,
        )
        for coords in everyone
    ]


def _shifted(box: Box, block: Box) -> Box:
    """``box`` relative to ``block``'s origin."""
    return tuple((o - b, e) for (o, e), (b, _) in zip(box, block, strict=True))


def busiest_member_profile(
    src: Operand, out: Operand, team: Team, reduced: bool, limit: int | None = None
) -> tuple[Exchange, ...]:
    """The :func:`profile` of one member alone, the one that receives the most
    (:func:`most_received`'s measure): the rounds it needs (:func:`rounds_needed`) are no
    more than all members need, a lower bound the planner gets from one member's pieces.
    None at all where it receives more than ``limit`` pieces (:func:`_received_count`)."""
    busiest = _busiest(src, out, team, reduced)[1]
    if limit is not None:
        roles = _roles(src, out, team, reduced)
        if _received_count(roles, _box(roles.out_layout, team.mesh.coordinates(busiest))) > limit:
            return ()
    return (profile(member_exchange(src, out, team, busiest, reduced)),)


def most_received(src: Operand, out: Operand, team: Team, reduced: bool) -> int:
    """The most elements a member receives from others: its out block once per reduced
    coordinate (the sources tile it so), less the piece it keeps (its own ``src`` block
    within its ``out`` block), at most over members; linear in the mesh, no pieces.
    Raises what :func:`member_exchange` raises for the first member."""
    roles = _roles(src, out, team, reduced)  # what member_exchange raises, without its pieces
    if roles.uncoverable:
        _check_coverage(src, out, team, _members(team.mesh)[0][0], roles)
    return _busiest(src, out, team, reduced)[0]


@lru_cache(maxsize=256)
def _busiest(src: Operand, out: Operand, team: Team, reduced: bool) -> tuple[int, int]:
    """(the most elements a member receives from others, the first such member); cached:
    the planner asks for both."""
    roles = _roles(src, out, team, reduced)
    mesh = team.mesh
    copies = math.prod(mesh.shape[m] for m in roles.reduced)
    most = (0, _members(mesh)[0][0])
    for (rank, _), src_box, out_box in zip(
        _members(mesh),
        _boxes(roles.src_layout, mesh.shape),
        _boxes(roles.out_layout, mesh.shape),
        strict=True,
    ):
        kept = intersect(src_box, out_box)
        received = copies * volume(out_box) - (volume(kept) if kept else 0)
        most = (received, rank) if received > most[0] else most
    return most


def _profile_key(
    roles: _Roles, coords: tuple[int, ...], src_box: Box, out_box: Box, swept: list[int]
) -> tuple:
    """What a member's profile depends on (members with equal keys have equal profiles;
    ``tests/lowering/test_exchange_profiles.py`` checks it on every member of every
    exchange between the sweep's distributions).
    A profile is relative, so it holds of the member only the geometry of the blocks
    overlapping its two blocks (per dim, each block's offset modulo the other layout's
    block, and where the carries fall among the overlapping blocks' mesh digits, which
    orders the pieces by member) and, when the member keeps a piece of its own, where
    that piece lies in that order (its offset against the out block, and the member's
    coordinates on the ``swept`` axes: the reduced ones and those its sends run over).
    ``src_box``, ``out_box``: its blocks."""
    geometry = tuple(
        (_within(o_off, theirs.local, mine), _within(s_off, mine.local, theirs))
        for mine, theirs, (s_off, _), (o_off, _) in zip(
            roles.src_layout, roles.out_layout, src_box, out_box, strict=True
        )
    )
    if intersect(src_box, out_box) is None:
        return geometry, None
    offsets = tuple(s - o for (s, _), (o, _) in zip(src_box, out_box, strict=True))
    return geometry, offsets, tuple(coords[m] for m in swept)


def _within(offset: int, extent: int, blocks: _DimBlocks) -> tuple[int, ...]:
    """Where the interval ``[offset, offset + extent)`` of one dim lies among ``blocks``:
    its offset modulo their local extent and the carry into their mesh digits (which
    orders the pieces by member), or nothing where it lies within one block (one piece,
    the whole interval, from one block whatever its offset: a member's pieces in that dim
    are alike wherever its block lies)."""
    start = offset % blocks.local
    if start + extent <= blocks.local:
        return ()
    return start, (offset // blocks.local) % math.prod(blocks.sizes[1:])


def _relative_piece(piece: Piece, member: int, block: Box) -> Piece:
    return Piece(
        int(piece.source != member), int(piece.destination != member), _shifted(piece.box, block)
    )


ROUNDS_LIMIT = 64
"""The most rounds the planner cuts an exchange into."""

Round = tuple[tuple[Piece, ...], tuple[Piece, ...]]
"""What a member sends and receives in one alltoallv call."""


@lru_cache(maxsize=8192)
def exchange_rounds(exchange: Exchange, rounds: int) -> tuple[Round, ...]:
    """The member's part of an AllToAllV made in ``rounds`` alltoallv calls: round r moves
    part r of every piece (:func:`piece_part`). Sender and receiver cut a piece alike, and
    every contribution to a region of ``out`` (its partial copies, the kept one too)
    lies in the same round, so combining round by round in source order combines each
    region in source order: replicas stay bitwise equal."""
    if rounds == 1:
        return ((exchange.sends, exchange.receives),)
    found = []
    for r in range(rounds):
        sends = tuple(p for p in (piece_part(q, r, rounds) for q in exchange.sends) if p)
        receives = tuple(p for p in (piece_part(q, r, rounds) for q in exchange.receives) if p)
        found.append((sends, receives))
    return tuple(found)


def piece_part(piece: Piece, r: int, rounds: int) -> Piece | None:
    """Part ``r`` of ``rounds`` near-equal sub-boxes of ``piece`` (:func:`cut`); None where
    the piece has fewer parts (fewer elements than rounds)."""
    parts = cut(piece.box, rounds)
    return Piece(piece.source, piece.destination, parts[r]) if r < len(parts) else None


@lru_cache(maxsize=4096)
def cut(box: Box, parts: int) -> tuple[Box, ...]:
    """``box`` cut into ``parts`` near-equal sub-boxes in row-major order (fewer when it
    has fewer elements): its outermost dim into at most ``parts`` slabs, the parts shared
    among the slabs, each slab cut the same way along the dims after it."""
    if parts <= 1 or not box:
        return (box,)
    (offset, extent), rest = box[0], box[1:]
    slabs = min(extent, parts)
    found = []
    for i in range(slabs):
        low, high = offset + i * extent // slabs, offset + (i + 1) * extent // slabs
        share = parts * (i + 1) // slabs - parts * i // slabs
        found += [((low, high - low), *sub) for sub in cut(rest, share)]
    return tuple(found)


@lru_cache(maxsize=8192)
def round_buffers(exchange: Exchange, rounds: int, reduced: bool) -> int:
    """The most buffer elements the member holds in any of ``rounds`` rounds (the rounds of
    :func:`exchange_rounds`, cut here as bare boxes)."""
    sends = [(p.source == p.destination, _sized_parts(p.box, rounds)) for p in exchange.sends]
    receives = [(p.source == p.destination, _sized_parts(p.box, rounds)) for p in exchange.receives]
    return max(
        _call_buffers(
            exchange,
            [(kept, *parts[r]) for kept, parts in sends if r < len(parts)],
            [(kept, *parts[r]) for kept, parts in receives if r < len(parts)],
            reduced,
        )
        for r in range(rounds)
    )


@lru_cache(maxsize=4096)
def _sized_parts(box: Box, rounds: int) -> tuple[tuple[Box, int], ...]:
    """(part, its volume) of :func:`cut`'s parts of ``box``."""
    return tuple((part, volume(part)) for part in cut(box, rounds))


def rounds_needed(
    exchanges: Sequence[Exchange],
    reduced: bool,
    allowance: int | None = None,
    limit: int = ROUNDS_LIMIT,
    buffers: Callable[[Any, int, bool], int] = round_buffers,
) -> int:
    """The fewest rounds in which no member's buffers pass ``allowance`` elements (default:
    its :func:`budget`); ``exchanges``: every member's part, from every group; ``limit``
    if none up to it does. What the planner writes as the instruction's ``rounds``.
    ``buffers``: a member's buffers in a number of rounds (or an upper bound on them, for
    parts that are bounds: ``hostir.analysis.exchange_bound``)."""

    def room(e: Exchange) -> int:
        return budget(e) if allowance is None else allowance

    # A round's buffers are about 1/rounds of one call's: start there, then step up.
    one_call = max((buffers(e, 1, reduced) / max(room(e), 1) for e in exchanges), default=0)
    if one_call <= 1:
        return 1
    rounds = min(math.ceil(one_call), limit)
    while rounds < limit and any(buffers(e, rounds, reduced) > room(e) for e in exchanges):
        rounds += 1
    return rounds
