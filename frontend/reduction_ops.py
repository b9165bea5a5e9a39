"""``fd.ops``' reductions and the composites built from them (mean, var, var_mean, welford).

The reductions (``sum``, ``prod``, ``max``, ``min``) are declared once in
``hostir.ir.reductions``: each is recorded from its declaration (``frontend.recording``),
one host IR ``Reduction`` instruction with that op. The composites are written with
``fd.ops``' own ops, as nvFuser's C++ composites are (``csrc/ops/normalization.cpp``), so
they shard and communicate as those ops do: a sum over a sharded dim is a partial sum that
one Allreduce finishes. ``var`` and ``var_mean`` take two passes (the mean first, then the
sum of squared deviations from it), which stays accurate on data with a large mean, sharded
or not. Half and BFloat16 operands of ``mean``, ``var`` and ``var_mean`` are summed in Float
and give Float results (``var_mean`` is then nvFuser's ``var_mean(cast(x, Float))``, the
program nvFuser asks for where it refuses them); ``welford`` refuses them (docs/ops.md).

The methods live on :class:`ReductionOps` and are made ``fd.ops`` methods by
``frontend.ops`` (which also checks their arguments and that the definition is open).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from frontend.arguments import check_bool, int_list, is_int, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.recording import record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const
from hostir.ir.ops import Category, category
from hostir.ir.reductions import REDUCTION_DECLS, REDUCTION_OPS, ReductionDecl
from hostir.ir.requirements import HIGH, LOW, Requirement

_REDUCED_PRECISION = (DataType.Half, DataType.BFloat16)


def _tensor(op: str, value: Any) -> TensorView:
    if not isinstance(value, TensorView):
        raise OperandError(f"{op}: arg must be a TensorView, got {shown(value)}")
    return value


def reduced_dims(op: str, tv: TensorView, dims: int | Sequence[int] | None) -> tuple[int, ...]:
    """``dims`` of ``tv`` normalized (negative ones count from the end), sorted; None means
    every dim (nvFuser's ``sum(arg)``). OperandError naming ``tv`` for a dim out of range, a
    repeated dim, or no dim to reduce."""
    ndim = len(tv.shape_domain())
    if dims is None:
        dims = list(range(ndim))
    wanted = int_list(OperandError, op, "dims", dims, allow_int=True)
    result = []
    for dim in wanted:
        if not -ndim <= dim < ndim:
            raise OperandError(f"{op}: dim {dim} is out of range for {tv.name} with {ndim} dims")
        result.append(dim % ndim)
    if len(set(result)) != len(result):
        raise OperandError(f"{op}: dims {wanted} of {tv.name} repeat")
    if not result:
        raise OperandError(f"{op} of {tv.name}: dims is empty; name at least one dim to reduce")
    return tuple(sorted(result))


def _requested(op: str, dtype: Any) -> DataType | None:
    """The ``dtype`` argument: None (``DataType.Null``) or a DataType / torch.dtype."""
    if dtype is None:
        return None
    if not isinstance(dtype, DataType | torch.dtype):
        raise OperandError(f"{op}: dtype must be a DataType or torch.dtype, got {shown(dtype)}")
    return DataType.of(dtype)


class ReductionOps:
    """The reductions of ``fd.ops`` and their composites (attached to ``frontend.ops.Ops``,
    whose helpers ``_new`` and ops they use)."""

    # ----- the declared reductions ------------------------------------------------------
    def _reduce(
        self,
        name: str,
        arg: TensorView,
        dims: int | Sequence[int] | None,
        keepdim: bool,
        dtype: DataType | torch.dtype | None,
    ) -> TensorView:
        """Reduction ``name`` of ``arg`` over ``dims``, recorded from its declaration (its
        dtype from the declared rule), the reduced dims kept with extent 1 if ``keepdim``
        (a broadcast after the reduction)."""
        arg = _tensor(name, arg)
        normalized = reduced_dims(name, arg, dims)
        keepdim = check_bool(OperandError, name, "keepdim", keepdim)
        requested = _requested(name, dtype)
        operands = {"src": arg, "dims": normalized, "dtype": requested and requested.to_hostir()}
        (out,) = record(self._fusion, REDUCTION_DECLS[name], operands)
        return self._kept(out, arg, normalized) if keepdim else out

    def _kept(self, reduced: TensorView, arg: TensorView, dims: tuple[int, ...]) -> TensorView:
        """``reduced`` (``arg`` reduced over ``dims``) with those dims back, of extent 1."""
        ndim = len(arg.shape_domain())
        kept = [d for d in range(ndim) if d not in dims]
        return self.broadcast_in_dim(reduced, [1 if d in dims else -1 for d in range(ndim)], kept)

    # ----- composites ---------------------------------------------------------------------
    def _count(self, arg: TensorView, dims: tuple[int, ...]) -> ScalarVal:
        """How many elements of ``arg`` each result of a reduction over ``dims`` reads: the
        product of those dims' global extents, an Int scalar (a constant or an extent)."""
        count = arg.size(dims[0])
        for dim in dims[1:]:
            count = self.mul(count, arg.size(dim))
        return count

    def _mean(self, arg: TensorView, dims: tuple[int, ...]) -> TensorView:
        """The mean over ``dims`` (not kept): the sum divided by the count, as nvFuser's
        ``mean``. Half and BFloat16 are summed in Float (their result is Float, as nvFuser's
        ``sum / count`` gives); integers and bools are summed exactly (Int) and divided in
        Double (nvFuser divides by a Double count)."""
        if arg.dtype in _REDUCED_PRECISION:
            arg = self.cast(arg, DataType.Float)
        total = self._reduce("sum", arg, dims, False, None)
        if category(total.dtype.to_hostir()) is not Category.FLOAT:
            total = self.cast(total, DataType.Double)
        return self.div(total, self._count(arg, dims))

    def mean(
        self, arg: TensorView, dims: int | Sequence[int] | None = None, keepdim: bool = False
    ) -> TensorView:
        """The mean over ``dims`` (every dim if None), as ``torch.mean``: ``sum / count``.

        Dtype: Float for Float, Half and BFloat16 (reduced precision is summed in Float);
        Double for Double, integers and bool (nvFuser's C++ ``mean`` divides by a Double
        count; torch refuses integers). nvFuser's Python frontend has no ``mean``
        (docs/ops.md). A sharded reduced dim: a partial sum and one Allreduce."""
        arg = _tensor("mean", arg)
        dims = reduced_dims("mean", arg, dims)
        keepdim = check_bool(OperandError, "mean", "keepdim", keepdim)
        result = self._mean(arg, dims)
        return self._kept(result, arg, dims) if keepdim else result

    def _squared_deviations(
        self, arg: TensorView, dims: tuple[int, ...]
    ) -> tuple[TensorView, TensorView]:
        """(the mean over ``dims``, the sum over ``dims`` of the squared deviations from
        it): the second pass reads the mean broadcast back, so a large mean cancels before
        squaring (no ``E[x^2] - E[x]^2``)."""
        mean = self._mean(arg, dims)
        deviations = self.sub(arg, self._kept(mean, arg, dims))
        squares = self.mul(deviations, deviations)
        return mean, self._reduce("sum", squares, dims, False, None)

    def _variance(
        self, op: str, arg: TensorView, dims: tuple[int, ...], correction: Any
    ) -> tuple[TensorView, TensorView]:
        """(variance, mean) over ``dims`` with ``correction``: the sum of squared deviations
        divided by ``count - correction``."""
        if not is_int(correction) or correction < 0:
            raise OperandError(
                f"{op} of {arg.name}: correction must be an int >= 0 (nvFuser: 'correction"
                f" must be non-negative'), got {shown(correction)}"
            )
        count = self._count(arg, dims)
        # Checked now where the extents are constants, else when the inputs bind them
        # (the program carries it: hostir.check.value_rules), in the same words.
        rule = Requirement(
            low=Const(value=correction),
            high=count.to_hostir(),
            message=f"{op} of {arg.name}: correction {LOW} is larger than the {HIGH}"
            f" elements each result reduces over dims {list(dims)}",
        )
        self._fusion.require((rule,), carry=True)
        mean, squared = self._squared_deviations(arg, dims)
        denominator = self.sub(count, correction) if correction else count
        return self.div(squared, denominator), mean

    def var(
        self,
        arg: TensorView,
        dims: int | Sequence[int],
        correction: int = 1,
        keepdim: bool = False,
    ) -> TensorView:
        """The variance over ``dims``, as nvFuser's ``var`` and ``torch.var``: the sum of
        squared deviations from the mean, divided by ``count - correction``.

        Two passes (the mean, then the deviations), each sum over a sharded dim a partial
        sum and one Allreduce. Dtype: as ``sub(arg, mean)``: Float for Float, Half and
        BFloat16, Double for Double, integers and bool."""
        arg = _tensor("var", arg)
        dims = reduced_dims("var", arg, dims)
        keepdim = check_bool(OperandError, "var", "keepdim", keepdim)
        variance, _ = self._variance("var", arg, dims, correction)
        return self._kept(variance, arg, dims) if keepdim else variance

    def _float_operand(self, op: str, arg: Any, reduced_precision: bool) -> TensorView:
        """``arg`` if it is a Float or Double tensor, or, where ``reduced_precision``, a Half
        or BFloat16 one (which the caller computes in Float); else OperandError naming it."""
        arg = _tensor(op, arg)
        allowed = (DataType.Float, DataType.Double)
        allowed += _REDUCED_PRECISION if reduced_precision else ()
        if arg.dtype in allowed:
            return arg
        if arg.dtype in _REDUCED_PRECISION:
            why = (
                f"nvFuser's welford would keep {arg.dtype.name} for avg and var_sum, and its"
                " var_mean refuses reduced precision: 'please upcast to float'"
            )
        else:
            why = "torch refuses integers and bools; nvFuser's Welford would give an integer mean"
        takes = ", ".join(dtype.name for dtype in allowed)
        raise OperandError(
            f"{op}: {arg.name} is {arg.dtype.name}; {op} takes {takes} ({why}): cast"
            f" {arg.name} to Float first"
        )

    def var_mean(
        self,
        arg: TensorView,
        dims: int | Sequence[int],
        correction: int = 1,
        keepdim: bool = False,
    ) -> tuple[TensorView, TensorView]:
        """``(var, mean)`` over ``dims``, as nvFuser's ``var_mean`` and ``torch.var_mean``.

        Two passes (no Welford combine is needed: the mean is reduced first, over every
        rank, then the squared deviations from it), each a partial sum and one Allreduce
        when a reduced dim is sharded. Dtype: Float and Double give their own; Half and
        BFloat16 are computed in Float and both results are Float, as ``var`` and ``mean``
        give: the values and dtypes of nvFuser's ``var_mean(cast(arg, Float))``, the
        program nvFuser asks for where it refuses them ("please upcast to float").
        Integers and bools are refused."""
        arg = self._float_operand("var_mean", arg, reduced_precision=True)
        dims = reduced_dims("var_mean", arg, dims)
        keepdim = check_bool(OperandError, "var_mean", "keepdim", keepdim)
        variance, mean = self._variance("var_mean", arg, dims, correction)
        if keepdim:
            return self._kept(variance, arg, dims), self._kept(mean, arg, dims)
        return variance, mean

    def welford(
        self, arg: TensorView, dims: int | Sequence[int]
    ) -> tuple[TensorView, TensorView, TensorView]:
        """``(avg, var_sum, n)`` over ``dims``, as nvFuser's ``welford``: the mean, the sum of
        squared deviations from it (M2), and how many elements each result reduces (an Int
        tensor of avg's shape).

        Computed in two passes as ``var_mean`` (same results; a Welford merge of partial
        (n, mean, M2) triples is not needed when the mean is reduced first). Takes Float or
        Double; avg and var_sum have its dtype. ``n`` is the count written into a tensor:
        no communication."""
        arg = self._float_operand("welford", arg, reduced_precision=False)
        dims = reduced_dims("welford", arg, dims)
        avg, var_sum = self._squared_deviations(arg, dims)
        count = self._count(arg, dims)
        # A tensor of avg's shape holding the count: where() with both branches the count
        # (any Bool tensor of that shape will do as the condition; NaNs included).
        n = self.where(self.eq(avg, avg), count, count)
        return avg, var_sum, n


def _reduction_method(decl: ReductionDecl) -> Callable[..., TensorView]:
    """The ``fd.ops`` method of a declared reduction: nvFuser's signature
    ``(arg, dims=None, keepdim=False, dtype=None)``."""

    def method(
        self: ReductionOps,
        arg: TensorView,
        dims: int | Sequence[int] | None = None,
        keepdim: bool = False,
        dtype: DataType | torch.dtype | None = None,
    ) -> TensorView:
        return self._reduce(decl.name, arg, dims, keepdim, dtype)

    method.__name__ = decl.name
    method.__qualname__ = f"ReductionOps.{decl.name}"
    method.__signature__ = inspect.signature(method)
    rule = (
        "Int for integer and bool operands, else the operand's (Half stays Half); ``dtype``"
        " casts the operand first and is the result's"
        if decl.takes_dtype
        else "the operand's; no ``dtype`` (nvFuser refuses one)"
    )
    method.__doc__ = (
        f"{decl.summary} ``dims``: an int, a list, or None for every dim; ``keepdim`` keeps"
        f" them with extent 1.\n\nDtype: {rule}. A sharded reduced dim leaves partial"
        f" results that one collective with ``{decl.combine.value}`` combines (an Allreduce,"
        " or a ReduceScatter where the output is sharded on the same mesh axis;"
        " docs/ops.md)."
    )
    return method


for _decl in REDUCTION_OPS.values():
    setattr(ReductionOps, _decl.name, _reduction_method(_decl))

REDUCTION_METHODS: dict[str, Callable[..., Any]] = {
    name: method
    for name, method in vars(ReductionOps).items()
    if not name.startswith("__") and callable(method)
}
"""Every method ``frontend.ops.Ops`` takes from here (the public ones are ``fd.ops``')."""
