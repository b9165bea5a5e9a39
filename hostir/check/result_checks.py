"""What every verifier rule of a compute instruction asks of its result: that ``out`` is
declared with the extents and dtype the op gives, said the same way for every op."""

from __future__ import annotations

from typing import Any

from hostir.ir.dtypes import DType
from hostir.ir.extents import differ, extents_text
from hostir.ir.scalars import Scalar
from hostir.ir.values import TensorValue


def shape_text(value: TensorValue) -> str:
    """``[i0, 4]``: a tensor's global extents as the text form prints them."""
    return extents_text(value.shape)


def same_extents(a: tuple[Scalar, ...], b: tuple[Scalar, ...]) -> bool:
    """Same rank, and no extent certainly different (see hostir.ir.extents.differ)."""
    return len(a) == len(b) and not any(differ(x, y) for x, y in zip(a, b, strict=True))


def result_problem(
    instruction: Any, shape: tuple[Scalar, ...], dtype: DType | None = None, op: str = "the op"
) -> str | None:
    """The problem with ``instruction.out`` if its extents are not ``shape`` or (unless
    ``dtype`` is None) its dtype not ``dtype``; ``op`` names what gives them."""
    return value_problem(instruction.out, shape, dtype, op)


def value_problem(
    out: TensorValue, shape: tuple[Scalar, ...], dtype: DType | None = None, op: str = "the op"
) -> str | None:
    """The problem with result ``out`` if its extents are not ``shape`` or (unless ``dtype``
    is None) its dtype not ``dtype``; ``op`` names what gives them."""
    if not same_extents(out.shape, shape):
        return (
            f"{out.name} is declared with extents {extents_text(out.shape)}, but {op} gives"
            f" {extents_text(shape)}"
        )
    if dtype is not None and out.dtype is not dtype:
        return (
            f"{out.name} is declared {out.dtype.value}, but {op} gives {dtype.value} for"
            " these operands"
        )
    return None
