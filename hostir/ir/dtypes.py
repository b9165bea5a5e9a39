"""Element types of host IR tensors and their torch equivalents."""

from __future__ import annotations

import enum

import torch

from hostir.errors import HostIrError


class DType(enum.Enum):
    """A tensor element type; the value is its printed name."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"
    UINT64 = "uint64"
    """nvFuser's UInt64 (the philox seed and offset of its attention ops): torch's
    ``uint64`` copies, casts, views and communicates, but has no arithmetic on CPU, so
    the pointwise ops refuse it (docs/ops.md)."""

    def to_torch(self) -> torch.dtype:
        """The matching ``torch.dtype``."""
        return _TO_TORCH[self]

    @staticmethod
    def from_torch(dtype: torch.dtype) -> DType:
        """The DType of a ``torch.dtype``; raises HostIrError for unsupported ones."""
        for ours, theirs in _TO_TORCH.items():
            if theirs == dtype:
                return ours
        supported = ", ".join(str(t) for t in _TO_TORCH.values())
        raise HostIrError(f"unsupported torch dtype {dtype}; expected one of {supported}")


def python_type(dtype: DType) -> type:
    """The Python type of a scalar of ``dtype``: bool, int (the integer dtypes) or float."""
    if dtype is DType.BOOL:
        return bool
    return int if dtype in (DType.INT64, DType.INT32) else float


NVFUSER_NAMES: dict[DType, str] = {
    DType.FLOAT32: "Float",
    DType.FLOAT64: "Double",
    DType.FLOAT16: "Half",
    DType.BFLOAT16: "BFloat16",
    DType.INT64: "Int",
    DType.INT32: "Int32",
    DType.BOOL: "Bool",
    DType.UINT64: "UInt64",
}
"""nvFuser's name of each dtype (its ``DataType``, as ``frontend.types.DataType`` names its
members): what an op's refusal calls an operand's dtype, in the words ``fd.ops`` takes."""


_TO_TORCH = {
    DType.FLOAT32: torch.float32,
    DType.FLOAT64: torch.float64,
    DType.FLOAT16: torch.float16,
    DType.BFLOAT16: torch.bfloat16,
    DType.INT64: torch.int64,
    DType.INT32: torch.int32,
    DType.BOOL: torch.bool,
    DType.UINT64: torch.uint64,
}

INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.INT64: (-(2**63), 2**63 - 1),
    DType.INT32: (-(2**31), 2**31 - 1),
}
"""The values each integer dtype holds (lowest, highest): torch wraps an int outside
around silently, so hostir refuses one."""
