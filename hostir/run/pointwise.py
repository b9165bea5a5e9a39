"""The torch call of each pointwise op (declared in ``hostir.ir.ops`` and
``hostir.ir.pointwise``), keyed by its name, and the ops' implementation
(``hostir.run.implementations``).

:func:`pointwise_call` builds the call an instruction makes, once: tensor operands whose
dtype is not the op's compute dtype are cast to it first (nvFuser computes Half in Float
and an int tensor with a float scalar in Double), then the torch op runs on the compute
dtype, so its result has the declared dtype without torch's own promotion deciding.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir.ir.dtypes import DType
from hostir.ir.ops import (
    POINTWISE_OPS,
    Category,
    DtypeRule,
    OperandKind,
    OperandType,
    category,
    promote,
    scalar_dtype,
    scalar_operand,
    tensor_operand,
)
from hostir.ir.pointwise import POINTWISE_DECLS
from hostir.ir.scalars import Const
from hostir.ir.values import TensorValue
from hostir.run.implementations import implements

TorchCall = Callable[..., torch.Tensor]


def _divide(compute: DType) -> TorchCall:
    """nvFuser's ``div``: C++'s ``/``, which truncates integers towards zero."""
    if category(compute) is Category.FLOAT:
        return operator.truediv
    return _truncating_div


def _truncating_div(lhs: Any, rhs: Any) -> torch.Tensor:
    if not isinstance(lhs, torch.Tensor):  # torch.div takes a tensor first
        return torch.div(torch.tensor(lhs, dtype=rhs.dtype), rhs, rounding_mode="trunc")
    return torch.div(lhs, rhs, rounding_mode="trunc")


def _same(call: TorchCall) -> Callable[[DType], TorchCall]:
    return lambda compute: call


TORCH_CALLS: dict[str, Callable[[DType], TorchCall]] = {
    "neg": _same(torch.neg),
    "abs": _same(torch.abs),
    "exp": _same(torch.exp),
    "log": _same(torch.log),
    "sqrt": _same(torch.sqrt),
    "rsqrt": _same(torch.rsqrt),
    "reciprocal": _same(torch.reciprocal),
    "tanh": _same(torch.tanh),
    "sigmoid": _same(torch.sigmoid),
    "silu": _same(torch.nn.functional.silu),
    "relu": _same(torch.relu),
    "gelu": _same(torch.nn.functional.gelu),
    "tanh_gelu": _same(functools.partial(torch.nn.functional.gelu, approximate="tanh")),
    "erf": _same(torch.erf),
    # The operator module's functions take a scalar on either side (torch.add does not).
    "add": _same(operator.add),
    "sub": _same(operator.sub),
    "mul": _same(operator.mul),
    "div": _divide,
    "truediv": _same(operator.truediv),
    "pow": _same(operator.pow),
    "lt": _same(operator.lt),
    "le": _same(operator.le),
    "gt": _same(operator.gt),
    "ge": _same(operator.ge),
    "eq": _same(operator.eq),
    "ne": _same(operator.ne),
    "where": _same(torch.where),
}
"""Per op name: the torch call for a given compute dtype."""

if set(TORCH_CALLS) != set(POINTWISE_OPS):  # one call per declared op, no other
    raise TypeError(f"torch calls {sorted(TORCH_CALLS)} differ from {sorted(POINTWISE_OPS)}")


def pointwise_call(
    name: str, operands: Sequence[OperandType | None], out_dtype: DType
) -> TorchCall:
    """The call computing op ``name`` into a result of ``out_dtype`` (the verifier checked
    it against the op's dtype rule) on operands of these types; None stands for a scalar
    whose Python type is known only when it runs (a scalar input)."""
    op = POINTWISE_OPS[name]
    if op.rule is not DtypeRule.COMPARE:
        compute = out_dtype  # the result is computed in its own dtype
    elif None in operands:  # the scalar's type decides the compute dtype: ask at each call
        return functools.partial(_typed_when_called, name, tuple(operands), out_dtype)
    else:
        compute = promote(op, tuple(operands)).compute
    call = TORCH_CALLS[name](compute)
    # where's condition stays bool; the other operands are cast; scalars are taken as they
    # are (torch computes a tensor with a scalar in the tensor's dtype).
    first = 1 if op.rule is DtypeRule.SELECT else 0
    casts = tuple(
        i >= first and o is not None and o.kind is not OperandKind.SCALAR and o.dtype is not compute
        for i, o in enumerate(operands)
    )
    # torch.where of two scalars gives the default float dtype, not nvFuser's Double.
    scalars_only = all(o is None or o.kind is OperandKind.SCALAR for o in operands[first:])
    if not any(casts) and not (op.rule is DtypeRule.SELECT and scalars_only):
        return call
    compute_dtype, result_dtype = compute.to_torch(), out_dtype.to_torch()

    def cast_then_call(*args: Any) -> torch.Tensor:
        converted = [a.to(compute_dtype) if c else a for a, c in zip(args, casts, strict=True)]
        return call(*converted).to(result_dtype)

    return cast_then_call


def _typed_when_called(
    name: str, operands: tuple[OperandType | None, ...], out_dtype: DType, *args: Any
) -> torch.Tensor:
    """Op ``name`` with the unknown scalar types read off the arguments."""
    known = tuple(
        o if o is not None else OperandType(scalar_dtype(type(a)), OperandKind.SCALAR, "scalar")
        for o, a in zip(operands, args, strict=True)
    )
    return pointwise_call(name, known, out_dtype)(*args)


@implements(*POINTWISE_DECLS, fresh=True)
def prepare_pointwise(instruction: Any) -> TorchCall:
    """The torch call of a pointwise instruction (on its operands in ``INS`` order)."""
    fields = type(instruction).INS
    operands = [_operand_type(getattr(instruction, name), name) for name in fields]
    return pointwise_call(instruction.op.value, operands, instruction.out.dtype)


def _operand_type(value: Any, name: str) -> OperandType | None:
    """What the dtype rule reads of an operand; None for a scalar whose type is known only
    when it runs."""
    if isinstance(value, TensorValue):
        return tensor_operand(value.dtype, value.ndim, value.name)
    if isinstance(value, Const):
        return scalar_operand(type(value.value), name)
    return None
