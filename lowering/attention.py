"""Lowering of the attention and MoE ops (``frontend.attention_ops``): their instruction
builders, which projections are left out, and which output axes each computes whole.

- **Projections nobody uses** (a result of ``sdpfa_fwd`` / ``sdpfa_bwd`` that is neither
  read nor a fusion output) are not lowered: :func:`unused_projections`.
- **Axes computed whole** (:func:`whole_axes`): attention's sequence and head-size axes
  (a sharded one would need ring attention or a causal mask offset), and the dim
  ``grouped_mm``'s offsets index (the groups are global row, column or K ranges).
  ``decompose_resharding`` keeps them unsharded in the op's compute layout, so a sharded
  operand is gathered by a ``set`` before the op, and a sharded output sliced after it.
  Input axes that map to no output axis (the key's sequence, ``grouped_mm``'s groups, the
  embedding's vocabulary) are read whole by the same pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontend import attention_ops as fa
from frontend.fusion import Fusion
from hostir import Const
from hostir.ir.attention import EmbeddingFwd, GroupedMm, SdpaBwd, SdpaFwd, SdpaPhilox
from hostir.ir.instructions import Instruction


def _scale(value: float | None) -> Const | None:
    return None if value is None else Const(value=value)


def attention_builders(placeholder: Callable[[Any], Any]) -> dict[type, Callable[..., Instruction]]:
    """The instruction builder of each attention expression (``lowering.snapshot``'s
    table), ``placeholder`` making a tensor's unsharded value."""
    p = placeholder
    return {
        fa.SdpaFwdExpr: lambda e, out: SdpaFwd(
            out=out,
            query=p(e.query),
            key=p(e.key),
            value=p(e.value),
            result=e.result,
            is_causal=e.is_causal,
            scale=_scale(e.scale),
        ),
        fa.SdpaPhiloxExpr: lambda e, out: SdpaPhilox(out=out, result=e.result),
        fa.SdpaBwdExpr: lambda e, out: SdpaBwd(
            out=out,
            grad_output=p(e.grad_output),
            query=p(e.query),
            key=p(e.key),
            value=p(e.value),
            output=p(e.attention),
            logsumexp=p(e.logsumexp),
            result=e.result,
            is_causal=e.is_causal,
            scale=_scale(e.scale),
        ),
        fa.GroupedMmExpr: lambda e, out: GroupedMm(
            out=out, mat1=p(e.mat1), mat2=p(e.mat2), offsets=p(e.offsets)
        ),
        fa.EmbeddingFwdExpr: lambda e, out: EmbeddingFwd(
            out=out, input=p(e.input), weight=p(e.weight)
        ),
    }


def unused_projections(fusion: Fusion) -> set[str]:
    """The names of projection results (one result of a multi-result op) that no
    expression reads and that are no fusion output: they are not computed."""
    outputs = {tv.name for tv in fusion.outputs()}
    return {
        expr.output.name
        for expr in fusion.exprs()
        if getattr(expr, "PROJECTION", False)
        and not expr.output.uses
        and expr.output.name not in outputs
    }


def whole_axes(instruction: Instruction) -> tuple[int, ...]:
    """The logical axes of its output that ``instruction`` computes unsharded (see the
    module docstring)."""
    if isinstance(instruction, SdpaFwd | SdpaBwd):
        rank = instruction.out.ndim
        return tuple(range(instruction.query.ndim - 2, rank))  # L (or S), and E
    if isinstance(instruction, GroupedMm):
        ranks = (instruction.mat1.ndim, instruction.mat2.ndim)
        # The logical axes are the data dims and the reduction axis K, last.
        return {(2, 3): (0,), (3, 2): (1,), (2, 2): (0, 3)}[ranks]
    return ()


def reads_no_tensor(instruction: Instruction) -> bool:
    """Whether the instruction reads no tensor (``sdpfa_philox``): it needs none of its
    expression's inputs resharded."""
    return isinstance(instruction, SdpaPhilox)
