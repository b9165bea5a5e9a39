"""Scalars without tensors: arithmetic on scalars alone, and scalars as shape entries.

nvFuser lets a program compute with scalars alone (``fd.ops.reciprocal(fd.define_scalar(2.0))``,
any pointwise op) and build shapes from sizes (``fd.ops.broadcast_in_dim(t, x.shape(), [-1])``).
Here a scalar is known at definition (a constant: its value is computed now, in nvFuser's
dtype for scalars, by the torch call the runtime makes) or is an extent (``tv.size(i)``, or
an Int scalar input: its value is known once the inputs are bound, and add, sub or mul on
it stays a host IR extent expression; other ops on it are refused by name). A shape entry
that is a scalar input is its symbol (``s0``), bound at execute as nvFuser binds it: the
fusion is lowered once per kind of inputs, not per value.
Python's ``+``, ``-`` and ``*`` on a scalar are :func:`scalar_binary` too (set on ``ScalarVal``
below), as nvFuser's Vals take them: ``reshape(t, [b * s, e])``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from frontend.arguments import as_list, check_fits, is_int, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.types import DataType
from hostir import Const, Scalar
from hostir.ir import scalars
from hostir.ir.dtypes import DType
from hostir.ir.ops import (
    POINTWISE_OPS,
    Category,
    DtypeRule,
    OperandKind,
    OperandType,
    category,
    common_dtype,
)
from hostir.ir.scalars import print_scalar
from hostir.run.pointwise import TORCH_CALLS


class ScalarMaker(Protocol):
    """What makes a new scalar of a fusion (a ``Fusion``), as this module sees it."""

    def new_scalar(
        self, dtype: DataType, value: int | float | bool | None, extent: Scalar | None = None
    ) -> ScalarVal:
        """A new scalar ``s<n>``."""


INTEGER_DTYPES = (DataType.Int, DataType.Int32)
"""The dtypes of a scalar that may be an extent."""

_INT_OPS: dict[str, Callable[..., int]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "neg": operator.neg,
    "abs": abs,
    "relu": lambda x: max(x, 0),
}
"""The integer ops computed exactly, then checked to fit their dtype (torch would wrap
around); ``div`` and ``pow`` are exact too (:func:`_exact_int`)."""

_EXTENT_OPS: dict[str, Callable[[Scalar, Scalar], Scalar]] = {
    "add": scalars.add,
    "sub": scalars.sub,
    "mul": scalars.mul,
}
"""The arithmetic an extent keeps (host IR extents are integers: no true division)."""


def scalar_op(fusion: ScalarMaker, name: str, operands: Sequence[Any]) -> ScalarVal:
    """Pointwise op ``name`` (any of ``hostir.ir.ops.POINTWISE_OPS``) on scalars alone
    (ScalarVals or Python numbers) as a new scalar of ``fusion``: a constant, computed now
    in nvFuser's dtype for scalars (:func:`scalar_promotion`) by the runtime's torch call,
    if every operand is known; else an extent (add, sub and mul of integer extents, Int
    scalar inputs and int constants: ``fd.ops.mul(s0, s1)`` as a reshape's size). Raises
    OperandError naming the operand that is a size or scalar input used in another op, or
    what the op does not take."""
    names = f"{name}({', '.join(_name(x) for x in operands)})"
    known = [_value(x) for x in operands]
    if all(value is not None for value in known):
        promotion = scalar_promotion(names, name, [_dtype(x) for x in operands])
        return fusion.new_scalar(promotion[1], _constant(names, name, known, promotion))
    extent = next(x for x in operands if _value(x) is None)
    if name not in _EXTENT_OPS or any(_dtype(x) not in INTEGER_DTYPES for x in operands):
        what = (
            "a scalar input, bound at execute"
            if extent.is_input()
            else f"the size {print_scalar(extent.extent)}, known only when the inputs are bound"
        )
        raise OperandError(
            f"{names}: {extent.name} is {what}; arithmetic on it alone is add, sub or mul"
            f" with integers (an extent), got {name}; use it with a tensor operand instead"
            f" (fd.ops.{name} with a tensor among its operands)"
        )
    lhs, rhs = operands
    result = _EXTENT_OPS[name](_as_extent(lhs), _as_extent(rhs))
    return fusion.new_scalar(DataType.Int, None, result)


def scalar_binary(fusion: ScalarMaker, op: str, lhs: Any, rhs: Any) -> ScalarVal:
    """``op`` of two scalars (ScalarVals or Python numbers): :func:`scalar_op`."""
    return scalar_op(fusion, op, (lhs, rhs))


def scalar_promotion(names: str, name: str, dtypes: Sequence[DataType]) -> tuple[DType, DataType]:
    """(compute dtype, result dtype) of op ``name`` on scalars of ``dtypes`` alone, by
    nvFuser's code path for scalar Vals (``csrc/ops/arith.cpp``, ``csrc/type_promotion.cpp``):
    the common dtype of the operands (all equal: that one; else promoted, Half and BFloat16
    counting as Float); ``float_op_config`` makes integers and bools Float; every config
    but ``where``'s casts Half and BFloat16 to Float. Scalars are cast only across
    categories (``optionalCast``), so a one-operand op keeps a floating operand's own dtype
    (``reciprocal(Double)`` is Double, ``exp(Half)`` Half, ``exp(Int)`` Float); a binary op
    gives the common dtype, a comparison Bool, ``where`` the common dtype of its values.
    Raises OperandError for a dtype the op does not take (as for tensors)."""
    op = POINTWISE_OPS[name]
    operands = tuple(
        OperandType(d.to_hostir(), OperandKind.SCALAR, f"s{i}") for i, d in enumerate(dtypes)
    )
    values = operands
    if op.rule is DtypeRule.SELECT:
        if operands[0].dtype is not DType.BOOL:
            raise OperandError(f"{names}: the condition must be Bool, got {dtypes[0].name}")
        values = operands[1:]
    compute = common_dtype(values)
    if op.rule is DtypeRule.FLOAT and category(compute) is not Category.FLOAT:
        compute = DType.FLOAT32
    if op.rule is not DtypeRule.SELECT and compute in (DType.FLOAT16, DType.BFLOAT16):
        compute = DType.FLOAT32
    if category(compute) not in op.accepts or DType.UINT64 in (v.dtype for v in values):
        taken = " or ".join(sorted(c.value for c in op.accepts))
        raise OperandError(
            f"{names}: {name} computes in {compute.value} for scalars of"
            f" {', '.join(d.name for d in dtypes)}; it takes {taken} dtypes"
        )
    if op.rule is DtypeRule.COMPARE:
        return compute, DataType.Bool
    own = values[0].dtype
    if op.arity == 1 and (op.rule is DtypeRule.SAME or category(own) is category(compute)):
        compute = values[0].dtype  # optionalCast keeps a scalar within its category
    return compute, DataType(compute)


def shape_entries(op: str, shape: Any) -> list[int | Scalar]:
    """``shape`` as a list of ints and symbolic extents: an int stays; a ScalarVal becomes
    its value if known at definition, else its extent expression (a size ``tv.size(i)``, an
    Int scalar input's symbol, or arithmetic on them, bound when the inputs are). Raises
    OperandError, naming ``op`` and the entry, for a scalar that is not an integer, and
    anything else."""
    entries = as_list(OperandError, op, "shape", shape, "ints or Int scalars")
    sizes: list[int | Scalar] = []
    for position, entry in enumerate(entries):
        where = f"{op}: shape[{position}]"
        if is_int(entry):
            sizes.append(entry)
            continue
        if not isinstance(entry, ScalarVal):
            raise OperandError(
                f"{where} must be an int or an Int scalar, got {shown(entry)} in {shown(shape)}"
            )
        where = f"{where} = {entry.name}"
        if entry.dtype not in INTEGER_DTYPES:
            raise OperandError(f"{where} must be an integer scalar, got a {entry.dtype.name}")
        sizes.append(int(entry.value) if entry.value is not None else entry.to_hostir())
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


def _constant(
    names: str, name: str, values: list[Any], promotion: tuple[DType, DataType]
) -> int | float | bool:
    """Op ``name`` on the known ``values``: exactly for an integer result (refused if it does
    not fit its dtype: torch would wrap around), else by the runtime's torch call
    (``hostir.run.pointwise``) on 0-dim tensors of the compute dtype, so a constant is what
    the op computes on a tensor of that dtype."""
    compute, result = promotion
    if result in INTEGER_DTYPES:
        exact = _exact_int(names, name, [int(v) for v in values])
        check_fits(OperandError, names, "the result", exact, result, ": it would wrap around")
        return exact
    first = 1 if POINTWISE_OPS[name].rule is DtypeRule.SELECT else 0
    tensors = [
        torch.tensor(v, dtype=torch.bool if i < first else compute.to_torch())
        for i, v in enumerate(values)
    ]
    try:
        value = TORCH_CALLS[name](compute)(*tensors).to(result.to_torch()).item()
    except (RuntimeError, TypeError) as error:
        raise OperandError(f"{names}: torch refuses it in {compute.value}: {error}") from None
    return bool(value) if result is DataType.Bool else float(value)


def _exact_int(names: str, name: str, values: list[int]) -> int:
    """An integer op on Python ints, exactly: C++'s truncating ``div``; ``pow`` with a
    non-negative exponent (a result past 64 bits is refused without computing it)."""
    if name in _INT_OPS:
        return _INT_OPS[name](*values)
    if name == "where":
        return values[1] if values[0] else values[2]
    lhs, rhs = values
    if name == "div":
        if rhs == 0:
            raise OperandError(f"{names}: integer division by zero")
        quotient = abs(lhs) // abs(rhs)
        return quotient if (lhs < 0) == (rhs < 0) else -quotient
    if name == "pow":
        if rhs < 0:
            raise OperandError(
                f"{names}: an integer to a negative power ({rhs}) is not an integer; cast"
                " the base to a floating dtype first"
            )
        if abs(lhs) > 1 and rhs * (abs(lhs).bit_length() - 1) > 64:
            raise OperandError(f"{names}: the result is past 64 bits: it would wrap around")
        return lhs**rhs
    raise OperandError(f"{names}: {name} has no integer form")


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
