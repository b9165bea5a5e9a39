"""The pointwise instructions (``Unary``, ``Binary``, ``Ternary``) and each pointwise op's
declaration (``hostir.ir.opdecl``).

Each op of :data:`hostir.ir.ops.POINTWISE_OPS` (its name, operands and dtype rule) is
declared on the instruction class of its arity: its result dtype is its rule's
(:func:`hostir.ir.ops.promote`), its extents its tensor operands' broadcast together
(:mod:`hostir.ir.broadcasting`), and it is elementwise, so a tensor read as two operands
needs one layout. The frontend's ``fd.ops``, the verifier, lowering and the runtime read
these declarations (:data:`POINTWISE_DECLS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hostir.errors import HostIrError
from hostir.ir.broadcasting import broadcast_axes
from hostir.ir.catalog import Kind, declare
from hostir.ir.opdecl import (
    OpArgs,
    OpDecl,
    OpSharding,
    Param,
    ParamKind,
    ResultType,
    declare_op,
)
from hostir.ir.ops import (
    POINTWISE_OPS,
    BinaryOpKind,
    PointwiseOp,
    TernaryOpKind,
    UnaryOpKind,
    promote,
    scalar_operand,
    tensor_operand,
)
from hostir.ir.scalars import Scalar
from hostir.ir.values import TensorValue

Operand = TensorValue | Scalar


@declare(kind=Kind.COMPUTE, op_field="op", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Unary:
    """``out = op(src)`` elementwise; ``op`` is declared in ``hostir.ir.ops``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    op: UnaryOpKind
    out: TensorValue
    src: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, op_field="op", positional=("lhs", "rhs"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Binary:
    """``out = op(lhs, rhs)`` elementwise; an operand may be a scalar (``hostir.ir.ops``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("lhs", "rhs")
    op: BinaryOpKind
    out: TensorValue
    lhs: Operand
    rhs: Operand
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, op_field="op", positional=("a", "b", "c"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Ternary:
    """``out = op(a, b, c)`` elementwise (``where(condition, x, y)``); ``b`` and ``c`` may
    be scalars (``hostir.ir.ops``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("a", "b", "c")
    op: TernaryOpKind
    out: TensorValue
    a: Operand
    b: Operand
    c: Operand
    preallocated: bool = False


_FAMILY: dict[int, tuple[type, tuple[tuple[str, Any], ...]]] = {
    1: (Unary, (("src", TensorValue),)),
    2: (Binary, (("lhs", Operand), ("rhs", Operand))),
    3: (Ternary, (("a", Operand), ("b", Operand), ("c", Operand))),
}
"""Per arity: the instruction class and its operand fields with their types."""


def _inferrer(op: PointwiseOp, fields: tuple[str, ...]):
    """The dtype and shape rule of ``op`` on operands in ``fields``."""

    def infer(args: OpArgs) -> tuple[ResultType, ...] | str:
        operands, tensors = [], []
        for name in fields:
            value = args[name]
            if isinstance(value, TensorValue):
                operands.append(tensor_operand(value.dtype, value.ndim, value.name))
                tensors.append((name, value.name, value.shape))
            else:
                operands.append(scalar_operand(args.scalar_type(name), args.name(name)))
        try:
            dtype = promote(op, tuple(operands)).result
        except HostIrError as error:
            return str(error)
        if not tensors:
            return f"{op.name}: no operand is a tensor"
        axes = broadcast_axes(op.name, tensors)
        if isinstance(axes, str):
            return axes
        return (ResultType(dtype=dtype, axes=axes),)

    return infer


def _declare(op: PointwiseOp) -> OpDecl:
    cls, operands = _FAMILY[op.arity]
    params = []
    for (field, annotation), name in zip(operands, op.params, strict=True):
        kind = ParamKind.TENSOR if annotation is TensorValue else ParamKind.OPERAND
        params.append(Param(field, kind, annotation, nvfuser=name if name != field else None))
    return declare_op(
        op.name,
        cls=cls,
        params=tuple(params),
        infer=_inferrer(op, tuple(field for field, _ in operands)),
        summary=op.summary,
        dtype_rule=op.rule.value,
        sharding=OpSharding(elementwise=True),
    )


POINTWISE_DECLS: dict[str, OpDecl] = {op.name: _declare(op) for op in POINTWISE_OPS.values()}
"""The declaration of every pointwise op, by name."""
