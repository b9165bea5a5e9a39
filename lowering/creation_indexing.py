"""Snapshots of the creation and indexing ops (``frontend.creation_ops``,
``frontend.indexing_ops``): :data:`BUILDERS`, one host IR instruction per frontend
expression of the classes they had before they were declared (joined to
``lowering.snapshot``'s table).

None is reached any more: every op is declared (``hostir.ir.creation``,
``hostir.ir.indexing``) and ``fd.ops`` records its instruction itself (``topk``'s builder
went when it became one instruction of two results); the entries go with the expression
classes when every family is declared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontend import creation_ops as fc
from frontend import exprs as fe
from frontend import indexing_ops as fi
from frontend.tensor_view import TensorView
from hostir import Const, Scalar, TensorValue
from hostir.ir.creation import Full, Iota, Random
from hostir.ir.indexing import Cumsum, GatherAlong, IndexSelect
from hostir.ir.instructions import Instruction


def _tensor(tv: TensorView) -> TensorValue:
    """The placeholder value of ``tv`` (unsharded; lowering binds the sharded one)."""
    shape = tuple(axis.extent for axis in tv.shape_domain())
    return TensorValue(name=tv.name, dtype=tv.dtype.to_hostir(), shape=shape)


def _scalar(value: Any) -> Scalar | None:
    """A scalar argument in host IR: a constant, a scalar input's symbol or a size."""
    if value is None:
        return None
    if isinstance(value, fe.ScalarVal):
        return value.to_hostir()
    return Const(value=value)


BUILDERS: dict[type, Callable[[Any, TensorValue], Instruction]] = {
    fc.FullOp: lambda e, out: Full(out=out, fill_value=_scalar(e.fill_value)),
    fc.IotaOp: lambda e, out: Iota(out=out, start=_scalar(e.start), step=_scalar(e.step)),
    fc.RandomOp: lambda e, out: Random(
        distribution=e.distribution,
        out=out,
        a=_scalar(e.a),
        b=_scalar(e.b),
        seed=_scalar(e.seed),
        offset=_scalar(e.offset),
    ),
    fi.IndexSelectOp: lambda e, out: IndexSelect(
        out=out, src=_tensor(e.src), index=_tensor(e.index), dim=e.dim
    ),
    fi.GatherOp: lambda e, out: GatherAlong(
        kind=e.kind, out=out, src=_tensor(e.src), index=_tensor(e.index), dim=e.dim
    ),
    fi.CumsumOp: lambda e, out: Cumsum(out=out, src=_tensor(e.src), dim=e.dim),
}
"""One instruction builder per frontend expression class of these ops."""
