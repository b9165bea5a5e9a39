"""``linear`` and ``matmul``: their instructions and declarations (``hostir.ir.opdecl``:
the dtype rule, the result axes with the operand axes they map), read by the frontend
(``fd.ops.linear`` / ``fd.ops.matmul``), the verifier, lowering and the runtime alike.

nvFuser (``csrc/ops/composite.cpp``: ``linear``, ``matmul``, ``newForLinear``,
``newForMatmul``):

- **dtype**: every operand (input, weight and bias; both matmul operands) has one dtype,
  and the result has it (Half stays Half: the product accumulates in Float inside the
  kernel). Bool is refused (torch has no Bool product).
- **linear**: input ``[*I, K]``, weight ``[*W, N, K]``, bias ``[N]`` or ``[*W, N]`` ->
  ``[*W, *I, N]``. nvFuser takes the leading weight dims ``*W`` for device dims of a
  "logically split" weight; hostir computes them for any extent.
- **matmul**: torch's ranks, 1-d operands included: ``[K] x [K] -> []``,
  ``[*B, M, K] x [K] -> [*B, M]``, ``[K] x [*B, K, N] -> [*B, N]``, and batch dims
  broadcast from the right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from hostir.ir.catalog import Kind, declare
from hostir.ir.dtypes import DType
from hostir.ir.extents import is_one, unequal_dims_problem
from hostir.ir.opdecl import (
    AxisKind,
    OpArgs,
    OpSharding,
    Param,
    ParamKind,
    ResultType,
    declare_op,
    result_axis,
)
from hostir.ir.ops import OpDtypeError
from hostir.ir.scalars import Const, print_scalar
from hostir.ir.values import TensorValue


def contraction_dtype(op: str, operands: Sequence[tuple[str, DType]]) -> DType:
    """The result dtype of ``op`` (linear or matmul) on ``operands`` (name, dtype); raises
    OpDtypeError naming the operands whose dtypes differ, or a Bool operand."""
    (first_name, first), *_ = operands
    for name, dtype in operands:
        if dtype is not first:
            shown = ", ".join(f"{n}: {d.value}" for n, d in operands)
            raise OpDtypeError(
                f"{op}({shown}): {name} is {dtype.value} but {first_name} is {first.value};"
                f" {op} takes operands of one dtype (nvFuser's rule); cast one first"
            )
    if first is DType.BOOL:
        raise OpDtypeError(f"{op}: {first_name} is bool; {op} takes numbers (cast it first)")
    return first


@declare(kind=Kind.COMPUTE, keyword="linear", positional=("input", "weight"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Linear:
    """``out = torch.nn.functional.linear(input, weight, bias)``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("input", "weight", "bias")
    out: TensorValue
    input: TensorValue
    weight: TensorValue
    bias: TensorValue | None = None
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="matmul", positional=("lhs", "rhs"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Matmul:
    """``out = torch.matmul(lhs, rhs)``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("lhs", "rhs")
    out: TensorValue
    lhs: TensorValue
    rhs: TensorValue
    preallocated: bool = False


def _dtype(op: str, operands: tuple[TensorValue, ...]) -> DType | str:
    try:
        return contraction_dtype(op, [(o.name, o.dtype) for o in operands])
    except OpDtypeError as error:
        return str(error)


def _infer_linear(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``[*I, K] x [*W, N, K] (+ [N] or [*W, N]) -> [*W, *I, N]``, K a reduction axis last."""
    x, w, bias = args["input"], args["weight"], args["bias"]
    if x.ndim < 1:
        return f"linear: input {x.name} must have at least 1 dim"
    if w.ndim < 2:
        return f"linear: weight {w.name} must have at least 2 dims [*W, N, K], got {w.ndim}"
    problem = unequal_dims_problem("linear", x, x.ndim - 1, w, w.ndim - 1)
    if problem is None and bias is not None:
        if bias.ndim not in (1, w.ndim - 1):
            return (
                f"linear: bias {bias.name} must have 1 dim [N] or {w.ndim - 1} dims [*W, N]"
                f" (as weight {w.name}), got {bias.ndim}"
            )
        for d in range(bias.ndim):
            problem = problem or unequal_dims_problem(
                "linear", bias, d, w, w.ndim - 1 - bias.ndim + d
            )
    if problem is not None:
        return problem
    dtype = _dtype("linear", (x, w) if bias is None else (x, w, bias))
    if isinstance(dtype, str):
        return dtype
    leading = [
        result_axis(
            e, ("weight", d), *((("bias", d),) if bias is not None and bias.ndim > 1 else ())
        )
        for d, e in enumerate(w.shape[:-2])
    ]
    batch = [result_axis(e, ("input", d)) for d, e in enumerate(x.shape[:-1])]
    n = result_axis(
        w.shape[-2], ("weight", w.ndim - 2), *((("bias", bias.ndim - 1),) if bias else ())
    )
    k = result_axis(
        x.shape[-1], ("input", x.ndim - 1), ("weight", w.ndim - 1), kind=AxisKind.REDUCTION
    )
    return (ResultType(dtype=dtype, axes=(*leading, *batch, n, k)),)


def _infer_matmul(args: OpArgs) -> tuple[ResultType, ...] | str:
    """torch.matmul's ranks (1-d operands included), batch dims broadcast from the right
    (the first extent other than 1 wins), K a reduction axis last."""
    a, b = args["lhs"], args["rhs"]
    for value in (a, b):
        if value.ndim < 1:
            return f"matmul: {value.name} has 0 dims; operands need at least 1"
    b_k = b.ndim - 2 if b.ndim > 1 else 0
    problem = unequal_dims_problem("matmul", a, a.ndim - 1, b, b_k)
    if problem is not None:
        return problem
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    nbatch = max(len(a_batch), len(b_batch))
    axes = []
    for position in range(nbatch):
        ia, ib = position - (nbatch - len(a_batch)), position - (nbatch - len(b_batch))
        both = (("lhs", a_batch, ia), ("rhs", b_batch, ib))
        sources = [(field, dims[i], i) for field, dims, i in both if i >= 0]
        real = [source for source in sources if not is_one(source[1])]
        extents = {e for _, e, _ in real if isinstance(e, Const)}
        if len(extents) > 1:
            return (
                f"matmul: batch dim {position} of {a.name} and {b.name} differ"
                f" ({', '.join(print_scalar(e) for e in extents)})"
            )
        mapped = real or sources
        axes.append(result_axis(mapped[0][1], *((f, i) for f, _, i in mapped)))
    dtype = _dtype("matmul", (a, b))
    if isinstance(dtype, str):
        return dtype
    if a.ndim > 1:
        axes.append(result_axis(a.shape[-2], ("lhs", a.ndim - 2)))
    if b.ndim > 1:
        axes.append(result_axis(b.shape[-1], ("rhs", b.ndim - 1)))
    axes.append(
        result_axis(a.shape[-1], ("lhs", a.ndim - 1), ("rhs", b_k), kind=AxisKind.REDUCTION)
    )
    return (ResultType(dtype=dtype, axes=tuple(axes)),)


LINEAR = declare_op(
    "linear",
    cls=Linear,
    params=(
        Param("input", ParamKind.TENSOR, TensorValue),
        Param("weight", ParamKind.TENSOR, TensorValue),
        Param("bias", ParamKind.TENSOR, TensorValue | None, None),
    ),
    infer=_infer_linear,
    summary="``input @ weight.T + bias``: input ``[*I, K]``, weight ``[*W, N, K]``, bias"
    " ``[N]`` or ``[*W, N]``; the result ``[*W, *I, N]``.",
    dtype_rule="one dtype",
    sharding=OpSharding(mesh_priority=("weight", "bias", "input"), added_after_reduction="bias"),
)

MATMUL = declare_op(
    "matmul",
    cls=Matmul,
    params=(
        Param("lhs", ParamKind.TENSOR, TensorValue),
        Param("rhs", ParamKind.TENSOR, TensorValue),
    ),
    infer=_infer_matmul,
    summary="``lhs @ rhs`` as torch.matmul (1-d operands too, batch dims broadcast).",
    dtype_rule="one dtype",
    sharding=OpSharding(mesh_priority=("rhs", "lhs")),
)
