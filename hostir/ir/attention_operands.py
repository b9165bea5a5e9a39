"""The rules on the operands of the attention and MoE ops (``hostir.ir.attention``): what
their declarations refuse, in ``fd.ops``' words (the frontend records the ops with the
declarations and the verifier checks programs with them, so both say the same).

Attention tensors are ``[*N, H, L, E]``, batch dims first: query ``[*N, H, L, E]``, key
and value ``[*N, H, S, E]``, in one dtype of :data:`ATTENTION_DTYPES`. An attention's
``scale`` and ``dropout_p`` are constants (:func:`constants_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import unequal_dims_problem
from hostir.ir.opdecl import OpArgs
from hostir.ir.scalars import Const, print_scalar
from hostir.ir.values import TensorValue

ATTENTION_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32)
"""The dtypes torch's flash-attention and grouped-mm kernels compute in."""


def _named(dtype: DType) -> str:
    return NVFUSER_NAMES[dtype]


def attention_operands_problem(op: str, named: Mapping[str, TensorValue]) -> str | None:
    """Why the attention operands ``named`` (by role, the first the reference) do not have
    one dtype of :data:`ATTENTION_DTYPES` and one rank of at least 4, or None."""
    (first_role, first), *_ = named.items()
    for role, value in named.items():
        if value.dtype is not first.dtype:
            return (
                f"{op}: {role} {value.name} is {_named(value.dtype)} but {first_role}"
                f" {first.name} is {_named(first.dtype)}; they must have one dtype"
            )
        if value.ndim < 4 or value.ndim != first.ndim:
            return (
                f"{op}: {role} {value.name} has {value.ndim} dims; expected [*N, H, L, E] with"
                f" at least 4 dims, as many as {first_role} {first.name}"
            )
    if first.dtype not in ATTENTION_DTYPES:
        return (
            f"{op}: {first_role} {first.name} is {_named(first.dtype)}; attention takes Half,"
            " BFloat16 or Float"
        )
    return None


def qkv_problem(op: str, q: TensorValue, k: TensorValue, v: TensorValue) -> str | None:
    """Why query ``[*N, H, L, E]``, key ``[*N, H, S, E]`` and value ``[*N, H, S, E]`` do not
    go together, or None: batch and head extents agree, key and value have one sequence
    length, and the value's head size is the query's (torch's flash kernels require it)."""
    batch = q.ndim - 2
    for dim in range(batch):
        problem = unequal_dims_problem(op, q, dim, k, dim) or unequal_dims_problem(
            op, q, dim, v, dim
        )
        if problem is not None:
            return problem
    return (
        unequal_dims_problem(op, k, batch, v, batch)
        or unequal_dims_problem(op, q, batch + 1, k, batch + 1)
        or unequal_dims_problem(op, q, batch + 1, v, batch + 1)
    )


def constants_problem(instruction: Any) -> str | None:
    """Why an attention's ``scale`` and dropout are not as its kernels take them, or None:
    ``scale`` a constant, ``dropout_p`` a constant in (0, 1) with the philox state in
    torch 2.7's form (uint64 ``[2]`` and ``[]``), or no dropout and no philox tensors."""
    scale = instruction.scale
    if scale is not None and not isinstance(scale, Const):
        shown = scale.name if isinstance(scale, TensorValue) else print_scalar(scale)
        return f"scale {shown} must be a constant"
    p, seed, offset = instruction.dropout_p, instruction.philox_seed, instruction.philox_offset
    if p is None:
        if seed is not None or offset is not None:
            return "philox_seed and philox_offset are read only with dropout_p"
        return None
    if not isinstance(p, Const) or isinstance(p.value, bool) or not 0 < p.value < 1:
        shown = p.name if isinstance(p, TensorValue) else print_scalar(p)
        return f"dropout_p {shown} must be a constant in (0, 1)"
    for role, tensor, shape in (("philox_seed", seed, "[2]"), ("philox_offset", offset, "[]")):
        if tensor is None or tensor.dtype is not DType.UINT64 or _shown(tensor) != shape:
            return f"with dropout_p, {role} must be a uint64 {shape} tensor (torch 2.7's form)"
    return None


def _shown(tensor: TensorValue) -> str:
    """A tensor's extents as the philox rule words them (``[2]``, ``[]``; a symbolic
    extent printed by name, which no rule takes)."""
    return "[" + ", ".join(print_scalar(e) for e in tensor.shape) + "]"


def bwd_operands_problem(args: OpArgs) -> str | None:
    """Why ``sdpfa_bwd``'s operands do not go together, or None: one attention dtype and
    rank, query, key and value as the forward takes them, grad_output and output of the
    forward output's shape, logsumexp the forward's (Float, ``[*N, H, L]``)."""
    op = "sdpfa_bwd"
    named = {role: args[role] for role in ("grad_output", "query", "key", "value", "output")}
    q, k, v = named["query"], named["key"], named["value"]
    problem = attention_operands_problem(op, named) or qkv_problem(op, q, k, v)
    if problem is not None:
        return problem
    last = q.ndim - 1
    for role in ("grad_output", "output"):
        for dim in range(last + 1):
            problem = unequal_dims_problem(op, named[role], dim, q if dim < last else v, dim)
            if problem is not None:
                return problem
    lse = args["logsumexp"]
    if lse.dtype is not DType.FLOAT32 or lse.ndim != last:
        return (
            f"{op}: logsumexp {lse.name} must be sdpfa_fwd's logsumexp (Float, [*N, H, L]),"
            f" got {_named(lse.dtype)} with {lse.ndim} dims"
        )
    for dim in range(last):
        problem = unequal_dims_problem(op, lse, dim, q, dim)
        if problem is not None:
            return problem
    return None
