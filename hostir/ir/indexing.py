"""The indexing and scan instructions: ``index_select``, ``gather``,
``take_along_axis``, ``cumsum`` and ``topk``.

Each computes on local data along a dim that is whole on every rank: lowering gathers a
sharded ``dim`` of ``src`` before the op (the dim is not mapped to the output, so a
``set`` makes it whole; docs/ops.md). Other dims may be sharded and compute locally.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.scalars import Scalar
from hostir.ir.values import TensorValue


@declare(kind=Kind.COMPUTE, keyword="index_select", positional=("src", "index"))
@dataclass(frozen=True, slots=True, kw_only=True)
class IndexSelect:
    """``out = torch.index_select(src, dim, index)``: the 1-d ``index`` picks entries of
    ``src``'s dim ``dim``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "index")
    out: TensorValue
    src: TensorValue
    index: TensorValue
    dim: int
    preallocated: bool = False


class GatherKind(enum.Enum):
    """nvFuser's two gathers; the value is the keyword."""

    GATHER = "gather"
    """``index`` may be smaller than ``src`` on the other dims (``torch.gather``)."""
    TAKE_ALONG_AXIS = "take_along_axis"
    """``index`` has ``src``'s extents on the other dims, where a dim of extent 1 of
    either broadcasts (``torch.take_along_dim``)."""


@declare(kind=Kind.COMPUTE, op_field="kind", positional=("src", "index"))
@dataclass(frozen=True, slots=True, kw_only=True)
class GatherAlong:
    """``out[i..., j, k...] = src[i..., index[i..., j, k...], k...]`` along ``dim``; ``out``
    has ``index``'s extents (``kind`` says how they relate to ``src``'s)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "index")
    kind: GatherKind
    out: TensorValue
    src: TensorValue
    index: TensorValue
    dim: int
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="cumsum", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Cumsum:
    """``out = torch.cumsum(src, dim)`` in ``out``'s dtype (``src``'s: nvFuser's scan does
    not promote)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    dim: int
    preallocated: bool = False


class TopKResult(enum.Enum):
    """Which result of ``topk`` an instruction gives (nvFuser returns both)."""

    VALUES = "values"
    INDICES = "indices"


@declare(kind=Kind.COMPUTE, keyword="topk", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class TopK:
    """One result of ``torch.topk(src, k, dim, largest, sorted)``: the values or their
    indices (int64). Each instruction computes the op for its own result."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "k")
    out: TensorValue
    src: TensorValue
    k: Scalar
    dim: int
    largest: bool = True
    sorted: bool = False
    result: TopKResult = TopKResult.VALUES
    preallocated: bool = False
