"""The shape ops (``reshape``, ``slice``, ``pad``, ``cat``): their instructions and their
declarations (``hostir.ir.opdecl``).

A reshape keeps the order of elements; its dims fall into *groups*: consecutive input dims
whose extents multiply to the product of consecutive output dims (``[b, s, 3e] -> [b, s, h,
3e/h]`` is ``b -> b``, ``s -> s``, ``3e -> (h, 3e/h)``). ``hostir.ir.reshape_groups`` finds
them from the (possibly symbolic) extents; the declaration maps the dims of one-to-one groups,
and the lowering decides from them whether a sharded dim stays contiguous on each rank
(``lowering.shape_ops``, keyed on the declaration's ``keeps_blocks``). ``slice`` and
``pad`` act on one dim each and ``cat`` joins two tensors: an op on several dims, or of
more tensors, is a chain of them (docs/ops.md, "Shape ops").

Each keeps its operand's dtype. A dim the op creates or changes (a reshape's dims outside
one-to-one groups, the sliced, padded or joined dim) iterates with no operand dim and is
computed whole on each rank (``ResultAxis.whole``): the instruction reads that dim whole,
so a program that shards it there is refused by name (each declaration's ``check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any, ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import python_type
from hostir.ir.extents import differ, local_extents, normal_form, times
from hostir.ir.opdecl import (
    AxisSource,
    OpArgs,
    OpSharding,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.ir.requirements import HIGH, LOW, Requirement, pad_requirements, slice_requirements
from hostir.ir.reshape_groups import ONE, ReshapeError, reshape_groups
from hostir.ir.scalars import Scalar, add, print_scalar, product, sub
from hostir.ir.values import TensorValue


@declare(kind=Kind.COMPUTE, keyword="reshape", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Reshape:
    """``out = src.reshape(out's local shape)``: the same elements in the same order. On
    sharded tensors each rank reshapes its own shard; the lowering keeps a sharded dim only
    where the shard stays one contiguous block of the output (``lowering.shape_ops``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="slice", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    """``out = src.narrow(dim, start, stop - start)``: elements ``start <= i < stop`` of
    ``dim`` (already normalized: ``0 <= start <= stop <= extent``); ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "start", "stop")
    out: TensorValue
    src: TensorValue
    dim: int
    start: Scalar
    stop: Scalar
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="pad", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Pad:
    """``out``: ``src`` with ``left`` elements before and ``right`` after along ``dim``, all
    ``value`` (``torch.nn.functional.pad``); ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "left", "right", "value")
    out: TensorValue
    src: TensorValue
    dim: int
    left: Scalar
    right: Scalar
    value: TensorValue | Scalar  # a scalar (written as an operand: a float is allowed)
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="cat", positional=("lhs", "rhs"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Cat:
    """``out = torch.cat([lhs, rhs], dim)``; ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("lhs", "rhs")
    out: TensorValue
    lhs: TensorValue
    rhs: TensorValue
    dim: int
    preallocated: bool = False


# ----- the declarations -------------------------------------------------------------------


def _axes(fields: tuple[str, ...], like: TensorValue, dim: int, extent: Scalar) -> tuple:
    """``like``'s axes, each iterating with the same dim of operands ``fields``, but a new
    axis of ``extent`` at ``dim``, computed whole."""
    return tuple(
        ResultAxis(extent=extent, whole=True)
        if d == dim
        else ResultAxis(extent=e, sources=tuple(AxisSource(f, d) for f in fields))
        for d, e in enumerate(like.shape)
    )


def _dim_problem(op: str, src: TensorValue, dim: int) -> str | None:
    ok = 0 <= dim < src.ndim
    return None if ok else f"{op}: dim {dim} is out of range for {src.name} ({src.ndim} dims)"


def _dim_whole(*fields: str) -> Any:
    """The ``check`` of an op reading its operands ``fields`` whole along ``dim``: a
    program that shards that dim is refused (the lowering gathers it first)."""

    def check(instruction: Any) -> str | None:
        for field in fields:
            src, dim = getattr(instruction, field), instruction.dim
            if 0 <= dim < src.ndim and src.sharding is not None and src.sharding.mesh_axes_of(dim):
                return f"dim {dim} of {src.name} is sharded; it must be whole on each rank"
        return None

    return check


# ----- reshape ----------------------------------------------------------------------------


def _infer_reshape(args: OpArgs) -> tuple[ResultType, ...] | str:
    """The extents the caller gives, in groups of ``src``'s (:func:`reshape_groups`): a dim
    of a one-to-one group iterates with its input dim, the others are new (whole)."""
    src, out = args["src"], args.given["out"]
    try:
        groups = reshape_groups(src.shape, out.shape)
    except ReshapeError as error:
        return f"reshape of {src.name}: {error}"
    kept = {outs[0]: ins[0] for ins, outs in groups if len(ins) == 1 and len(outs) == 1}
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", kept[o]),))
        if o in kept
        else ResultAxis(extent=e, whole=True)
        for o, e in enumerate(out.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


def _reshape_requirements(instruction: Reshape) -> tuple[Requirement, ...]:
    """Equal element counts, where the symbols alone do not show them (a shape entry that
    is a scalar input, ``[i0] -> [s0, s1]``; a -1 next to one, ``i0 // s0``): two
    requirements, each side at most the other."""
    src, out = instruction.src, instruction.out
    held, made = product(list(src.shape)), product(list(out.shape))
    try:
        reshape_groups(src.shape, out.shape)
    except ReshapeError:
        return ()  # infer names it
    if normal_form(held) == normal_form(made):
        return ()
    shape = "[" + ", ".join(print_scalar(e) for e in out.shape) + "]"
    where = f"reshape of {src.name} to {shape}"
    return (
        Requirement(
            low=held,
            high=made,
            message=f"{where}: {src.name} holds {LOW} elements, more than the {HIGH} of the"
            " new shape; the element counts must be equal",
        ),
        Requirement(
            low=made,
            high=held,
            message=f"{where}: the new shape holds {LOW} elements, more than the {HIGH} of"
            f" {src.name}; the element counts must be equal",
        ),
    )


def _check_reshape(instruction: Reshape) -> str | None:
    """Each rank reshapes its own shard: the local shards hold as many elements."""
    src, out = instruction.src, instruction.out
    try:
        reshape_groups(src.shape, out.shape)
    except ReshapeError:
        return None  # infer names it
    mine, theirs = (reduce(times, local_extents(v), ONE) for v in (out, src))
    if mine[1] == theirs[1] and mine[0] != theirs[0]:
        return (
            f"{out.name} = reshape({src.name}): the local shards hold different numbers of"
            " elements; a rank reshapes its own shard"
        )
    return None


RESHAPE = declare_op(
    "reshape",
    cls=Reshape,
    params=(Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),),
    infer=_infer_reshape,
    summary="The same elements, in order, in ``new_shape``.",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True, keeps_blocks=True),
    check=_check_reshape,
    requirements=_reshape_requirements,
    given=frozenset({"shape"}),
    nvfuser_signature="reshape(arg, new_shape)",
)


# ----- slice ------------------------------------------------------------------------------


def _infer_slice(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src``'s extents, ``stop - start`` at ``dim``."""
    src, dim = args["src"], args["dim"]
    problem = _dim_problem("slice", src, dim)
    if problem is not None:
        return problem
    extent = sub(args["stop"], args["start"])
    return (ResultType(dtype=src.dtype, axes=_axes(("src",), src, dim, extent)),)


def _slice_requirements(instruction: Slice) -> tuple[Requirement, ...]:
    """``0 <= start <= stop <= extent`` (``hostir.ir.requirements``; a dim out of range:
    none, infer names it)."""
    src, dim = instruction.src, instruction.dim
    if not 0 <= dim < src.ndim:
        return ()
    return slice_requirements(src.name, dim, src.shape[dim], instruction.start, instruction.stop)


SLICE = declare_op(
    "slice",
    cls=Slice,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("dim", ParamKind.ATTRIBUTE, int),
        Param("start", ParamKind.SCALAR, Scalar),
        Param("stop", ParamKind.SCALAR, Scalar),
    ),
    infer=_infer_slice,
    summary="Elements ``start <= i < end`` of each dim (one instruction per sliced dim).",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True),
    requirements=_slice_requirements,
    check=_dim_whole("src"),
    nvfuser_signature="slice(arg, start_indices, end_indices, strides=None,"
    " manual_normalization=False)",
)


# ----- pad --------------------------------------------------------------------------------


def pad_value_problem(src: TensorValue, kind: type, name: str) -> str | None:
    """Why a fill value of Python type ``kind``, shown as ``name``, cannot pad ``src``: it
    must be of the tensor's kind (nvFuser's ``hasSimilarDtype``), or None."""
    wanted = python_type(src.dtype)
    if kind is wanted:
        return None
    return (
        f"pad of {src.name}: value {name} is a {kind.__name__}, but {src.name} is"
        f" {src.dtype.value}: the value must be of the tensor's kind (a {wanted.__name__};"
        " nvFuser: 'Tensor arg and pad value must have the same dtype')"
    )


def _infer_pad(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src``'s extents, ``left + extent + right`` at ``dim``; the fill value a scalar of
    the tensor's kind."""
    src, dim = args["src"], args["dim"]
    problem = _dim_problem("pad", src, dim)
    if problem is not None:
        return problem
    if isinstance(args["value"], TensorValue):
        return f"pad of {src.name}: value {args['value'].name} must be a scalar"
    problem = pad_value_problem(src, args.scalar_type("value"), args.name("value"))
    if problem is not None:
        return problem
    extent = add(add(args["left"], src.shape[dim]), args["right"])
    return (ResultType(dtype=src.dtype, axes=_axes(("src",), src, dim, extent)),)


def _pad_requirements(instruction: Pad) -> tuple[Requirement, ...]:
    """Widths ``>= 0`` (``hostir.ir.requirements``)."""
    return pad_requirements(
        instruction.src.name, instruction.dim, instruction.left, instruction.right
    )


PAD = declare_op(
    "pad",
    cls=Pad,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("dim", ParamKind.ATTRIBUTE, int),
        Param("left", ParamKind.SCALAR, Scalar),
        Param("right", ParamKind.SCALAR, Scalar),
        Param("value", ParamKind.OPERAND, TensorValue | Scalar),
    ),
    infer=_infer_pad,
    summary="``arg`` widened by ``pad_widths`` (torch's ``F.pad`` order), filled with"
    " ``value`` (one instruction per padded dim).",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True),
    requirements=_pad_requirements,
    check=_dim_whole("src"),
    nvfuser_signature="pad(arg, pad_widths, value=None)",
)


# ----- cat --------------------------------------------------------------------------------


def cat_problem(lhs: TensorValue, rhs: TensorValue, dim: int) -> str | None:
    """Why ``rhs`` cannot be joined to ``lhs`` along ``dim``: another dtype, another rank,
    or another extent off ``dim``; or None."""
    if rhs.dtype is not lhs.dtype:
        return (
            f"cat: {rhs.name} is {rhs.dtype.value} but {lhs.name} is {lhs.dtype.value};"
            " nvFuser concatenates tensors of one dtype (cast them first)"
        )
    if rhs.ndim != lhs.ndim:
        return f"cat: {rhs.name} has {rhs.ndim} dims, {lhs.name} {lhs.ndim}"
    for d, (a, b) in enumerate(zip(lhs.shape, rhs.shape, strict=True)):
        if d != dim and differ(a, b):
            return (
                f"cat along dim {dim}: {rhs.name} dim {d} has extent {print_scalar(b)},"
                f" {lhs.name} {print_scalar(a)}; the dims other than the cat dim must agree"
            )
    return None


def _infer_cat(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``lhs``'s extents, the two extents added at ``dim``; the other dims iterate with
    both operands'."""
    lhs, rhs, dim = args["lhs"], args["rhs"], args["dim"]
    problem = _dim_problem("cat", lhs, dim) or cat_problem(lhs, rhs, dim)
    if problem is not None:
        return problem
    extent = add(lhs.shape[dim], rhs.shape[dim])
    return (ResultType(dtype=lhs.dtype, axes=_axes(("lhs", "rhs"), lhs, dim, extent)),)


CAT = declare_op(
    "cat",
    cls=Cat,
    params=(
        Param("lhs", ParamKind.TENSOR, TensorValue),
        Param("rhs", ParamKind.TENSOR, TensorValue),
        Param("dim", ParamKind.ATTRIBUTE, int),
    ),
    infer=_infer_cat,
    summary="``tensors`` (one dtype, equal extents off ``dim``) joined along ``dim`` (a"
    " chain of two-tensor instructions).",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True),  # lhs and rhs dims iterate together: one role
    check=_dim_whole("lhs", "rhs"),
    nvfuser_signature="cat(tensors, dim=0, manual_padding=False)",
)
