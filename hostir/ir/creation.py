"""The creation instructions: tensors made from scalars alone (``full``, ``iota``) and
random tensors (``uniform``, ``normal``), and their declarations (``hostir.ir.opdecl``).

None reads a tensor: the caller gives the result's dtype and extents (``fd.ops``' ``dtype``
and ``shape``, or ``iota``'s ``length``; in a program, ``out``'s), and the declaration checks
the scalars against them. Where ``out`` is sharded, each rank makes its own slice of the
global tensor: ``full`` fills its local shape, ``iota`` and the random ops give each
element the value it has in the unsharded tensor (the implementations,
``hostir.run.creation``, compute the global values and keep this rank's slice), so a
sharded result equals the corresponding slice of the single-device one.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import extents_text
from hostir.ir.opdecl import (
    AxisKind,
    OpArgs,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.ir.scalars import Const, Scalar
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


# ----- the declarations -------------------------------------------------------------------

FLOATS = frozenset({DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16})
"""The floating-point dtypes."""
INTEGERS = frozenset({DType.INT64, DType.INT32})
"""The integer dtypes ``fd.ops`` computes in (nvFuser's Int and Int32)."""

_ARTICLED = {int: "an int", float: "a float"}
_MADE = frozenset({"shape", "dtype"})
"""What of a creation op's result the caller gives: all of it."""


def factory_axes(shape: tuple[Scalar, ...]) -> tuple[ResultAxis, ...]:
    """The axes of a tensor made of ``shape``: a constant extent of 1 is a broadcast axis
    (nvFuser's ``factoryOutput``); none iterates with an operand's."""
    one = Const(value=1)
    return tuple(
        ResultAxis(extent=e, kind=AxisKind.BROADCAST if e == one else AxisKind.ITERATION)
        for e in shape
    )


def _scalar_problem(op: str, args: OpArgs, field: str, what: str) -> str | None:
    """A tensor where the op takes a number or a scalar (a program's field: the fields are
    typed as operands, so that text takes floats there)."""
    value = args[field]
    if isinstance(value, TensorValue):
        return f"{op}: {what} must be a number or a scalar, got the tensor {value.name}"
    return None


def _infer_full(args: OpArgs) -> tuple[ResultType, ...] | str:
    """The given dtype and extents; ``fill_value`` a scalar (converted to the dtype)."""
    problem = _scalar_problem("full", args, "fill_value", "fill_value")
    if problem is not None:
        return problem
    out = args.given["out"]
    return (ResultType(dtype=out.dtype, axes=factory_axes(out.shape)),)


def _infer_iota(args: OpArgs) -> tuple[ResultType, ...] | str:
    """A 1-d tensor of the given integer or floating-point dtype; ``start`` and ``step``
    ints for an integer dtype and floats for a floating-point one (nvFuser checks it), a
    constant one finite, a constant step not 0."""
    out = args.given["out"]
    if len(out.shape) != 1:
        return f"iota: {out.name} must be 1-d, got {extents_text(out.shape)}"
    if out.dtype not in INTEGERS | FLOATS:
        name = NVFUSER_NAMES[out.dtype]
        return f"iota: dtype {name} is neither an integer nor a float dtype"
    wanted = float if out.dtype in FLOATS else int
    for field in ("start", "step"):
        problem = _scalar_problem("iota", args, field, field)
        if problem is not None:
            return problem
        found = args.scalar_type(field)
        if found is not wanted:
            return (
                f"iota: {field} {args.name(field)} is a {found.__name__}, but dtype is"
                f" {NVFUSER_NAMES[out.dtype]}: nvFuser's iota takes {_ARTICLED[wanted]}"
                f" {field} for it"
            )
        value = args[field]
        constant = value.value if isinstance(value, Const) else None
        if isinstance(constant, float) and not math.isfinite(constant):
            return f"iota: {field} must be finite, got {constant}"
    if args["step"] == Const(value=0):  # a scalar input is checked when it runs
        return "iota: step must not be 0"
    return (ResultType(dtype=out.dtype, axes=(ResultAxis(out.shape[0], AxisKind.ITERATION),)),)


def _random_infer(op: str, a: str, b: str):
    """The ``infer`` of random op ``op``, whose ``a`` and ``b`` nvFuser names ``a`` and
    ``b`` (``minval``, ``maxval``)."""

    def infer(args: OpArgs) -> tuple[ResultType, ...] | str:
        """The given floating-point dtype and extents; a seed and an offset, integers,
        together or neither (nvFuser's rule)."""
        out = args.given["out"]
        if out.dtype not in FLOATS:
            return (
                f"{op}: dtype {NVFUSER_NAMES[out.dtype]} is not a floating-point dtype; random"
                " distributions only create floating-point tensors"
            )
        problem = _scalar_problem(op, args, "a", a) or _scalar_problem(op, args, "b", b)
        if problem is not None:
            return problem
        if (args["seed"] is None) != (args["offset"] is None):
            return f"{op}: rng_seed and rng_offset must be provided together"
        for field, what in (("seed", "rng_seed"), ("offset", "rng_offset")):
            if args[field] is not None and args.scalar_type(field) is not int:
                return f"{op}: {what} must be an integer, got {args.name(field)}"
        return (ResultType(dtype=out.dtype, axes=factory_axes(out.shape)),)

    return infer


FULL = declare_op(
    "full",
    cls=Full,
    params=(Param("fill_value", ParamKind.OPERAND, Number),),
    infer=_infer_full,
    summary="A tensor of ``shape`` with every element ``fill_value`` converted to ``dtype``.",
    dtype_rule="given",
    given=_MADE,
    nvfuser_signature="full(shape, fill_value, dtype)",
)

IOTA = declare_op(
    "iota",
    cls=Iota,
    params=(Param("start", ParamKind.OPERAND, Number), Param("step", ParamKind.OPERAND, Number)),
    infer=_infer_iota,
    summary="The 1-d tensor ``start + i * step`` for ``i`` in ``range(length)``.",
    dtype_rule="given",
    given=_MADE,
    nvfuser_signature="iota(length, start=None, step=None, dtype=DataType.Int)",
)


def _declare_random(distribution: Distribution, a: str, b: str, summary: str):
    """The declaration of a random op, its ``a`` and ``b`` named ``a`` and ``b`` by nvFuser."""
    op = distribution.value
    return declare_op(
        op,
        cls=Random,
        params=(
            Param("a", ParamKind.OPERAND, Number, nvfuser=a),
            Param("b", ParamKind.OPERAND, Number, nvfuser=b),
            Param("seed", ParamKind.SCALAR, Scalar | None, None, nvfuser="rng_seed"),
            Param("offset", ParamKind.SCALAR, Scalar | None, None, nvfuser="rng_offset"),
        ),
        infer=_random_infer(op, a, b),
        summary=summary,
        dtype_rule="given",
        given=_MADE,
        nvfuser_signature=(
            f"{op}({a}, {b}, shape, *, rng_seed=None, rng_offset=None, dtype=DataType.Float)"
        ),
    )


UNIFORM = _declare_random(
    Distribution.UNIFORM, "minval", "maxval", "Values drawn uniformly from ``[minval, maxval)``."
)
NORMAL = _declare_random(
    Distribution.NORMAL, "mean", "std", "Values drawn from the normal distribution."
)
RANDOM_DECLS = {Distribution.UNIFORM: UNIFORM, Distribution.NORMAL: NORMAL}
"""The declaration of each random op."""
