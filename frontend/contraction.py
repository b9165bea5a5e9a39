"""Output axes and axis maps of linear, matmul and broadcast_in_dim."""

from __future__ import annotations

from frontend.errors import OperandError
from frontend.iter_domain import IterDomain, IterType
from frontend.tensor_view import TensorView
from hostir import Const, Scalar
from hostir.ir.extents import same_extent
from hostir.ir.scalars import print_scalar

AxisPairs = list[tuple[IterDomain, IterDomain]]


def _fresh(axis: IterDomain, iter_type: IterType | None = None) -> IterDomain:
    return IterDomain(axis.extent, iter_type or axis.iter_type)


def _check_same_extent(op: str, a: TensorView, a_dim: int, b: TensorView, b_dim: int) -> None:
    ea, eb = a.shape_domain()[a_dim].extent, b.shape_domain()[b_dim].extent
    if isinstance(ea, Const) and isinstance(eb, Const) and ea != eb:
        raise OperandError(
            f"{op}: {a.name} dim {a_dim} has extent {print_scalar(ea)} but {b.name} dim {b_dim}"
            f" has extent {print_scalar(eb)}; they must be equal"
        )


def linear_axes(
    input: TensorView, weight: TensorView, bias: TensorView | None
) -> tuple[list[IterDomain], dict[TensorView, AxisPairs]]:
    """``[*I, K] x [*W, N, K] (+ [N] or [*W, N]) -> [*W, *I, N, rK]`` (nvFuser's
    ``newForLinear``; ``hostir.ir.contraction``)."""
    x, w = input.shape_domain(), weight.shape_domain()
    if len(x) < 1:
        raise OperandError(f"linear: input {input.name} must have at least 1 dim")
    if len(w) < 2:
        raise OperandError(
            f"linear: weight {weight.name} must have at least 2 dims [*W, N, K], got {len(w)}"
        )
    _check_same_extent("linear", input, len(x) - 1, weight, len(w) - 1)
    leading = [_fresh(axis) for axis in w[:-2]]
    batch = [_fresh(axis) for axis in x[:-1]]
    n_axis = _fresh(w[-2])
    k_axis = _fresh(x[-1], IterType.REDUCTION)
    axis_map: dict[TensorView, AxisPairs] = {
        input: list(zip(batch, x[:-1], strict=True)) + [(k_axis, x[-1])],
        weight: list(zip(leading, w[:-2], strict=True)) + [(n_axis, w[-2]), (k_axis, w[-1])],
    }
    if bias is not None:
        b = bias.shape_domain()
        if len(b) not in (1, len(w) - 1):
            raise OperandError(
                f"linear: bias {bias.name} must have 1 dim [N] or {len(w) - 1} dims [*W, N]"
                f" (as weight {weight.name}), got {len(b)}"
            )
        for dim in range(len(b)):
            _check_same_extent("linear", bias, dim, weight, len(w) - 1 - len(b) + dim)
        pairs = list(zip(leading, b[:-1], strict=False)) + [(n_axis, b[-1])]
        axis_map.setdefault(bias, []).extend(pairs)
    return leading + batch + [n_axis, k_axis], axis_map


def matmul_axes(
    lhs: TensorView, rhs: TensorView
) -> tuple[list[IterDomain], dict[TensorView, AxisPairs]]:
    """``[*B, M, K] x [*B, K, N] -> [*B, M, N, rK]``, batch dims broadcast from the right;
    a 1-d operand has no M (lhs ``[K]``) or no N (rhs ``[K]``), as torch.matmul."""
    a, b = lhs.shape_domain(), rhs.shape_domain()
    for tv, domain in ((lhs, a), (rhs, b)):
        if len(domain) < 1:
            raise OperandError(f"matmul: {tv.name} has 0 dims; operands need at least 1")
    b_k = len(b) - 2 if len(b) > 1 else 0
    _check_same_extent("matmul", lhs, len(a) - 1, rhs, b_k)
    axis_map: dict[TensorView, AxisPairs] = {lhs: [], rhs: []}
    batch = []
    a_batch, b_batch = a[:-2], b[:-2]
    nbatch = max(len(a_batch), len(b_batch))
    for position in range(nbatch):
        ia, ib = position - (nbatch - len(a_batch)), position - (nbatch - len(b_batch))
        sources = [(tv, d[i]) for tv, d, i in ((lhs, a_batch, ia), (rhs, b_batch, ib)) if i >= 0]
        real = [(tv, axis) for tv, axis in sources if axis.extent != Const(value=1)]
        template = real[0][1] if real else sources[0][1]
        extents = {axis.extent for _, axis in real if isinstance(axis.extent, Const)}
        if len(extents) > 1:
            raise OperandError(
                f"matmul: batch dim {position} of {lhs.name} and {rhs.name} differ"
                f" ({', '.join(print_scalar(e) for e in extents)})"
            )
        new = _fresh(template)
        batch.append(new)
        for tv, axis in real or sources:
            axis_map[tv].append((new, axis))
    k_axis = _fresh(a[-1], IterType.REDUCTION)
    rows_columns = []
    if len(a) > 1:
        m_axis = _fresh(a[-2])
        rows_columns.append(m_axis)
        axis_map[lhs].append((m_axis, a[-2]))
    if len(b) > 1:
        n_axis = _fresh(b[-1])
        rows_columns.append(n_axis)
        axis_map[rhs].append((n_axis, b[-1]))
    axis_map[lhs].append((k_axis, a[-1]))
    axis_map[rhs].append((k_axis, b[b_k]))
    return batch + rows_columns + [k_axis], axis_map


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


def broadcast_axes(
    tv: TensorView, shape: list[int | Scalar], broadcast_dims: list[int]
) -> tuple[list[IterDomain], AxisPairs]:
    """Output axes of ``broadcast_in_dim`` and the pairs of mapped (non-expanded) axes.
    ``shape`` holds ints and symbolic extents (sizes known once the inputs are bound);
    ``broadcast_dims`` is wrapped (:func:`wrapped_dims`)."""
    source = tv.shape_domain()
    axes: list[IterDomain] = []
    pairs: AxisPairs = []
    for out_dim, size in enumerate(shape):
        if out_dim not in broadcast_dims:
            if isinstance(size, int) and size < 1:
                raise OperandError(
                    f"broadcast_in_dim: new dim {out_dim} needs a positive size, got {size}"
                )
            extent = Const(value=size) if isinstance(size, int) else size
            axes.append(IterDomain(extent, IterType.BROADCAST))
            continue
        axis = source[broadcast_dims.index(out_dim)]
        axes.append(_mapped_axis(tv, axis, size, out_dim, pairs))
    return axes, pairs


def _mapped_axis(
    tv: TensorView, axis: IterDomain, size: int | Scalar, out_dim: int, pairs: AxisPairs
) -> IterDomain:
    """The output axis of ``tv``'s ``axis`` at ``out_dim`` of size ``size`` (nvFuser's
    ``expand``): kept for -1 or its own extent; a size-1 dim expanded; a symbolic dim takes
    the size (checked when the inputs are bound: torch's expand refuses a mismatch, naming
    the instruction); a constant dim keeps its extent for a symbolic size, as nvFuser."""
    symbolic = not isinstance(size, int)
    if size == -1 or (symbolic and same_extent(size, axis.extent)):
        new = _fresh(axis)
        pairs.append((new, axis))
        return new
    if not symbolic and isinstance(axis.extent, Const) and axis.extent.value == size:
        new = _fresh(axis)
        pairs.append((new, axis))
        return new
    if not symbolic and size < 1:
        raise OperandError(
            f"broadcast_in_dim: {tv.name} dim {tv.shape_domain().index(axis)} (extent"
            f" {print_scalar(axis.extent)}) maps to output dim {out_dim} of size {size}; expected"
            " a positive size, or -1 to keep the extent"
        )
    extent = size if symbolic else Const(value=size)
    if axis.extent == Const(value=1):  # expanding a size-1 dim
        return IterDomain(extent, IterType.BROADCAST)
    if isinstance(axis.extent, Const):
        if symbolic:  # nvFuser keeps a constant extent for a size known later
            new = _fresh(axis)
            pairs.append((new, axis))
            return new
        raise OperandError(
            f"broadcast_in_dim: {tv.name} dim {tv.shape_domain().index(axis)} has extent"
            f" {print_scalar(axis.extent)}, which cannot become {size} at output dim {out_dim}"
        )
    new = IterDomain(extent, axis.iter_type)
    pairs.append((new, axis))
    return new
