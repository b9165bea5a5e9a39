"""``TensorView``: a tensor of the fusion and its schedule.

A TensorView has a *logical* domain (its axes as the math sees them, including
reduction axes of a reduction's output), a *loop* domain (how it is iterated
and distributed, derived from the logical one by splits and swizzles, in any
order), and optionally an *allocation* domain. Scheduling methods act on the
loop domain and refer to its axes by index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from frontend.arguments import as_list, check_bool, contiguity_flags, is_int, shown
from frontend.errors import DefinitionError, MeshError, OperandError, ScheduleError
from frontend.iter_domain import IterDomain, Split, Swizzle1D
from frontend.mesh import DeviceMesh, as_mesh
from frontend.schedule_clock import ScheduleClock
from frontend.types import DataType, ParallelType
from hostir import Const, Scalar

# What a tensor knows of the fusion around it, declared here rather than imported: the
# modules defining ``Fusion`` and ``Expr`` import this one, so naming them here would close
# an import circle.


class ValueOwner(Protocol):
    """The fusion a tensor or scalar belongs to (a ``Fusion``), as the value sees it."""

    number: int
    """Tells fusions apart in messages."""

    def describe(self) -> str:
        """``fusion #2 (inputs T0, T1)``: which fusion, in a message."""

    def new_scalar(
        self, dtype: DataType, value: int | float | bool | None, extent: Scalar | None = None
    ) -> Any:
        """A new scalar of the fusion (a ``ScalarVal``): ``size`` makes its sizes with it."""

    def rfactor(self, tv: TensorView, axes: Any) -> TensorView:
        """``tv.rfactor(axes)``: the rfactored tensor (``frontend.rfactor``)."""


class TensorExpr(Protocol):
    """An expression that defines or uses a tensor (an ``exprs.Expr``), as the tensor sees it."""

    output: TensorView

    def inputs(self) -> list[Any]:
        """Operands in order (tensors, scalars and Python numbers)."""

    def describe(self) -> str:
        """``T2 = linear(T0, T1)``-style text."""


class TensorView:
    """A tensor in a fusion: dtype, logical/loop/allocation domains, device mesh."""

    def __init__(self, name: str, dtype: DataType, logical: list[IterDomain]) -> None:
        self.name = name
        self.dtype = dtype
        self._logical = list(logical)
        self._loop = list(logical)
        self._allocation: list[IterDomain] | None = None
        self.allocation_contiguity: list[bool | None] | None = None
        self.contiguity: list[bool | None] = [True] * len(self.shape_domain())
        self.stride_order: list[int] | None = None
        self.is_cpu = False  # a CPU scalar tensor (define_tensor's is_cpu)
        self.device_mesh: DeviceMesh | None = None
        self.mesh_set_by_user = False
        self.definition: TensorExpr | None = None
        self.uses: list[TensorExpr] = []
        self.schedule_clock = ScheduleClock()  # the fusion's, once the fusion holds it
        self.fusion: ValueOwner | None = None  # set by the fusion that creates it
        for axis in self._logical:
            axis.owner = self

    # ----- domains -----
    def get_logical_domain(self) -> list[IterDomain]:
        """The logical axes, including reduction axes."""
        return list(self._logical)

    def get_loop_domain(self) -> list[IterDomain]:
        """The loop axes that scheduling methods index."""
        return list(self._loop)

    def get_allocation_domain(self) -> list[IterDomain]:
        """The allocation axes (the logical axes unless set)."""
        return list(self._allocation) if self._allocation is not None else list(self._logical)

    def shape_domain(self) -> list[IterDomain]:
        """The logical axes that are not reductions: the dims of the tensor's data."""
        return [axis for axis in self._logical if not axis.is_reduction()]

    @property
    def ndim(self) -> int:
        """Number of loop axes (the indices scheduling methods accept)."""
        return len(self._loop)

    def axis(self, index: int) -> IterDomain:
        """Loop axis ``index`` (negative counts from the end)."""
        return self._loop[self._normalize(index, "axis")]

    def _normalize(self, index: int, method: str) -> int:
        if not is_int(index) or not -len(self._loop) <= index < len(self._loop):
            raise ScheduleError(
                f"{method}: axis {index} is out of range for {self.name}, whose loop domain has"
                f" {len(self._loop)} axes {self._loop}"
            )
        return index % len(self._loop)

    def size(self, dim: int) -> Any:
        """The extent of data dim ``dim`` (negative counts from the end; reduction axes are
        not dims) as an Int scalar of the fusion, as nvFuser's ``tv.size(dim)``: the
        global extent, a constant if it is one, else known once the inputs are bound. It
        serves as a shape entry (``broadcast_in_dim``), in arithmetic with ints on scalars
        alone, and as the scalar operand of a pointwise op."""
        dims = self.shape_domain()
        if not is_int(dim) or not -len(dims) <= dim < len(dims):
            raise OperandError(
                f"size: dim {shown(dim)} is out of range for {self.name}, which has"
                f" {len(dims)} dims"
            )
        if self.fusion is None:
            raise DefinitionError(f"size: {self.name} belongs to no FusionDefinition")
        extent = dims[dim].extent
        value = extent.value if isinstance(extent, Const) else None
        return self.fusion.new_scalar(DataType.Int, value, extent)

    def shape(self) -> list[Any]:
        """Every data dim's size (``size(i)`` for each dim), as nvFuser's ``tv.shape()``."""
        return [self.size(dim) for dim in range(len(self.shape_domain()))]

    # ----- scheduling -----
    def set_device_mesh(self, mesh: DeviceMesh) -> TensorView:
        """Places this tensor on ``mesh``; axes not parallelized are replicated."""
        self.device_mesh = as_mesh(mesh)
        self.mesh_set_by_user = True
        self.schedule_clock.tick()
        self.check_mesh_axes()
        return self

    def split(self, axis: int, factor: int, inner_split: bool = True) -> TensorView:
        """Splits loop axis ``axis``; ``factor`` is the inner size if ``inner_split``."""
        index = self._normalize(axis, "split")
        check_bool(ScheduleError, f"split of {self.name}", "inner_split", inner_split)
        split = Split(self._loop[index], factor, inner_split)
        self._loop[index : index + 1] = split.outputs()
        for out in split.outputs():
            out.owner = self
        self.schedule_clock.tick()
        return self

    def outer_split(self, axis: int, factor: int) -> TensorView:
        """``[e] -> [factor, e / factor]``."""
        return self.split(axis, factor, inner_split=False)

    def inner_split(self, axis: int, factor: int) -> TensorView:
        """``[e] -> [e / factor, factor]``."""
        return self.split(axis, factor, inner_split=True)

    def rfactor(self, axes: int | Sequence[int]) -> TensorView:
        """nvFuser's ``tv.rfactor(axes)``: a new tensor that this one's op now writes (its
        reduction on each device's data, partial over the mesh axes its reduction axis is
        parallelized on), with this one redefined as a ``set`` of it that finishes the
        reduction. ``axes``: reduction loop axes of this tensor (``frontend.rfactor``)."""
        if self.fusion is None:
            raise DefinitionError(f"rfactor: {self.name} belongs to no FusionDefinition")
        return self.fusion.rfactor(self, axes)

    def swizzle1d(self, axis: int, parallel_type: ParallelType) -> TensorView:
        """Rotates loop axis ``axis`` by this device's coordinate on ``parallel_type``."""
        index = self._normalize(axis, "swizzle1d")
        if not isinstance(parallel_type, ParallelType) or not parallel_type.is_device():
            raise ScheduleError(
                f"swizzle1d on {self.name} axis {axis} needs a mesh parallel type"
                f" (mesh_x, mesh_y, mesh_z), got {parallel_type!r}"
            )
        swizzle = Swizzle1D(self._loop[index], parallel_type)
        self._loop[index] = swizzle.out
        swizzle.out.owner = self
        self.schedule_clock.tick()
        return self

    def reorder(self, old_to_new: dict[int, int]) -> TensorView:
        """Moves loop axes: ``{old: new}``; unnamed axes keep their relative order."""
        n = len(self._loop)
        if not isinstance(old_to_new, Mapping):
            raise ScheduleError(
                f"reorder of {self.name}: expected a dict {{old axis: new axis}}, got"
                f" {shown(old_to_new)}"
            )
        moves: dict[int, int] = {}
        for old, new in old_to_new.items():
            index = self._normalize(old, "reorder")
            if index in moves:
                raise ScheduleError(
                    f"reorder of {self.name}: loop axis {index} is named twice in {old_to_new}"
                )
            moves[index] = self._normalize(new, "reorder")
        if len(set(moves.values())) != len(moves):
            raise ScheduleError(
                f"reorder of {self.name}: two axes moved to one place: {old_to_new}"
            )
        result: list[IterDomain | None] = [None] * n
        for old, new in moves.items():
            result[new] = self._loop[old]
        rest = iter(self._loop[i] for i in range(n) if i not in moves)
        self._loop = [slot if slot is not None else next(rest) for slot in result]
        self.schedule_clock.tick()
        return self

    def set_allocation_domain(
        self, axes: Sequence[IterDomain], contiguity: bool | Sequence[bool | None] = True
    ) -> TensorView:
        """Sets the allocation axes (a permutation of loop or logical axes)."""
        where = f"set_allocation_domain of {self.name}"
        axes = as_list(ScheduleError, where, "axes", axes, "IterDomains")
        known = set(self._loop) | set(self._logical)
        for axis in axes:
            if not isinstance(axis, IterDomain) or axis not in known:
                raise ScheduleError(
                    f"set_allocation_domain: {shown(axis)} is not an axis of {self.name}"
                    f" (loop {self._loop}, logical {self._logical})"
                )
        if len(set(axes)) != len(axes):
            raise ScheduleError(f"{where}: axes {axes} name an axis twice")
        if isinstance(contiguity, Sequence) and not isinstance(contiguity, str | bytes):
            if len(contiguity) != len(axes):
                raise ScheduleError(
                    f"{where}: {len(axes)} axes but {len(contiguity)} contiguity flags"
                )
        contiguity = contiguity_flags(ScheduleError, where, contiguity, len(axes))
        self._allocation = axes
        self.allocation_contiguity = contiguity
        self.schedule_clock.tick()
        return self

    def axis_parallelized(self) -> None:
        """Records that one of its loop axes changed parallel type (``IterDomain.parallelize``
        calls it); raises if the tensor's mesh does not fit the change."""
        self.schedule_clock.tick()
        if self.device_mesh is not None:
            self.check_mesh_axes()

    # ----- queries -----
    def device_axes(self) -> dict[ParallelType, IterDomain]:
        """The loop axes parallelized over mesh axes, by parallel type. A mesh axis
        parallelizes at most one iteration axis and one reduction axis: both is nvFuser's
        reduce-scatter form (the reduction's result scattered along the iteration axis);
        the iteration axis is the one listed then."""
        found: dict[ParallelType, IterDomain] = {}
        for axis in self.device_loop_axes():
            other = found.get(axis.parallel_type)
            if other is not None and other.is_reduction() == axis.is_reduction():
                raise ScheduleError(
                    f"{self.name} parallelizes two axes ({other} and"
                    f" {axis}) over {axis.parallel_type.name}"
                )
            if other is None or other.is_reduction():
                found[axis.parallel_type] = axis
        return found

    def device_loop_axes(self) -> list[IterDomain]:
        """Every loop axis parallelized over a mesh axis, in loop order."""
        return [axis for axis in self._loop if axis.is_device_dim()]

    def check_mesh_axes(self) -> None:
        """Raises if a device-parallel axis has no mesh or a size that differs from it."""
        self.device_axes()  # raises if a mesh axis is used twice
        for axis in self.device_loop_axes():
            parallel_type = axis.parallel_type
            if self.device_mesh is None:
                raise MeshError(
                    f"{self.name} axis {axis} is parallelized over {parallel_type.name} but"
                    " the tensor has no device mesh (call set_device_mesh)"
                )
            size = self.device_mesh.axis_size(parallel_type)
            extent = axis.extent
            if isinstance(extent, Const) and extent.value != size:
                raise ScheduleError(
                    f"{self.name} axis {axis} has extent {extent.value} but is parallelized over"
                    f" {parallel_type.name} of {self.device_mesh!r}, which has {size} devices"
                )

    def __repr__(self) -> str:
        mesh = f" @{self.device_mesh.devices}" if self.device_mesh is not None else ""
        loop = f" loop={self._loop}" if self._loop != self._logical else ""
        return f"{self.name}_{self.dtype.name}{self._logical}{loop}{mesh}"
