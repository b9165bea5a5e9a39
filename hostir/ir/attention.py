"""Attention and MoE compute instructions: nvFuser's ``sdpfa_fwd``, ``sdpfa_bwd``,
``grouped_mm`` and ``embedding_fwd``.

nvFuser's attention ops return several tensors. Each host IR instruction here defines
one of them, named by its ``result`` field (a projection): a program that uses the
attention output and its logsumexp runs the forward twice (a known cost, until
instructions may define several tensors), and an output nobody uses is not computed.
The philox seed and offset of ``sdpfa_fwd`` depend on no data and have their own
instruction, ``sdpfa_philox``, which reads nothing: zeros without dropout; with dropout
the seed is drawn at run time (``hostir.run.attention_dropout``) and the forward's
output and the backward read the seed and offset tensors, so that one draw serves
every instruction that needs the dropout mask.

Shapes (docs/ops.md, "Attention and MoE ops"): attention tensors are ``[*N, H, L, E]``,
batch dims first; ``grouped_mm`` takes the three rank combinations of nvFuser's
``createGroupedMmaOutput``. An attention's ``scale`` is typed as an operand (the field type
that admits a float constant); its verifier rule takes constants only.

``sdpfa_philox``, ``grouped_mm`` and ``embedding_fwd`` are declared (``hostir.ir.opdecl``);
``sdpfa_fwd`` and ``sdpfa_bwd``, which define one result per instruction, keep their
class's rules until they define all of them, and share the operand checks here
(:data:`ATTENTION_DTYPES`, :func:`attention_operands_problem`, :func:`qkv_problem`) with
``fd.ops``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import differ
from hostir.ir.opdecl import (
    AxisKind,
    AxisSource,
    OpArgs,
    OpSharding,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.ir.scalars import Scalar, print_scalar
from hostir.ir.values import TensorValue


class SdpaFwdResult(enum.Enum):
    """Which result of ``sdpfa_fwd`` an instruction defines."""

    OUTPUT = "output"  # [*N, H, L, Ev], the query's dtype
    LOGSUMEXP = "logsumexp"  # [*N, H, L], Float


class SdpaBwdResult(enum.Enum):
    """Which result of ``sdpfa_bwd`` an instruction defines."""

    GRAD_QUERY = "grad_query"
    GRAD_KEY = "grad_key"
    GRAD_VALUE = "grad_value"


class PhiloxResult(enum.Enum):
    """Which of ``sdpfa_fwd``'s random-number state tensors ``sdpfa_philox`` defines."""

    SEED = "philox_seed"
    OFFSET = "philox_offset"


@declare(kind=Kind.COMPUTE, keyword="sdpfa_fwd", positional=("query", "key", "value"))
@dataclass(frozen=True, slots=True, kw_only=True)
class SdpaFwd:
    """One result of scaled dot-product attention: ``dropout(softmax(q k^T * scale
    (+ causal mask))) v`` (``result=output``) or the logsumexp of each query row's scores
    (``result=logsumexp``, which dropout does not change). ``scale`` None is
    ``1 / sqrt(E)``. With ``dropout_p`` (a constant in (0, 1)) the output reads the
    ``philox_seed`` and ``philox_offset`` tensors that choose the mask
    (``hostir.run.attention_dropout``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("query", "key", "value", "philox_seed", "philox_offset")
    out: TensorValue
    query: TensorValue
    key: TensorValue
    value: TensorValue
    result: SdpaFwdResult
    is_causal: bool = False
    scale: TensorValue | Scalar | None = None  # a constant (the verifier's rule)
    dropout_p: TensorValue | Scalar | None = None  # a constant (the verifier's rule)
    philox_seed: TensorValue | None = None  # with dropout_p: int64 [] tensors
    philox_offset: TensorValue | None = None
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="sdpfa_philox")
@dataclass(frozen=True, slots=True, kw_only=True)
class SdpaPhilox:
    """``sdpfa_fwd``'s philox seed or offset: an int64 scalar tensor. Without ``dropout``
    both are 0 (no dropout runs); with it the seed is drawn from torch's default CPU
    generator each run and the offset is 0."""

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
    """One gradient (``result``) of :class:`SdpaFwd`'s output; with ``dropout_p`` of the
    output that the mask of ``philox_seed`` and ``philox_offset`` dropped."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
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
    out: TensorValue
    grad_output: TensorValue
    query: TensorValue
    key: TensorValue
    value: TensorValue
    output: TensorValue
    logsumexp: TensorValue
    result: SdpaBwdResult
    is_causal: bool = False
    scale: TensorValue | Scalar | None = None  # a constant (the verifier's rule)
    dropout_p: TensorValue | Scalar | None = None  # a constant (the verifier's rule)
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


# ----- operand checks ---------------------------------------------------------------------

ATTENTION_DTYPES = (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32)
"""The dtypes torch's flash-attention and grouped-mm kernels compute in."""


def _named(dtype: DType) -> str:
    return NVFUSER_NAMES[dtype]


def extent_problem(op: str, a: TensorValue, a_dim: int, b: TensorValue, b_dim: int) -> str | None:
    """Why dim ``a_dim`` of ``a`` and dim ``b_dim`` of ``b`` cannot be one extent (they
    certainly differ; symbolic ones are checked when bound), or None."""
    ea, eb = a.shape[a_dim], b.shape[b_dim]
    if not differ(ea, eb):
        return None
    return (
        f"{op}: {a.name} dim {a_dim} has extent {print_scalar(ea)} but {b.name} dim {b_dim}"
        f" has extent {print_scalar(eb)}; they must be equal"
    )


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
        problem = extent_problem(op, q, dim, k, dim) or extent_problem(op, q, dim, v, dim)
        if problem is not None:
            return problem
    return (
        extent_problem(op, k, batch, v, batch)
        or extent_problem(op, q, batch + 1, k, batch + 1)
        or extent_problem(op, q, batch + 1, v, batch + 1)
    )


# ----- the declarations -------------------------------------------------------------------


def _axis(extent: Scalar, *sources: tuple[str, int], kind=AxisKind.INHERIT, whole=False):
    found = tuple(AxisSource(*s) for s in sources)
    return ResultAxis(extent=extent, kind=kind, sources=found, whole=whole)


SDPA_PHILOX = declare_op(
    "sdpfa_philox",
    cls=SdpaPhilox,
    params=(
        Param("result", ParamKind.ATTRIBUTE, PhiloxResult),
        Param("dropout", ParamKind.ATTRIBUTE, bool, False),
    ),
    infer=lambda args: (ResultType(dtype=DType.INT64, axes=()),),
    summary="``sdpfa_fwd``'s philox seed or offset: an Int tensor of 0 dims (0 without"
    " dropout; with it a seed drawn each run, and offset 0).",
    dtype_rule="Int",
    sharding=OpSharding(reads_no_tensor=True),
    fd_method=False,  # recorded by fd.ops.sdpfa_fwd only
)

_GROUPED = {(2, 3): "rows", (3, 2): "columns", (2, 2): "K"}
"""What ``grouped_mm``'s groups split, by the ranks of mat1 and mat2."""


def _infer_grouped_mm(args: OpArgs) -> tuple[ResultType, ...] | str:
    """nvFuser's ``createGroupedMmaOutput``: ``[M, K] x [G, K, N] -> [M, N]``, ``[G, M, K]
    x [K, N] -> [M, N]``, ``[M, K] x [K, N] -> [G, M, N]``, K a reduction axis last; the
    grouped dim (and the groups) computed whole."""
    a, b, offsets = args["mat1"], args["mat2"], args["offsets"]
    op = "grouped_mm"
    if offsets.ndim != 1 or offsets.dtype is not DType.INT32:
        return (
            f"{op}: offsets {offsets.name} must be a 1-d Int32 tensor of group ends, got"
            f" {_named(offsets.dtype)} with {offsets.ndim} dims"
        )
    if a.dtype is not b.dtype:
        return (
            f"{op}: mat1 {a.name} is {_named(a.dtype)} but mat2 {b.name} is"
            f" {_named(b.dtype)}; they must have one dtype"
        )
    if a.dtype not in ATTENTION_DTYPES:
        return f"{op}: mat1 {a.name} is {_named(a.dtype)}; expected Half, BFloat16 or Float"
    grouped = _GROUPED.get((a.ndim, b.ndim))
    if grouped is None:
        return (
            f"{op}: mat1 {a.name} has {a.ndim} dims and mat2 {b.name} {b.ndim}; expected"
            " [M, K] x [G, K, N], [G, M, K] x [K, N] or [M, K] x [K, N] (two 3-d operands:"
            " use matmul)"
        )
    problem = extent_problem(op, a, a.ndim - 1, b, b.ndim - 2)
    if grouped != "K":
        problem = problem or extent_problem(
            op, offsets, 0, *((b, 0) if grouped == "rows" else (a, 0))
        )
    if problem is not None:
        return problem
    groups = (_axis(offsets.shape[0], whole=True),) if grouped == "K" else ()
    rows = _axis(a.shape[-2], ("mat1", a.ndim - 2), whole=grouped == "rows")
    columns = _axis(b.shape[-1], ("mat2", b.ndim - 1), whole=grouped == "columns")
    k = _axis(
        a.shape[-1],
        ("mat1", a.ndim - 1),
        ("mat2", b.ndim - 2),
        kind=AxisKind.REDUCTION,
        whole=grouped == "K",
    )
    return (ResultType(dtype=a.dtype, axes=(*groups, rows, columns, k)),)


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
    " ending at ``offsets`` (``torch._grouped_mm``).",
    dtype_rule="one dtype",
)


def _infer_embedding_fwd(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Indices ``[*I]`` (Int or Int32) pick rows of the weight ``[V, D]``: ``[*I, D]`` in the
    weight's dtype (``V`` maps to no result axis: it is read whole)."""
    indices, weight = args["input"], args["weight"]
    op = "embedding_fwd"
    if indices.dtype not in (DType.INT64, DType.INT32):
        return f"{op}: input {indices.name} is {_named(indices.dtype)}; expected Int or Int32"
    if indices.ndim < 1:
        return f"{op}: input {indices.name} must have at least 1 dim"
    if weight.ndim != 2:
        return f"{op}: weight {weight.name} has {weight.ndim} dims; expected [V, D]"
    axes = tuple(_axis(e, ("input", d)) for d, e in enumerate(indices.shape))
    return (ResultType(dtype=weight.dtype, axes=(*axes, _axis(weight.shape[1], ("weight", 1)))),)


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
