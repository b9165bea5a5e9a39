"""The indexing and scan instructions, and their declarations (``hostir.ir.opdecl``):
``index_select``, ``gather``, ``take_along_axis``, ``cumsum`` and ``topk`` (one
instruction defining both of its results, the values and their indices).

Each computes on local data along a dim that is whole on every rank: lowering gathers a
sharded ``dim`` of ``src`` before the op (the declaration maps no result axis to it, or
marks the result axis ``whole``; docs/ops.md). Other dims may be sharded and compute
locally.

``argsort`` is declared at the end in the generating form: its declaration makes its
class (docs/extending.md, "Adding an op", walks through it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import differ, is_one
from hostir.ir.opdecl import (
    AxisKind,
    AxisSource,
    OpArgs,
    Param,
    ParamKind,
    Result,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.ir.requirements import (
    Requirement,
    gather_requirement,
    topk_requirements,
)
from hostir.ir.scalars import Const, Scalar, print_scalar
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


@declare(kind=Kind.COMPUTE, keyword="topk", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class TopK:
    """``values, indices = torch.topk(src, k, dim, largest, sorted)``: the ``k`` largest
    (or smallest) entries of ``src`` along ``dim`` and their indices (int64), both from one
    kernel call."""

    OUTS: ClassVar[tuple[str, ...]] = ("values", "indices")
    INS: ClassVar[tuple[str, ...]] = ("src", "k")
    values: TensorValue
    indices: TensorValue
    src: TensorValue
    k: Scalar
    dim: int
    largest: bool = True
    sorted: bool = False
    preallocated: bool = False


# ----- the declarations -------------------------------------------------------------------

INDEX_DTYPES = frozenset({DType.INT64, DType.INT32})
"""The dtypes of indices (nvFuser's Int and Int32)."""


def index_problem(op: str, name: str, dtype: DType) -> str | None:
    """Why the index ``name`` of ``dtype`` cannot index, or None (``fd.ops`` asks before it
    translates its arguments, the declarations when they infer)."""
    if dtype in INDEX_DTYPES:
        return None
    return f"{op}: the index {name} is {NVFUSER_NAMES[dtype]}; indices are Int or Int32"


def _dim_problem(op: str, src: TensorValue, dim: int) -> str | None:
    """Why ``dim`` is no dim of ``src`` (``fd.ops`` wraps a negative one first)."""
    if src.ndim == 0:
        return f"{op}: {src.name} is 0-d; {op} needs a tensor with dims"
    if not 0 <= dim < src.ndim:
        return f"{op}: dim {dim} is out of range for {src.name} with {src.ndim} dims"
    return None


def _axis(extent: Scalar, *sources: tuple[str, int], whole: bool = False) -> ResultAxis:
    """A result axis of ``extent``: a broadcast axis if it is 1, else an iteration axis
    (whatever its sources' are), iterating with ``sources``."""
    kind = AxisKind.BROADCAST if extent == Const(value=1) else AxisKind.ITERATION
    found = tuple(AxisSource(*s) for s in sources)
    return ResultAxis(extent=extent, kind=kind, sources=found, whole=whole)


def _infer_index_select(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src``'s extents, ``index``'s at ``dim``: that axis iterates with the index (the
    source's ``dim`` maps to none, so it is read whole)."""
    src, index, dim = args["src"], args["index"], args["dim"]
    problem = _dim_problem("index_select", src, dim) or index_problem(
        "index_select", index.name, index.dtype
    )
    if problem is not None:
        return problem
    if index.ndim != 1:
        return f"index_select: the index {index.name} has {index.ndim} dims; it must be 1-d"
    axes = tuple(
        _axis(index.shape[0], ("index", 0)) if d == dim else _axis(e, ("src", d))
        for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


def _gather_axis(
    kind: GatherKind, src: TensorValue, index: TensorValue, dim: int, d: int
) -> ResultAxis | str:
    """Result axis ``d`` of a gather of ``src`` along ``dim`` by ``index``, or why the two
    axes ``d`` do not go together. It has the index's extent (take_along_axis: the
    source's where the index's is 1, which broadcasts); it iterates with the index's axis
    of that extent and off ``dim`` with the source's of that extent (take_along_axis: also
    of another form of it). A gather's axis that does not iterate with the source's is
    computed whole (the index's rows do not line up with the source's shard by shard)."""
    a, i = src.shape[d], index.shape[d]
    extent = i
    if d != dim and kind is GatherKind.TAKE_ALONG_AXIS:
        if differ(a, i) and not is_one(a) and not is_one(i):
            return (
                f"take_along_axis: dim {d} of {src.name} ({print_scalar(a)}) and of the index"
                f" {index.name} ({print_scalar(i)}) differ; they must be equal (or one of them 1)"
            )
        extent = a if is_one(i) else i
    same = kind is GatherKind.TAKE_ALONG_AXIS and not is_one(a) and not is_one(i)
    sources = []
    if d != dim and (a == extent or same):
        sources.append(("src", d))
    if i == extent:
        sources.append(("index", d))
    whole = kind is GatherKind.GATHER and d != dim and ("src", d) not in sources
    return _axis(extent, *sources, whole=whole)


def _gather_infer(kind: GatherKind):
    """The ``infer`` of ``gather`` or ``take_along_axis``."""
    op = kind.value

    def infer(args: OpArgs) -> tuple[ResultType, ...] | str:
        """The index's extents (see :func:`_gather_axis`), the source's dtype."""
        src, index, dim = args["src"], args["index"], args["dim"]
        problem = _dim_problem(op, src, dim) or index_problem(op, index.name, index.dtype)
        if problem is not None:
            return problem
        if index.ndim != src.ndim:
            return (
                f"{op}: the index {index.name} has {index.ndim} dims and {src.name}"
                f" {src.ndim}; they must have the same number of dims"
            )
        axes = [_gather_axis(kind, src, index, dim, d) for d in range(src.ndim)]
        refused = [axis for axis in axes if isinstance(axis, str)]
        if refused:
            return refused[0]
        return (ResultType(dtype=src.dtype, axes=tuple(axes)),)

    return infer


def _gather_requirements(instruction: GatherAlong) -> tuple[Requirement, ...]:
    """``gather``'s index is at most as large as its source off ``dim`` (checked now where
    both extents are constants, else on the bound values)."""
    src, index = instruction.src, instruction.index
    if src.ndim != index.ndim:
        return ()  # its infer names it
    return tuple(
        gather_requirement(src.name, index.name, d, index.shape[d], src.shape[d])
        for d in range(src.ndim)
        if d != instruction.dim
    )


def _infer_cumsum(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src``'s extents and dtype (nvFuser's scan does not promote), ``dim`` scanned
    whole."""
    src, dim = args["src"], args["dim"]
    problem = _dim_problem("cumsum", src, dim)
    if problem is not None:
        return problem
    if src.dtype in (DType.BOOL, DType.UINT64):
        return f"cumsum: {src.name} is {NVFUSER_NAMES[src.dtype]}; cumsum takes numbers"
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),), whole=d == dim)
        for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


def _params() -> tuple[Param, ...]:
    return (
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("index", ParamKind.TENSOR, TensorValue),
        Param("dim", ParamKind.ATTRIBUTE, int),
    )


INDEX_SELECT = declare_op(
    "index_select",
    cls=IndexSelect,
    params=_params(),
    infer=_infer_index_select,
    summary="The entries of ``arg``'s dim ``dim`` at the positions in the 1-d ``index``.",
    dtype_rule="same",
)

GATHER_DECLS = {
    kind: declare_op(
        kind.value,
        cls=GatherAlong,
        params=_params(),
        infer=_gather_infer(kind),
        summary=summary,
        dtype_rule="same",
        requirements=_gather_requirements if kind is GatherKind.GATHER else None,
    )
    for kind, summary in (
        (GatherKind.GATHER, "``arg`` gathered along ``dim`` at ``index`` (``torch.gather``)."),
        (
            GatherKind.TAKE_ALONG_AXIS,
            "``gather`` whose ``index`` has ``arg``'s extents off ``dim`` (1s broadcast).",
        ),
    )
}
"""The declarations of ``gather`` and ``take_along_axis``."""

CUMSUM = declare_op(
    "cumsum",
    cls=Cumsum,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("dim", ParamKind.ATTRIBUTE, int),
    ),
    infer=_infer_cumsum,
    summary="The running sum of ``arg`` along ``dim``.",
    dtype_rule="same",
    nvfuser_signature="cumsum(arg, dim, init=None)",
)


def _infer_topk(args: OpArgs) -> tuple[ResultType, ...] | str:
    """The values (``src``'s dtype) and the indices (Int): ``src``'s extents, ``k`` along
    ``dim``, which is computed whole (a rank needs all of it to find the top ``k``)."""
    src, k, dim = args["src"], args["k"], args["dim"]
    problem = _dim_problem("topk", src, dim)
    if problem is not None:
        return problem
    if src.dtype in (DType.BOOL, DType.UINT64):
        return f"topk: {src.name} is {NVFUSER_NAMES[src.dtype]}; topk compares numbers"
    axes = tuple(
        _axis(k, whole=True) if d == dim else _axis(e, ("src", d)) for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes), ResultType(dtype=DType.INT64, axes=axes))


def _topk_requirements(instruction: TopK) -> tuple[Requirement, ...]:
    """``topk``'s rules on bound values: ``0 <= k <=`` the extent of ``dim``."""
    src = instruction.src
    if not 0 <= instruction.dim < src.ndim:
        return ()  # its infer names it
    return topk_requirements(src.name, instruction.dim, src.shape[instruction.dim], instruction.k)


TOPK = declare_op(
    "topk",
    cls=TopK,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("k", ParamKind.SCALAR, Scalar),
        Param("dim", ParamKind.ATTRIBUTE, int, nvfuser_default=-1),
        Param("largest", ParamKind.ATTRIBUTE, bool, True),
        Param("sorted", ParamKind.ATTRIBUTE, bool, False),
    ),
    results=(Result("values"), Result("indices")),
    infer=_infer_topk,
    summary="The ``k`` largest (or smallest) entries of ``arg`` along ``dim`` and their"
    " indices: ``(values, indices)``, one instruction.",
    dtype_rule="same; indices Int",
    requirements=_topk_requirements,
)


# ----- argsort: declared in the generating form (docs/extending.md, "Adding an op") -------


def _infer_argsort(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Int positions of ``src``'s extents; the sorted ``dim`` is computed whole (a rank needs
    all of it), every dim iterates with ``src``'s."""
    src, dim = args["src"], args["dim"]
    problem = _dim_problem("argsort", src, dim)
    if problem is not None:
        return problem
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),), whole=d == dim)
        for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=DType.INT64, axes=axes),)


ARGSORT = declare_op(
    "argsort",
    class_name="Argsort",
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("dim", ParamKind.ATTRIBUTE, int, dim_of="src"),
        Param("descending", ParamKind.ATTRIBUTE, bool, False),
        Param("stable", ParamKind.ATTRIBUTE, bool, False),
    ),
    positional=("src",),
    infer=_infer_argsort,
    summary="The positions that sort ``arg`` along ``dim`` (``torch.argsort``).",
    dtype_rule="Int",
)
Argsort = ARGSORT.cls
"""``out = torch.argsort(src, dim, descending, stable=stable)``: the class the declaration
made (text ``argsort(T0, dim=1, ...)``, JSON tag ``Argsort``)."""
