"""Members' profiles: what an AllToAllV member's buffers depend on, for the planner.

A :func:`profile` is a member's exchange (:mod:`hostir.analysis.member_exchanges`) with
the blocks at the origin and the members reduced to "itself" or "another"; members with
equal profiles hold equal buffers in every number of rounds. :func:`member_profiles`
lists the distinct ones of an exchange, :func:`busiest_member_profile` the one of the
member that receives the most (:func:`most_received`), without listing every member's
pieces where the mesh is large.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from hostir.analysis.boxes import (
    Box,
    Operand,
    _box,
    _boxes,
    _DimBlocks,
    _members,
    first_positions,
    grid_starts,
    intersect,
    least_kept,
    paired_starts,
)
from hostir.analysis.member_exchanges import (
    Exchange,
    Piece,
    _check_coverage,
    _linear,
    _received,
    _Roles,
    _roles,
    _sent,
    _sources,
    member_exchange,
)
from hostir.ir.team import Team


def profile(exchange: Exchange) -> Exchange:
    """``exchange`` with what its buffers do not depend on taken out: blocks at the
    origin, pieces relative to them, members reduced to "itself" (0) or "another" (1).
    Members with equal profiles hold equal buffers in every number of rounds, so the
    planner costs each profile once (on a regular mesh, few)."""
    member = exchange.member
    # One relative piece per distinct (flags, box): a member sends its block whole to
    # many members, and shifting and building each piece once costs less.
    pieces: dict[tuple, Piece] = {}

    def relative(pieces_of: tuple[Piece, ...], origin: tuple[int, ...]) -> tuple[Piece, ...]:
        found = []
        for p in pieces_of:
            key = (p.source != member, p.destination != member, p.box, origin)
            piece = pieces.get(key)
            if piece is None:
                piece = pieces[key] = Piece(int(key[0]), int(key[1]), _from(p.box, origin))
            found.append(piece)
        return tuple(found)

    sends = relative(exchange.sends, tuple(o for o, _ in exchange.src_box))
    receives = relative(exchange.receives, tuple(o for o, _ in exchange.out_box))
    origin_src = tuple((0, e) for _, e in exchange.src_box)
    origin_out = tuple((0, e) for _, e in exchange.out_box)
    return Exchange(0, 0, origin_src, origin_out, sends, receives, exchange.communicates)


def member_profile(roles: _Roles, shape: tuple[int, ...], coords: tuple[int, ...]) -> Exchange:
    """:func:`profile` of the :func:`~hostir.analysis.member_exchanges.member_exchange` of
    the member at ``coords`` (of an exchange with ``roles``, on a mesh of ``shape``), built
    from the same (peer, box) lists without the absolute pieces in between: the planner
    builds one per class of members (:func:`member_profiles`), some hundred pieces each
    on a large mesh. One object per distinct relative piece: a member most often sends its
    block whole to many others, and the buffers' costing looks pieces up by object.
    ``tests/lowering/test_exchange_profiles.py`` checks it against :func:`profile` on every
    member of every sweep exchange."""
    member = _linear(coords, roles.team, shape)
    src_box, out_box = _box(roles.src_layout, coords), _box(roles.out_layout, coords)
    got = _received(roles, shape, coords, out_box)
    sent = _sent(roles, shape, coords, src_box, member)
    return Exchange(
        0,
        0,
        tuple((0, e) for _, e in src_box),
        tuple((0, e) for _, e in out_box),
        _relative(sent, member, src_box, sending=True),
        _relative(got, member, out_box, sending=False),
        roles.communicates,
    )


def _relative(
    found: list[tuple[int, Box]], member: int, block: Box, sending: bool
) -> tuple[Piece, ...]:
    """:func:`profile`'s pieces of ``found`` ((peer, box) in order) of a member whose block
    on this side is ``block``: boxes shifted to its origin, the peer 0 where it is the
    member itself, else 1."""
    pieces: dict[tuple[bool, Box], Piece] = {}
    every = []
    for peer, box in found:
        key = (peer != member, box)
        piece = pieces.get(key)
        if piece is None:
            other, shifted = int(key[0]), _shifted(box, block)
            piece = Piece(0, other, shifted) if sending else Piece(other, 0, shifted)
            pieces[key] = piece
        every.append(piece)
    return tuple(every)


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
    if by_coordinates:
        if limit is not None and int(_received_counts(roles, mesh.shape).sum()) > limit:
            return None
        if roles.uncoverable:  # what the first member whose group lacks a source raises
            for rank in dict.fromkeys(min(team.group_of(r)) for r in mesh.devices):
                _check_coverage(src, out, team, rank, roles)
        return tuple(dict.fromkeys(_every_profile(roles, team)))
    first = _class_members(roles, mesh.shape, _swept(roles))
    if limit is not None and int(_received_counts(roles, mesh.shape)[first].sum()) > limit:
        return None
    if roles.uncoverable:  # what member_exchange raises for the first member lacking a source
        for i in first:
            _check_coverage(src, out, team, mesh.devices[i], roles)
    everyone = _members(mesh)
    return tuple(dict.fromkeys(member_profile(roles, mesh.shape, everyone[i][1]) for i in first))


def _swept(roles: _Roles) -> list[int]:
    """The axes whose coordinates a member that keeps a piece has in its class
    (:func:`_profile_key`): the reduced ones and the keyed ones its sends run over."""
    out_dims = {m for blocks in roles.out_layout for m in blocks.dims}
    return sorted({*roles.reduced, *(m for m in roles.keyed if m not in out_dims)})


def _class_members(roles: _Roles, shape: tuple[int, ...], swept: list[int]) -> list[int]:
    """The position in device order of the first member of each class of
    :func:`_profile_key`, in that order. The key is integer arithmetic on the member's
    block offsets and a few coordinates, and each dim's offsets depend only on the mesh
    dims placing it (:func:`~hostir.analysis.boxes.grid_starts`), so the key's fields are
    computed for the whole mesh at once, as int64 columns broadcast over its grid, and
    ``torch.unique`` finds the classes: a few tensor operations, not a Python key per
    member (that walk cost some 40 ms on 4096 devices). Each field is as
    :func:`_profile_key` computes it, with a flag column wherever the key leaves a
    field out (``_within``'s empty tuple, the offsets and swept coordinates of a member
    that keeps nothing), so equal rows are equal keys.
    ``tests/lowering/test_plan_classes.py`` checks it against a walk of every member."""
    columns = []
    overlaps = torch.ones(shape, dtype=torch.bool)
    offsets = []
    for mine, theirs, s_off, o_off in paired_starts(roles.src_layout, roles.out_layout, shape):
        s_off, o_off = s_off.expand(shape), o_off.expand(shape)
        columns += _within_columns(o_off, theirs.local, mine)
        columns += _within_columns(s_off, mine.local, theirs)
        high = torch.minimum(s_off + mine.local, o_off + theirs.local)
        overlaps = overlaps & (high > torch.maximum(s_off, o_off))
        offsets.append(s_off - o_off)
    for m in swept:
        view = [1] * len(shape)
        view[m] = shape[m]
        offsets.append(torch.arange(shape[m], dtype=torch.int64).view(view).expand(shape))
    columns.append(overlaps.to(torch.int64))
    columns += [torch.where(overlaps, field, 0) for field in offsets]
    return first_positions([c.reshape(-1) for c in columns])


def _within_columns(offset: torch.Tensor, extent: int, blocks: _DimBlocks) -> list[torch.Tensor]:
    """:func:`_within` of every member's interval ``[offset, offset + extent)`` as three
    columns: whether it spans blocks, and where so its offset modulo their local extent
    and its carry into their mesh digits (0 where not: the flag tells)."""
    start = offset % blocks.local
    spans = start + extent > blocks.local
    carry = (offset // blocks.local) % math.prod(blocks.sizes[1:])
    return [spans.to(torch.int64), torch.where(spans, start, 0), torch.where(spans, carry, 0)]


def _received_count(roles: _Roles, out_box: Box) -> int:
    """How many pieces the member whose out block is ``out_box`` receives
    (:func:`_sources`; where its group lacks a source, at least that many, and listing
    raises): per dim the src blocks its out interval overlaps, times the reduced copies;
    from geometry alone."""
    count = roles.reduced_count
    for blocks, (start, extent) in zip(roles.src_layout, out_box, strict=True):
        count *= (start + extent - 1) // blocks.local - start // blocks.local + 1
    return count


def _received_counts(roles: _Roles, shape: tuple[int, ...]) -> torch.Tensor:
    """:func:`_received_count` of every member of a mesh of ``shape``, in device order:
    per dim the src blocks each member's out interval overlaps, broadcast over the grid
    (:func:`~hostir.analysis.boxes.grid_starts`) and multiplied, not a box per member."""
    count = torch.full((1,) * len(shape), roles.reduced_count, dtype=torch.int64)
    for blocks, start, out_blocks in zip(
        roles.src_layout, grid_starts(roles.out_layout, shape), roles.out_layout, strict=True
    ):
        count = count * ((start + out_blocks.local - 1) // blocks.local - start // blocks.local + 1)
    return count.expand(shape).reshape(-1)


def _every_profile(roles: _Roles, team: Team) -> list[Exchange]:
    """Every member's :func:`profile` (that of its :func:`member_exchange`), in the mesh's
    device order, from the receiving side alone: each member's receives
    (:func:`_sources`) are linear in its own pieces, and its sends are the pieces the
    others receive from it, so the work is linear in the pieces of the whole mesh.
    :func:`~hostir.analysis.member_exchanges._sends` instead tries every member whose out
    block overlaps the sender's src block and keeps those it serves: as many tries per
    member as there are replicas times its pieces. The two sides agree piece by piece
    (every member applies the rule of :func:`member_exchange`), and a member sends at most
    one piece to each destination (the pieces a destination receives come from distinct
    cells, so from distinct members), so sorting by destination gives the same order;
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
    pieces: dict[tuple, Piece] = {}  # one object per distinct relative piece: most repeat
    for coords, out_box in zip(everyone, _boxes(roles.out_layout, shape), strict=True):
        member = member_of[coords]
        got = []
        for holder, box in _sources(roles, shape, coords, out_box):
            source = member_of[holder]
            other = int(source != member)
            key = (other, 0, _shifted(box, out_box))
            got.append((source, pieces.get(key) or pieces.setdefault(key, Piece(*key))))
            key = (0, other, _shifted(box, src_of[holder]))
            sends[holder].append((member, pieces.get(key) or pieces.setdefault(key, Piece(*key))))
        receives[coords] = got
    origin_src = tuple((0, e) for _, e in src_of[everyone[0]])
    origin_out = tuple((0, e) for _, e in _box(roles.out_layout, everyone[0]))

    def in_order(found: list[tuple[int, Piece]]) -> tuple[Piece, ...]:
        if len(found) < 2:
            return tuple(p for _, p in found)
        return tuple(p for _, p in sorted(found, key=lambda mp: mp[0]))

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


def _from(box: Box, origin: tuple[int, ...]) -> Box:
    """``box`` relative to ``origin`` (a block's offsets)."""
    return tuple([(o - b, e) for (o, e), b in zip(box, origin, strict=True)])


def _shifted(box: Box, block: Box) -> Box:
    """``box`` relative to ``block``'s origin."""
    return tuple([(o - b, e) for (o, e), (b, _) in zip(box, block, strict=True)])


def busiest_member_profile(
    src: Operand, out: Operand, team: Team, reduced: bool, limit: int | None = None
) -> tuple[Exchange, ...]:
    """The :func:`profile` of one member alone, the one that receives the most
    (:func:`most_received`'s measure): the rounds it needs
    (:func:`~hostir.analysis.exchange_buffers.rounds_needed`) are no more than all members
    need, a lower bound the planner gets from one member's pieces.
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
    the planner asks for both. Received: the out block once per reduced copy, less what
    the member keeps (:func:`~hostir.analysis.boxes.least_kept`, from per-dim overlaps;
    blocks are even, so every out block has the same volume)."""
    roles = _roles(src, out, team, reduced)
    mesh = team.mesh
    copies = math.prod(mesh.shape[m] for m in roles.reduced)
    kept, position = least_kept(roles.src_layout, roles.out_layout, mesh.shape)
    out_volume = math.prod(blocks.local for blocks in roles.out_layout)
    return copies * out_volume - kept, mesh.devices[position]


def _profile_key(
    roles: _Roles, coords: tuple[int, ...], src_box: Box, out_box: Box, swept: list[int]
) -> tuple:
    """What a member's profile depends on (members with equal keys have equal profiles;
    ``tests/lowering/test_exchange_profiles.py`` checks it on every member of every
    exchange between the sweep's distributions). :func:`_class_members` computes its
    fields for the whole mesh at once; this per-member form is the reference
    ``tests/lowering/test_plan_classes.py`` checks that against.
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
