"""The piece pattern of an AllToAllV: which boxes one member sends and receives.

:func:`member_exchange` is one member's part of the exchange an ``AllToAllV``
performs: which boxes it sends to which member and receives from which. It is
a pure function of the two shardings, the two global shapes, the team and the
member's own coordinates (SPMD: linear in its own pieces, not in the group),
and every member applies the same rule, so a sender and its receiver agree on
every piece; it needs neither torch nor a running world (:func:`group_pieces`
gathers a group's pieces for the traffic picture and static traffic). The boxes
are those of :mod:`hostir.analysis.boxes`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter

from hostir.analysis.boxes import (
    Box,
    Operand,
    _box,
    _cells,
    _DimBlocks,
    _layout,
    _overlapping,
    print_box,
    volume,
)
from hostir.errors import EvaluationError
from hostir.ir.mesh import MeshAxis
from hostir.ir.sharding import print_sharding_dims
from hostir.ir.team import Team


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
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        # Hashed once: the planner's caches key on exchanges of hundreds of pieces, and a
        # frozen dataclass would hash every piece again on every lookup.
        if not self._hash:
            fields = (self.member, self.group_size, self.src_box, self.out_box, self.sends)
            object.__setattr__(self, "_hash", hash((*fields, self.receives, self.communicates)))
        return self._hash


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
    got = _received(roles, mesh.shape, coords, out_box)
    sent = _sent(roles, mesh.shape, coords, src_box, member)
    receives = tuple(Piece(source, member, box) for source, box in got)
    sends = tuple(Piece(member, destination, box) for destination, box in sent)
    return Exchange(member, roles.group_size, src_box, out_box, sends, receives, roles.communicates)


def _received(roles: _Roles, shape: Sequence[int], coords: tuple[int, ...], out_box: Box) -> list:
    """(source member, box) per piece the member at ``coords`` (out block ``out_box``)
    receives, in source order (a stable sort: :func:`_sources`' order among pieces from
    one member)."""
    found = [
        (_linear(h, roles.team, shape), box) for h, box in _sources(roles, shape, coords, out_box)
    ]
    return sorted(found, key=itemgetter(0))


def _sent(
    roles: _Roles, shape: Sequence[int], coords: tuple[int, ...], src_box: Box, member: int
) -> list:
    """(destination member, box) per piece the member at ``coords`` (position ``member``,
    src block ``src_box``) sends, in destination order (a stable sort of :func:`_sends`)."""
    found = list(_sends(roles, shape, coords, src_box, member))
    return sorted(found, key=itemgetter(0))


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
        for digits, common in _overlapping(blocks, interval):
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


def _sources(roles: _Roles, shape: Sequence[int], coords: tuple[int, ...], out_box: Box):
    """(coordinates of the member it comes from, box) per piece the member at ``coords``
    receives (:func:`_received`); ``coords`` itself for the piece it keeps."""
    reduced_values = _values(roles.reduced, tuple(shape))
    replica = None  # the replica rule's free coordinates, once a piece comes from another
    for pairs, box in _cells(roles.src_layout, out_box, roles.outside, coords):
        cell = list(coords)
        for m, c in pairs:
            cell[m] = c
        for values in reduced_values:
            for m, c in zip(roles.reduced, values, strict=True):
                cell[m] = c
            for m in roles.keyed:
                if cell[m] != coords[m]:
                    break
            else:  # in the member's own cell: the piece it keeps
                yield coords, box
                continue
            if replica is None:
                replica = _replica(roles, shape, coords, coords, +1).items()
            holder = list(cell)
            for m, c in replica:
                holder[m] = c
            yield tuple(holder), box


@lru_cache(maxsize=64)
def _values(dims: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every combination of coordinates on the mesh dims ``dims``; cached: asked once per
    member."""
    return tuple(itertools.product(*(range(shape[m]) for m in dims)))


def _sends(roles: _Roles, shape: Sequence[int], coords: tuple[int, ...], src_box: Box, member: int):
    """(destination member, box) per piece the member at ``coords`` sends: to each member
    whose out block overlaps its src block and that takes this cell's piece from it
    (itself, or by the rule of :func:`_replica`)."""
    fixed = set(roles.outside) | set(roles.kept)  # a receiver agrees with its source there
    out_dims = {m for blocks in roles.out_layout for m in blocks.dims}
    open_dims = [m for m in roles.keyed if m not in out_dims and m not in fixed]
    open_values = list(itertools.product(*(range(shape[m]) for m in open_dims)))
    keyed, own = roles.keyed, [coords[m] for m in roles.keyed]
    for base, box in _overlaps(roles.out_layout, src_box, coords, fixed):
        for values in open_values:
            destination = list(base)
            for m, c in zip(open_dims, values, strict=True):
                destination[m] = c
            if [destination[m] for m in keyed] == own:
                if destination == list(coords):  # in this cell: only itself takes from it
                    yield member, box
                continue
            if roles.free:  # the receiver's free coordinates that make this its replica
                wanted = _replica(roles, shape, coords, destination, -1)
                if any(m in out_dims and destination[m] != c for m, c in wanted.items()):
                    continue
                for m, c in wanted.items():
                    destination[m] = c
            yield _linear(destination, roles.team, shape), box


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
    return out_box, sum(volume(box) for _, box in _sources(roles, team.mesh.shape, coords, out_box))


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
