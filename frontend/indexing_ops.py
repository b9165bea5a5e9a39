"""``fd.ops`` indexing and scan ops, as nvFuser's Python frontend names and defines them:
``index_select``, ``gather``, ``take_along_axis``, ``cumsum``, ``topk`` and ``bincount``
(whose ``length``, as ``topk``'s ``k``, is an extent). ``scatter``, ``scatter_add`` and
``index_add`` need no method written out: theirs are made from their declarations
(``hostir.ir.scatter_ops``, ``frontend.declared_methods``).

Each is recorded from its declaration (``hostir.ir.indexing``, ``frontend.recording``);
the methods here check the form of their arguments and wrap a negative ``dim``. Their
axis maps say how they shard: a dim that is indexed or scanned is computed whole (lowering
gathers it first where it is sharded, see ``lowering.op_layouts``); the other dims map to
the output's and compute locally. ``topk`` returns two tensors, both defined by one
expression (one instruction): the op runs once for both, and a result nothing uses is
defined and freed at once. The methods are joined to ``frontend.ops.Ops`` by
:data:`INDEXING_METHODS`; their ``self`` is that ``Ops`` (not imported here:
``frontend.ops`` imports this module).
"""

from __future__ import annotations

from typing import Any

from frontend.arguments import MAX_EXTENT, check_bool, is_int, shown
from frontend.errors import OperandError
from frontend.exprs import ScalarVal
from frontend.iter_domain import IterDomain, IterType
from frontend.recording import record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, Scalar
from hostir.ir.indexing import CUMSUM, GATHER_DECLS, INDEX_SELECT, TOPK, GatherKind, index_problem
from hostir.ir.scatter_ops import BINCOUNT

_INDEX_DTYPES = (DataType.Int, DataType.Int32)

AxisPairs = list[tuple[IterDomain, IterDomain]]


# ----- argument checks --------------------------------------------------------------------


def _tensor(op: str, role: str, value: Any) -> TensorView:
    if not isinstance(value, TensorView):
        raise OperandError(f"{op}: {role} must be a TensorView, got {shown(value)}")
    return value


def _dim(op: str, tv: TensorView, dim: Any) -> int:
    """``dim`` of ``tv``'s data dims, normalized; OperandError naming the tensor else."""
    ndim = len(tv.shape_domain())
    if ndim == 0:
        raise OperandError(f"{op}: {tv.name} is 0-d; {op} needs a tensor with dims")
    if not is_int(dim) or not -ndim <= dim < ndim:
        raise OperandError(f"{op}: dim {shown(dim)} is out of range for {tv.name} with {ndim} dims")
    return dim % ndim


def _index(op: str, index: Any) -> TensorView:
    """An index tensor (its dtype checked before ``fd.ops`` translates it further)."""
    index = _tensor(op, "index", index)
    problem = index_problem(op, index.name, index.dtype.to_hostir())
    if problem is not None:
        raise OperandError(problem)
    return index


def _copy(axis: IterDomain, extent: Scalar | None = None) -> IterDomain:
    extent = axis.extent if extent is None else extent
    one = extent == Const(value=1)
    return IterDomain(extent, IterType.BROADCAST if one else IterType.ITERATION)


# ----- the methods ------------------------------------------------------------------------


def index_select(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
    """nvFuser's ``index_select(arg, index, dim)``: the entries of ``arg``'s dim ``dim`` at
    the positions in the 1-d (or 0-d) ``index``, as ``torch.index_select``; the dtype is
    ``arg``'s. Shards: ``arg``'s dim ``dim`` is read whole (gathered first where sharded);
    its other dims, and the output's dim ``dim`` through ``index``, compute locally."""
    arg = _tensor("index_select", "arg", arg)
    index = _index("index_select", index)
    dim = _dim("index_select", arg, dim)
    if len(index.shape_domain()) == 0:  # nvFuser selects and unsqueezes: one entry
        index = self.broadcast(index, [True])
    if len(index.shape_domain()) != 1:
        raise OperandError(
            f"index_select: the index {index.name} has {len(index.shape_domain())} dims;"
            " it must be 1-d (or 0-d)"
        )
    operands = {"src": arg, "index": index, "dim": dim}
    return record(self._fusion, INDEX_SELECT, operands)[0]


def _gather(self, kind: GatherKind, arg: Any, index: Any, dim: Any) -> TensorView:
    op = kind.value
    arg, index = _tensor(op, "arg", arg), _index(op, index)
    dim = _dim(op, arg, dim)
    operands = {"src": arg, "index": index, "dim": dim}
    return record(self._fusion, GATHER_DECLS[kind], operands)[0]


def gather(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
    """nvFuser's ``gather(arg, index, dim)``, as ``torch.gather``: ``out[i.., j, k..] =
    arg[i.., index[i.., j, k..], k..]``; ``index`` has ``arg``'s number of dims, extents at
    most ``arg``'s on the other dims, and gives the output's extents; the dtype is
    ``arg``'s. Shards: ``arg``'s dim ``dim`` (and any dim where the extents differ) is read
    whole, gathered first where sharded; the other dims compute locally."""
    return _gather(self, GatherKind.GATHER, arg, index, dim)


def take_along_axis(self, arg: TensorView, index: TensorView, dim: int) -> TensorView:
    """nvFuser's ``take_along_axis(arg, index, dim)``: ``gather`` whose ``index`` has
    ``arg``'s extents on every other dim (or 1 on either side, which broadcasts, as
    ``torch.take_along_dim``). Shards as ``gather``."""
    return _gather(self, GatherKind.TAKE_ALONG_AXIS, arg, index, dim)


def cumsum(self, arg: TensorView, dim: int, init: Any = None) -> TensorView:
    """nvFuser's ``cumsum(arg, dim, init=None)``: the running sum along ``dim`` in ``arg``'s
    dtype (nvFuser's scan does not promote: Half stays Half, Int32 stays Int32). Shards:
    ``dim`` is scanned whole (gathered first where sharded, the result sliced back); the
    other dims compute locally."""
    arg = _tensor("cumsum", "arg", arg)
    dim = _dim("cumsum", arg, dim)
    if init is not None:
        raise OperandError(
            f"cumsum: init={shown(init)} is not supported; only the default (None: the sum"
            " starts at 0) is, and nvFuser's evaluator ignores init too (ScanOp::evaluate)"
        )
    return record(self._fusion, CUMSUM, {"src": arg, "dim": dim})[0]


def _k_extent(arg: TensorView, k: Any, op: str = "topk", name: str = "k") -> Scalar:
    """``k`` as the extent of the results' dim ``dim`` (``bincount``: ``length``, its
    result's): an int, or an Int scalar that is a constant, a size or a scalar input (the
    declaration's requirements check it against ``arg``'s extent: now where both are
    constants, else when the inputs bind them)."""
    if isinstance(k, ScalarVal):
        if k.dtype not in _INDEX_DTYPES:
            raise OperandError(f"{op}: {name} = {k.name} must be an integer, not a {k.dtype.name}")
        return k.to_hostir()  # a scalar input's symbol, bound at execute
    if is_int(k) and 0 <= k <= MAX_EXTENT:
        return Const(value=int(k))
    raise OperandError(f"{op}: {name} must be a non-negative int, got {shown(k)}")


def topk(
    self, arg: TensorView, k: Any, dim: int = -1, largest: bool = True, sorted: bool = False
) -> tuple[TensorView, TensorView]:
    """nvFuser's ``topk(arg, k, dim=-1, largest=True, sorted=False)``: ``(values,
    indices)`` of the ``k`` largest (or smallest) entries along ``dim``, as ``torch.topk``;
    values have ``arg``'s dtype, indices are Int. One instruction defines both (the op runs
    once; a result nothing uses is freed at once). Shards: ``dim`` is read whole (gathered
    first where sharded); the other dims compute locally."""
    arg = _tensor("topk", "arg", arg)
    dim = _dim("topk", arg, dim)
    largest = check_bool(OperandError, "topk", "largest", largest)
    sorted = check_bool(OperandError, "topk", "sorted", sorted)
    operands = {"src": arg, "k": _k_extent(arg, k), "dim": dim}
    values, indices = record(self._fusion, TOPK, {**operands, "largest": largest, "sorted": sorted})
    return values, indices


def bincount(self, arg: TensorView, length: Any) -> TensorView:
    """``bincount(arg, length)``: how many times each value in ``[0, length)`` occurs in the
    1-d Int or Int32 ``arg``, as ``torch.bincount(arg, minlength=length)`` (Int
    ``[length]``); a value outside is an IndexDataError when the op runs. ``length`` is
    the result's extent: an int or a size, as ``topk``'s ``k``. Shards: ``arg``'s dim is a
    reduction axis of the result (``hostir.ir.scatter_ops``): a sharded ``arg`` gives
    partial counts, summed by one Allreduce."""
    arg = _tensor("bincount", "arg", arg)
    extent = _k_extent(arg, length, "bincount", "length")
    return record(self._fusion, BINCOUNT, {"src": arg, "length": extent})[0]


INDEXING_METHODS = {
    "index_select": index_select,
    "gather": gather,
    "take_along_axis": take_along_axis,
    "cumsum": cumsum,
    "topk": topk,
    "bincount": bincount,
}
"""The ``fd.ops`` methods of this module, by name."""
