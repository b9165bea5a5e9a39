"""The verifier's rules for the attention and MoE instructions (``hostir.ir.attention``):
operand ranks, dtypes and extents, and the result's, as the frontend infers them
(docs/ops.md, "Attention and MoE ops"). Merged into ``verify_compute.COMPUTE_RULES``.

Only the rules of ``sdpfa_fwd`` and ``sdpfa_bwd`` are still reached (their operand checks
are ``hostir.ir.attention``'s, shared with ``fd.ops``): ``sdpfa_philox``, ``grouped_mm`` and
``embedding_fwd`` are declared and checked by their declarations' ``infer``
(``hostir.check.verify_ops``); their rules go when every family is declared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.attention import (
    ATTENTION_DTYPES,
    EmbeddingFwd,
    GroupedMm,
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
from hostir.ir.values import TensorValue


def _same(what: str, a: TensorValue, a_dim: int, b: TensorValue, b_dim: int) -> str | None:
    if differ(a.shape[a_dim], b.shape[b_dim]):
        return (
            f"{what}: {a.name} dim {a_dim} {shape_text(a)} and {b.name} dim {b_dim}"
            f" {shape_text(b)} differ"
        )
    return None


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


def grouped_mm_shape(mat1: TensorValue, mat2: TensorValue, offsets: TensorValue) -> Any:
    """The output extents of ``grouped_mm`` (nvFuser's ``createGroupedMmaOutput``), or the
    problem as text."""
    ranks = (mat1.ndim, mat2.ndim)
    if ranks == (2, 3):
        return (mat1.shape[0], mat2.shape[2])
    if ranks == (3, 2):
        return (mat1.shape[1], mat2.shape[1])
    if ranks == (2, 2):
        return (offsets.shape[0], mat1.shape[0], mat2.shape[1])
    return f"grouped_mm: ranks {ranks} of mat1 and mat2; expected (2, 3), (3, 2) or (2, 2)"


def _rule_grouped_mm(instruction: GroupedMm, scalars: Any) -> str | None:
    mat1, mat2, offsets = instruction.mat1, instruction.mat2, instruction.offsets
    if offsets.ndim != 1 or offsets.dtype is not DType.INT32:
        return f"grouped_mm: offsets {offsets.name} must be int32 [G]"
    if mat1.dtype is not mat2.dtype or mat1.dtype not in ATTENTION_DTYPES:
        return (
            f"grouped_mm: mat1 is {mat1.dtype.value} and mat2 {mat2.dtype.value}; expected"
            " one of float16, bfloat16, float32 for both"
        )
    shape = grouped_mm_shape(mat1, mat2, offsets)
    if isinstance(shape, str):
        return shape
    problem = _same(
        "grouped_mm: the contraction extents differ", mat1, mat1.ndim - 1, mat2, mat2.ndim - 2
    )
    groups = {(2, 3): (mat2, 0), (3, 2): (mat1, 0)}.get((mat1.ndim, mat2.ndim))
    if problem is None and groups is not None:
        problem = _same("grouped_mm: the group counts differ", offsets, 0, *groups)
    return problem or result_problem(instruction, shape, mat1.dtype)


def _rule_embedding_fwd(instruction: EmbeddingFwd, scalars: Any) -> str | None:
    indices, weight = instruction.input, instruction.weight
    if indices.dtype not in (DType.INT64, DType.INT32):
        return f"embedding_fwd: input {indices.name} is {indices.dtype.value}; expected int"
    if weight.ndim != 2:
        return f"embedding_fwd: weight {weight.name} {shape_text(weight)} must be 2-d"
    return result_problem(instruction, indices.shape + weight.shape[1:], weight.dtype)


ATTENTION_RULES: dict[type, Callable[[Any, Any], str | None]] = {
    SdpaFwd: _rule_sdpa_fwd,
    SdpaPhilox: _rule_sdpa_philox,
    SdpaBwd: _rule_sdpa_bwd,
    GroupedMm: _rule_grouped_mm,
    EmbeddingFwd: _rule_embedding_fwd,
}
"""One rule per attention or MoE instruction."""
