"""The checks of a collective's arguments, made before anything is posted: a group's
members, a position in a group, a tensor's shape and dtype. Each raises a
:class:`~hostir.errors.CommunicationError` naming the collective and its group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hostir.comm.backend_hooks import Group
from hostir.comm.rank_text import describe_group
from hostir.errors import CommunicationError

_CHECKED: dict[tuple[Group, int], bool] = {}
"""Groups (with their world size) found good already: each collective of a program posts
on one of a few groups, and a simulated world's ranks all post in one process."""
MAX_CHECKED = 4096


def _check_members(group: Sequence[int], world_size: int, what: str) -> Group:
    """``group`` as a tuple after checking it is non-empty, duplicate-free and in the world."""
    if type(group) is tuple and (group, world_size) in _CHECKED:
        return group
    team = tuple(int(r) for r in group)
    if not team:
        raise CommunicationError(f"{what}: the group is empty")
    if len(set(team)) != len(team):
        raise CommunicationError(f"{what}: group {describe_group(team)} lists a rank twice")
    outside = [r for r in team if not 0 <= r < world_size]
    if outside:
        raise CommunicationError(
            f"{what}: group {describe_group(team)} names rank {outside[0]}, but the world has"
            f" {world_size} ranks"
        )
    if len(_CHECKED) < MAX_CHECKED:
        _CHECKED[(team, world_size)] = True
    return team


def _check_position(team: Group, position: int, name: str, what: str) -> None:
    if not 0 <= position < len(team):
        raise CommunicationError(
            f"{what} over {describe_group(team)}: {name} position {position} is outside"
            f" 0..{len(team) - 1}"
        )


def _expect(
    tensor: Any,
    shape: tuple[int, ...] | None,
    dtype: torch.dtype | None,
    where: str,
    name: str,
) -> None:
    """Raises unless ``tensor`` is a tensor of ``shape`` and ``dtype`` (None: any)."""
    if not isinstance(tensor, torch.Tensor):
        raise CommunicationError(f"{where}: {name} must be a tensor on this rank, got {tensor!r}")
    if shape is not None and tuple(tensor.shape) != shape:
        raise CommunicationError(
            f"{where}: {name} has shape {list(tensor.shape)}, expected {list(shape)}"
        )
    if dtype is not None and tensor.dtype != dtype:
        raise CommunicationError(f"{where}: {name} has dtype {tensor.dtype}, expected {dtype}")
