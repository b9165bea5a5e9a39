"""Device meshes and their named axes.

A :class:`Mesh` is an N-d arrangement of device ids (ranks), 1 to 3 dims. Its
axes are named from the innermost: ``x`` is the last axis, ``y`` the second to
last, ``z`` the third to last (nvFuser's DIDx/DIDy/DIDz).

A regular mesh is a *layout*, as in CuTe and PyTorch's ``_MeshLayout``: the
device at coordinates ``c`` is ``offset + sum(c[k] * strides[k])``. It prints as
``[16, 16, 16] : [256, 16, 1]`` (shape : strides, ``+ offset`` when not 0), and
every question about it (is a device in it, what are its coordinates) is
answered by arithmetic, without listing its devices: cost and text do not grow
with the number of devices. A mesh whose devices follow no layout keeps them in
a table and prints them as nested lists (``[[3, 1], [0, 2]]``).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

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


@dataclass(frozen=True, slots=True, init=False)
class Mesh:
    """Devices arranged row-major in ``shape`` (1 to 3 dims): a layout (``strides`` and
    ``offset``) when they follow one, else an explicit ``table`` (see the module docstring).

    Build it from its devices, ``Mesh(devices=(0, 1, 2, 3), shape=(2, 2))`` (a layout is
    found when there is one), or as a layout, ``Mesh(shape=(16, 16), strides=(16, 1))``.
    Two meshes with the same devices in the same arrangement are equal.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    table: tuple[int, ...]

    def __init__(
        self,
        *,
        shape: Sequence[int],
        devices: Sequence[int] | None = None,
        strides: Sequence[int] = (),
        offset: int = 0,
        table: Sequence[int] = (),
    ) -> None:
        shape = tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 3 or any(s < 1 for s in shape):
            raise MeshError(f"a mesh has 1 to 3 dims of positive sizes, got shape {shape}")
        if devices is None and table:
            devices = table
        if devices is not None:
            devices = tuple(int(d) for d in devices)
            strides, offset, table = _checked_layout(devices, shape)
        else:
            strides, offset, table = tuple(int(s) for s in strides), int(offset), ()
            if len(strides) != len(shape):
                raise MeshError(f"mesh shape {shape} needs {len(shape)} strides, got {strides}")
            if not _decodes(shape, strides, offset):
                raise MeshError(
                    f"the layout {_layout_text(shape, strides, offset)} is not a mesh: its"
                    " devices must be distinct and non-negative"
                )
            strides = _canonical(shape, strides)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "strides", tuple(strides))
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "table", tuple(table))

    @property
    def ndim(self) -> int:
        """Number of mesh dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(self.shape)

    @property
    def regular(self) -> bool:
        """Whether the mesh is a layout (no device table)."""
        return not self.table

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device, row-major (O(devices): prefer :meth:`contains`, :meth:`device`)."""
        if self.table:
            return self.table
        return _layout_devices(self.shape, self.strides, self.offset)

    def device(self, coords: Sequence[int]) -> int:
        """The device at ``coords``."""
        if self.table:
            flat = 0
            for coord, extent in zip(coords, self.shape, strict=True):
                flat = flat * extent + coord
            return self.table[flat]
        return self.offset + sum(c * s for c, s in zip(coords, self.strides, strict=True))

    def contains(self, device: int) -> bool:
        """Whether ``device`` is in the mesh."""
        return self.coordinates(device) is not None

    def axis_size(self, axis: MeshAxis) -> int:
        """Number of devices along ``axis``."""
        return self.shape[axis.dim(self.ndim)]

    def axes(self) -> tuple[MeshAxis, ...]:
        """The mesh's axes, outermost first."""
        return tuple(reversed(list(MeshAxis)[: self.ndim]))

    def coordinates(self, device: int) -> tuple[int, ...] | None:
        """The position of ``device`` in the mesh, or None if it is not in it."""
        if self.table:
            if device not in self.table:
                return None
            flat = self.table.index(device)
            coords = []
            for extent in reversed(self.shape):
                coords.append(flat % extent)
                flat //= extent
            return tuple(reversed(coords))
        return _decode(device, self.shape, self.strides, self.offset)

    def coordinate(self, device: int, axis: MeshAxis) -> int | None:
        """``device``'s coordinate on ``axis``, or None if it is not in the mesh."""
        coords = self.coordinates(device)
        return None if coords is None else coords[axis.dim(self.ndim)]

    def max_device(self) -> int:
        """The largest device id."""
        if self.table:
            return max(self.table)
        return self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True))

    def __str__(self) -> str:
        if self.table:
            return _nested_list(list(self.table), list(self.shape))
        return _layout_text(self.shape, self.strides, self.offset)


@lru_cache(maxsize=64)
def _checked_layout(
    devices: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """:func:`_layout_of` ``devices`` after checking them; cached: the planner and the
    command line build the same mesh of thousands of devices again and again, and checking
    walks every device (a bad list raises, and an exception is not cached)."""
    _check_devices(devices, shape)
    return _layout_of(devices, shape)


@lru_cache(maxsize=64)
def _layout_devices(
    shape: tuple[int, ...], strides: tuple[int, ...], offset: int
) -> tuple[int, ...]:
    """Every device of a layout, row-major; cached for :attr:`Mesh.devices`, which the
    analyses of a large mesh ask for once per exchange."""
    devices = [offset]
    for size, stride in zip(shape, strides, strict=True):  # outer dims first: row-major
        devices = [d + c * stride for d in devices for c in range(size)]
    return tuple(devices)


def _check_devices(devices: tuple[int, ...], shape: tuple[int, ...]) -> None:
    if math.prod(shape) != len(devices):
        raise MeshError(f"mesh shape {shape} needs {math.prod(shape)} devices, got {len(devices)}")
    if any(d < 0 for d in devices):
        raise MeshError(f"mesh devices must be non-negative, got {describe_devices(devices)}")
    if len(set(devices)) != len(devices):
        raise MeshError(f"mesh devices must be distinct, got {describe_devices(devices)}")


def describe_devices(devices: Sequence[int]) -> str:
    """``[0, 1, 2, 3]``: devices for a message, shortened when there are many (the first 8
    and the count)."""
    if len(devices) <= 16:
        return str(list(devices))
    return f"[{', '.join(map(str, devices[:8]))}, ...] ({len(devices)} devices)"


def _layout_of(
    devices: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """(strides, offset, ()) when ``devices`` (row-major over ``shape``) follow a layout that
    decodes back (see :func:`_decode`), else ((), 0, devices)."""
    offset = devices[0]
    row_major = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
    strides = tuple(
        devices[row_major[k]] - offset if shape[k] > 1 else row_major[k] for k in range(len(shape))
    )
    strides = _canonical(shape, strides)
    if strides == _canonical(shape, row_major):  # consecutive devices: compared in C
        follows = devices == tuple(range(offset, offset + len(devices)))
    else:
        expected = (
            offset + sum(c * s for c, s in zip(coords, strides, strict=True))
            for coords in itertools.product(*(range(n) for n in shape))
        )
        follows = all(a == b for a, b in zip(devices, expected, strict=True))
    if follows and _decodes(shape, strides, offset):
        return strides, offset, ()
    return (), 0, devices


def _canonical(shape: tuple[int, ...], strides: Sequence[int]) -> tuple[int, ...]:
    """``strides`` with the stride of every size-1 dim made the row-major one (it places
    nothing, so any value describes the same mesh: one value keeps meshes comparable)."""
    return tuple(
        s if n > 1 else math.prod(shape[k + 1 :])
        for k, (n, s) in enumerate(zip(shape, strides, strict=True))
    )


def _decode(
    device: int, shape: tuple[int, ...], strides: tuple[int, ...], offset: int
) -> tuple[int, ...] | None:
    """The coordinates of ``device`` in a layout whose positive strides nest (each larger
    than the span of the smaller ones): digits by decreasing stride; None if not in it."""
    rest = device - offset
    coords = [0] * len(shape)
    for k in sorted(range(len(shape)), key=lambda k: -strides[k]):
        if shape[k] == 1:
            continue
        coord, rest = divmod(rest, strides[k])
        if not 0 <= coord < shape[k]:
            return None
        coords[k] = coord
    return tuple(coords) if rest == 0 else None


def _decodes(shape: tuple[int, ...], strides: Sequence[int], offset: int) -> bool:
    """Whether the layout is injective, non-negative and decodable by :func:`_decode`: its
    strides, largest first, each exceed the span the smaller ones cover."""
    if offset < 0:
        return False
    used = sorted((s, n) for n, s in zip(shape, strides, strict=True) if n > 1)
    span = 0
    for stride, size in used:
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


def _layout_text(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> str:
    text = f"{list(shape)} : {list(strides)}"
    return text if offset == 0 else f"{text} + {offset}"


def _nested_list(flat: list[int], shape: list[int]) -> str:
    if len(shape) == 1:
        return "[" + ", ".join(str(d) for d in flat) + "]"
    step = len(flat) // shape[0]
    rows = [_nested_list(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]
    return "[" + ", ".join(rows) + "]"
