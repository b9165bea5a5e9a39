"""An upper bound on a member's AllToAllV buffers from block geometry alone, for the
planner on large meshes.

The planner costs an exchange from every member's :func:`~hostir.analysis.exchange_profiles.profile`
(:func:`~hostir.analysis.exchange_profiles.member_profiles`). Where replicas take turns every
member is its own class, and every member's pieces are listed: on 4096 devices up to
16 million of them (``S1S1 -> S0R`` on 64x64: every member receives 4096 pieces). Past
:data:`PIECES_LIMIT` pieces, :func:`member_costs` gives instead a :class:`BufferBound`
per member, no piece listed: per dim the overlap of an interval with a regular grid of
blocks has at most three extents (a first partial one, full ones, a last partial one),
so what a member receives is a handful of (extents, count) classes, and what it sends is
bounded by counting the receivers it can serve. The bound assumes no buffer is a view
(every piece is buffered), so it is at least the exact
:func:`~hostir.analysis.exchange_buffers.round_buffers` of the member in every number of rounds:
rounds chosen with it keep every member's buffers within the allowance (perhaps in more
rounds than the exact count), and the temporaries it reports are an upper bound
(``explain`` says "at most"). ``tests/lowering/test_exchange_bound.py`` checks it
against every member's exact buffers over the sweep's exchanges.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from hostir.analysis.boxes import (
    Box,
    Operand,
    _box,
    _boxes,
    _members,
    first_positions,
    intersect,
    paired_starts,
    volume,
)
from hostir.analysis.exchange_buffers import cut, round_buffers
from hostir.analysis.exchange_profiles import busiest_member_profile, member_profiles
from hostir.analysis.member_exchanges import Exchange, _check_coverage, _Roles, _roles
from hostir.ir.team import Team

PIECES_LIMIT = 2**13
"""The most pieces received (summed over the members it lists) the exact costing may list
before :func:`member_costs` bounds the buffers instead (listing and costing a piece takes
some 10 µs: about 0.1 s at the limit)."""

BUSIEST_LIMIT = 2**10
"""The most pieces received the busiest member's profile may list (:func:`busiest_costs`)."""

Classes = tuple[tuple[tuple[int, ...], int], ...]
"""(extents of a piece, how many pieces have them)."""


@dataclass(frozen=True, slots=True)
class BufferBound:
    """What bounds one member's buffers, its blocks at the origin (as in a profile): at
    most ``sends`` pieces sent to others, of ``send_volume`` elements in all, each within
    ``send_extents`` per dim; and exactly the pieces ``receives`` from others."""

    src_box: Box
    out_box: Box
    sends: int
    send_volume: int
    send_extents: tuple[int, ...]
    receives: Classes


Cost = Exchange | BufferBound
"""What the planner costs a member by: its exact profile, or a bound."""


def member_costs(src: Operand, out: Operand, team: Team, reduced: bool) -> tuple[Cost, ...]:
    """The distinct profiles of the members
    (:func:`~hostir.analysis.exchange_profiles.member_profiles`) where listing them takes
    no more than :data:`PIECES_LIMIT` pieces, else the distinct :func:`member_bound` of the
    members. Raises what ``member_exchange`` raises."""
    exact = member_profiles(src, out, team, reduced, limit=PIECES_LIMIT)
    return exact if exact is not None else buffer_bounds(src, out, team, reduced)


def busiest_costs(src: Operand, out: Operand, team: Team, reduced: bool) -> tuple[Exchange, ...]:
    """The busiest member's profile
    (:func:`~hostir.analysis.exchange_profiles.busiest_member_profile`, for the fewest
    rounds the exchange can need), or none where it receives more than
    :data:`BUSIEST_LIMIT` pieces (listing it would cost more than the bound: the fewest
    rounds are then one)."""
    return busiest_member_profile(src, out, team, reduced, limit=BUSIEST_LIMIT)


def buffers_in(cost: Cost, rounds: int, reduced: bool) -> int:
    """The member's buffers in ``rounds`` rounds: exact for a profile
    (:func:`~hostir.analysis.exchange_buffers.round_buffers`), at most :func:`bound_buffers` for a
    bound."""
    if isinstance(cost, Exchange):
        return round_buffers(cost, rounds, reduced)
    return bound_buffers(cost, rounds)


def is_bound(costs: Sequence[Cost]) -> bool:
    """Whether ``costs`` hold bounds (their buffers are upper bounds, not exact)."""
    return any(isinstance(cost, BufferBound) for cost in costs)


def buffer_bounds(src: Operand, out: Operand, team: Team, reduced: bool) -> tuple[BufferBound, ...]:
    """The distinct :func:`member_bound` of the members, in the order of the first member
    (by rank) with each; linear in the mesh, no piece listed. Raises what
    ``member_exchange`` raises (an uncovered block: what the exact costing raises)."""
    roles = _roles(src, out, team, reduced)
    shape = team.mesh.shape
    if roles.uncoverable:
        _check_covered(src, out, team, roles)
    counts = _SendCounts.of(roles, shape)
    everyone = _members(team.mesh)
    found = []
    for position in _bound_classes(roles, shape):
        coords = everyone[position][1]
        boxes = _box(roles.src_layout, coords), _box(roles.out_layout, coords)
        found.append(_member_bound(roles, counts, *boxes))
    return tuple(dict.fromkeys(found))


def _bound_classes(roles: _Roles, shape: tuple[int, ...]) -> list[int]:
    """The position in device order of the first member of each class of members with
    equal bounds, ascending. All a bound depends on: its blocks' overlaps with the other
    layout's blocks (:func:`_overlap_classes` of each dim) and the extents of the piece it
    keeps; their fields are computed for the whole mesh at once, broadcast over its grid
    (:func:`~hostir.analysis.boxes.grid_starts`), and the first member of each distinct
    row found (:func:`~hostir.analysis.boxes.first_positions`), not a key per member.
    ``tests/lowering/test_exchange_bound.py`` checks the result against every member's
    own bound."""
    columns, kept_extents = [], []
    kept = torch.ones(shape, dtype=torch.bool)
    for src_blocks, out_blocks, s_off, o_off in paired_starts(
        roles.src_layout, roles.out_layout, shape
    ):
        s_off, o_off = s_off.expand(shape), o_off.expand(shape)
        columns += _overlap_columns(o_off, out_blocks.local, src_blocks.local)
        columns += _overlap_columns(s_off, src_blocks.local, out_blocks.local)
        high = torch.minimum(s_off + src_blocks.local, o_off + out_blocks.local)
        extent = high - torch.maximum(s_off, o_off)
        kept = kept & (extent > 0)
        kept_extents.append(extent)
    columns.append(kept.to(torch.int64))
    columns += [torch.where(kept, extent, 0) for extent in kept_extents]
    return first_positions([c.reshape(-1) for c in columns])


def _overlap_columns(start: torch.Tensor, extent: int, local: int) -> list[torch.Tensor]:
    """What :func:`_overlap_classes` of every member's interval ``[start, start +
    extent)`` depends on, as columns: whether it lies in one block, and where not the
    extents of its first and last partial overlaps and the count of full ones between
    (0 where it does: the flag tells)."""
    first, last = start // local, (start + extent - 1) // local
    within = first == last
    return [
        within.to(torch.int64),
        torch.where(within, 0, (first + 1) * local - start),
        torch.where(within, 0, last - first - 1),
        torch.where(within, 0, start + extent - last * local),
    ]


def _overlaps_per_dim(box: Box, layout: Sequence) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per dim, :func:`_overlap_classes` of ``box``'s interval with ``layout``'s blocks."""
    return tuple(
        _overlap_classes(start, extent, blocks.local)
        for (start, extent), blocks in zip(box, layout, strict=True)
    )


def member_bound(src: Operand, out: Operand, team: Team, rank: int, reduced: bool) -> BufferBound:
    """The :class:`BufferBound` of ``rank``'s part of the exchange (coverage not checked:
    :func:`buffer_bounds` checks it for every member)."""
    roles = _roles(src, out, team, reduced)
    shape, coords = team.mesh.shape, team.mesh.coordinates(rank)
    boxes = _box(roles.src_layout, coords), _box(roles.out_layout, coords)
    return _member_bound(roles, _SendCounts.of(roles, shape), *boxes)


@lru_cache(maxsize=8192)
def bound_buffers(bound: BufferBound, rounds: int) -> int:
    """At least the member's buffers in any of ``rounds`` rounds, every piece buffered
    (:func:`~hostir.analysis.exchange_buffers.round_buffers` without views, its least choice for the
    kept piece: it neither sent nor received). Received: exactly, round by round, part r
    of each piece (:func:`~hostir.analysis.exchange_buffers.cut` depends on extents alone). Sent:
    at most ``send_volume``, and at most ``sends`` times the largest part of a piece of
    ``send_extents`` (the largest part grows with every extent: ``cut``'s outermost dim
    of extent e >= rounds gives slabs of at most ceil(e / rounds) rows, one part each;
    e < rounds gives rows of one, at least floor(rounds / e) parts each, and fewer parts
    make no part smaller; ``tests/lowering/test_exchange_bound.py`` checks it)."""
    widest = tuple((0, e) for e in bound.send_extents)
    largest_part = max(map(volume, cut(widest, rounds)))
    sent = max(0, min(bound.send_volume, bound.sends * largest_part))
    received = [0] * rounds
    for extents, count in bound.receives:
        for r, part in enumerate(cut(tuple((0, e) for e in extents), rounds)):
            received[r] += count * volume(part)
    return sent + max(received)


@lru_cache(maxsize=4096)
def _overlap_classes(start: int, extent: int, local: int) -> tuple[tuple[int, int], ...]:
    """(extent, count) of the overlaps of ``[start, start + extent)`` with blocks of
    ``local`` elements: a first partial one, full ones, a last partial one (equal extents
    merged)."""
    first, last = start // local, (start + extent - 1) // local
    if first == last:
        return ((extent, 1),)
    found: dict[int, int] = {}
    for size, count in (
        ((first + 1) * local - start, 1),
        (local, last - first - 1),
        (start + extent - last * local, 1),
    ):
        if count:
            found[size] = found.get(size, 0) + count
    return tuple(found.items())


@dataclass(frozen=True)
class _SendCounts:
    """What bounds the receivers a member serves, alike for every member (see
    :func:`_member_bound`): per dim, how many values the keyed team axes among ``out``'s
    block axes there take (a receiver's out block fixes them; those fixed to the sender's
    own, axes kept partial, count once); how many the keyed axes no ``out`` dim uses take
    (``open``); per dim, how many values the free team axes among them take
    (``free_per_dim``), and how many the free axes no ``out`` dim uses (``free_left``);
    how often the most frequent keyed index comes up modulo the replicas' count, over
    every keyed value (``alike``); and the most receivers it serves per out block
    (``per_block``)."""

    per_dim: tuple[int, ...]
    open: int
    free_per_dim: tuple[int, ...]
    free_left: int
    alike: int
    per_block: int

    @staticmethod
    def of(roles: _Roles, shape: Sequence[int]) -> _SendCounts:
        """The counts of the exchange ``roles`` on a mesh of ``shape``."""
        varying = set(roles.keyed) - set(roles.kept)
        out_dims = {m for blocks in roles.out_layout for m in blocks.dims}
        open_axes = [m for m in roles.keyed if m in varying and m not in out_dims]
        # A receiver's keyed index runs over the open axes' part of it (the rest is fixed by
        # its out block and the sender): how often the most frequent value mod the
        # replicas' count comes up.
        strides, stride = {}, 1
        for m in reversed(roles.keyed):
            strides[m], stride = stride, stride * shape[m]
        free_left = math.prod(shape[m] for m in roles.free if m not in out_dims)
        opened = math.prod(shape[m] for m in open_axes)
        return _SendCounts(
            per_dim=tuple(
                math.prod(shape[m] for m in blocks.dims if m in varying)
                for blocks in roles.out_layout
            ),
            open=opened,
            free_per_dim=tuple(
                math.prod(shape[m] for m in blocks.dims if m in roles.free)
                for blocks in roles.out_layout
            ),
            free_left=free_left,
            alike=_most_alike([m for m in roles.keyed if m in varying], strides, shape, roles),
            per_block=min(opened, free_left * _most_alike(open_axes, strides, shape, roles)),
        )


def _most_alike(
    axes: Sequence[int], strides: dict[int, int], shape: Sequence[int], roles: _Roles
) -> int:
    """How often the most frequent value of the part of the keyed index that ``axes`` (with
    ``strides`` in it) make comes up modulo the replicas' count, over all their values."""
    residues = Counter(
        sum(c * strides[m] for m, c in zip(axes, values, strict=True)) % roles.free_count
        for values in itertools.product(*(range(shape[m]) for m in axes))
    )
    return max(residues.values())


def _member_bound(roles: _Roles, counts: _SendCounts, src_box: Box, out_box: Box) -> BufferBound:
    """The bound of the member whose blocks are ``src_box`` and ``out_box``.

    Receives: per dim its out interval against the src blocks (every block overlapping it
    is a source, coverage checked), times the reduced copies, less the piece it keeps.

    Sends: one piece per receiver it serves, the overlap of its src block with the
    receiver's out block. Besides the piece it keeps, it serves the receivers outside its
    cell whose replica rule names it: those whose index on the free team axes plus index
    on the keyed ones is its own free index modulo the replicas' count. Two bounds:
    (1) a receiver's coordinates on the keyed axes fix those on the free ones (the free
    index runs over every residue once), so it serves at most one receiver per keyed
    value, and its own keyed value only itself (the kept piece); per dim the keyed values
    among the out blocks overlapping its src block are at most min(blocks, values of the
    dim's keyed axes), each piece at most the widest overlap, all of them at most the src
    interval. (2) Per out block, the receivers differ on the free axes no out dim uses
    (distinct free indices) and on the open keyed axes: for each free value at most as
    many receivers as open values share a residue (``per_block``), and at most one per
    open value; the pieces of the blocks tile its src block. (3) Over all those blocks,
    for each free index a receiver may have (per dim at most min(blocks, values of the
    dim's free axes), times the free axes no out dim uses) at most ``alike`` keyed values
    give the residue.
    """
    copies = roles.reduced_count
    received: dict[tuple[int, ...], int] = {}
    for combo in itertools.product(*_overlaps_per_dim(out_box, roles.src_layout)):
        extents = tuple(e for e, _ in combo)
        received[extents] = received.get(extents, 0) + copies * math.prod(c for _, c in combo)
    by_value, by_value_volume, blocks_overlapping, widest = counts.open, counts.open, 1, []
    by_free = counts.free_left * counts.alike
    for (_, extent), classes, values, free_values in zip(
        src_box,
        _overlaps_per_dim(src_box, roles.out_layout),
        counts.per_dim,
        counts.free_per_dim,
        strict=True,
    ):
        largest, overlapping = max(e for e, _ in classes), sum(c for _, c in classes)
        served = min(overlapping, values)
        by_value *= served
        by_value_volume *= min(extent, served * largest)
        blocks_overlapping *= overlapping
        by_free *= min(overlapping, free_values)
        widest.append(largest)
    kept = intersect(src_box, out_box)
    if kept is not None:  # sent to and received from itself: not buffered
        received[tuple(e for _, e in kept)] -= 1
        by_value, by_value_volume = by_value - 1, by_value_volume - volume(kept)
    return BufferBound(
        src_box=tuple((0, e) for _, e in src_box),
        out_box=tuple((0, e) for _, e in out_box),
        sends=min(by_value, counts.per_block * blocks_overlapping, by_free),
        send_volume=min(
            by_value_volume, counts.per_block * volume(src_box), by_free * math.prod(widest)
        ),
        send_extents=tuple(widest),
        receives=tuple(sorted((e, c) for e, c in received.items() if c)),
    )


def _check_covered(src: Operand, out: Operand, team: Team, roles: _Roles) -> None:
    """Raises what the exact costing raises when some member's out block lacks sources in
    its group: per dim, every src block overlapping its out interval must have the
    member's own coordinates on the axes outside the team (members of a group share
    them), which holds of a run of block indices where its digit there is one (the
    run's indices agree above it). Geometry per member, no piece listed; the message
    from the first such group (by rank), as ``member_profiles`` gives it."""
    shape = team.mesh.shape
    outside = {m for m in roles.outside if shape[m] > 1}
    failing = set()
    everyone = _members(team.mesh)
    for (_, coords), out_box in zip(everyone, _boxes(roles.out_layout, shape), strict=True):
        for blocks, (start, extent) in zip(roles.src_layout, out_box, strict=True):
            low, high = start // blocks.local, (start + extent - 1) // blocks.local
            for position, m in enumerate(blocks.dims):
                if m not in outside:
                    continue
                stride = math.prod(blocks.sizes[position + 1 :])
                digit = (low // stride) % blocks.sizes[position]
                if low // stride != high // stride or digit != coords[m]:
                    failing.add(tuple(coords[m] for m in roles.outside))
    for rank, coords in everyone:  # the exact check raises, with its message
        if tuple(coords[m] for m in roles.outside) in failing:
            _check_coverage(src, out, team, rank, roles)
