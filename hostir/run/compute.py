"""Evaluator handlers for compute instructions: one torch call each.

A handler receives the instruction, its resolved operands (tensors and
evaluated scalars, keyed by field name) and the local shape of ``out``, and
returns the local result. With ``preallocated`` set, ``operands["out"]`` is the
buffer to write, and the handler writes into it (torch ``out=`` where the op
has one, ``copy_`` otherwise).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from hostir.ir.instructions import (
    Binary,
    BroadcastInDim,
    Cast,
    Linear,
    Matmul,
    Permute,
    Reduction,
    Set,
    Ternary,
    Unary,
)
from hostir.ir.ops import OperandType, scalar_operand, tensor_operand
from hostir.ir.scalars import Const
from hostir.ir.values import TensorValue
from hostir.run.attention import ATTENTION_HANDLERS
from hostir.run.contraction import linear
from hostir.run.handler_common import into_out
from hostir.run.implementations import run_declared
from hostir.run.pointwise import pointwise_call
from hostir.run.reductions import reduction_call, run_reduction
from hostir.run.shape_ops import SHAPE_HANDLERS

Operands = dict[str, Any]


def plain_call(instruction: Any) -> tuple[Callable[..., torch.Tensor], tuple[str, ...]] | None:
    """The torch call a compute instruction makes when it defines a fresh ``out`` (not
    preallocated), and the operand fields it takes, positionally; None for an instruction
    whose call needs more (``broadcast_in_dim`` reads the local output shape). The
    handlers below make this call, and compiled replays (``hostir.run.replay``) make it
    directly: one meaning, written once."""
    kind = type(instruction)
    if kind is Set:
        return torch.clone, ("src",)
    if kind in _POINTWISE_FIELDS:
        return _pointwise_plain(instruction)
    if kind is Cast:
        return functools.partial(torch.Tensor.to, dtype=instruction.out.dtype.to_torch()), ("src",)
    if kind is Reduction:
        return reduction_call(instruction), ("src",)
    if kind is Linear:
        # A 2-d weight (its rank is declared) is torch's own linear: no frame of ours.
        if len(instruction.weight.shape) == 2:
            return torch.nn.functional.linear, ("input", "weight", "bias")
        return linear, ("input", "weight", "bias")
    if kind is Matmul:
        return torch.matmul, ("lhs", "rhs")
    if kind is Permute:
        return functools.partial(torch.permute, dims=instruction.dims), ("src",)
    return None


def _plain(instruction: Any, operands: Operands) -> torch.Tensor:
    """The result of :func:`plain_call` on the resolved operands."""
    call, fields = plain_call(instruction)
    return call(*(operands.get(name) for name in fields))


def run_set(instruction: Set, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``set``: a copy of the source."""
    if instruction.preallocated:
        return operands["out"].copy_(operands["src"])
    return _plain(instruction, operands)


_POINTWISE_FIELDS: dict[type, tuple[str, ...]] = {
    Unary: ("src",),
    Binary: ("lhs", "rhs"),
    Ternary: ("a", "b", "c"),
}
"""The operand fields of each pointwise instruction class, in the op's order."""


_BUILT_CALLS: dict[int, tuple[Any, tuple[Callable[..., torch.Tensor], tuple[str, ...]]]] = {}
"""Pointwise calls built, by the id of their instruction (kept with it, so that an id
reused by a later instruction is told apart): a handler asks at every run."""
_MAX_BUILT_CALLS = 4096


def _pointwise_plain(instruction: Any) -> tuple[Callable[..., torch.Tensor], tuple[str, ...]]:
    """The pointwise instruction's call (built once per instruction) and its fields."""
    built = _BUILT_CALLS.get(id(instruction))
    if built is not None and built[0] is instruction:
        return built[1]
    fields = _POINTWISE_FIELDS[type(instruction)]
    operands = [_operand_type(getattr(instruction, name), name) for name in fields]
    result = pointwise_call(instruction.op.value, operands, instruction.out.dtype), fields
    if len(_BUILT_CALLS) >= _MAX_BUILT_CALLS:  # many programs made and dropped (tests)
        _BUILT_CALLS.clear()
    _BUILT_CALLS[id(instruction)] = (instruction, result)
    return result


def _operand_type(value: Any, name: str) -> OperandType | None:
    """What the dtype rule reads of an operand; None for a scalar whose type is known only
    when it runs."""
    if isinstance(value, TensorValue):
        return tensor_operand(value.dtype, value.ndim, value.name)
    if isinstance(value, Const):
        return scalar_operand(type(value.value), name)
    return None


def run_pointwise(instruction: Any, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """A pointwise op (``hostir.ir.ops``): torch broadcasting, nvFuser's dtype promotion."""
    return into_out(instruction, operands, _plain(instruction, operands))


def run_cast(instruction: Cast, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``cast`` to the output's dtype."""
    return into_out(instruction, operands, _plain(instruction, operands))


def run_linear(instruction: Linear, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``linear``: ``input @ weight.T (+ bias)``; written in place if preallocated."""
    return run_declared(instruction, operands, out_shape)


def run_matmul(instruction: Matmul, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``matmul`` with torch's batching rules; written in place if preallocated."""
    return run_declared(instruction, operands, out_shape)


def run_broadcast_in_dim(
    instruction: BroadcastInDim, operands: Operands, out_shape: list[int]
) -> torch.Tensor:
    """``broadcast_in_dim``: place source dims, then expand to the local output shape."""
    src = operands["src"]
    view = [1] * len(out_shape)
    for src_dim, out_dim in enumerate(instruction.broadcast_dims):
        view[out_dim] = src.shape[src_dim]
    result = src.reshape(view).expand(out_shape)
    return into_out(instruction, operands, result)


def run_permute(instruction: Permute, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``permute`` (a view unless written into a preallocated buffer)."""
    return into_out(instruction, operands, _plain(instruction, operands))


COMPUTE_HANDLERS: dict[type, Callable[[Any, Operands, list[int]], torch.Tensor]] = {
    Set: run_set,
    Unary: run_pointwise,
    Binary: run_pointwise,
    Ternary: run_pointwise,
    Cast: run_cast,
    Reduction: run_reduction,
    Linear: run_linear,
    Matmul: run_matmul,
    BroadcastInDim: run_broadcast_in_dim,
    Permute: run_permute,
    **ATTENTION_HANDLERS,  # sdpfa_fwd, sdpfa_bwd, grouped_mm, embedding_fwd
    **SHAPE_HANDLERS,
}
"""One handler per compute instruction class."""

# The indexing and scan ops' handlers live in their own module (hostir.run.indexing).
from hostir.run.indexing import INDEXING_HANDLERS  # noqa: E402 - after the table it joins

COMPUTE_HANDLERS.update(INDEXING_HANDLERS)
