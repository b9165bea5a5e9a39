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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.scalars import Scalar
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
