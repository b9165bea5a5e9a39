"""``fd.ops`` creation and random ops, as nvFuser's Python frontend names and defines them:
``full``, ``iota``, ``uniform``, ``normal``, and the composite ``triu``.

The factories read no tensor: their output's extents come from a ``shape`` (ints, sizes
of the fusion's tensors, Int scalar inputs bound at execute), its dtype from ``dtype``.
Each is recorded from its declaration (``hostir.ir.creation``, ``frontend.recording``),
which checks the scalars against the dtype; the methods here check the form of their
arguments and translate ``shape`` to extents. ``triu`` is built from ``iota``,
``broadcast``, ``le`` and ``where``, as nvFuser's C++ composite (``csrc/ops/composite.cpp``).
The methods are joined to ``frontend.ops.Ops`` by :data:`CREATION_METHODS`; their ``self`` is
that ``Ops`` (not imported here: ``frontend.ops`` imports this module).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from frontend.arguments import MAX_EXTENT, check_fits, is_int, shown
from frontend.errors import DefinitionError, OperandError
from frontend.exprs import Operand, ScalarVal
from frontend.recording import record
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, Scalar, TensorValue
from hostir.ir.creation import FULL, IOTA, RANDOM_DECLS, Distribution

_FLOATS = (DataType.Float, DataType.Double, DataType.Half, DataType.BFloat16)
_INTEGERS = (DataType.Int, DataType.Int32)


# ----- argument checks --------------------------------------------------------------------


def _scalar_kind(value: Any) -> type | None:
    """The Python type a scalar argument stands for (bool, int, float), None if it is not
    a scalar."""
    if isinstance(value, ScalarVal):
        if value.dtype is DataType.Bool:
            return bool
        return int if value.dtype in _INTEGERS else float
    if isinstance(value, bool | int | float):
        return type(value)
    return None


def _number(op: str, what: str, value: Any) -> Operand:
    """A scalar argument (a Python number or a scalar of the fusion); OperandError else."""
    if _scalar_kind(value) is None:
        raise OperandError(f"{op}: {what} must be a number or a scalar, got {shown(value)}")
    if is_int(value):
        check_fits(OperandError, op, what, value, DataType.Int)
    return value


def _extent(op: str, what: str, entry: Any) -> Scalar:
    """A shape entry as an extent: an int, or an Int scalar that is a constant, a size of
    the fusion's tensors (``tv.size(i)``), a scalar input (its symbol, bound at execute;
    the extent checks refuse a negative value then) or arithmetic on them."""
    if isinstance(entry, ScalarVal):
        if entry.dtype not in _INTEGERS:
            raise OperandError(
                f"{op}: {what} = {entry.name} must be an integer, not a {entry.dtype.name}"
            )
        if entry.value is None:
            return entry.to_hostir()
        entry = entry.value
    if not is_int(entry) or not 0 <= entry <= MAX_EXTENT:
        raise OperandError(f"{op}: {what} must be a non-negative int, got {shown(entry)}")
    return Const(value=int(entry))


def _extents(op: str, shape: Any) -> tuple[Scalar, ...]:
    """The extents of a factory's output of ``shape``."""
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise OperandError(f"{op}: shape must be a list of extents, got {shown(shape)}")
    return tuple(_extent(op, f"shape[{position}]", entry) for position, entry in enumerate(shape))


def _made(dtype: DataType, extents: tuple[Scalar, ...]) -> dict[str, TensorValue]:
    """What a creation op is given of its result: the dtype and the extents."""
    return {"out": TensorValue(name="out", dtype=dtype.to_hostir(), shape=extents)}


def _dtype(op: str, dtype: Any) -> DataType:
    try:
        return DataType.of(dtype)
    except DefinitionError as error:  # its message names the dtypes taken
        raise OperandError(f"{op}: {error}") from None


def _seed(op: str, what: str, value: Any) -> Operand | None:
    """A seed or an offset: None, or a scalar (an int that fits Int; the declaration
    checks that it is an integer, and that seed and offset come together)."""
    if value is not None and _scalar_kind(value) is None:
        raise OperandError(f"{op}: {what} must be an integer, got {shown(value)}")
    if is_int(value):
        check_fits(OperandError, op, what, value, DataType.Int)
    return value


# ----- the methods ------------------------------------------------------------------------


def full(self, shape: Sequence[Any], fill_value: Any, dtype: DataType) -> TensorView:
    """nvFuser's ``full(shape, fill_value, dtype)``: a tensor of ``shape`` with every element
    ``fill_value`` converted to ``dtype`` (a float truncates into an integer dtype). Each
    rank makes its own shard; it communicates nothing."""
    dtype = _dtype("full", dtype)
    fill_value = _number("full", "fill_value", fill_value)
    if is_int(fill_value) and dtype in _INTEGERS:
        check_fits(OperandError, "full", "fill_value", fill_value, dtype)
    given = _made(dtype, _extents("full", shape))
    return record(self._fusion, FULL, {"fill_value": fill_value}, given=given)[0]


def iota(
    self, length: Any, start: Any = None, step: Any = None, dtype: DataType = DataType.Int
) -> TensorView:
    """nvFuser's ``iota(length, start=None, step=None, dtype=DataType.Int)``: the 1-d tensor
    ``start + i * step`` for ``i`` in ``range(length)`` (start 0 and step 1 by default).
    ``start`` and ``step`` are integers for an integer ``dtype`` and floats for a
    floating-point one, as nvFuser requires; a constant step is not 0. Each rank makes its
    own shard (its elements' global indices); it communicates nothing."""
    dtype = _dtype("iota", dtype)
    wanted = float if dtype in _FLOATS else int
    start = wanted(0) if start is None else _number("iota", "start", start)
    step = wanted(1) if step is None else _number("iota", "step", step)
    given = _made(dtype, (_extent("iota", "length", length),))
    return record(self._fusion, IOTA, {"start": start, "step": step}, given=given)[0]


def _random(
    self,
    distribution: Distribution,
    params: tuple[tuple[str, Any], tuple[str, Any]],
    shape: Sequence[Any],
    rng_seed: Any,
    rng_offset: Any,
    dtype: Any,
) -> TensorView:
    op = distribution.value
    dtype = _dtype(op, dtype)
    (name_a, a), (name_b, b) = params
    operands = {
        "a": _number(op, name_a, a),
        "b": _number(op, name_b, b),
        "seed": _seed(op, "rng_seed", rng_seed),
        "offset": _seed(op, "rng_offset", rng_offset),
    }
    given = _made(dtype, _extents(op, shape))
    return record(self._fusion, RANDOM_DECLS[distribution], operands, given=given)[0]


def uniform(
    self,
    minval: Any,
    maxval: Any,
    shape: Sequence[Any],
    *,
    rng_seed: Any = None,
    rng_offset: Any = None,
    dtype: DataType = DataType.Float,
) -> TensorView:
    """nvFuser's ``uniform(minval, maxval, shape, *, rng_seed=None, rng_offset=None,
    dtype=DataType.Float)``: values drawn uniformly from ``[minval, maxval)``. Seeded, the
    values depend on ``(rng_seed, rng_offset)`` and the shape only: replicas agree, and a
    sharded result is the slice of the unsharded one. Unseeded, each execute draws a seed
    from torch's default generator (docs/ops.md)."""
    params = (("minval", minval), ("maxval", maxval))
    return _random(self, Distribution.UNIFORM, params, shape, rng_seed, rng_offset, dtype)


def normal(
    self,
    mean: Any,
    std: Any,
    shape: Sequence[Any],
    *,
    rng_seed: Any = None,
    rng_offset: Any = None,
    dtype: DataType = DataType.Float,
) -> TensorView:
    """nvFuser's ``normal(mean, std, shape, *, rng_seed=None, rng_offset=None,
    dtype=DataType.Float)``: values drawn from the normal distribution; seeded and sharded
    as ``uniform``."""
    params = (("mean", mean), ("std", std))
    return _random(self, Distribution.NORMAL, params, shape, rng_seed, rng_offset, dtype)


def triu(self, arg: TensorView, diagonal: int = 0) -> TensorView:
    """nvFuser's ``triu(arg, diagonal=0)``: ``arg`` with the elements below diagonal
    ``diagonal`` of its last two dims set to zero, as its C++ composite builds it:
    ``where(le(iota(rows)[:, None], iota(cols, -diagonal)[None, :]), arg, 0)``. Shards as
    ``where``: each rank masks its own shard (the iotas make the rows and columns it holds)."""
    if not isinstance(arg, TensorView):
        raise OperandError(f"triu: arg must be a TensorView, got {shown(arg)}")
    ndim = len(arg.shape_domain())
    if ndim < 2:
        raise OperandError(f"triu: {arg.name} has {ndim} dims; triu needs at least 2")
    if not is_int(diagonal):
        raise OperandError(f"triu: diagonal must be an int, got {shown(diagonal)}")
    check_fits(OperandError, "triu", "diagonal", -diagonal, DataType.Int)
    rows = self.iota(arg.size(-2))
    cols = self.iota(arg.size(-1), -diagonal)
    mask = self.le(self.broadcast(rows, [False, True]), self.broadcast(cols, [True, False]))
    zero: bool | int | float = 0.0 if arg.dtype in _FLOATS else 0
    if arg.dtype is DataType.Bool:
        zero = False
    return self.where(mask, arg, zero)


CREATION_METHODS = {
    "full": full,
    "iota": iota,
    "uniform": uniform,
    "normal": normal,
    "triu": triu,
}
"""The ``fd.ops`` methods of this module, by name."""
