"""The pointwise ops, each declared once: its nvFuser name, operands, dtype rule.

Everything that knows an op reads :data:`POINTWISE_OPS`: the frontend's ``fd.ops``
methods, the op enums of the host IR's ``Unary`` / ``Binary`` / ``Ternary`` instructions
(so their text keywords and JSON values), the verifier's dtype check, the runtime's torch
calls (``hostir.run.pointwise``, keyed by op name, since this layer computes nothing) and
docs/ops.md (checked against this table by ``tests/test_ops_doc.py``).

The dtype rules are nvFuser's type promotion (``csrc/type_promotion.cpp``,
``csrc/type.h`` ``promoteType`` and the config each op passes in ``csrc/ops/arith.cpp``);
docs/ops.md states them with their sources. :func:`promote` applies them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hostir.errors import HostIrError
from hostir.ir.dtypes import DType


class OpDtypeError(HostIrError):
    """An op's operands have dtypes the op does not take (names the op and the operand)."""


class DtypeRule(enum.Enum):
    """How an op's result dtype follows from its operands' (nvFuser's configs)."""

    PROMOTE = "promote"
    """``default_op_config``: the operands' common dtype; Half/BFloat16 compute and
    return Float (``cast_half_to_float``)."""
    FLOAT = "float"
    """``float_op_config``: as PROMOTE, and integer or bool operands compute in Float."""
    SAME = "same"
    """No promotion (``unaryOp`` without a config): the operand's dtype, Half stays Half."""
    COMPARE = "compare"
    """``comparison_op_config``: operands promoted as PROMOTE; the result is Bool."""
    SELECT = "select"
    """``where``: the condition is Bool; the values promote as PROMOTE but Half stays
    Half (``computeTypes(..., cast_half_to_float=false)``)."""


class Category(enum.Enum):
    """The kinds of compute dtype an op takes."""

    BOOL = "bool"
    INT = "int"
    FLOAT = "float"


ANY = frozenset(Category)
NUMBERS = frozenset({Category.INT, Category.FLOAT})
FLOATS = frozenset({Category.FLOAT})


@dataclass(frozen=True)
class PointwiseOp:
    """One pointwise op: how it is called, and its dtype rule."""

    name: str
    """Its nvFuser name: the ``fd.ops`` method, the host IR keyword, the torch call's key."""
    params: tuple[str, ...]
    """Its operands' names, in order (their number is the arity)."""
    rule: DtypeRule
    summary: str
    """What it computes, one line (the ``fd.ops`` docstring and docs/ops.md)."""
    accepts: frozenset[Category] = NUMBERS
    """The categories of compute dtype it takes (torch refuses the others)."""

    @property
    def arity(self) -> int:
        """How many operands it takes."""
        return len(self.params)


def _unary(name: str, rule: DtypeRule, summary: str, accepts=NUMBERS) -> PointwiseOp:
    return PointwiseOp(name, ("x",), rule, summary, accepts)


def _binary(name: str, rule: DtypeRule, summary: str, accepts=NUMBERS) -> PointwiseOp:
    return PointwiseOp(name, ("lhs", "rhs"), rule, summary, accepts)


_F, _P, _S, _C = DtypeRule.FLOAT, DtypeRule.PROMOTE, DtypeRule.SAME, DtypeRule.COMPARE

POINTWISE_OPS: dict[str, PointwiseOp] = {
    op.name: op
    for op in (
        _unary("neg", _P, "``-x``."),
        _unary("abs", _S, "``|x|``."),
        _unary("exp", _F, "``e ** x``."),
        _unary("log", _F, "The natural logarithm of ``x``."),
        _unary("sqrt", _F, "The square root of ``x``."),
        _unary("rsqrt", _F, "``1 / sqrt(x)``."),
        _unary("reciprocal", _F, "``1 / x``."),
        _unary("tanh", _F, "The hyperbolic tangent of ``x``."),
        _unary("sigmoid", _F, "``1 / (1 + exp(-x))``."),
        _unary("silu", _S, "``x * sigmoid(x)``.", FLOATS),
        _unary("relu", _S, "``max(x, 0)``."),
        _unary("gelu", _F, "``x * Phi(x)`` (the exact GELU, with erf)."),
        _unary("tanh_gelu", _F, "GELU's tanh approximation."),
        _unary("erf", _F, "The error function of ``x``."),
        _binary("add", _P, "``lhs + rhs``."),
        _binary("sub", _P, "``lhs - rhs``."),
        _binary("mul", _P, "``lhs * rhs``."),
        _binary("div", _P, "``lhs / rhs``; integers truncate towards zero (C++'s ``/``)."),
        _binary("truediv", _F, "``lhs / rhs`` in floating point (integers give Float)."),
        _binary("pow", _P, "``lhs ** rhs``."),
        _binary("lt", _C, "``lhs < rhs``.", ANY),
        _binary("le", _C, "``lhs <= rhs``.", ANY),
        _binary("gt", _C, "``lhs > rhs``.", ANY),
        _binary("ge", _C, "``lhs >= rhs``.", ANY),
        _binary("eq", _C, "``lhs == rhs``.", ANY),
        _binary("ne", _C, "``lhs != rhs``.", ANY),
        PointwiseOp(
            "where",
            ("condition", "x", "y"),
            DtypeRule.SELECT,
            "``x`` where ``condition`` is true, else ``y``.",
            ANY,
        ),
    )
}
"""Every pointwise op by name (the order docs/ops.md lists them in)."""


def _op_enum(name: str, arity: int, doc: str) -> type[enum.Enum]:
    members = [(op.name.upper(), op.name) for op in POINTWISE_OPS.values() if op.arity == arity]
    generated = enum.Enum(name, members, module=__name__, qualname=name)
    generated.__doc__ = doc
    return generated


UnaryOpKind = _op_enum("UnaryOpKind", 1, "The one-operand pointwise ops; the value is the name.")
BinaryOpKind = _op_enum("BinaryOpKind", 2, "The two-operand pointwise ops; the value is the name.")
TernaryOpKind = _op_enum(
    "TernaryOpKind", 3, "The three-operand pointwise ops; the value is the name."
)


# ----- nvFuser's type promotion -----------------------------------------------------------

_REDUCED = frozenset({DType.FLOAT16, DType.BFLOAT16})
_FLOAT_RANK = {DType.FLOAT16: 0, DType.BFLOAT16: 0, DType.FLOAT32: 1, DType.FLOAT64: 2}
_INT_RANK = {DType.BOOL: 0, DType.INT32: 1, DType.INT64: 2}


class OperandKind(enum.Enum):
    """nvFuser's three operand states: a tensor with dims, a 0-dim tensor, a scalar."""

    TENSOR = "tensor"
    ZERO_DIM = "0-dim tensor"
    SCALAR = "scalar"


@dataclass(frozen=True)
class OperandType:
    """What the promotion reads of one operand (and its name, for errors)."""

    dtype: DType
    kind: OperandKind
    name: str


@dataclass(frozen=True)
class Promotion:
    """An op's dtypes for given operands: tensors are cast to ``compute`` (scalars are
    taken as they are), the op runs, the result is ``result``."""

    compute: DType
    result: DType


def tensor_operand(dtype: DType, ndim: int, name: str) -> OperandType:
    """A tensor operand: with dims, or 0-dim (nvFuser promotes those after the others)."""
    return OperandType(dtype, OperandKind.TENSOR if ndim else OperandKind.ZERO_DIM, name)


def scalar_operand(python_type: type, name: str) -> OperandType:
    """A scalar operand of a Python type (bool, int or float)."""
    return OperandType(scalar_dtype(python_type), OperandKind.SCALAR, name)


def category(dtype: DType) -> Category:
    """Bool, integer or floating point."""
    if dtype is DType.BOOL:
        return Category.BOOL
    return Category.FLOAT if dtype in _FLOAT_RANK else Category.INT


def scalar_dtype(python_type: type) -> DType:
    """The dtype nvFuser gives a Python scalar: Bool, Int (int64) or Double."""
    if python_type is bool:
        return DType.BOOL
    return DType.INT64 if python_type is int else DType.FLOAT64


def promote_types(a: DType, b: DType) -> DType:
    """nvFuser's ``promoteType`` (C++'s rules): bool < int32 < int64 < floats; Half and
    BFloat16 together give Float; a float type wins over any integer."""
    if a is b:
        return a
    if a in _FLOAT_RANK and b in _FLOAT_RANK:
        if a in _REDUCED and b in _REDUCED:
            return DType.FLOAT32
        return a if _FLOAT_RANK[a] > _FLOAT_RANK[b] else b
    if a in _FLOAT_RANK:
        return a
    if b in _FLOAT_RANK:
        return b
    return a if _INT_RANK[a] > _INT_RANK[b] else b


def _skip_none(a: DType | None, b: DType | None) -> DType | None:
    if a is None:
        return b
    return a if b is None else promote_types(a, b)


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """``combineCategories``: a lower state counts only if it is of a higher category."""
    if higher is not None and category(higher) is Category.FLOAT:
        return higher
    if higher is DType.BOOL or (lower is not None and category(lower) is Category.FLOAT):
        return _skip_none(higher, lower)
    return higher if higher is not None else lower


def common_dtype(operands: tuple[OperandType, ...]) -> DType:
    """``computeTypes`` without the config: the one dtype if all operands share it, else
    tensors with dims first, then 0-dim tensors, then scalars (a scalar's Half counts as
    Float), each later state only where it raises the category."""
    if len({o.dtype for o in operands}) == 1:
        return operands[0].dtype
    dims = zero = wrapped = None
    for operand in operands:
        if operand.kind is OperandKind.TENSOR:
            dims = _skip_none(dims, operand.dtype)
        elif operand.kind is OperandKind.ZERO_DIM:
            zero = _skip_none(zero, operand.dtype)
        else:
            dtype = DType.FLOAT32 if operand.dtype in _REDUCED else operand.dtype
            wrapped = _skip_none(wrapped, dtype)
    return _combine(dims, _combine(zero, wrapped))


def promote(op: PointwiseOp, operands: tuple[OperandType, ...]) -> Promotion:
    """The compute and result dtypes of ``op`` on ``operands``; OpDtypeError naming the op
    and the operand it does not take."""
    if len(operands) != op.arity:
        raise OpDtypeError(f"{op.name} takes {op.arity} operands, got {len(operands)}")
    for operand in operands:
        if operand.dtype is DType.UINT64:  # torch's uint64 has no arithmetic on CPU
            raise OpDtypeError(
                f"{op.name}: the {operand.kind.value} {operand.name} is uint64, which the"
                " pointwise ops do not take (torch has no uint64 arithmetic); cast it to"
                " DataType.Int first"
            )
    values = operands
    if op.rule is DtypeRule.SELECT:
        condition, *rest = operands
        if condition.dtype is not DType.BOOL:
            raise OpDtypeError(
                f"{op.name}: the condition {condition.name} must be bool, got"
                f" {condition.dtype.value}"
            )
        values = tuple(rest)
    compute = common_dtype(values)
    if op.rule is DtypeRule.FLOAT and category(compute) is not Category.FLOAT:
        compute = DType.FLOAT32
    if op.rule in (DtypeRule.PROMOTE, DtypeRule.FLOAT, DtypeRule.COMPARE) and compute in _REDUCED:
        compute = DType.FLOAT32
    if category(compute) not in op.accepts:
        named = next((o for o in values if o.dtype is compute), values[0])
        taken = " or ".join(sorted(c.value for c in op.accepts))
        raise OpDtypeError(
            f"{op.name}: the {named.kind.value} {named.name} is {named.dtype.value}, and"
            f" {op.name} computes in {compute.value} for these operands; it takes {taken} dtypes"
        )
    result = DType.BOOL if op.rule is DtypeRule.COMPARE else compute
    return Promotion(compute=compute, result=result)
