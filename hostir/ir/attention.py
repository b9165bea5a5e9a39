"""Attention and MoE compute instructions: nvFuser's ``sdpfa_fwd``, ``sdpfa_philox``,
``sdpfa_bwd``, ``grouped_mm`` and ``embedding_fwd``, and their declarations
(``hostir.ir.opdecl``).

nvFuser's attention ops return several tensors. ``sdpfa_fwd`` is one instruction defining
the attention output and its logsumexp, ``sdpfa_bwd`` one defining the three gradients:
one kernel call gives every result, and lowering keeps an unused one defined (and frees
it at once). The philox seed and offset of ``sdpfa_fwd`` depend on no data and have their
own instruction, ``sdpfa_philox``, which reads nothing: zeros without dropout; with
dropout the seed is drawn at run time (``hostir.run.attention_dropout``) and the forward
and the backward read the seed and offset tensors, so that one draw serves every
instruction that needs the dropout mask.

Shapes (docs/ops.md, "Attention and MoE ops"): attention tensors are ``[*N, H, L, E]``,
batch dims first; ``grouped_mm`` takes the three rank combinations of nvFuser's
``createGroupedMmaOutput``. An attention's ``scale`` and ``dropout_p`` are typed as
operands (the field type that admits a float constant); the declaration's ``check`` takes
constants only. The rules on operands are ``hostir.ir.attention_operands``'.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.attention_operands import (
    ATTENTION_DTYPES,
    attention_operands_problem,
    bwd_operands_problem,
    constants_problem,
    qkv_problem,
)
from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import unequal_dims_problem
from hostir.ir.opdecl import (
    AxisKind,
    OpArgs,
    OpSharding,
    Param,
    ParamKind,
    Result,
    ResultAxis,
    ResultType,
    declare_op,
    result_axis,
)
from hostir.ir.scalars import Const, Scalar
from hostir.ir.values import TensorValue


class PhiloxResult(enum.Enum):
    """Which of ``sdpfa_fwd``'s random-number state tensors ``sdpfa_philox`` defines."""

    SEED = "philox_seed"
    OFFSET = "philox_offset"


@declare(kind=Kind.COMPUTE, keyword="sdpfa_fwd", positional=("query", "key", "value"))
@dataclass(frozen=True, slots=True, kw_only=True)
class SdpaFwd:
    """Scaled dot-product attention, both results of one kernel call: ``output =
    dropout(softmax(q k^T * scale (+ causal mask))) v`` (``[*N, H, L, Ev]``, the query's
    dtype) and ``logsumexp``, the logsumexp of each query row's scores (``[*N, H, L]``,
    float32; dropout does not change it). ``scale`` None is ``1 / sqrt(E)``. With
    ``dropout_p`` (a constant in (0, 1)) the output reads the ``philox_seed`` and
    ``philox_offset`` tensors that choose the mask (``hostir.run.attention_dropout``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("output", "logsumexp")
    INS: ClassVar[tuple[str, ...]] = ("query", "key", "value", "philox_seed", "philox_offset")
    output: TensorValue
    logsumexp: TensorValue
    query: TensorValue
    key: TensorValue
    value: TensorValue
    is_causal: bool = False
    scale: TensorValue | Scalar | None = None  # a constant (the declaration's check)
    dropout_p: TensorValue | Scalar | None = None  # a constant (the declaration's check)
    philox_seed: TensorValue | None = None  # with dropout_p: uint64 [2] and uint64 []
    philox_offset: TensorValue | None = None
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="sdpfa_philox")
@dataclass(frozen=True, slots=True, kw_only=True)
class SdpaPhilox:
    """``sdpfa_fwd``'s philox state in torch 2.7's form, as nvFuser gives it there: the seed
    result is the generator state, a uint64 ``[2]`` tensor (the seed, then the offset), the
    offset result a uint64 ``[]`` tensor nothing reads (torch's ``_unused``). Without
    ``dropout`` all are 0 (no dropout runs); with it the seed is drawn from torch's default
    CPU generator each run and the offsets are 0."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ()
    out: TensorValue
    result: PhiloxResult
    dropout: bool = False
    preallocated: bool = False


@declare(
    kind=Kind.COMPUTE,
    keyword="sdpfa_bwd",
    positional=("grad_output", "query", "key", "value", "output", "logsumexp"),
)
@dataclass(frozen=True, slots=True, kw_only=True)
class SdpaBwd:
    """The three gradients of :class:`SdpaFwd`'s output (of the query, the key and the
    value, each of its input's shape and dtype), from one kernel call; with ``dropout_p``
    of the output that the mask of ``philox_seed`` and ``philox_offset`` dropped."""

    OUTS: ClassVar[tuple[str, ...]] = ("grad_query", "grad_key", "grad_value")
    INS: ClassVar[tuple[str, ...]] = (
        "grad_output",
        "query",
        "key",
        "value",
        "output",
        "logsumexp",
        "philox_seed",
        "philox_offset",
    )
    grad_query: TensorValue
    grad_key: TensorValue
    grad_value: TensorValue
    grad_output: TensorValue
    query: TensorValue
    key: TensorValue
    value: TensorValue
    output: TensorValue
    logsumexp: TensorValue
    is_causal: bool = False
    scale: TensorValue | Scalar | None = None  # a constant (the declaration's check)
    dropout_p: TensorValue | Scalar | None = None  # a constant (the declaration's check)
    philox_seed: TensorValue | None = None  # with dropout_p: int64 [] tensors
    philox_offset: TensorValue | None = None
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="grouped_mm", positional=("mat1", "mat2", "offsets"))
@dataclass(frozen=True, slots=True, kw_only=True)
class GroupedMm:
    """``torch._grouped_mm(mat1, mat2, offsets)``: per group ``g`` (rows, columns or the
    contraction between ``offsets[g-1]`` and ``offsets[g]``) one matrix product."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("mat1", "mat2", "offsets")
    out: TensorValue
    mat1: TensorValue
    mat2: TensorValue
    offsets: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="embedding_fwd", positional=("input", "weight"))
@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddingFwd:
    """``out[*i, :] = weight[input[*i], :]`` (``torch.nn.functional.embedding``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("input", "weight")
    out: TensorValue
    input: TensorValue
    weight: TensorValue
    preallocated: bool = False


ATTENTION_INSTRUCTIONS: tuple[type, ...] = (SdpaFwd, SdpaPhilox, SdpaBwd, GroupedMm, EmbeddingFwd)
"""The classes of this module, for the tables that key on instruction classes."""


# ----- the declarations -------------------------------------------------------------------


PHILOX_STATE_EXTENT = 2
"""The philox seed result's extent: torch 2.7's generator state, ``(seed, offset)``."""


def _philox_type(result: PhiloxResult) -> ResultType:
    """A philox result's type: the state ``uint64 [2]`` (the seed result, replicated: a rank
    needs all of it), or the unread offset ``uint64 []``."""
    if result is PhiloxResult.SEED:
        axis = ResultAxis(extent=Const(value=PHILOX_STATE_EXTENT), whole=True)
        return ResultType(dtype=DType.UINT64, axes=(axis,))
    return ResultType(dtype=DType.UINT64, axes=())


SDPA_PHILOX = declare_op(
    "sdpfa_philox",
    cls=SdpaPhilox,
    params=(
        Param("result", ParamKind.ATTRIBUTE, PhiloxResult),
        Param("dropout", ParamKind.ATTRIBUTE, bool, False),
    ),
    infer=lambda args: (_philox_type(args["result"]),),
    summary="``sdpfa_fwd``'s philox state in torch 2.7's form: the seed result a UInt64"
    " ``[2]`` tensor (seed, offset), the offset result a UInt64 ``[]`` one, unread (0"
    " without dropout; with it a seed drawn each run, and offset 0).",
    dtype_rule="UInt64",
    sharding=OpSharding(reads_no_tensor=True),
    fd_method=False,  # recorded by fd.ops.sdpfa_fwd only
)


def _head_axes(reference: TensorValue, roles: tuple[str, ...]) -> list[ResultAxis]:
    """The batch and head axes ``[*N, H]`` of an attention result: ``reference``'s extents
    (the first of ``roles``, whose iter types they take), iterating with those dims of every
    operand of ``roles``: they compute locally, sharded or not."""
    return [
        result_axis(reference.shape[d], *((role, d) for role in roles))
        for d in range(reference.ndim - 2)
    ]


def _infer_sdpa_fwd(args: OpArgs) -> tuple[ResultType, ...] | str:
    """The output ``[*N, H, L, Ev]`` in the query's dtype and the logsumexp ``[*N, H, L]``
    in Float: batch and head axes iterate with every operand's, L with the query's, Ev with
    the value's; L and Ev are computed whole (a shard of them would need ring attention, or
    a causal mask offset by the shard's first row)."""
    q, k, v = args["query"], args["key"], args["value"]
    problem = attention_operands_problem(
        "sdpfa_fwd", {"query": q, "key": k, "value": v}
    ) or qkv_problem("sdpfa_fwd", q, k, v)
    if problem is not None:
        return problem
    heads = _head_axes(q, ("query", "key", "value"))
    rows = result_axis(q.shape[-2], ("query", q.ndim - 2), whole=True)
    width = result_axis(v.shape[-1], ("value", v.ndim - 1), whole=True)
    return (
        ResultType(dtype=q.dtype, axes=(*heads, rows, width)),
        ResultType(dtype=DType.FLOAT32, axes=(*heads, rows)),
    )


SDPA_FWD = declare_op(
    "sdpfa_fwd",
    cls=SdpaFwd,
    params=(
        Param("query", ParamKind.TENSOR, TensorValue),
        Param("key", ParamKind.TENSOR, TensorValue),
        Param("value", ParamKind.TENSOR, TensorValue),
        Param("is_causal", ParamKind.ATTRIBUTE, bool, False),
        Param("scale", ParamKind.ATTRIBUTE, TensorValue | Scalar | None, None),
        Param("dropout_p", ParamKind.ATTRIBUTE, TensorValue | Scalar | None, None),
        Param("philox_seed", ParamKind.TENSOR, TensorValue | None, None),
        Param("philox_offset", ParamKind.TENSOR, TensorValue | None, None),
    ),
    results=(Result("output"), Result("logsumexp")),
    infer=_infer_sdpa_fwd,
    summary="Scaled dot-product flash attention: its output and the logsumexp of each"
    " query row's scores, one instruction (the philox seed and offset: ``sdpfa_philox``).",
    dtype_rule="same; logsumexp Float",
    check=constants_problem,
    nvfuser_signature="sdpfa_fwd(query, key, value, bias=None, mask=None, dropout_p=None,"
    " is_causal=None, scale=None)",
)

_BWD_OPERANDS = ("grad_output", "query", "key", "value", "output", "logsumexp")
"""``sdpfa_bwd``'s tensor operands but the philox ones, in field order."""


def _infer_sdpa_bwd(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Each gradient has its input's extents and dtype: batch and head axes iterate with
    every operand's, the sequence and head-size axes with its input's (the query's L also
    with grad_output's, output's and logsumexp's), computed whole as the forward's."""
    problem = bwd_operands_problem(args)
    if problem is not None:
        return problem
    results = []
    for role in ("query", "key", "value"):
        source = args[role]
        others = tuple(r for r in _BWD_OPERANDS if r != role)
        rows = ((role, source.ndim - 2),)
        if role == "query":
            rows += tuple((r, source.ndim - 2) for r in ("grad_output", "output", "logsumexp"))
        axes = (
            *_head_axes(source, (role, *others)),
            result_axis(source.shape[-2], *rows, whole=True),
            result_axis(source.shape[-1], (role, source.ndim - 1), whole=True),
        )
        results.append(ResultType(dtype=source.dtype, axes=axes))
    return tuple(results)


SDPA_BWD = declare_op(
    "sdpfa_bwd",
    cls=SdpaBwd,
    params=(
        *(Param(role, ParamKind.TENSOR, TensorValue) for role in _BWD_OPERANDS),
        Param("is_causal", ParamKind.ATTRIBUTE, bool, False),
        Param("scale", ParamKind.ATTRIBUTE, TensorValue | Scalar | None, None),
        Param("dropout_p", ParamKind.ATTRIBUTE, TensorValue | Scalar | None, None),
        Param("philox_seed", ParamKind.TENSOR, TensorValue | None, None),
        Param("philox_offset", ParamKind.TENSOR, TensorValue | None, None),
    ),
    results=(Result("grad_query"), Result("grad_key"), Result("grad_value")),
    infer=_infer_sdpa_bwd,
    summary="The gradients of ``sdpfa_fwd``'s output for query, key and value, one instruction.",
    dtype_rule="same as each input",
    check=constants_problem,
    nvfuser_signature="sdpfa_bwd(grad_output, query, key, value, output, logsumexp,"
    " dropout_p, is_causal, philox_seed, philox_offset, scale)",
)

_GROUPED = {(2, 3): "rows", (3, 2): "columns", (2, 2): "K"}
"""What ``grouped_mm``'s groups split, by the ranks of mat1 and mat2."""


def _infer_grouped_mm(args: OpArgs) -> tuple[ResultType, ...] | str:
    """nvFuser's ``createGroupedMmaOutput``: ``[M, K] x [G, K, N] -> [M, N]``, ``[G, M, K]
    x [K, N] -> [M, N]``, ``[M, K] x [K, N] -> [G, M, N]``, K a reduction axis last; the
    grouped dim (and the groups) computed whole."""
    a, b, offsets = args["mat1"], args["mat2"], args["offsets"]
    op = "grouped_mm"
    if offsets.ndim == 2 and offsets.dtype is DType.INT32:
        return _infer_batched_grouped_mm(a, b, offsets)
    if offsets.ndim != 1 or offsets.dtype is not DType.INT32:
        return (
            f"{op}: offsets {offsets.name} must be a 1-d Int32 tensor of group ends (2-d"
            f" [B, G] for a batch), got {NVFUSER_NAMES[offsets.dtype]} with {offsets.ndim} dims"
        )
    if a.dtype is not b.dtype:
        return (
            f"{op}: mat1 {a.name} is {NVFUSER_NAMES[a.dtype]} but mat2 {b.name} is"
            f" {NVFUSER_NAMES[b.dtype]}; they must have one dtype"
        )
    if a.dtype not in ATTENTION_DTYPES:
        return f"{op}: mat1 {a.name} is {NVFUSER_NAMES[a.dtype]}; expected Half, BFloat16 or Float"
    grouped = _GROUPED.get((a.ndim, b.ndim))
    if grouped is None:
        return (
            f"{op}: mat1 {a.name} has {a.ndim} dims and mat2 {b.name} {b.ndim}; expected"
            " [M, K] x [G, K, N], [G, M, K] x [K, N] or [M, K] x [K, N] (two 3-d operands:"
            " use matmul)"
        )
    problem = unequal_dims_problem(op, a, a.ndim - 1, b, b.ndim - 2)
    if grouped != "K":
        problem = problem or unequal_dims_problem(
            op, offsets, 0, *((b, 0) if grouped == "rows" else (a, 0))
        )
    if problem is not None:
        return problem
    groups = (result_axis(offsets.shape[0], whole=True),) if grouped == "K" else ()
    rows = result_axis(a.shape[-2], ("mat1", a.ndim - 2), whole=grouped == "rows")
    columns = result_axis(b.shape[-1], ("mat2", b.ndim - 1), whole=grouped == "columns")
    k = result_axis(
        a.shape[-1],
        ("mat1", a.ndim - 1),
        ("mat2", b.ndim - 2),
        kind=AxisKind.REDUCTION,
        whole=grouped == "K",
    )
    return (ResultType(dtype=a.dtype, axes=(*groups, rows, columns, k)),)


def _infer_batched_grouped_mm(
    a: TensorValue, b: TensorValue, offsets: TensorValue
) -> tuple[ResultType, ...] | str:
    """The batched rows form (hostir's, not nvFuser's): ``[B, M, K] x [B, G, K, N]`` with
    offsets ``[B, G]`` -> ``[B, M, N]``, batch ``b`` the rows form on ``mat1[b]``,
    ``mat2[b]`` and ``offsets[b]``. The batch dim iterates with all three, so where it is
    split over devices each computes its own batch: an expert-parallel layer's experts,
    ``[D, r, K]`` tokens received by run-time counts and ``[D, G / D, K, N]`` weights, the
    group ends each device's own (docs/run_time_extents.md)."""
    op = "grouped_mm"
    if (a.ndim, b.ndim) != (3, 4):
        return (
            f"{op}: with 2-d offsets {offsets.name} (a batch), mat1 {a.name} must be"
            f" [B, M, K] and mat2 {b.name} [B, G, K, N], got {a.ndim} and {b.ndim} dims"
        )
    if a.dtype is not b.dtype or a.dtype not in ATTENTION_DTYPES:
        return (
            f"{op}: mat1 {a.name} is {NVFUSER_NAMES[a.dtype]} and mat2 {b.name}"
            f" {NVFUSER_NAMES[b.dtype]}; expected one dtype, Half, BFloat16 or Float"
        )
    problem = (
        unequal_dims_problem(op, a, 0, b, 0)
        or unequal_dims_problem(op, offsets, 0, a, 0)
        or unequal_dims_problem(op, offsets, 1, b, 1)
        or unequal_dims_problem(op, a, 2, b, 2)
    )
    if problem is not None:
        return problem
    batch = result_axis(a.shape[0], ("mat1", 0), ("mat2", 0), ("offsets", 0))
    rows = result_axis(a.shape[1], ("mat1", 1), whole=True)
    columns = result_axis(b.shape[3], ("mat2", 3))
    k = result_axis(a.shape[2], ("mat1", 2), ("mat2", 2), kind=AxisKind.REDUCTION)
    return (ResultType(dtype=a.dtype, axes=(batch, rows, columns, k)),)


GROUPED_MM = declare_op(
    "grouped_mm",
    cls=GroupedMm,
    params=(
        Param("mat1", ParamKind.TENSOR, TensorValue),
        Param("mat2", ParamKind.TENSOR, TensorValue),
        Param("offsets", ParamKind.TENSOR, TensorValue),
    ),
    infer=_infer_grouped_mm,
    summary="One matrix product per group of mat1's rows, mat2's columns or K, the groups"
    " ending at ``offsets`` (``torch._grouped_mm``); with 2-d offsets, a batch of the rows"
    " form, computed where each batch is.",
    dtype_rule="one dtype",
)


def _infer_embedding_fwd(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Indices ``[*I]`` (Int or Int32) pick rows of the weight ``[V, D]``: ``[*I, D]`` in the
    weight's dtype (``V`` maps to no result axis: it is read whole)."""
    indices, weight = args["input"], args["weight"]
    op = "embedding_fwd"
    if indices.dtype not in (DType.INT64, DType.INT32):
        return (
            f"{op}: input {indices.name} is {NVFUSER_NAMES[indices.dtype]}; expected Int or Int32"
        )
    if indices.ndim < 1:
        return f"{op}: input {indices.name} must have at least 1 dim"
    if weight.ndim != 2:
        return f"{op}: weight {weight.name} has {weight.ndim} dims; expected [V, D]"
    axes = tuple(result_axis(e, ("input", d)) for d, e in enumerate(indices.shape))
    return (
        ResultType(dtype=weight.dtype, axes=(*axes, result_axis(weight.shape[1], ("weight", 1)))),
    )


EMBEDDING_FWD = declare_op(
    "embedding_fwd",
    cls=EmbeddingFwd,
    params=(
        Param("input", ParamKind.TENSOR, TensorValue),
        Param("weight", ParamKind.TENSOR, TensorValue),
    ),
    infer=_infer_embedding_fwd,
    summary="The rows of ``weight`` ``[V, D]`` that the indices ``input`` pick: ``[*input, D]``.",
    dtype_rule="same as weight",
    nvfuser_signature="embedding_fwd(input, weight, padding_idx=None, max_norm=None,"
    " norm_type=None, scale_grad_by_freq=None, sparse=None)",
)
