"""Scalars without tensors: arithmetic on scalars alone, and scalars as shape entries.

nvFuser lets a program compute with scalars alone (``fd.ops.mul(fd.define_scalar(2.0), 3)``)
and build shapes from sizes (``fd.ops.broadcast_in_dim(t, [t.size(0), 4], [0])``). Here a
scalar is known at definition (a constant: its value is computed now, in its dtype) or is an
extent (``tv.size(i)``: its value is known once the inputs are bound, and arithmetic on it
stays a host IR extent expression). A scalar input is known only at execute: arithmetic on
it alone, or a shape entry made of it, is refused by name when the fusion is defined.
Python's ``+``, ``-`` and ``*`` on a scalar are :func:`scalar_binary` too (set on ``ScalarVal``
below), as nvFuser's Vals take them: ``reshape(t, [b * s, e])``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from frontend.arguments import check_fits, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, Scalar
from hostir.ir import scalars
from hostir.ir.scalars import print_scalar


class ScalarMaker(Protocol):
    """What makes a new scalar of a fusion (a ``Fusion``), as this module sees it."""

    def new_scalar(
        self, dtype: DataType, value: int | float | bool | None, extent: Scalar | None = None
    ) -> ScalarVal:
        """A new scalar ``s<n>``."""


SCALAR_OPS = ("add", "sub", "mul", "div")
"""The ops ``fd.ops`` computes on scalars alone (``scalar_binary``)."""

INTEGER_DTYPES = (DataType.Int, DataType.Int32)
"""The dtypes of a scalar that may be an extent."""

_TORCH_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.true_divide,
}
"""How a constant result is computed in a floating or Bool dtype: as torch computes it."""

_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
}
"""How an integer result is computed: exactly, then checked to fit its dtype."""

_EXTENT_OPS: dict[str, Callable[[Scalar, Scalar], Scalar]] = {
    "add": scalars.add,
    "sub": scalars.sub,
    "mul": scalars.mul,
}
"""The arithmetic an extent keeps (host IR extents are integers: no true division)."""


def scalar_binary(fusion: ScalarMaker, op: str, lhs: Any, rhs: Any) -> ScalarVal:
    """``op`` (add, sub, mul or div) of two scalars (ScalarVals or Python numbers) as a new
    scalar of ``fusion``: a constant if both are known, else an extent (add, sub and mul
    of integer extents and int constants). Raises OperandError naming the operand that
    is an input bound at execute, or the division of an extent."""
    names = f"{op}({_name(lhs)}, {_name(rhs)})"
    for operand in (lhs, rhs):
        if isinstance(operand, ScalarVal) and operand.is_input():
            raise OperandError(
                f"{names}: {operand.name} is a scalar input, bound only at execute; arithmetic"
                " on scalars alone needs values known when the fusion is defined (constants,"
                " sizes): compute it before execute and pass the result, or use it with a"
                " tensor operand"
            )
    dtype = _result_dtype(op, _dtype(lhs), _dtype(rhs))
    known = [_value(x) for x in (lhs, rhs)]
    if known[0] is not None and known[1] is not None:
        return fusion.new_scalar(dtype, _constant(names, op, known[0], known[1], dtype))
    if op not in _EXTENT_OPS or dtype not in INTEGER_DTYPES:
        extent = next(x for x in (lhs, rhs) if _value(x) is None)
        raise OperandError(
            f"{names}: {extent.name} is the size {print_scalar(extent.extent)}, known only when"
            f" the inputs are bound; arithmetic on it alone is add, sub or mul with integers"
            f" (an extent), got {op} with a {dtype.name} result; use it with a tensor operand"
            f" instead (fd.ops.{op}(tensor, {extent.name}))"
        )
    extent = _EXTENT_OPS[op](_as_extent(lhs), _as_extent(rhs))
    return fusion.new_scalar(DataType.Int, None, extent)


def shape_sizes(op: str, tv: TensorView, shape: Any, broadcast_dims: Any) -> Any:
    """``shape`` with every ScalarVal entry as the int the op takes: its value if constant,
    -1 (the input's extent) for a size at an output dim mapped from an input dim of that
    very extent. Anything else passes unchanged for the op's own checks. Raises
    OperandError, naming ``op`` and the entry, for a scalar input, a scalar that is not an
    integer, and a size the op cannot take (at a new or expanded dim, or a different
    extent than the mapped input dim's)."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        return shape
    if not any(isinstance(entry, ScalarVal) for entry in shape):
        return shape
    dims = list(broadcast_dims) if isinstance(broadcast_dims, Sequence) else []
    source = tv.shape_domain()
    sizes = []
    for position, entry in enumerate(shape):
        if not isinstance(entry, ScalarVal):
            sizes.append(entry)
            continue
        where = f"{op}: shape[{position}] = {entry.name}"
        if entry.is_input():
            raise OperandError(
                f"{where} is a scalar input, bound only at execute; a shape entry is an int,"
                " a size of a tensor of the fusion (tv.size(i), tv.shape()) or arithmetic"
                " on sizes and ints"
            )
        if entry.dtype not in INTEGER_DTYPES:
            raise OperandError(f"{where} must be an integer scalar, got a {entry.dtype.name}")
        if entry.value is not None:
            sizes.append(int(entry.value))
            continue
        mapped = dims.index(position) if position in dims else None
        if mapped is not None and mapped < len(source) and source[mapped].extent == entry.extent:
            sizes.append(-1)
            continue
        target = (
            f"output dim {position}, mapped from {tv.name} dim {mapped} of extent"
            f" {print_scalar(source[mapped].extent)}"
            if mapped is not None and mapped < len(source)
            else f"output dim {position}, a new dim"
        )
        raise OperandError(
            f"{where} is the size {print_scalar(entry.extent)}, known only when the inputs are"
            f" bound, at {target}: a size is taken only as the extent of the input dim it maps"
            " (or give -1 there); a new or expanded dim needs an int size"
        )
    return sizes


def _name(operand: Any) -> str:
    return operand.name if isinstance(operand, ScalarVal) else shown(operand)


def _dtype(operand: Any) -> DataType:
    """A scalar's dtype; a Python number's as ``define_scalar`` gives it (bool: Bool, int:
    Int, float: Double)."""
    if isinstance(operand, ScalarVal):
        return operand.dtype
    return {bool: DataType.Bool, int: DataType.Int}.get(type(operand), DataType.Double)


def _value(operand: Any) -> int | float | bool | None:
    """The value known at definition: a constant's, a Python number's, a constant size's."""
    if isinstance(operand, ScalarVal):
        return operand.value
    return operand


def _as_extent(operand: Any) -> Scalar:
    if isinstance(operand, ScalarVal):
        return operand.to_hostir()
    return Const(value=int(operand))


def _result_dtype(op: str, lhs: DataType, rhs: DataType) -> DataType:
    """torch's promotion of two 0-dim tensors of these dtypes; a true division of integers
    or bools gives a Double, as a Python ``/`` (a scalar's float is a double, as in
    nvFuser), not torch's default float32."""
    promoted = DataType.from_torch(torch.promote_types(lhs.to_torch(), rhs.to_torch()))
    if op == "div" and promoted in (*INTEGER_DTYPES, DataType.Bool):
        return DataType.Double
    return promoted


def _constant(names: str, op: str, lhs: Any, rhs: Any, dtype: DataType) -> int | float | bool:
    """``lhs op rhs`` in ``dtype``: exactly for integers (refused if it does not fit the
    dtype: torch would wrap around), else as torch computes it on 0-dim tensors."""
    if dtype in INTEGER_DTYPES:
        result = _INT_OPS[op](int(lhs), int(rhs))
        check_fits(OperandError, names, "the result", result, dtype, ": it would wrap around")
        return result
    try:
        result = _TORCH_OPS[op](
            torch.tensor(lhs, dtype=dtype.to_torch()), torch.tensor(rhs, dtype=dtype.to_torch())
        )
    except (RuntimeError, TypeError) as error:
        raise OperandError(f"{names}: torch refuses it in {dtype.name}: {error}") from None
    return bool(result.item()) if dtype is DataType.Bool else float(result.item())


def _operator(op: str, reflected: bool = False) -> Callable[[ScalarVal, Any], Any]:
    """Python's ``+``, ``-`` or ``*`` on a ScalarVal, as nvFuser's Vals take them
    (``t.size(0) * t.size(1)``): :func:`scalar_binary` in the scalars' fusion; NotImplemented
    for an operand that is not a scalar or a Python number."""

    def apply(self: ScalarVal, other: Any) -> Any:
        if not isinstance(other, ScalarVal | int | float | bool):
            return NotImplemented
        lhs, rhs = (other, self) if reflected else (self, other)
        if isinstance(other, ScalarVal) and other.fusion is not self.fusion:
            raise OperandError(
                f"{op}({_name(lhs)}, {_name(rhs)}): the scalars belong to different"
                " FusionDefinitions"
            )
        return scalar_binary(self.fusion, op, lhs, rhs)

    apply.__name__ = f"__{'r' if reflected else ''}{op}__"
    return apply


for _op in ("add", "sub", "mul"):
    setattr(ScalarVal, f"__{_op}__", _operator(_op))
    setattr(ScalarVal, f"__r{_op}__", _operator(_op, reflected=True))
