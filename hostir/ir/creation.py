"""The creation instructions: tensors made from scalars alone (``full``, ``iota``) and
random tensors (``uniform``, ``normal``).

None reads a tensor. Where ``out`` is sharded, each rank makes its own slice of the
global tensor: ``full`` fills its local shape, ``iota`` and the random ops give each
element the value it has in the unsharded tensor (the handlers,
``hostir.run.creation``, compute the global values and keep this rank's slice), so a
sharded result equals the corresponding slice of the single-device one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.scalars import Scalar
from hostir.ir.values import TensorValue

Number = TensorValue | Scalar
"""A field holding a scalar of any type (an int, a float or a bool): typed like a pointwise
operand so that text and the verifier take floats there (``Scalar`` fields hold integers);
the verifier's rules refuse a tensor in it."""


@declare(kind=Kind.COMPUTE, keyword="full", positional=("fill_value",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Full:
    """``out``: every element ``fill_value`` converted to ``out``'s dtype."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("fill_value",)
    out: TensorValue
    fill_value: Number
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="iota", positional=("start", "step"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Iota:
    """``out[i] = start + i * step`` for the 1-d ``out`` (its extent is the length)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("start", "step")
    out: TensorValue
    start: Number
    step: Number
    preallocated: bool = False


class Distribution(enum.Enum):
    """The random ops; the value is the keyword (nvFuser's op name)."""

    UNIFORM = "uniform"
    """``a`` is ``minval``, ``b`` is ``maxval``: values in ``[minval, maxval)``."""
    NORMAL = "normal"
    """``a`` is ``mean``, ``b`` is ``std``."""


@declare(kind=Kind.COMPUTE, op_field="distribution", positional=("a", "b"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Random:
    """``out`` drawn from ``distribution`` with parameters ``a`` and ``b``.

    With ``seed`` and ``offset`` the values are a function of them (and of the global
    shape) alone: every run, every replica and every shard agree with the unsharded
    result. Without them each run draws a seed from torch's default CPU generator
    (``hostir.run.creation``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("a", "b", "seed", "offset")
    distribution: Distribution
    out: TensorValue
    a: Number
    b: Number
    seed: Scalar | None = None
    offset: Scalar | None = None
    preallocated: bool = False
