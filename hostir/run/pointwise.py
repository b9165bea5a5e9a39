"""The torch call of each pointwise op (declared in ``hostir.ir.ops`` and
``hostir.ir.pointwise``), keyed by its name, and the ops' implementation
(``hostir.run.implementations``).

:func:`pointwise_call` builds the call an instruction makes, once: tensor operands whose
dtype is not the op's compute dtype are cast to it first (nvFuser computes Half in Float
and an int tensor with a float scalar in Double), then the torch op runs on the compute
dtype, so its result has the declared dtype without torch's own promotion deciding.
:func:`pointwise_into` builds the same computation writing a preallocated ``out`` (a
stream chunk) in place, through torch's ``out=`` forms.
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


_OUT_FORMS: dict[str, Callable[[DType], TorchCall]] = {
    **{
        name: _same(getattr(torch, name))
        for name in ("neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh")
    },
    "sigmoid": _same(torch.sigmoid),
    # torch.nn.functional's silu and gelu call these; their out= forms write in place.
    # Not the erf gelu: torch 2.13's CPU gelu(out=) writes wrong values into a strided out
    # (float32, bfloat16), so it computes and copies (tests/lowering/test_chunks_in_place).
    "silu": _same(torch._C._nn.silu),
    "tanh_gelu": _same(functools.partial(torch._C._nn.gelu, approximate="tanh")),
    # torch's relu is clamp_min(x, 0); its own relu(out=) computes, then copies.
    "relu": _same(functools.partial(torch.clamp_min, min=0)),
    "add": _same(torch.add),
    "sub": _same(torch.sub),
    "mul": _same(torch.mul),
    "div": lambda compute: (
        torch.div
        if category(compute) is Category.FLOAT
        else functools.partial(torch.div, rounding_mode="trunc")
    ),
    "truediv": _same(torch.div),
    "pow": _same(torch.pow),
    **{name: _same(getattr(torch, name)) for name in ("lt", "le", "gt", "ge", "eq", "ne")},
    "where": _same(torch.where),
}
"""Per op name: the torch call taking ``out=`` (a tensor first, but ``pow``) that computes
what :data:`TORCH_CALLS`' does, writing ``out`` in place."""

_MIRRORED = {"add": "add", "mul": "mul", "eq": "eq", "ne": "ne"}
_MIRRORED.update({"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"})
"""The binary ops whose scalar left operand moves right (``2 < x`` is ``x > 2``), as
torch's out= forms take a tensor first (``pow`` takes a scalar base as it is)."""


def pointwise_into(
    name: str, operands: Sequence[OperandType | None], out_dtype: DType
) -> Callable[..., torch.Tensor] | None:
    """``write(out, *operands)``: op ``name`` written into ``out`` in place (torch's
    ``out=``), on operands as :func:`pointwise_call` takes them, computing the same
    values; None where the op has none in :data:`_OUT_FORMS` (``erf``, ``gelu``) or torch
    has none for these operands (a scalar left of ``sub``, ``div`` or ``truediv``, a
    scalar ``where`` value, a scalar of a comparison typed only when it runs): then the
    result is copied."""
    op = POINTWISE_OPS[name]
    scalar = [o is None or o.kind is OperandKind.SCALAR for o in operands]
    if op.rule is DtypeRule.COMPARE and None in operands:
        return None
    first = 1 if op.rule is DtypeRule.SELECT else 0
    if op.rule is DtypeRule.SELECT and any(scalar):
        return None
    if scalar[0] and (len(operands) == 1 or scalar[1]):
        return None  # no tensor operand
    swapped = scalar[0] and name != "pow"
    if swapped:
        if name not in _MIRRORED:
            return None
        name = _MIRRORED[name]
    compute = out_dtype
    if op.rule is DtypeRule.COMPARE:
        compute = promote(op, tuple(operands)).compute
    out_form = _OUT_FORMS.get(name)
    if out_form is None:
        return None  # an op without a listed out= form (erf, gelu) computes, then copies
    call = out_form(compute)
    casts = [
        i >= first and not s and o.dtype is not compute
        for i, (o, s) in enumerate(zip(operands, scalar, strict=True))
    ]
    compute_dtype = compute.to_torch()
    if not any(casts) and not swapped:
        return lambda out, *args: call(*args, out=out)

    def cast_then_write(out: torch.Tensor, *args: Any) -> torch.Tensor:
        converted = [a.to(compute_dtype) if c else a for a, c in zip(args, casts, strict=True)]
        return call(*(converted[::-1] if swapped else converted), out=out)

    return cast_then_write


def _operand_types(instruction: Any) -> list[OperandType | None]:
    """What the dtype rule reads of each of a pointwise instruction's operands."""
    return [_operand_type(getattr(instruction, name), name) for name in type(instruction).INS]


def _into(instruction: Any) -> Callable[..., torch.Tensor] | None:
    """A pointwise instruction's write into its preallocated ``out`` (:func:`pointwise_into`)."""
    return pointwise_into(instruction.op.value, _operand_types(instruction), instruction.out.dtype)


@implements(*POINTWISE_DECLS, into=_into, fresh=True)
def prepare_pointwise(instruction: Any) -> TorchCall:
    """The torch call of a pointwise instruction (on its operands in ``INS`` order)."""
    return pointwise_call(instruction.op.value, _operand_types(instruction), instruction.out.dtype)


def _operand_type(value: Any, name: str) -> OperandType | None:
    """What the dtype rule reads of an operand; None for a scalar whose type is known only
    when it runs."""
    if isinstance(value, TensorValue):
        return tensor_operand(value.dtype, value.ndim, value.name)
    if isinstance(value, Const):
        return scalar_operand(type(value.value), name)
    return None
