"""The reduction ops, each declared once: its nvFuser name, dtype rule, how partial results
combine.

:data:`REDUCTION_OPS` generates the op enum of the host IR's ``Reduction`` instruction
(so its text keywords and JSON values), and each op is declared on that instruction
(``hostir.ir.opdecl``, :data:`REDUCTION_DECLS`): its dtype rule (:func:`reduction_dtype`),
its result axes (the reduced ones kept as reduction axes of the frontend's tensor), and
how its partial results combine. Everything that knows a reduction reads the
declaration: the frontend's ``fd.ops`` methods (``sum``, ``prod``, ``max``, ``min``), the
verifier, the runtime's torch call (``hostir.run.reductions``) and lowering, which marks a
tensor reduced over a sharded dim as partial with the op's ``combine`` (the collective
that finishes it: an Allreduce or ReduceScatter with that op). docs/ops.md
("Reductions") is checked against the declarations by ``tests/test_ops_doc.py``.

The dtype rules are nvFuser's (``csrc/ops/arith.cpp``: ``sum``, ``prod``, ``max``, ``min``
and ``newForReduction``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import DType
from hostir.ir.opdecl import (
    AxisKind,
    AxisSource,
    OpArgs,
    OpDecl,
    OpSharding,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.ir.ops import Category, OpDtypeError, category
from hostir.ir.scalars import Const, print_scalar
from hostir.ir.sharding import ReduceOp
from hostir.ir.values import TensorValue


class ReductionDtypeRule(enum.Enum):
    """How a reduction's result dtype follows from its operand's (nvFuser's)."""

    ACCUMULATE = "accumulate"
    """``sum`` / ``prod``: integer and bool operands give Int (int64), floating point ones
    keep their dtype (Half stays Half); a ``dtype`` argument casts the operand to it first
    and is the result's dtype."""
    SAME = "same"
    """``max`` / ``min``: the operand's dtype; no ``dtype`` argument (nvFuser refuses one)."""


@dataclass(frozen=True)
class ReductionDecl:
    """One reduction op: its name, how partial results combine, its dtype rule."""

    name: str
    """Its nvFuser name: the ``fd.ops`` method, the host IR keyword."""
    combine: ReduceOp
    """How results over parts of a reduced dim combine: the op of the partial sharding a
    reduction over a sharded dim leaves, and of the collective that finishes it."""
    rule: ReductionDtypeRule
    summary: str
    """What it computes, one line (the ``fd.ops`` docstring and docs/ops.md)."""

    @property
    def takes_dtype(self) -> bool:
        """Whether it takes a ``dtype`` argument (the dtype it accumulates in)."""
        return self.rule is ReductionDtypeRule.ACCUMULATE


_ACC, _SAME = ReductionDtypeRule.ACCUMULATE, ReductionDtypeRule.SAME

REDUCTION_OPS: dict[str, ReductionDecl] = {
    op.name: op
    for op in (
        ReductionDecl("sum", ReduceOp.SUM, _ACC, "The sum over ``dims``."),
        ReductionDecl("prod", ReduceOp.PROD, _ACC, "The product over ``dims``."),
        ReductionDecl("max", ReduceOp.MAX, _SAME, "The largest value over ``dims``."),
        ReductionDecl("min", ReduceOp.MIN, _SAME, "The smallest value over ``dims``."),
    )
}
"""Every reduction op by name (the order docs/ops.md lists them in)."""

ReductionOpKind = enum.Enum(
    "ReductionOpKind",
    [(op.name.upper(), op.name) for op in REDUCTION_OPS.values()],
    module=__name__,
    qualname="ReductionOpKind",
)
ReductionOpKind.__doc__ = "The reduction ops (``hostir.ir.reductions``); the value is the name."


def reduction_dtype(op: ReductionDecl, operand: DType, requested: DType | None, name: str) -> DType:
    """The result dtype of ``op`` on an operand of dtype ``operand`` (called ``name``) with
    the ``dtype`` argument ``requested``; OpDtypeError naming the op and the operand."""
    if requested is not None:
        if not op.takes_dtype:
            raise OpDtypeError(
                f"{op.name} of {name}: takes no dtype (nvFuser: 'A dtype other than Null is"
                f" not currently supported'); got {requested.value}, cast the result instead"
            )
        return requested
    if op.rule is ReductionDtypeRule.ACCUMULATE and category(operand) is not Category.FLOAT:
        return DType.INT64
    return operand


@declare(kind=Kind.COMPUTE, op_field="op", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Reduction:
    """``out = op(src)`` over ``dims`` (``keepdim`` keeps them with extent 1) of the local
    data: a partial result if a reduced dim is sharded. ``op`` (``sum``, ``prod``, ``max``,
    ``min``) is declared in ``hostir.ir.reductions``; ``dtype``, for ``sum`` and ``prod``, is
    the dtype the operand is cast to first (nvFuser's ``dtype`` argument), None for the op's
    default."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    op: ReductionOpKind
    out: TensorValue
    src: TensorValue
    dims: tuple[int, ...]
    keepdim: bool = False
    dtype: DType | None = None
    preallocated: bool = False


def _shape_text(value: TensorValue) -> str:
    return "[" + ", ".join(print_scalar(e) for e in value.shape) + "]"


def _inferrer(op: ReductionDecl):
    """The dtype and shape rule of reduction ``op``."""

    def infer(args: OpArgs) -> tuple[ResultType, ...] | str:
        src, dims, keepdim = args["src"], args["dims"], args["keepdim"]
        if any(not -src.ndim <= d < src.ndim for d in dims):
            return f"{op.name}: dims {list(dims)} out of range for {src.name} {_shape_text(src)}"
        reduced = {d % src.ndim for d in dims}
        if not reduced or len(reduced) != len(dims):
            return f"{op.name}: dims {list(dims)} of {src.name} must be distinct, at least one"
        try:
            dtype = reduction_dtype(op, src.dtype, args["dtype"], src.name)
        except OpDtypeError as error:
            return str(error)
        axes = []
        for d, extent in enumerate(src.shape):
            if d in reduced and keepdim:  # a kept dim of extent 1: no data of src's along it
                axes.append(ResultAxis(extent=Const(value=1), kind=AxisKind.BROADCAST))
                continue
            kind = AxisKind.REDUCTION if d in reduced else AxisKind.INHERIT
            axes.append(ResultAxis(extent=extent, kind=kind, sources=(AxisSource("src", d),)))
        return (ResultType(dtype=dtype, axes=tuple(axes)),)

    return infer


def _declare(op: ReductionDecl) -> OpDecl:
    return declare_op(
        op.name,
        cls=Reduction,
        params=(
            Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
            Param("dims", ParamKind.ATTRIBUTE, tuple[int, ...], nvfuser_default=None),
            Param("keepdim", ParamKind.ATTRIBUTE, bool, False),
            Param("dtype", ParamKind.ATTRIBUTE, DType | None, None),
        ),
        infer=_inferrer(op),
        summary=op.summary,
        dtype_rule=op.rule.value,
        sharding=OpSharding(combine=op.combine),
    )


REDUCTION_DECLS: dict[str, OpDecl] = {op.name: _declare(op) for op in REDUCTION_OPS.values()}
"""The declaration of every reduction op, by name."""
