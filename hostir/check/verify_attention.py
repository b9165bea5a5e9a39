"""The verifier's rules for the attention and MoE instructions (``hostir.ir.attention``):
operand ranks, dtypes and extents, and the result's, as the frontend infers them
(docs/ops.md, "Attention and MoE ops"). Merged into ``verify_compute.COMPUTE_RULES``.

None of these rules is reached any more: every attention op is declared and checked by
its declaration's ``infer`` (``hostir.check.verify_ops``); the rules of ``sdpfa_philox``,
``grouped_mm`` and ``embedding_fwd`` go when every family's tables do (``sdpfa_fwd``'s and
``sdpfa_bwd``'s went when each became one instruction of several results).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.attention import EmbeddingFwd, GroupedMm, SdpaPhilox
from hostir.ir.attention_operands import ATTENTION_DTYPES
from hostir.ir.dtypes import DType
from hostir.ir.extents import differ
from hostir.ir.values import TensorValue


def _same(what: str, a: TensorValue, a_dim: int, b: TensorValue, b_dim: int) -> str | None:
    if differ(a.shape[a_dim], b.shape[b_dim]):
        return (
            f"{what}: {a.name} dim {a_dim} {shape_text(a)} and {b.name} dim {b_dim}"
            f" {shape_text(b)} differ"
        )
    return None


def _rule_sdpa_philox(instruction: SdpaPhilox, scalars: Any) -> str | None:
    return result_problem(instruction, (), DType.INT64)


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
    SdpaPhilox: _rule_sdpa_philox,
    GroupedMm: _rule_grouped_mm,
    EmbeddingFwd: _rule_embedding_fwd,
}
"""One rule per attention or MoE instruction class whose op has one result."""
