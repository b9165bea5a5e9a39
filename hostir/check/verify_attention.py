"""The verifier's rules for the attention and MoE instructions (``hostir.ir.attention``):
operand ranks, dtypes and extents, and the result's, as the frontend infers them
(docs/ops.md, "Attention and MoE ops"). Merged into ``verify_compute.COMPUTE_RULES``.

Only the rules of ``sdpfa_fwd`` and ``sdpfa_bwd`` are still reached (their operand checks
are ``hostir.ir.attention``'s, shared with ``fd.ops``): ``sdpfa_philox``, ``grouped_mm`` and
``embedding_fwd`` are declared and checked by their declarations' ``infer``
(``hostir.check.verify_ops``); ``grouped_mm``'s and ``embedding_fwd``'s rules are gone,
``sdpfa_philox``'s goes with the sdpfa ops' tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.attention import (
    SdpaBwd,
    SdpaBwdResult,
    SdpaFwd,
    SdpaFwdResult,
    SdpaPhilox,
    attention_operands_problem,
    qkv_problem,
)
from hostir.ir.dtypes import DType
from hostir.ir.extents import differ
from hostir.ir.scalars import Const, print_scalar


def _scale_problem(instruction: SdpaFwd | SdpaBwd) -> str | None:
    if instruction.scale is None or isinstance(instruction.scale, Const):
        return None
    return f"scale {print_scalar(instruction.scale)} must be a constant"


def _dropout_problem(instruction: SdpaFwd | SdpaBwd) -> str | None:
    """``dropout_p`` a constant in (0, 1) with int64 ``[]`` philox tensors, or neither; a
    logsumexp (which dropout does not change) takes none."""
    p, seed, offset = instruction.dropout_p, instruction.philox_seed, instruction.philox_offset
    if p is None:
        if seed is not None or offset is not None:
            return "philox_seed and philox_offset are read only with dropout_p"
        return None
    if getattr(instruction, "result", None) is SdpaFwdResult.LOGSUMEXP:
        return "the logsumexp does not depend on dropout: leave dropout_p out"
    if not isinstance(p, Const) or isinstance(p.value, bool) or not 0 < p.value < 1:
        return f"dropout_p {print_scalar(p)} must be a constant in (0, 1)"
    for role, tensor in (("philox_seed", seed), ("philox_offset", offset)):
        if tensor is None or tensor.dtype is not DType.INT64 or tensor.ndim != 0:
            return f"with dropout_p, {role} must be an int64 [] tensor"
    return None


def _rule_sdpa_fwd(instruction: SdpaFwd, scalars: Any) -> str | None:
    q, k, v = instruction.query, instruction.key, instruction.value
    problem = (
        attention_operands_problem("sdpfa_fwd", {"query": q, "key": k, "value": v})
        or qkv_problem("sdpfa_fwd", q, k, v)
        or _scale_problem(instruction)
        or _dropout_problem(instruction)
    )
    if problem:
        return problem
    if instruction.result is SdpaFwdResult.LOGSUMEXP:
        return result_problem(instruction, q.shape[:-1], DType.FLOAT32)
    return result_problem(instruction, q.shape[:-1] + v.shape[-1:], q.dtype)


def _rule_sdpa_philox(instruction: SdpaPhilox, scalars: Any) -> str | None:
    return result_problem(instruction, (), DType.INT64)


def _rule_sdpa_bwd(instruction: SdpaBwd, scalars: Any) -> str | None:
    i = instruction
    q, k, v, out, grad = i.query, i.key, i.value, i.output, i.grad_output
    problem = (
        attention_operands_problem(
            "sdpfa_bwd", {"grad_output": grad, "query": q, "key": k, "value": v, "output": out}
        )
        or qkv_problem("sdpfa_bwd", q, k, v)
        or _scale_problem(instruction)
        or _dropout_problem(instruction)
    )
    if problem:
        return problem
    for tensor in (grad, out):
        if any(
            differ(a, b) for a, b in zip(tensor.shape, q.shape[:-1] + v.shape[-1:], strict=True)
        ):
            return f"sdpfa_bwd: {tensor.name} {shape_text(tensor)} must be the output's shape"
    lse = i.logsumexp
    if lse.dtype is not DType.FLOAT32 or len(lse.shape) != q.ndim - 1:
        return f"sdpfa_bwd: logsumexp {lse.name} must be float32 [*N, H, L]"
    if any(differ(a, b) for a, b in zip(lse.shape, q.shape[:-1], strict=True)):
        return f"sdpfa_bwd: logsumexp {lse.name} {shape_text(lse)} must be [*N, H, L]"
    source = {
        SdpaBwdResult.GRAD_QUERY: q,
        SdpaBwdResult.GRAD_KEY: k,
        SdpaBwdResult.GRAD_VALUE: v,
    }[i.result]
    return result_problem(instruction, source.shape, source.dtype)


ATTENTION_RULES: dict[type, Callable[[Any, Any], str | None]] = {
    SdpaFwd: _rule_sdpa_fwd,
    SdpaPhilox: _rule_sdpa_philox,
    SdpaBwd: _rule_sdpa_bwd,
}
"""One rule per attention or MoE instruction."""
