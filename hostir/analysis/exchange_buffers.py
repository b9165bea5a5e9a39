"""Buffers and rounds: the memory an AllToAllV member holds besides ``src`` and ``out``.

:func:`call_buffers` is what one alltoallv call holds (its packing and receive buffers,
none where the pieces are one contiguous run of a block), :func:`exchange_rounds` cuts
an exchange into ``rounds`` calls, and :func:`rounds_needed` finds the fewest that keep
every member's buffers within its bound (:func:`budget`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from itertools import compress
from operator import itemgetter, not_
from typing import Any

from hostir.analysis.boxes import Box, volume
from hostir.analysis.member_exchanges import Exchange, Piece


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


def consecutive(boxes: Iterable[Box], block: Box) -> bool:
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
    return [(p.source == p.destination, p.box, _volume(p.box)) for p in pieces]


@lru_cache(maxsize=8192)
def _volume(box: Box) -> int:
    """:func:`~hostir.analysis.boxes.volume`, cached: a profile's pieces repeat a few boxes,
    and the planner sizes them once per profile and number of rounds."""
    return volume(box)


def _call_buffers(exchange: Exchange, sends: Marked, receives: Marked, reduced: bool) -> int:
    # The kept piece goes through the call where that holds less (_keeps_through).
    beside = _buffers(exchange, sends, receives, reduced, False)
    if reduced or not any(map(_KEPT, sends)):
        return beside
    return min(beside, _buffers(exchange, sends, receives, reduced, True))


def _keeps_through(exchange: Exchange, sends: Marked, receives: Marked, reduced: bool) -> bool:
    if reduced or not any(map(_KEPT, sends)):
        return False
    return _buffers(exchange, sends, receives, reduced, True) < _buffers(
        exchange, sends, receives, reduced, False
    )


_KEPT, _BOX, _SIZE = itemgetter(0), itemgetter(1), itemgetter(2)


def _buffers(
    exchange: Exchange, sends: Marked, receives: Marked, reduced: bool, through: bool
) -> int:
    # The planner asks this for every profile and number of rounds, so the pieces are
    # walked in C (map, filter, compress over the Marked fields) rather than in Python
    # comprehensions; consecutive() stops at the first piece out of place (most often the
    # first or second), and a buffer's size is summed only where one is needed.
    packing = 0
    if not consecutive(_moved(sends, through, _BOX), exchange.src_box):
        packing = sum(_moved(sends, through, _SIZE))
    if not reduced and consecutive(_moved(receives, through, _BOX), exchange.out_box):
        return packing
    return packing + sum(_moved(receives, through, _SIZE))


def _moved(pieces: Marked, through: bool, field: itemgetter) -> Iterator:
    """``field`` of the pieces that pass through the call: all of them ``through``, else
    all but the kept one."""
    if through:
        return map(field, pieces)
    return compress(map(field, pieces), map(not_, map(_KEPT, pieces)))


def budget(exchange: Exchange) -> int:
    """SPEC §6's bound on what the member may hold besides ``src`` and ``out``: the
    larger of its two blocks."""
    return max(volume(exchange.src_box), volume(exchange.out_box))


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
    if rounds == 1:  # the pieces themselves (cut into one part: the box)
        return _call_buffers(exchange, _marked(exchange.sends), _marked(exchange.receives), reduced)
    sends, receives = _by_round(exchange.sends, rounds), _by_round(exchange.receives, rounds)
    return max(_call_buffers(exchange, s, g, reduced) for s, g in zip(sends, receives, strict=True))


def _by_round(pieces: Sequence[Piece], rounds: int) -> list[list[tuple[bool, Box, int]]]:
    """Per round, the :data:`Marked` parts of ``pieces`` it moves (a piece with fewer parts
    than rounds, none in the last ones), in the pieces' order."""
    # A profile holds one object per distinct piece (a block sent whole to many members
    # is one Piece), so the parts are looked up once per object (by identity: hashing a
    # Piece hashes its box).
    seen: dict[int, tuple[tuple[bool, Box, int], ...]] = {}
    every = []
    for p in pieces:
        parts = seen.get(id(p))
        if parts is None:
            parts = seen[id(p)] = _marked_parts(p.source == p.destination, p.box, rounds)
        every.append(parts)
    if set(map(len, every)) == {rounds}:  # most often: every piece in every round; in C
        return [list(row) for row in zip(*every, strict=True)]
    found: list[list[tuple[bool, Box, int]]] = [[] for _ in range(rounds)]
    for parts in every:
        # zip stops at the piece's last part: the rounds after it move none of it
        for row, marked in zip(found, parts, strict=False):
            row.append(marked)
    return found


@lru_cache(maxsize=4096)
def _marked_parts(kept: bool, box: Box, rounds: int) -> tuple[tuple[bool, Box, int], ...]:
    """(``kept``, part, its volume) of :func:`cut`'s parts of ``box``; cached: the pieces
    of a member's profile repeat a few boxes."""
    return tuple((kept, part, volume(part)) for part in cut(box, rounds))


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
