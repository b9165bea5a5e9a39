"""Rank lists in messages, short at any world size: ``rank 3``, ``ranks 0-2, 5``.

Messages must not grow with the number of devices (a 4096-rank world would
print pages of ids), so consecutive ranks collapse into ranges and at most
:data:`MAX_RANGES` ranges are written before the count of the rest.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_RANGES = 6
"""How many ranges a rank list shows before it summarizes the rest."""


def describe_ranks(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2``, ``ranks 0-3, 8-11``, or ``ranks 0, 2, 4, ... (64 ranks)``."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    ranges = _ranges(ordered)
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:MAX_RANGES]]
    text = "ranks " + ", ".join(shown)
    if len(ranges) > MAX_RANGES:
        text += f", ... ({len(ordered)} ranks)"
    return text


def _ranges(ordered: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive ranks, as (first, last)."""
    runs: list[tuple[int, int]] = []
    for rank in ordered:
        if runs and runs[-1][1] == rank - 1:
            runs[-1] = (runs[-1][0], rank)
        else:
            runs.append((rank, rank))
    return runs


def describe_group(group: tuple[int, ...] | list[int]) -> str:
    """A group in its own (team) order, short at any size: ``(3, 1, 0, 2)``,
    ``(0, 2, 4, ..., 4094) of 2048 ranks`` (a regular stride), or
    ``(5, 9, 1, 0, ..., 7, 3) of 512 ranks``."""
    members = list(group)
    if len(members) <= 2 * MAX_RANGES:
        return "(" + ", ".join(map(str, members)) + ")"
    steps = {b - a for a, b in zip(members, members[1:], strict=False)}
    if len(steps) == 1:
        head = ", ".join(map(str, members[:3]))
        return f"({head}, ..., {members[-1]}) of {len(members)} ranks"
    head = ", ".join(map(str, members[:4]))
    tail = ", ".join(map(str, members[-2:]))
    return f"({head}, ..., {tail}) of {len(members)} ranks"
