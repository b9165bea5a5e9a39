"""IterDomains and the transforms that derive loop axes from logical axes.

Each logical axis of a tensor is an :class:`IterDomain`. Scheduling replaces
loop axes by the outputs of a :class:`Split` or a :class:`Swizzle1D`, so every
loop axis derives from exactly one logical axis through a tree of transforms.
Walking that tree (``leaves``) gives, per logical axis, its loop axes outer to
inner, which is what shardings, ``shard_tensor`` and lowering read.
"""

from __future__ import annotations

import enum
import itertools
from typing import Protocol

from frontend.arguments import MAX_EXTENT, is_int, shown
from frontend.errors import HostIrError, ScheduleError
from frontend.types import ParallelType
from hostir import Const, Scalar
from hostir.ir.scalars import floordiv, print_scalar

_ids = itertools.count()


class AxisOwner(Protocol):
    """The tensor holding an axis (a ``TensorView``), as the axis sees it.

    Declared here rather than imported: tensor_view imports this module, so naming
    ``TensorView`` here would close an import circle.
    """

    def axis_parallelized(self) -> None:
        """Records that one of its axes changed parallel type; raises a ``HostIrError`` if
        the tensor refuses the change (the axis then takes its previous type back)."""


class IterType(enum.Enum):
    """What an axis iterates over."""

    ITERATION = "i"
    REDUCTION = "r"
    BROADCAST = "b"


class IterDomain:
    """One axis: an extent (maybe symbolic), an iteration type and a parallel type."""

    def __init__(
        self,
        extent: Scalar,
        iter_type: IterType = IterType.ITERATION,
        definition: Split | Swizzle1D | None = None,
    ) -> None:
        self.extent = extent
        self.iter_type = iter_type
        self.parallel_type = ParallelType.serial
        self.definition = definition
        self.use: Split | Swizzle1D | None = None
        self.number = next(_ids)
        self.owner: AxisOwner | None = None  # set by the TensorView holding this axis

    def parallelize(self, parallel_type: ParallelType) -> None:
        """Runs this axis over a mesh axis, as a stream loop, or serially."""
        if not isinstance(parallel_type, ParallelType):
            raise ScheduleError(
                f"parallelize expects a ParallelType, got {parallel_type!r} for axis {self}"
            )
        previous, self.parallel_type = self.parallel_type, parallel_type
        if self.owner is not None:
            try:
                self.owner.axis_parallelized()
            except HostIrError:
                self.parallel_type = previous  # a refused parallelization leaves no trace
                raise

    def is_reduction(self) -> bool:
        """Whether this axis is reduced away."""
        return self.iter_type is IterType.REDUCTION

    def is_broadcast(self) -> bool:
        """Whether this axis is a broadcast (size 1 expanded)."""
        return self.iter_type is IterType.BROADCAST

    def is_device_dim(self) -> bool:
        """Whether this axis is distributed over a mesh axis."""
        return self.parallel_type.is_device()

    def is_stream(self) -> bool:
        """Whether this axis runs as a stream loop."""
        return self.parallel_type is ParallelType.stream

    def leaves(self) -> list[IterDomain]:
        """The axes this one is transformed into, outer to inner (itself if none)."""
        if self.use is None:
            return [self]
        return [leaf for out in self.use.outputs() for leaf in out.leaves()]

    def __repr__(self) -> str:
        prefix = {
            ParallelType.serial: "S",
            ParallelType.stream: "stream",
            ParallelType.mesh_x: "mesh_x",
            ParallelType.mesh_y: "mesh_y",
            ParallelType.mesh_z: "mesh_z",
        }[self.parallel_type]
        return f"{self.iter_type.value}{prefix}{self.number}{{{print_scalar(self.extent)}}}"


class Split:
    """``in_`` split into ``outer`` x ``inner``; ``factor`` is the inner size if
    ``inner_split``, else the outer size."""

    def __init__(self, in_: IterDomain, factor: int, inner_split: bool) -> None:
        if not is_int(factor) or not 1 <= factor <= MAX_EXTENT:
            raise ScheduleError(
                f"split factor must be a positive int (at most {MAX_EXTENT}), got"
                f" {shown(factor)} for {in_}"
            )
        self.in_ = in_
        self.factor = factor
        self.inner_split = inner_split
        rest = floordiv(in_.extent, factor)
        outer_extent: Scalar = rest if inner_split else Const(value=factor)
        inner_extent: Scalar = Const(value=factor) if inner_split else rest
        self.outer = IterDomain(outer_extent, in_.iter_type, self)
        self.inner = IterDomain(inner_extent, in_.iter_type, self)
        in_.use = self

    def outputs(self) -> list[IterDomain]:
        """``[outer, inner]``."""
        return [self.outer, self.inner]

    def __repr__(self) -> str:
        kind = "inner" if self.inner_split else "outer"
        return f"{kind}_split({self.in_}, {self.factor}) -> {self.outer}, {self.inner}"


class Swizzle1D:
    """``out`` iterates ``in_`` rotated by this device's coordinate on a mesh axis:
    iteration ``i`` touches chunk ``(i + r) mod D``."""

    def __init__(self, in_: IterDomain, parallel_type: ParallelType) -> None:
        if not isinstance(parallel_type, ParallelType) or not parallel_type.is_device():
            raise ScheduleError(
                f"swizzle1d of {in_} needs a mesh parallel type (mesh_x, mesh_y, mesh_z),"
                f" got {parallel_type!r}"
            )
        self.in_ = in_
        self.parallel_type = parallel_type
        self.out = IterDomain(in_.extent, in_.iter_type, self)
        in_.use = self

    def outputs(self) -> list[IterDomain]:
        """``[out]``."""
        return [self.out]

    def __repr__(self) -> str:
        return f"swizzle1d({self.in_}, {self.parallel_type.name}) -> {self.out}"


def transforms_of(logical: list[IterDomain]) -> list[Split | Swizzle1D]:
    """Every transform below the logical axes, in creation order."""
    found: list[Split | Swizzle1D] = []
    stack = list(logical)
    while stack:
        axis = stack.pop()
        if axis.use is not None:
            found.append(axis.use)
            stack.extend(axis.use.outputs())
    return sorted(found, key=lambda t: t.outputs()[0].number)
