"""The ops that write into a tensor at indices, and count them (issue 35's MoE ops):
``scatter`` and ``scatter_add`` (one instruction class, two keywords), ``index_add`` and
``bincount``, each declared once (``hostir.ir.opdecl``) with its sharding rule.

- ``scatter`` / ``scatter_add`` (nvFuser's ``scatter(arg, index, src, dim)``; ``src`` may
  be a scalar for ``scatter``): ``out = arg.clone()``, then ``out[.., index[i, j], ..] =
  src[i, j]`` (or ``+=``) along ``dim``. ``arg``'s ``dim`` is written whole (every rank
  needs all of it: an index may point anywhere); another dim computes locally where
  ``index`` and ``src`` have ``arg``'s extent there (their rows are ``arg``'s rows),
  else it is computed whole too.
- ``index_add`` (torch's ``index_add``): ``out[.., index[i], ..] += src[.., i, ..]``
  along ``dim``, whole; the other dims compute locally (``src`` has ``arg``'s extents).
- ``bincount(arg, length)``: how many times each value in ``[0, length)`` occurs in the
  1-d ``arg``. The result's dim iterates with nothing of ``arg``'s: ``arg``'s dim is a
  *reduction* axis of the result (as a sum's), so where ``arg`` is sharded each rank
  counts its shard and the counts are partial sums over that mesh axis, which lowering
  reduces (an Allreduce) as it does a sum's.

Indices are global and checked at run time (``hostir.run.scatter_ops``, with
``hostir.run.index_checks``): a value outside ``[0, extent)`` is an ``IndexDataError``
naming the op and the tensor, on every rank that holds it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import NVFUSER_NAMES, DType
from hostir.ir.extents import differ
from hostir.ir.indexing import index_problem
from hostir.ir.opdecl import (
    AxisKind,
    OpArgs,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
    result_axis,
)
from hostir.ir.pointwise import Operand
from hostir.ir.requirements import HIGH, LOW, Requirement
from hostir.ir.scalars import Const, Scalar, print_scalar
from hostir.ir.values import TensorValue


class ScatterKind(enum.Enum):
    """How ``scatter`` writes a value; the value is the keyword."""

    SCATTER = "scatter"
    """Stores it (of several values for one position, which one is unspecified)."""
    SCATTER_ADD = "scatter_add"
    """Adds it to what is there."""


@declare(kind=Kind.COMPUTE, op_field="kind", positional=("arg", "index"))
@dataclass(frozen=True, slots=True, kw_only=True)
class ScatterAlong:
    """``out = torch.scatter(arg, dim, index, src)`` (or ``torch.scatter_add``): ``arg``
    with ``src[i..]`` written (added) at ``index[i..]`` along ``dim``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("arg", "index", "src")
    kind: ScatterKind
    out: TensorValue
    arg: TensorValue
    index: TensorValue
    src: Operand
    dim: int
    preallocated: bool = False


def _dim_problem(op: str, arg: TensorValue, dim: int) -> str | None:
    """Why ``dim`` is no dim of ``arg`` (``fd.ops`` wraps a negative one first)."""
    if arg.ndim == 0:
        return f"{op}: {arg.name} is 0-d; {op} needs a tensor with dims"
    if not 0 <= dim < arg.ndim:
        return f"{op}: dim {dim} is out of range for {arg.name} with {arg.ndim} dims"
    return None


def _dtype_problem(op: str, arg: TensorValue, src: TensorValue, adds: bool) -> str | None:
    """Why ``src``'s dtype cannot be written into ``arg`` (torch takes only one dtype)."""
    if adds and arg.dtype in (DType.BOOL, DType.UINT64):
        return f"{op}: {arg.name} is {NVFUSER_NAMES[arg.dtype]}; {op} adds numbers"
    if src.dtype is not arg.dtype:
        return (
            f"{op}: src {src.name} is {NVFUSER_NAMES[src.dtype]} and {arg.name}"
            f" {NVFUSER_NAMES[arg.dtype]}; they must have one dtype"
        )
    return None


def _scatter_infer(kind: ScatterKind):
    """The ``infer`` of ``scatter`` or ``scatter_add``."""
    op = kind.value

    def infer(args: OpArgs) -> tuple[ResultType, ...] | str:
        """``arg``'s extents and dtype; ``dim`` whole, another dim local where ``index``
        (and a tensor ``src``) have ``arg``'s extent there, whole elsewhere."""
        arg, index, src, dim = args["arg"], args["index"], args["src"], args["dim"]
        problem = _dim_problem(op, arg, dim) or index_problem(op, index.name, index.dtype)
        if problem is not None:
            return problem
        tensor = isinstance(src, TensorValue)
        if not tensor and kind is ScatterKind.SCATTER_ADD:
            return f"scatter_add: src {args.name('src')} must be a tensor"
        if tensor:
            problem = _dtype_problem(op, arg, src, kind is ScatterKind.SCATTER_ADD)
        operands = (("index", index), ("src", src)) if tensor else (("index", index),)
        for role, value in operands:
            if problem is None and value.ndim != arg.ndim:
                problem = (
                    f"{op}: the {role} {value.name} has {value.ndim} dims and {arg.name}"
                    f" {arg.ndim}; they must have the same number of dims"
                )
        if problem is not None:
            return problem
        axes = []
        for d, extent in enumerate(arg.shape):
            aligned = all(value.shape[d] == extent for _, value in operands)
            if d != dim and aligned:  # index and src rows are arg's rows: local
                axes.append(result_axis(extent, ("arg", d), *((r, d) for r, _ in operands)))
            else:
                axes.append(result_axis(extent, ("arg", d), whole=True))
        return (ResultType(dtype=arg.dtype, axes=tuple(axes)),)

    return infer


def _scatter_requirements(instruction: ScatterAlong) -> tuple[Requirement, ...]:
    """torch's rules on the extents: the index is at most as large as ``src`` on every dim
    and as ``arg`` off ``dim`` (checked now where both are constants, else when bound)."""
    arg, index, src = instruction.arg, instruction.index, instruction.src
    if index.ndim != arg.ndim or (isinstance(src, TensorValue) and src.ndim != arg.ndim):
        return ()  # its infer names it
    found = []
    for d in range(arg.ndim):
        larger = f"{instruction.kind.value}: dim {d} of the index {index.name} ({LOW}) is larger"
        if isinstance(src, TensorValue):
            message = f"{larger} than src {src.name}'s ({HIGH})"
            found.append(Requirement(low=index.shape[d], high=src.shape[d], message=message))
        if d != instruction.dim:
            message = f"{larger} than {arg.name}'s ({HIGH})"
            found.append(Requirement(low=index.shape[d], high=arg.shape[d], message=message))
    return tuple(found)


def _scatter_params() -> tuple[Param, ...]:
    return (
        Param("arg", ParamKind.TENSOR, TensorValue),
        Param("index", ParamKind.TENSOR, TensorValue),
        Param("src", ParamKind.OPERAND, Operand),
        Param("dim", ParamKind.ATTRIBUTE, int, dim_of="arg"),
    )


SCATTER_DECLS = {
    kind: declare_op(
        kind.value,
        cls=ScatterAlong,
        params=_scatter_params(),
        infer=_scatter_infer(kind),
        summary=summary,
        dtype_rule="same",
        requirements=_scatter_requirements,
    )
    for kind, summary in (
        (
            ScatterKind.SCATTER,
            "``arg`` with ``src`` (a tensor or a scalar) written at ``index`` along ``dim``"
            " (``torch.scatter``).",
        ),
        (
            ScatterKind.SCATTER_ADD,
            "``arg`` with ``src`` added at ``index`` along ``dim`` (``torch.scatter_add``).",
        ),
    )
}
"""The declarations of ``scatter`` and ``scatter_add``."""


# ----- index_add: declared in the generating form -----------------------------------------


def _infer_index_add(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``arg``'s extents and dtype; ``dim`` whole (``src``'s dim and ``index`` read whole),
    the other dims local with ``src``'s."""
    arg, index, src, dim = args["arg"], args["index"], args["src"], args["dim"]
    problem = (
        _dim_problem("index_add", arg, dim)
        or index_problem("index_add", index.name, index.dtype)
        or _dtype_problem("index_add", arg, src, adds=True)
    )
    if problem is not None:
        return problem
    if index.ndim != 1:
        return f"index_add: the index {index.name} has {index.ndim} dims; it must be 1-d"
    if src.ndim != arg.ndim:
        return (
            f"index_add: src {src.name} has {src.ndim} dims and {arg.name} {arg.ndim};"
            " they must have the same number of dims"
        )
    wanted = [index.shape[0] if d == dim else e for d, e in enumerate(arg.shape)]
    for d, (want, have) in enumerate(zip(wanted, src.shape, strict=True)):
        if differ(want, have):
            of = f"the index {index.name}'s length" if d == dim else f"{arg.name}'s"
            return (
                f"index_add: dim {d} of src {src.name} is {print_scalar(have)}; it must be"
                f" {of} ({print_scalar(want)})"
            )
    axes = tuple(  # src's dim and the index map to no result axis: read whole
        result_axis(e, ("arg", d), *(() if d == dim else (("src", d),)), whole=d == dim)
        for d, e in enumerate(arg.shape)
    )
    return (ResultType(dtype=arg.dtype, axes=axes),)


def _index_add_requirements(instruction) -> tuple[Requirement, ...]:
    """``src``'s extents equal ``arg``'s off ``dim`` and the index's length along it (both
    ways round: checked now where constants, else when bound)."""
    arg, index, src, dim = instruction.arg, instruction.index, instruction.src, instruction.dim
    if src.ndim != arg.ndim or index.ndim != 1 or not 0 <= dim < arg.ndim:
        return ()  # its infer names it
    found = []
    for d in range(arg.ndim):
        want = index.shape[0] if d == dim else arg.shape[d]
        of = f"the index {index.name}'s length" if d == dim else f"{arg.name}'s"
        message = f"index_add: dim {d} of src {src.name} is {{}}; it must be {of} ({{}})"
        found.append(Requirement(low=src.shape[d], high=want, message=message.format(LOW, HIGH)))
        found.append(Requirement(low=want, high=src.shape[d], message=message.format(HIGH, LOW)))
    return tuple(found)


INDEX_ADD = declare_op(
    "index_add",
    class_name="IndexAdd",
    params=(
        Param("arg", ParamKind.TENSOR, TensorValue),
        Param("index", ParamKind.TENSOR, TensorValue),
        Param("src", ParamKind.TENSOR, TensorValue),
        Param("dim", ParamKind.ATTRIBUTE, int, 0, dim_of="arg"),
    ),
    positional=("arg", "index"),
    infer=_infer_index_add,
    summary="``arg`` with the slices of ``src`` added at the 1-d ``index`` along ``dim``"
    " (``torch.index_add``).",
    dtype_rule="same",
    requirements=_index_add_requirements,
)
IndexAdd = INDEX_ADD.cls
"""``out = torch.index_add(arg, dim, index, src)`` (text ``index_add(T0, T1, src=T2,
dim=0)``, JSON tag ``IndexAdd``)."""


# ----- bincount ---------------------------------------------------------------------------


def _infer_bincount(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Int ``[length]``; ``arg``'s dim is a reduction axis of the result: a sharded one gives
    partial counts that sum."""
    arg, length = args["src"], args["length"]
    if arg.dtype not in (DType.INT64, DType.INT32) or arg.ndim != 1:
        what = f"{NVFUSER_NAMES[arg.dtype]} with {arg.ndim} dims"
        return f"bincount: {arg.name} is {what}; bincount counts a 1-d Int or Int32 tensor"
    if args.scalar_type("length") is not int:
        return f"bincount: length {args.name('length')} must be an integer"
    kind = AxisKind.BROADCAST if length == Const(value=1) else AxisKind.ITERATION
    # computed whole: each rank counts every bin (torch.bincount), a sharded result is
    # laid out afterwards (fuzz seed 8600041 at 8 ranks: a cyclic split of the bins)
    counts = ResultAxis(extent=length, kind=kind, whole=True)
    reduced = result_axis(arg.shape[0], ("src", 0), kind=AxisKind.REDUCTION)
    return (ResultType(dtype=DType.INT64, axes=(counts, reduced)),)


def _bincount_requirements(instruction) -> tuple[Requirement, ...]:
    """``length`` is not negative."""
    message = f"bincount: length {HIGH} of {instruction.src.name}'s counts is negative"
    return (Requirement(low=Const(value=0), high=instruction.length, message=message),)


BINCOUNT = declare_op(
    "bincount",
    class_name="Bincount",
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("length", ParamKind.SCALAR, Scalar),
    ),
    positional=("src",),
    infer=_infer_bincount,
    summary="How many times each value in ``[0, length)`` occurs in the 1-d ``arg``"
    " (``torch.bincount``; a value outside is refused).",
    dtype_rule="Int",
    requirements=_bincount_requirements,
)
Bincount = BINCOUNT.cls
"""``out = torch.bincount(src, minlength=length)``, every value of ``src`` checked in
``[0, length)`` (text ``bincount(T0, length=8)``, JSON tag ``Bincount``)."""
