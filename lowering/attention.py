"""Snapshotting the attention and MoE ops (``frontend.attention_ops``): the instruction
builders of the expression classes they had before they were declared.

None is reached any more: every attention op is declared (``hostir.ir.attention``) and
``fd.ops`` records its instruction itself (``sdpfa_fwd``'s and ``sdpfa_bwd``'s builders
went when each became one instruction of several results); the entries go with the
expression classes when every family is declared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontend import attention_ops as fa
from hostir.ir.attention import EmbeddingFwd, GroupedMm, SdpaPhilox
from hostir.ir.instructions import Instruction


def attention_builders(placeholder: Callable[[Any], Any]) -> dict[type, Callable[..., Instruction]]:
    """The instruction builder of each attention expression (``lowering.snapshot``'s
    table), ``placeholder`` making a tensor's unsharded value."""
    p = placeholder
    return {
        fa.SdpaPhiloxExpr: lambda e, out: SdpaPhilox(out=out, result=e.result, dropout=e.dropout),
        fa.GroupedMmExpr: lambda e, out: GroupedMm(
            out=out, mat1=p(e.mat1), mat2=p(e.mat2), offsets=p(e.offsets)
        ),
        fa.EmbeddingFwdExpr: lambda e, out: EmbeddingFwd(
            out=out, input=p(e.input), weight=p(e.weight)
        ),
    }
