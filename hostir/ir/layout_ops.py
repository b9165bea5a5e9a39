"""The ops that copy, convert or lay out one tensor: ``set``, ``cast``, ``broadcast_in_dim``
and ``permute``, their instructions and declarations (``hostir.ir.opdecl``).

- ``set`` copies its operand: the resharding point of a fusion (lowering plans the
  communication between the operand's sharding and the result's). Its instruction may
  copy a local buffer into a chunk of another tensor, so the verifier compares local
  extents, not global ones (its ``check``).
- ``cast`` converts to the dtype the caller gives.
- ``broadcast_in_dim`` places its operand's dims at ``broadcast_dims`` of the shape the
  caller gives; the other dims are new broadcast dims, and an operand dim of extent 1
  may be expanded.
- ``permute`` reorders its operand's dims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.extents import differ, is_one, local_extents
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
from hostir.ir.scalars import print_scalar
from hostir.ir.values import TensorValue


@declare(kind=Kind.COMPUTE, keyword="set", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Set:
    """``out = src.clone()``: a copy (a resharding point in the fusion)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="cast", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Cast:
    """``out = src.to(out.dtype)``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="broadcast_in_dim", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class BroadcastInDim:
    """``out``: ``src`` with its dim ``i`` placed at ``broadcast_dims[i]``, expanded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    broadcast_dims: tuple[int, ...]
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="permute", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Permute:
    """``out = src.permute(dims)``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    dims: tuple[int, ...]
    preallocated: bool = False


def _same_axes(src: TensorValue) -> tuple[ResultAxis, ...]:
    """``src``'s axes, each iterating with its own."""
    return tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),)) for d, e in enumerate(src.shape)
    )


def _shape_text(value: TensorValue) -> str:
    return "[" + ", ".join(print_scalar(e) for e in value.shape) + "]"


# ----- set --------------------------------------------------------------------------------


def _check_set(instruction: Set) -> str | None:
    """A copy of the local buffer: the dtype kept, local extents agree (a stream chunk may
    take a shard)."""
    src, out = instruction.src, instruction.out
    if out.dtype is not src.dtype:
        return f"{out.name} is declared {out.dtype.value}, but set copies {src.dtype.value}"
    mine, theirs = local_extents(out), local_extents(src)
    if len(mine) != len(theirs) or any(differ(a, b) for a, b in zip(mine, theirs, strict=True)):
        return f"{out.name}'s local extents differ from {src.name}'s: set copies a local buffer"
    return None


def _infer_set(args: OpArgs) -> tuple[ResultType, ...]:
    """``src``'s type; its global extents where the result's are not given (a program's
    copy into a chunk: the local extents are what agree, see :func:`_check_set`)."""
    src, given = args["src"], args.given.get("out")
    if given is None or len(given.shape) != src.ndim:
        return (ResultType(dtype=src.dtype, axes=_same_axes(src)),)
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),)) for d, e in enumerate(given.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


SET = declare_op(
    "set",
    cls=Set,
    params=(Param("src", ParamKind.TENSOR, TensorValue, nvfuser="tv"),),
    infer=_infer_set,
    summary="A copy of ``tv``; a resharding point where the copy is sharded otherwise.",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True),
    check=_check_set,
)


# ----- cast -------------------------------------------------------------------------------


def _infer_cast(args: OpArgs) -> tuple[ResultType, ...]:
    """``src``'s extents, in the dtype the caller gives."""
    return (ResultType(dtype=args.given["out"].dtype, axes=_same_axes(args["src"])),)


CAST = declare_op(
    "cast",
    cls=Cast,
    params=(Param("src", ParamKind.TENSOR, TensorValue, nvfuser="tv"),),
    infer=_infer_cast,
    summary="``tv`` converted to ``dtype``.",
    dtype_rule="given",
    sharding=OpSharding(elementwise=True),
    given=frozenset({"dtype"}),
    nvfuser_signature="cast(tv, dtype)",
)


# ----- broadcast_in_dim -------------------------------------------------------------------


def _infer_broadcast_in_dim(args: OpArgs) -> tuple[ResultType, ...] | str:
    """The given shape: ``src``'s dim ``i`` at ``broadcast_dims[i]`` (of the same extent, or
    of extent 1 expanded), the other dims new broadcast dims."""
    src, dims, out = args["src"], args["broadcast_dims"], args.given["out"]
    shape = out.shape
    if (
        len(dims) != src.ndim
        or list(dims) != sorted(set(dims))
        or any(not 0 <= d < len(shape) for d in dims)
    ):
        return (
            f"broadcast_in_dim: broadcast_dims {list(dims)} must place the {src.ndim} dims of"
            f" {src.name} at increasing dims of the {len(shape)}-d {out.name}"
        )
    axes = []
    for o, extent in enumerate(shape):
        if o not in dims:
            axes.append(ResultAxis(extent=extent, kind=AxisKind.BROADCAST))
            continue
        d = dims.index(o)
        own = src.shape[d]
        if is_one(own) and not is_one(extent):  # a dim of extent 1 expanded
            axes.append(ResultAxis(extent=extent, kind=AxisKind.BROADCAST))
        elif differ(own, extent):
            return (
                f"broadcast_in_dim: {src.name} dim {d} has extent {print_scalar(own)}, which"
                f" cannot become {print_scalar(extent)} at output dim {o}"
            )
        else:
            axes.append(ResultAxis(extent=extent, sources=(AxisSource("src", d),)))
    return (ResultType(dtype=src.dtype, axes=tuple(axes)),)


BROADCAST_IN_DIM = declare_op(
    "broadcast_in_dim",
    cls=BroadcastInDim,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="tv"),
        Param("broadcast_dims", ParamKind.ATTRIBUTE, tuple[int, ...]),
    ),
    infer=_infer_broadcast_in_dim,
    summary="``tv``'s dim ``i`` at output dim ``broadcast_dims[i]`` of ``shape``; the other"
    " dims new broadcast dims.",
    dtype_rule="same",
    given=frozenset({"shape"}),
    nvfuser_signature="broadcast_in_dim(tv, shape, broadcast_dims)",
)


# ----- permute ----------------------------------------------------------------------------


def _infer_permute(args: OpArgs) -> tuple[ResultType, ...] | str:
    """Result dim ``i`` is ``src``'s dim ``dims[i]``."""
    src, dims = args["src"], args["dims"]
    if sorted(dims) != list(range(src.ndim)):
        return f"permute: dims {list(dims)} is not a permutation of {src.ndim} dims"
    axes = tuple(ResultAxis(extent=src.shape[d], sources=(AxisSource("src", d),)) for d in dims)
    return (ResultType(dtype=src.dtype, axes=axes),)


PERMUTE = declare_op(
    "permute",
    cls=Permute,
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="tv"),
        Param("dims", ParamKind.ATTRIBUTE, tuple[int, ...]),
    ),
    infer=_infer_permute,
    summary="Output dim ``i`` is ``tv``'s dim ``dims[i]``.",
    dtype_rule="same",
)
