"""The verifier's rules for the creation and indexing instructions (``hostir.ir.creation``,
``hostir.ir.indexing``): a result's dtype and extents agree with the op and its operands.

A rule returns the problem as a sentence, or None; extents are global and compared
symbolically (``hostir.ir.extents``). Merged into ``COMPUTE_RULES``
(``hostir.check.verify_compute``).

None of these rules is reached any more: the ops are declared (``hostir.ir.creation``,
``hostir.ir.indexing``) and checked by their declarations' ``infer``
(``hostir.check.verify_ops``); the rules go when every family's tables do (``topk``'s went
when it became one instruction of two results).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.creation import Full, Iota, Random
from hostir.ir.dtypes import DType
from hostir.ir.extents import differ, is_one
from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, IndexSelect
from hostir.ir.scalars import Const, Symbol
from hostir.ir.values import TensorValue

ScalarTypes = Mapping[str, type]

_FLOATS = frozenset({DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16})
_INDICES = frozenset({DType.INT64, DType.INT32})


def _scalar_type(value: Any, scalars: ScalarTypes) -> type | None:
    """The Python type of a scalar field (None for a tensor, which no rule here takes)."""
    if isinstance(value, TensorValue):
        return None
    if isinstance(value, Const):
        return type(value.value)
    if isinstance(value, Symbol):
        return scalars.get(value.name, int)
    return int  # an expression of extents, loop indices and coordinates


def _scalars_only(instruction: Any, names: tuple[str, ...], scalars: ScalarTypes) -> str | None:
    for name in names:
        if _scalar_type(getattr(instruction, name), scalars) is None:
            return f"{name} must be a scalar, got the tensor {getattr(instruction, name).name}"
    return None


# ----- creation ---------------------------------------------------------------------------


def _rule_full(instruction: Full, scalars: ScalarTypes) -> str | None:
    return _scalars_only(instruction, ("fill_value",), scalars)


def _rule_iota(instruction: Iota, scalars: ScalarTypes) -> str | None:
    out = instruction.out
    if out.ndim != 1:
        return f"{out.name} must be 1-d, got {shape_text(out)}"
    if out.dtype is DType.BOOL or out.dtype is DType.UINT64:
        return f"{out.name} is {out.dtype.value}; iota makes integer or floating-point tensors"
    problem = _scalars_only(instruction, ("start", "step"), scalars)
    if problem is not None:
        return problem
    wanted = float if out.dtype in _FLOATS else int
    for name in ("start", "step"):
        found = _scalar_type(getattr(instruction, name), scalars)
        if (found is float) != (wanted is float) or found is bool:
            return (
                f"{name} is a {found.__name__}, but {out.name} is {out.dtype.value}: nvFuser's"
                f" iota takes {'a float' if wanted is float else 'an int'} {name} for it"
            )
    return None


def _rule_random(instruction: Random, scalars: ScalarTypes) -> str | None:
    out = instruction.out
    if out.dtype not in _FLOATS:
        return f"{out.name} is {out.dtype.value}; random ops make floating-point tensors"
    if (instruction.seed is None) != (instruction.offset is None):
        return "seed and offset are given together or not at all"
    return _scalars_only(instruction, ("a", "b"), scalars)


# ----- indexing ---------------------------------------------------------------------------


def _check_dim(op: str, src: TensorValue, dim: int) -> str | None:
    if not 0 <= dim < src.ndim:
        return f"{op}: dim {dim} is out of range for {src.name} {shape_text(src)}"
    return None


def _check_index(op: str, index: TensorValue) -> str | None:
    if index.dtype not in _INDICES:
        return f"{op}: the index {index.name} is {index.dtype.value}; indices are int64 or int32"
    return None


def _rule_index_select(instruction: IndexSelect, scalars: ScalarTypes) -> str | None:
    src, index, dim = instruction.src, instruction.index, instruction.dim
    problem = _check_dim("index_select", src, dim) or _check_index("index_select", index)
    if problem is not None:
        return problem
    if index.ndim != 1:
        return f"index_select: the index {index.name} must be 1-d, got {shape_text(index)}"
    shape = src.shape[:dim] + index.shape + src.shape[dim + 1 :]
    return result_problem(instruction, shape, src.dtype)


def _rule_gather(instruction: GatherAlong, scalars: ScalarTypes) -> str | None:
    src, index, dim = instruction.src, instruction.index, instruction.dim
    op = instruction.kind.value
    problem = _check_dim(op, src, dim) or _check_index(op, index)
    if problem is not None:
        return problem
    if index.ndim != src.ndim:
        return f"{op}: the index {index.name} has {index.ndim} dims, {src.name} {src.ndim}"
    shape = list(index.shape)
    for d, (a, i) in enumerate(zip(src.shape, index.shape, strict=True)):
        if d == dim:
            continue
        if instruction.kind is GatherKind.GATHER:
            if isinstance(a, Const) and isinstance(i, Const) and i.value > a.value:
                return f"{op}: dim {d} of the index {index.name} is larger than {src.name}'s"
        elif is_one(i):
            shape[d] = a
        elif not is_one(a) and differ(a, i):
            return f"{op}: dim {d} of {src.name} and of the index {index.name} differ"
    return result_problem(instruction, tuple(shape), src.dtype)


def _rule_cumsum(instruction: Cumsum, scalars: ScalarTypes) -> str | None:
    src = instruction.src
    problem = _check_dim("cumsum", src, instruction.dim)
    if problem is None and src.dtype in (DType.BOOL, DType.UINT64):
        problem = f"cumsum: {src.name} is {src.dtype.value}; cumsum takes numbers"
    return problem or result_problem(instruction, src.shape, src.dtype)


CREATION_RULES: dict[type, Callable[[Any, ScalarTypes], str | None]] = {
    Full: _rule_full,
    Iota: _rule_iota,
    Random: _rule_random,
    IndexSelect: _rule_index_select,
    GatherAlong: _rule_gather,
    Cumsum: _rule_cumsum,
}
"""One rule per creation and indexing instruction class."""
