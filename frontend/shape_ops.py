"""``fd.ops``' shape ops, with nvFuser's Python signatures: ``reshape``, ``slice``, ``pad``,
``cat``, ``squeeze``, ``expand``, ``stride_order`` (NVIDIA/Fuser
``python/python_direct/ops.cpp`` and ``csrc/ops/alias.cpp``).

Each function here takes the ``Ops`` object first and becomes its method
(``frontend.ops`` sets them). The ops with instructions (``reshape``, ``slice``, ``pad``,
``cat``) are recorded from their declarations (``hostir.ir.shape_ops``: the dtype, the
extents, the refusals); the functions here translate nvFuser's arguments to them (a -1 in
a new shape, indices clamped, one instruction per sliced or padded dim, a list of tensors
as a chain) and check their form. Sizes, indices and widths are ints or Int scalars:
constants, sizes (``tv.size(i)``), scalar inputs (their symbols, bound at execute, as
nvFuser's dynamic reshape) and arithmetic on them. Everything nvFuser would check is
checked when the op is defined, and what reads values known only at execute (a slice's
bounds, a pad's widths, a reshape's element counts) when the inputs bind them, by the
same rules in the same words (``hostir.ir.requirements``), so an op accepted here runs or
is refused by name before anything runs. How each shards and what it communicates:
docs/ops.md, "Shape ops".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from frontend.arguments import as_list, check_bool, is_int, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.recording import PYTHON_TYPES, placeholder, record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, Scalar, TensorValue
from hostir.ir.extents import divides, normal_form, same_extent
from hostir.ir.requirements import pad_requirements, slice_requirements
from hostir.ir.scalars import floordiv, print_scalar, product, sub
from hostir.ir.shape_ops import (
    CAT,
    PAD,
    RESHAPE,
    SLICE,
    cat_problem,
    pad_value_problem,
)

INTEGER_DTYPES = (DataType.Int, DataType.Int32)


class OpsLike(Protocol):
    """What these functions use of ``fd.ops`` (``frontend.ops.Ops``)."""

    _fusion: Any

    def set(self, tv: TensorView) -> TensorView:
        """A copy of ``tv``."""

    def broadcast_in_dim(self, tv: TensorView, shape: Any, broadcast_dims: Any) -> TensorView:
        """``tv``'s dims placed in ``shape``, the others broadcast."""


def _tensor(op: str, value: Any, role: str = "arg") -> TensorView:
    if not isinstance(value, TensorView):
        raise OperandError(f"{op}: {role} must be a TensorView, got {shown(value)}")
    return value


def _scalar(op: str, what: str, value: Any) -> Scalar:
    """An int, or an Int scalar (a constant, a size, a scalar input bound at execute), as
    a host IR scalar; its value, negative or not, is for the op's own rules to judge."""
    if isinstance(value, ScalarVal):
        if value.dtype not in INTEGER_DTYPES:
            raise OperandError(f"{op}: {what} = {value.name} must be an integer scalar")
        scalar = value.to_hostir()
    elif is_int(value):
        scalar = Const(value=value)
    else:
        raise OperandError(f"{op}: {what} must be an int or an Int scalar, got {shown(value)}")
    return scalar


def _dim(op: str, tv: TensorView, dim: Any, what: str = "dim") -> int:
    ndim = len(tv.shape_domain())
    if not is_int(dim) or not -ndim <= dim < ndim:
        raise OperandError(f"{op}: {what} {shown(dim)} is out of range for {tv.name} ({ndim} dims)")
    return dim % ndim


# ----- reshape ------------------------------------------------------------------------------


def reshape(self: OpsLike, arg: TensorView, new_shape: Sequence[Any]) -> TensorView:
    """nvFuser's ``reshape(arg, new_shape)``: the same elements, in order, in ``new_shape``
    (ints, Int scalars such as ``tv.size(i)``, scalar inputs or products of them, and at
    most one -1 for the extent that makes the element counts agree). Where the symbols do
    not show the counts equal (``[i0] -> [s0, s1]``; a -1 next to a scalar input is
    ``i0 // s0``), the reshape requires it of the bound values (``hostir.ir.shape_ops``).

    Shards: a dim kept one to one keeps its sharding; a split or merge keeps the sharding
    of its outermost input dim when each rank's shard stays one block of the output
    (``[b, s, 3e]`` sharded on ``3e`` to ``[b, s, h, 3e/h]`` with ``h`` divisible by the
    devices: ``h`` sharded), otherwise the dim is gathered first (``set``)."""
    arg = _tensor("reshape", arg)
    entries = as_list(OperandError, "reshape", "new_shape", new_shape, "ints or Int scalars")
    source = tuple(axis.extent for axis in arg.shape_domain())
    sizes: list[Scalar | None] = []
    for position, entry in enumerate(entries):
        size = _scalar("reshape", f"new_shape[{position}]", entry)
        if isinstance(size, Const) and size.value < 0:
            if size.value != -1 or None in sizes:
                raise OperandError(
                    f"reshape of {arg.name}: new_shape[{position}] = {size.value}; sizes are"
                    " >= 0, with at most one -1 (the extent inferred from the others)"
                )
            sizes.append(None)
            continue
        sizes.append(size)
    if None in sizes:
        sizes[sizes.index(None)] = _inferred(arg, source, sizes)
    return _reshaped(self, arg, tuple(sizes))


def _reshaped(self: OpsLike, arg: TensorView, target: tuple[Scalar, ...]) -> TensorView:
    """``reshape`` of ``arg`` to extents ``target``, recorded (``hostir.ir.shape_ops``)."""
    given = TensorValue(name=arg.name, dtype=arg.dtype.to_hostir(), shape=target)
    return record(self._fusion, RESHAPE, {"src": arg}, given={"out": given})[0]


def _inferred(arg: TensorView, source: tuple, sizes: list) -> Scalar:
    """The extent at the -1 of a new shape: all elements over the other sizes."""
    total = normal_form(product(list(source)))
    others = normal_form(product([s for s in sizes if s is not None]))
    quotient = divides(others, total) if others[0] else None
    if quotient is None and others[0] and others[1]:
        # Sizes known only at execute (a scalar input: nvFuser's dynamic reshape): the
        # floor quotient, whose exactness the reshape's requirement checks then.
        return floordiv(product(list(source)), product([s for s in sizes if s is not None]))
    if quotient is None:
        shown_sizes = ", ".join("-1" if s is None else print_scalar(s) for s in sizes)
        raise OperandError(
            f"reshape of {arg.name}: new_shape [{shown_sizes}] leaves no whole extent for its"
            f" -1: {print_scalar(product(list(source)))} elements are not a multiple of the"
            " other sizes' product"
        )
    coefficient, atoms = quotient
    return product([Const(value=int(coefficient)), *atoms])


# ----- squeeze, expand, stride_order --------------------------------------------------------


def squeeze(
    self: OpsLike, arg: TensorView, dims: Sequence[int], squeeze_expanded: bool = False
) -> TensorView:
    """nvFuser's ``squeeze(arg, dims, squeeze_expanded=False)``: ``arg`` without its dims
    ``dims``, each a broadcast dim of extent 1 (an expanded broadcast dim, extent > 1, only
    with ``squeeze_expanded``: its first element is kept). The other dims keep their
    sharding; nothing is communicated."""
    arg = _tensor("squeeze", arg)
    squeeze_expanded = check_bool(OperandError, "squeeze", "squeeze_expanded", squeeze_expanded)
    items = as_list(OperandError, "squeeze", "dims", dims, "ints")
    removed = sorted({_dim("squeeze", arg, d) for d in items})
    domain = arg.shape_domain()
    expanded: dict[int, Scalar] = {}
    for dim in removed:
        axis = domain[dim]
        if axis.extent == Const(value=1):
            continue
        if axis.is_broadcast() and squeeze_expanded:
            expanded[dim] = Const(value=1)
            continue
        why = (
            "an expanded broadcast dim; pass squeeze_expanded=True to keep its first element"
            if axis.is_broadcast()
            else "not a broadcast dim of extent 1 (a dim whose extent is known only at execute"
            " is not squeezed: nvFuser would check it then)"
        )
        raise OperandError(
            f"squeeze of {arg.name}: dim {dim} (extent {print_scalar(axis.extent)}) is {why}"
        )
    if not removed:
        return self.set(arg)
    if expanded:  # keep the first element of each expanded dim, then drop the 1s
        arg = _slice_dims(self, arg, {d: (Const(value=0), Const(value=1)) for d in expanded})
        domain = arg.shape_domain()
    kept = tuple(axis.extent for dim, axis in enumerate(domain) if dim not in removed)
    return _reshaped(self, arg, kept)


def expand(self: OpsLike, arg: TensorView, shape: Sequence[Any]) -> TensorView:
    """nvFuser's ``expand(arg, shape)``: each broadcast dim (extent 1) of ``arg`` expanded
    to ``shape``'s entry; -1 or the dim's own extent keeps a dim (``broadcast_in_dim`` with
    every dim kept). Shards as its operand; nothing is communicated."""
    arg = _tensor("expand", arg)
    entries = as_list(OperandError, "expand", "shape", shape, "ints or Int scalars")
    ndim = len(arg.shape_domain())
    if len(entries) != ndim:
        raise OperandError(
            f"expand of {arg.name}: shape {shown(entries)} has {len(entries)} entries for its"
            f" {ndim} dims"
        )
    return self.broadcast_in_dim(arg, entries, list(range(ndim)))


def stride_order(self: OpsLike, arg: TensorView, stride_order: Sequence[int]) -> TensorView:
    """nvFuser's ``stride_order(arg, stride_order)``: a copy of ``arg`` (``set``) that nvFuser
    allocates with dim ``i`` the ``stride_order[i]``-th from the innermost. The values are
    ``arg``'s; here the copy is row-major like every computed tensor (docs/ops.md)."""
    arg = _tensor("stride_order", arg)
    order = as_list(OperandError, "stride_order", "stride_order", stride_order, "ints")
    ndim = len(arg.shape_domain())
    if order and sorted(o % ndim if is_int(o) and -ndim <= o < ndim else -1 for o in order) != list(
        range(ndim)
    ):
        raise OperandError(
            f"stride_order of {arg.name}: {shown(order)} must be a permutation of its {ndim}"
            " dims (or empty)"
        )
    return self.set(arg)


# ----- slice --------------------------------------------------------------------------------


def slice(  # noqa: A001 - nvFuser's name
    self: OpsLike,
    arg: TensorView,
    start_indices: Sequence[Any],
    end_indices: Sequence[Any],
    strides: Sequence[Any] | None = None,
    manual_normalization: bool = False,
) -> TensorView:
    """nvFuser's ``slice(arg, start_indices, end_indices, strides=None,
    manual_normalization=False)``: elements ``start <= i < end`` of each dim. Starts are
    >= 0 and ends >= starts; an end past a constant extent is clamped to it (unless
    ``manual_normalization``: then the indices are taken as they are and must lie within
    the dim); strides must be 1 (nvFuser's limitation). Indices or extents known only at
    execute are checked then, by the same rules (``hostir.ir.requirements``), an end past
    the extent refused rather than clamped. A sliced dim is gathered first if
    it is sharded (``set``); the others keep their sharding."""
    arg = _tensor("slice", arg)
    if is_int(manual_normalization) and manual_normalization in (0, 1):
        manual_normalization = bool(manual_normalization)  # pybind11 converts 0 and 1 too
    manual = check_bool(OperandError, "slice", "manual_normalization", manual_normalization)
    ndim = len(arg.shape_domain())
    starts = as_list(OperandError, "slice", "start_indices", start_indices, "ints")
    ends = as_list(OperandError, "slice", "end_indices", end_indices, "ints")
    if len(starts) != ndim or len(ends) != ndim:
        raise OperandError(
            f"slice of {arg.name}: {len(starts)} start_indices and {len(ends)} end_indices for"
            f" its {ndim} dims; give one of each per dim"
        )
    if strides is not None:
        steps = as_list(OperandError, "slice", "strides", strides, "ints")
        if len(steps) != ndim:
            raise OperandError(f"slice of {arg.name}: {len(steps)} strides for its {ndim} dims")
        for position, step in enumerate(steps):
            value = _scalar("slice", f"strides[{position}]", step)
            if value != Const(value=1):
                raise OperandError(
                    f"slice of {arg.name}: strides[{position}] = {print_scalar(value)}; every"
                    " stride must be 1 (nvFuser's limitation)"
                )
    ranges: dict[int, tuple[Scalar, Scalar]] = {}
    for dim, axis in enumerate(arg.shape_domain()):
        start = _scalar("slice", f"start_indices[{dim}]", starts[dim])
        stop = _scalar("slice", f"end_indices[{dim}]", ends[dim])
        # The slice's rules (0 <= start <= end <= extent) on the indices as given, but an
        # end past the extent, which nvFuser clamps unless manual_normalization.
        rules = slice_requirements(arg.name, dim, axis.extent, start, stop)
        self._fusion.require(rules if manual else rules[:2])
        if not manual:
            start, stop = _clamped(arg, dim, axis.extent, start, stop)
        if start == Const(value=0) and same_extent(stop, axis.extent):
            continue
        ranges[dim] = (start, stop)
    if not ranges:
        return self.set(arg)
    return _slice_dims(self, arg, ranges)


def _clamped(
    arg: TensorView, dim: int, extent: Scalar, start: Scalar, stop: Scalar
) -> tuple[Scalar, Scalar]:
    """``(start, stop)`` clamped to a constant extent (nvFuser's ``min(extent, stop)``); a
    constant end against a symbolic extent is refused (nothing clamps it at run time, where
    the slice's rules refuse an end past the extent)."""
    past = normal_form(sub(stop, extent))
    if not past[1] and past[0] > 0:
        stop = extent
        start_past = normal_form(sub(start, extent))
        if not start_past[1] and start_past[0] > 0:
            start = extent
    elif past[1] and isinstance(stop, Const):
        # nvFuser's min(extent, stop) with an extent known only at execute: no min here.
        where = f"slice of {arg.name} dim {dim} (extent {print_scalar(extent)})"
        raise OperandError(
            f"{where}: end {print_scalar(stop)} against an extent known only at execute;"
            " nvFuser clamps it to the extent then, which this op cannot express: give the"
            " end as a size (tv.size(i)) or arithmetic on it, or pass"
            " manual_normalization=True to promise it lies within the dim"
        )
    return start, stop


def _slice_dims(
    self: OpsLike, arg: TensorView, ranges: dict[int, tuple[Scalar, Scalar]]
) -> TensorView:
    """One ``slice`` per dim of ``ranges``, in order."""
    for dim, (start, stop) in sorted(ranges.items()):
        operands = {"src": arg, "dim": dim, "start": start, "stop": stop}
        (arg,) = record(self._fusion, SLICE, operands)
    return arg


# ----- pad ----------------------------------------------------------------------------------


def pad(self: OpsLike, arg: TensorView, pad_widths: Sequence[Any], value: Any = None) -> TensorView:
    """nvFuser's ``pad(arg, pad_widths, value=None)``: ``pad_widths`` as torch's ``F.pad``
    (``[last_left, last_right, second_last_left, ...]``, at most two per dim, >= 0), filled
    with ``value`` (None: 0, or False for Bool), of the tensor's kind (a float for a
    floating tensor, an int for an integer one, a bool for a Bool one: nvFuser's
    ``hasSimilarDtype``). A padded dim is gathered first if it is sharded (``set``)."""
    arg = _tensor("pad", arg)
    widths = as_list(OperandError, "pad", "pad_widths", pad_widths, "ints")
    ndim = len(arg.shape_domain())
    if len(widths) % 2 or len(widths) > 2 * ndim:
        raise OperandError(
            f"pad of {arg.name}: {len(widths)} pad_widths; give an even number, at most two per"
            f" dim ({2 * ndim})"
        )
    fill = _pad_value(arg, value)
    result = arg
    for index in range(len(widths) // 2):
        dim = ndim - 1 - index
        left = _scalar("pad", f"pad_widths[{2 * index}]", widths[2 * index])
        right = _scalar("pad", f"pad_widths[{2 * index + 1}]", widths[2 * index + 1])
        self._fusion.require(pad_requirements(arg.name, dim, left, right))
        if left == Const(value=0) and right == Const(value=0):
            continue
        operands = {"src": result, "dim": dim, "left": left, "right": right, "value": fill}
        (result,) = record(self._fusion, PAD, operands)
    return self.set(arg) if result is arg else result


def _pad_value(arg: TensorView, value: Any) -> ScalarVal | bool | int | float:
    """The fill value, of the tensor's kind (see ``pad``; None: its zero)."""
    kind = PYTHON_TYPES.get(arg.dtype, float)
    if value is None:
        return kind(0)
    if isinstance(value, ScalarVal):
        given, name = PYTHON_TYPES.get(value.dtype, float), value.name
    elif type(value) in (bool, int, float):
        given, name = type(value), repr(value)
    else:
        raise OperandError(f"pad of {arg.name}: value must be a scalar, got {shown(value)}")
    problem = pad_value_problem(placeholder(arg), given, name)
    if problem is not None:
        raise OperandError(problem)
    return value


# ----- cat ----------------------------------------------------------------------------------


def cat(
    self: OpsLike, tensors: Sequence[TensorView], dim: int = 0, manual_padding: bool = False
) -> TensorView:
    """nvFuser's ``cat(tensors, dim=0, manual_padding=False)``: ``tensors`` (one dtype, one
    rank, equal extents off ``dim``) joined along ``dim``. With more than two tensors it is
    a chain of two-tensor ``cat`` s. ``dim`` is gathered first where it is sharded
    (``set``); the other dims keep their sharding."""
    items = as_list(OperandError, "cat", "tensors", tensors, "TensorViews")
    if not items:
        raise OperandError("cat: tensors is empty; give at least one tensor")
    for position, item in enumerate(items):
        _tensor("cat", item, f"tensors[{position}]")
        self._fusion.check_owns("fd.ops.cat", item, f"tensors[{position}]")
    if manual_padding not in (False, 0) or isinstance(manual_padding, float):
        raise OperandError(
            "cat: manual_padding=True (inputs already padded by pad ops, as nvFuser's fusion"
            " translation writes them) is not supported; pass the unpadded tensors"
        )
    first = items[0]
    dim = _dim("cat", first, dim)
    _check_cat_operands(items, dim)
    if len(items) == 1:
        return self.set(first)
    result = first
    for item in items[1:]:
        if item is result:  # one tensor as both operands: each needs its own axis map
            item = self.set(item)
        (result,) = record(self._fusion, CAT, {"lhs": result, "rhs": item, "dim": dim})
    return result


def _check_cat_operands(items: list[TensorView], dim: int) -> None:
    """Each tensor joins the first along ``dim`` (``hostir.ir.shape_ops.cat_problem``: one
    dtype, one rank, equal extents off ``dim``); raises OperandError naming the tensor that
    differs from the first, before any of the chain is recorded."""
    first = placeholder(items[0])
    for item in items[1:]:
        problem = cat_problem(first, placeholder(item), dim)
        if problem is not None:
            raise OperandError(problem)


SHAPE_METHODS = {
    "reshape": reshape,
    "squeeze": squeeze,
    "expand": expand,
    "stride_order": stride_order,
    "slice": slice,
    "pad": pad,
    "cat": cat,
}
"""The methods ``frontend.ops.Ops`` takes from this module, by name."""
