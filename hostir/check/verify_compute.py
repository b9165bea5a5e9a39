"""The verifier's rules for compute instructions: a result's dtype and extents agree with
its op and operands.

One rule per compute class, in :data:`COMPUTE_RULES`. A rule returns the problem as a
sentence, or None. Extents are global and compared symbolically
(:mod:`hostir.ir.extents`). A pointwise op's dtype is its declared rule's
(``hostir.ir.ops``, nvFuser's promotion), a reduction's too (``hostir.ir.reductions``);
linear's and matmul's their declared rule (``hostir.ir.contraction``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hostir.check.result_checks import result_problem, same_extents, shape_text
from hostir.check.verify_attention import ATTENTION_RULES
from hostir.check.verify_shape_ops import SHAPE_RULES
from hostir.errors import HostIrError
from hostir.ir.contraction import contraction_dtype
from hostir.ir.dtypes import DType
from hostir.ir.extents import differ, is_one, local_extents, same_extent
from hostir.ir.instructions import (
    Binary,
    BroadcastInDim,
    Cast,
    Linear,
    Matmul,
    Permute,
    Reduction,
    Set,
    ShardByStream,
    Ternary,
    Unary,
)
from hostir.ir.ops import POINTWISE_OPS, OpDtypeError, promote, scalar_operand, tensor_operand
from hostir.ir.reductions import REDUCTION_OPS, reduction_dtype
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Scalar, Symbol, print_scalar
from hostir.ir.values import TensorValue

ScalarTypes = Mapping[str, type]
"""The Python type (bool, int, float) of each scalar input and loop index by name."""


def _operand_type(operand: Any, scalars: ScalarTypes) -> object:
    """A tensor's DType, or a scalar's Python type."""
    if isinstance(operand, TensorValue):
        return operand.dtype
    if isinstance(operand, Const):
        return type(operand.value)
    if isinstance(operand, Symbol):
        return scalars.get(operand.name, int)
    if isinstance(operand, MeshCoordinate):
        return int
    if isinstance(operand, BinaryExpr):
        types = {_operand_type(operand.lhs, scalars), _operand_type(operand.rhs, scalars)}
        return float if float in types else int
    return int


# ----- the rules --------------------------------------------------------------------------


def _rule_set(instruction: Set, scalars: ScalarTypes) -> str | None:
    """A copy of the local buffer: local extents agree (a stream chunk may take a shard)."""
    src, out = instruction.src, instruction.out
    if out.dtype is not src.dtype:
        return f"{out.name} is declared {out.dtype.value}, but set copies {src.dtype.value}"
    mine, theirs = local_extents(out), local_extents(src)
    if len(mine) != len(theirs) or any(differ(a, b) for a, b in zip(mine, theirs, strict=True)):
        return f"{out.name}'s local extents differ from {src.name}'s: set copies a local buffer"
    return None


def _rule_cast(instruction: Cast, scalars: ScalarTypes) -> str | None:
    return result_problem(instruction, instruction.src.shape, None)


def _declared_dtype(instruction: Any, fields: tuple[str, ...], scalars: ScalarTypes) -> DType | str:
    """The result dtype of a pointwise instruction under its op's declared rule, or the
    rule's refusal as text."""
    operands = []
    for name in fields:
        value = getattr(instruction, name)
        if isinstance(value, TensorValue):
            operands.append(tensor_operand(value.dtype, value.ndim, value.name))
        else:
            operands.append(scalar_operand(_operand_type(value, scalars), print_scalar(value)))
    try:
        return promote(POINTWISE_OPS[instruction.op.value], tuple(operands)).result
    except HostIrError as error:
        return str(error)


def _rule_pointwise(instruction: Any, scalars: ScalarTypes) -> str | None:
    """Unary, Binary and Ternary: the declared dtype rule, and the operands' extents
    broadcast together (at least one operand is a tensor)."""
    fields = _POINTWISE_FIELDS[type(instruction)]
    dtype = _declared_dtype(instruction, fields, scalars)
    if isinstance(dtype, str):
        return dtype
    values = [getattr(instruction, name) for name in fields]
    tensors = [o for o in values if isinstance(o, TensorValue)]
    if not tensors:
        return f"{instruction.op.value}: no operand is a tensor"
    shape: tuple[Scalar, ...] | None = tensors[0].shape
    for tensor in tensors[1:]:
        shape = _broadcast(shape, tensor.shape)
        if shape is None:
            shown = " and ".join(shape_text(t) for t in tensors)
            return f"{instruction.op.value}: the extents {shown} do not broadcast together"
    return result_problem(instruction, shape, dtype)


_POINTWISE_FIELDS = {Unary: ("src",), Binary: ("lhs", "rhs"), Ternary: ("a", "b", "c")}


def _broadcast(a: tuple[Scalar, ...], b: tuple[Scalar, ...]) -> tuple[Scalar, ...] | None:
    """Torch's broadcast of two shapes (aligned on the right), or None."""
    result = []
    for k in range(1, max(len(a), len(b)) + 1):
        x = a[-k] if k <= len(a) else Const(value=1)
        y = b[-k] if k <= len(b) else Const(value=1)
        if is_one(y) or same_extent(x, y):
            result.append(x)
        elif is_one(x):
            result.append(y)
        elif differ(x, y):
            return None
        else:  # symbolic extents that may agree at run time (the binding checks them)
            result.append(x)
    return tuple(reversed(result))


def _rule_reduction(instruction: Reduction, scalars: ScalarTypes) -> str | None:
    """The declared dtype rule (``hostir.ir.reductions``) and the reduced extents."""
    src, op = instruction.src, instruction.op.value
    if any(not -src.ndim <= d < src.ndim for d in instruction.dims):
        return f"{op}: dims {list(instruction.dims)} out of range for {src.name} {shape_text(src)}"
    dims = {d % src.ndim for d in instruction.dims}
    if not dims or len(dims) != len(instruction.dims):
        return f"{op}: dims {list(instruction.dims)} of {src.name} must be distinct, at least one"
    one = Const(value=1)
    shape = tuple(
        one if d in dims else e
        for d, e in enumerate(src.shape)
        if instruction.keepdim or d not in dims
    )
    try:
        dtype = reduction_dtype(REDUCTION_OPS[op], src.dtype, instruction.dtype, src.name)
    except OpDtypeError as error:
        return str(error)
    return result_problem(instruction, shape, dtype)


def _contraction_dtype(op: str, operands: tuple[TensorValue, ...]) -> DType | str:
    """The declared dtype of linear or matmul (``hostir.ir.contraction``), or the refusal."""
    try:
        return contraction_dtype(op, [(o.name, o.dtype) for o in operands])
    except HostIrError as error:
        return str(error)


def _rule_linear(instruction: Linear, scalars: ScalarTypes) -> str | None:
    a, w, bias = instruction.input, instruction.weight, instruction.bias
    if a.ndim < 1 or w.ndim < 2:
        return (
            f"linear: input {shape_text(a)} and weight {shape_text(w)}; the weight must be"
            " [*W, N, K]"
        )
    if differ(a.shape[-1], w.shape[-1]):
        return (
            f"linear: the contraction extents differ: input {a.name} {shape_text(a)} ends in"
            f" {print_scalar(a.shape[-1])}, weight {w.name} {shape_text(w)} has"
            f" {print_scalar(w.shape[-1])} columns"
        )
    if bias is not None and not (
        same_extents(bias.shape, (w.shape[-2],)) or same_extents(bias.shape, w.shape[:-1])
    ):
        return (
            f"linear: bias {bias.name} {shape_text(bias)} must be [N] or [*W, N] of {shape_text(w)}"
        )
    operands = (a, w) if bias is None else (a, w, bias)
    dtype = _contraction_dtype("linear", operands)
    if isinstance(dtype, str):
        return dtype
    return result_problem(instruction, (*w.shape[:-2], *a.shape[:-1], w.shape[-2]), dtype)


def _rule_matmul(instruction: Matmul, scalars: ScalarTypes) -> str | None:
    a, b = instruction.lhs, instruction.rhs
    if a.ndim < 1 or b.ndim < 1:
        return f"matmul: operands {shape_text(a)} and {shape_text(b)} must have at least 1 dim"
    if differ(a.shape[-1], b.shape[-2] if b.ndim > 1 else b.shape[0]):
        return (
            f"matmul: the contraction extents differ: {a.name} {shape_text(a)} and {b.name}"
            f" {shape_text(b)}"
        )
    batch = _broadcast(a.shape[:-2], b.shape[:-2])
    if batch is None:
        return f"matmul: the batch extents of {shape_text(a)} and {shape_text(b)} do not broadcast"
    dtype = _contraction_dtype("matmul", (a, b))
    if isinstance(dtype, str):
        return dtype
    rows = a.shape[-2:-1] if a.ndim > 1 else ()
    columns = b.shape[-1:] if b.ndim > 1 else ()
    return result_problem(instruction, (*batch, *rows, *columns), dtype)


def _rule_broadcast_in_dim(instruction: BroadcastInDim, scalars: ScalarTypes) -> str | None:
    src, out, dims = instruction.src, instruction.out, instruction.broadcast_dims
    if (
        len(dims) != src.ndim
        or list(dims) != sorted(set(dims))
        or any(not 0 <= d < out.ndim for d in dims)
    ):
        return (
            f"broadcast_in_dim: broadcast_dims {list(dims)} must place the {src.ndim} dims of"
            f" {src.name} at increasing dims of the {out.ndim}-d {out.name}"
        )
    for src_dim, out_dim in enumerate(dims):
        extent = src.shape[src_dim]
        if differ(extent, out.shape[out_dim]) and not is_one(extent):
            return (
                f"broadcast_in_dim: dim {src_dim} of {src.name} {shape_text(src)} cannot become"
                f" dim {out_dim} of {out.name} {shape_text(out)}"
            )
    if out.dtype is not src.dtype:
        return (
            f"{out.name} is declared {out.dtype.value}, but broadcast_in_dim keeps"
            f" {src.dtype.value}"
        )
    return None


def _rule_permute(instruction: Permute, scalars: ScalarTypes) -> str | None:
    src, dims = instruction.src, instruction.dims
    if sorted(dims) != list(range(src.ndim)):
        return f"permute: dims {list(dims)} is not a permutation of {src.ndim} dims"
    return result_problem(instruction, tuple(src.shape[d] for d in dims), src.dtype)


def _rule_shard_by_stream(instruction: ShardByStream, scalars: ScalarTypes) -> str | None:
    src, out, axis = instruction.src, instruction.out, instruction.axis
    if not 0 <= axis < src.ndim or out.ndim != src.ndim:
        return f"shard_by_stream: axis {axis} of the {src.ndim}-d {src.name} into {out.ndim}-d"
    others = [d for d in range(src.ndim) if d != axis]
    if any(differ(src.shape[d], out.shape[d]) for d in others):
        return (
            f"shard_by_stream: {out.name} {shape_text(out)} must keep every extent of {src.name}"
            f" {shape_text(src)} but the one of axis {axis}"
        )
    if out.dtype is not src.dtype:
        return f"{out.name} is declared {out.dtype.value}, but it aliases {src.dtype.value} data"
    return None


COMPUTE_RULES: dict[type, Callable[[Any, ScalarTypes], str | None]] = {
    Set: _rule_set,
    Cast: _rule_cast,
    Unary: _rule_pointwise,
    Binary: _rule_pointwise,
    Ternary: _rule_pointwise,
    Reduction: _rule_reduction,
    Linear: _rule_linear,
    Matmul: _rule_matmul,
    BroadcastInDim: _rule_broadcast_in_dim,
    Permute: _rule_permute,
    ShardByStream: _rule_shard_by_stream,
    **ATTENTION_RULES,  # sdpfa_fwd, sdpfa_bwd, grouped_mm, embedding_fwd
    **SHAPE_RULES,
}
"""One rule per instruction that computes (or aliases) a tensor from tensors."""

# The creation and indexing ops' rules live in their own module (verify_creation).
from hostir.check.verify_creation import CREATION_RULES  # noqa: E402 - joins the table above

COMPUTE_RULES.update(CREATION_RULES)
