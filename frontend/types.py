"""``DataType`` and ``ParallelType``: the nvFuser-style enums of the frontend."""

from __future__ import annotations

import enum

import torch

from frontend.errors import DefinitionError, HostIrError
from hostir import DType, MeshAxis


class DataType(enum.Enum):
    """Element types, named as in nvFuser's Python frontend."""

    Float = DType.FLOAT32
    Double = DType.FLOAT64
    Half = DType.FLOAT16
    BFloat16 = DType.BFLOAT16
    Int = DType.INT64
    Int32 = DType.INT32
    Bool = DType.BOOL
    UInt64 = DType.UINT64

    def __call__(self) -> DataType:
        """The DataType itself: ``tv.dtype`` is an attribute here and a method in nvFuser,
        so ``tv.dtype()`` (nvFuser's spelling) gives the same DataType as ``tv.dtype``."""
        return self

    def to_torch(self) -> torch.dtype:
        """The matching ``torch.dtype``."""
        return self.value.to_torch()

    def to_hostir(self) -> DType:
        """The matching host IR ``DType``."""
        return self.value

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DataType:
        """The DataType of a ``torch.dtype``."""
        return DataType(DType.from_torch(dtype))

    @staticmethod
    def of(value: DataType | torch.dtype) -> DataType:
        """Accepts a DataType or a torch.dtype; raises DefinitionError otherwise."""
        if isinstance(value, DataType):
            return value
        known = ", ".join(f"DataType.{d.name}" for d in DataType)
        if isinstance(value, torch.dtype):
            try:
                return DataType.from_torch(value)
            except HostIrError:
                raise DefinitionError(
                    f"dtype {value} is not supported; expected one of {known} (or its torch dtype)"
                ) from None
        raise DefinitionError(
            f"expected a DataType or torch.dtype ({known} or their torch dtypes), got {value!r}"
        )


class ParallelType(enum.Enum):
    """How a loop axis runs: over a mesh axis, as a stream loop, or serially."""

    mesh_x = "mesh_x"
    mesh_y = "mesh_y"
    mesh_z = "mesh_z"
    stream = "stream"
    serial = "serial"

    def is_device(self) -> bool:
        """Whether the axis is distributed over a mesh axis."""
        return self in _MESH_AXES

    def mesh_axis(self) -> MeshAxis:
        """The host IR mesh axis of a device parallel type."""
        if self not in _MESH_AXES:
            raise DefinitionError(f"{self.name} is not a mesh parallel type")
        return _MESH_AXES[self]


_MESH_AXES = {
    ParallelType.mesh_x: MeshAxis.X,
    ParallelType.mesh_y: MeshAxis.Y,
    ParallelType.mesh_z: MeshAxis.Z,
}

# nvFuser's "no dtype" (``DataType.Null``, the default of the reductions' ``dtype``): None
# here, so ``fd.ops.sum(t, dims, dtype=DataType.Null)`` takes the op's own dtype rule.
DataType.Null = None
