"""Device meshes and their named axes.

A :class:`Mesh` is an N-d arrangement of device ids (ranks). Its axes are named
from the innermost: ``x`` is the last axis, ``y`` the second to last, ``z`` the
third to last (nvFuser's DIDx/DIDy/DIDz).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from hostir.errors import MeshError


class MeshAxis(enum.Enum):
    """A named mesh axis, counted from the innermost one."""

    X = "x"
    Y = "y"
    Z = "z"

    def dim(self, ndim: int) -> int:
        """The index of this axis in a mesh with ``ndim`` dims."""
        position = ndim - 1 - list(MeshAxis).index(self)
        if position < 0:
            raise MeshError(f"mesh axis {self.value} does not exist in a {ndim}-d mesh")
        return position


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    """Device ids arranged row-major in ``shape`` (1 to 3 dims)."""

    devices: tuple[int, ...]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.shape) <= 3:
            raise MeshError(f"a mesh has 1 to 3 dims, got shape {self.shape}")
        if math.prod(self.shape) != len(self.devices):
            raise MeshError(
                f"mesh shape {self.shape} needs {math.prod(self.shape)} devices,"
                f" got {len(self.devices)}"
            )
        if any(d < 0 for d in self.devices):
            raise MeshError(f"mesh devices must be non-negative, got {list(self.devices)}")
        if len(set(self.devices)) != len(self.devices):
            raise MeshError(f"mesh devices must be distinct, got {list(self.devices)}")

    @property
    def ndim(self) -> int:
        """Number of mesh dims."""
        return len(self.shape)

    def axis_size(self, axis: MeshAxis) -> int:
        """Number of devices along ``axis``."""
        return self.shape[axis.dim(self.ndim)]

    def axes(self) -> tuple[MeshAxis, ...]:
        """The mesh's axes, outermost first."""
        return tuple(reversed(list(MeshAxis)[: self.ndim]))

    def coordinates(self, device: int) -> tuple[int, ...] | None:
        """The position of ``device`` in the mesh, or None if it is not in it."""
        if device not in self.devices:
            return None
        flat = self.devices.index(device)
        coords = []
        for extent in reversed(self.shape):
            coords.append(flat % extent)
            flat //= extent
        return tuple(reversed(coords))

    def coordinate(self, device: int, axis: MeshAxis) -> int | None:
        """``device``'s coordinate on ``axis``, or None if it is not in the mesh."""
        coords = self.coordinates(device)
        return None if coords is None else coords[axis.dim(self.ndim)]

    def __str__(self) -> str:
        return _nested_list(list(self.devices), list(self.shape))


def _nested_list(flat: list[int], shape: list[int]) -> str:
    if len(shape) == 1:
        return "[" + ", ".join(str(d) for d in flat) + "]"
    step = len(flat) // shape[0]
    rows = [_nested_list(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]
    return "[" + ", ".join(rows) + "]"
