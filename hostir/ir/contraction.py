"""``linear`` and ``matmul``: their declared dtype rule and result extents, read by the
frontend (``fd.ops.linear`` / ``fd.ops.matmul``) and the verifier alike.

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

from hostir.ir.dtypes import DType
from hostir.ir.ops import OpDtypeError


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
