"""The reduction ops, each declared once: its nvFuser name, dtype rule, how partial results
combine.

Everything that knows a reduction reads :data:`REDUCTION_OPS`: the frontend's ``fd.ops``
methods (``sum``, ``prod``, ``max``, ``min``), the op enum of the host IR's ``Reduction``
instruction (so its text keywords and JSON values), the verifier's dtype check
(:func:`reduction_dtype`), the runtime's torch call (``hostir.run.reductions``) and lowering,
which marks a tensor reduced over a sharded dim as partial with the op's ``combine`` (the
collective that finishes it: an Allreduce or ReduceScatter with that op). docs/ops.md
("Reductions") is checked against this table by ``tests/test_ops_doc.py``.

The dtype rules are nvFuser's (``csrc/ops/arith.cpp``: ``sum``, ``prod``, ``max``, ``min``
and ``newForReduction``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hostir.ir.dtypes import DType
from hostir.ir.ops import Category, OpDtypeError, category
from hostir.ir.sharding import ReduceOp


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
