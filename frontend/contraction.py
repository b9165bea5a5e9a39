"""``broadcast_in_dim``'s arguments in the declaration's terms (``hostir.ir.layout_ops``):
its dims wrapped and checked, its output's extents. (linear's and matmul's result axes are
their declarations' own, ``hostir.ir.contraction``.)"""

from __future__ import annotations

from frontend.errors import OperandError
from frontend.tensor_view import TensorView
from hostir import Const, Scalar
from hostir.ir.extents import same_extent
from hostir.ir.requirements import HIGH, LOW, Requirement
from hostir.ir.scalars import print_scalar, symbols_of


def wrapped_dims(tv: TensorView, broadcast_dims: list[int], ndim: int) -> list[int]:
    """``broadcast_in_dim``'s dims, negative ones counted from the end of the ``ndim``-d
    output (nvFuser's ``wrapDim``). Raises OperandError for a count other than ``tv``'s
    dims, a dim out of range, a repeated dim, and an order that is not increasing: nvFuser
    places ``tv``'s dims at the listed positions in increasing order whatever the order
    given, which would read as a transpose here (``permute`` transposes)."""
    source = tv.shape_domain()
    if len(broadcast_dims) != len(source):
        raise OperandError(
            f"broadcast_in_dim: {tv.name} has {len(source)} dims but broadcast_dims"
            f" {broadcast_dims} names {len(broadcast_dims)}"
        )
    wrapped = []
    for position, dim in enumerate(broadcast_dims):
        if not -ndim <= dim < ndim:
            raise OperandError(
                f"broadcast_in_dim: broadcast_dims[{position}] = {dim} is out of range for"
                f" an output of {ndim} dims"
            )
        wrapped.append(dim % ndim)
    if len(set(wrapped)) != len(wrapped):
        raise OperandError(
            f"broadcast_in_dim: broadcast_dims {broadcast_dims} name output dim"
            f" {next(d for d in wrapped if wrapped.count(d) > 1)} more than once"
        )
    if sorted(wrapped) != wrapped:
        raise OperandError(
            f"broadcast_in_dim: broadcast_dims {broadcast_dims} must increase: {tv.name}'s dims"
            " keep their order (use permute to reorder them)"
        )
    return wrapped


def broadcast_extents(
    tv: TensorView, shape: list[int | Scalar], broadcast_dims: list[int]
) -> tuple[Scalar, ...]:
    """The extents of ``broadcast_in_dim``'s output for nvFuser's ``shape`` (ints and
    symbolic extents, sizes known once the inputs are bound) and ``broadcast_dims``
    (wrapped, :func:`wrapped_dims`): a new dim's size; for a dim of ``tv``, its extent for
    -1 or its own size, the size where it is expanded or symbolic, and its constant extent
    for a symbolic size (as nvFuser's ``expand``). Raises OperandError for a size below 1;
    the declaration (``hostir.ir.layout_ops``) refuses a dim that cannot take its size."""
    source = tv.shape_domain()
    extents: list[Scalar] = []
    for out_dim, size in enumerate(shape):
        symbolic = not isinstance(size, int)
        if out_dim not in broadcast_dims:
            if not symbolic and size < 1:
                raise OperandError(
                    f"broadcast_in_dim: new dim {out_dim} needs a positive size, got {size}"
                )
            extents.append(size if symbolic else Const(value=size))
            continue
        axis = source[broadcast_dims.index(out_dim)]
        own = axis.extent
        if size == -1 or (symbolic and same_extent(size, own)):
            extents.append(own)
        elif not symbolic and isinstance(own, Const) and own.value == size:
            extents.append(own)
        elif not symbolic and size < 1:
            raise OperandError(
                f"broadcast_in_dim: {tv.name} dim {source.index(axis)} (extent"
                f" {print_scalar(own)}) maps to output dim {out_dim} of size {size}; expected"
                " a positive size, or -1 to keep the extent"
            )
        elif symbolic and isinstance(own, Const) and own != Const(value=1):
            extents.append(own)  # nvFuser keeps a constant extent for a size known later
        else:
            extents.append(size if symbolic else Const(value=size))
    return tuple(extents)


def mapped_requirements(
    tv: TensorView, extents: tuple[Scalar, ...], broadcast_dims: list[int], inputs: set[str]
) -> tuple[Requirement, ...]:
    """Where a dim of ``tv`` maps to an output dim whose size reads scalar inputs
    (``inputs``, their names), the size must be the dim's extent, or be expanded from 1:
    requirements checked when the inputs bind them (nvFuser checks it at execute), so a
    wrong value is a named error before anything runs, not torch's."""
    rules: list[Requirement] = []
    for dim, (axis, out_dim) in enumerate(zip(tv.shape_domain(), broadcast_dims, strict=True)):
        own, size = axis.extent, extents[out_dim]
        if own == size or isinstance(own, Const) or not symbols_of(size) & inputs:
            continue  # a constant extent is kept (broadcast_extents); a 1 is expanded
        # Two sides of one equality; each message shows the dim's extent, then the size.
        for low, high, extent_mark, size_mark in ((own, size, LOW, HIGH), (size, own, HIGH, LOW)):
            message = (
                f"broadcast_in_dim of {tv.name}: dim {dim} (extent {extent_mark}) maps to"
                f" output dim {out_dim} of size {size_mark}; they must be equal"
            )
            rules.append(Requirement(low=low, high=high, message=message))
    return tuple(rules)
