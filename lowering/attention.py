"""Snapshotting the attention and MoE ops (``frontend.attention_ops``): their instruction
builders. A result of ``sdpfa_fwd`` / ``sdpfa_bwd`` that no output depends on is not
lowered (``lowering.snapshot`` keeps only what the outputs need). How they shard is
``lowering.op_layouts``'s.

Only the builders of ``sdpfa_fwd`` and ``sdpfa_bwd`` are still reached: ``sdpfa_philox``,
``grouped_mm`` and ``embedding_fwd`` are declared (``hostir.ir.attention``) and ``fd.ops``
records their instructions itself (``grouped_mm``'s and ``embedding_fwd``'s builders and
expression classes are gone; ``sdpfa_philox``'s go with the sdpfa ops').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontend import attention_ops as fa
from hostir import Const
from hostir.ir.attention import SdpaBwd, SdpaFwd, SdpaPhilox
from hostir.ir.instructions import Instruction


def _scale(value: float | None) -> Const | None:
    return None if value is None else Const(value=value)


def _dropout(e: Any, p: Callable[[Any], Any]) -> dict[str, Any]:
    """An expression's dropout fields: the probability and the philox tensors, if any."""
    if e.dropout is None:
        return {}
    return {
        "dropout_p": Const(value=e.dropout.p),
        "philox_seed": p(e.dropout.seed),
        "philox_offset": p(e.dropout.offset),
    }


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
            **_dropout(e, p),
        ),
        fa.SdpaPhiloxExpr: lambda e, out: SdpaPhilox(out=out, result=e.result, dropout=e.dropout),
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
            **_dropout(e, p),
        ),
    }
