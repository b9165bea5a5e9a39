"""Attention with dropout: the handlers of ``sdpfa_fwd`` (output), ``sdpfa_bwd`` and
``sdpfa_philox`` that take the run context, because a dropout mask depends on where this
rank's shard lies in the global tensor. Instructions without ``dropout_p`` go to the
plain handlers (``hostir.run.attention``) unchanged. ``sdpfa_philox``'s handler is its
implementation (the op is declared: ``hostir.ir.attention``), dropout or not.

The mask. For attention weights of global shape ``[*N, H, L, S]`` (the query's batch,
head and sequence extents, the key's sequence extent)::

    generator = torch.Generator("cpu").manual_seed(generator_seed(seed, offset))
    keep = torch.rand([*N, H, L, S], generator=generator) >= dropout_p

(``hostir.run.creation.generator_seed``), and each rank keeps its slice of it (the
query's sharding: batch and head dims; sequence dims are never sharded here, they are
gathered first). Kept weights are scaled by ``1 / (1 - dropout_p)``, as
``torch.nn.functional.dropout``. The mask is drawn on the CPU, so it is the same on every
device; it is not nvFuser's (CUDA Philox) stream. Cost: every rank draws the global
``[*N, H, L, S]`` tensor (the CPU generator cannot skip to a shard), and attention runs
the math path (matmul, softmax, mask, matmul; Float) instead of the flash kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.attention import PhiloxResult, SdpaBwd, SdpaFwd, SdpaFwdResult, SdpaPhilox
from hostir.ir.scalars import evaluate_scalar
from hostir.ir.sharding import slice_global_tensor
from hostir.ir.values import TensorValue
from hostir.run.attention import (
    _GRADIENT_OF,
    _flat,
    _laid_out_like,
    _scale,
    attention_scores,
    laid_out_gradients,
    run_sdpa_bwd,
    run_sdpa_fwd,
    sdpa_bwd_results,
    sdpa_fwd_results,
)
from hostir.run.creation import generator_seed
from hostir.run.handler_common import checked_result, compute_handler, into_out
from hostir.run.implementations import implements
from hostir.run.shared_results import shared, sharing

Operands = dict[str, Any]


def dropout_mask(
    seed: int, offset: int, shape: list[int], dropout_p: float, device: torch.device
) -> torch.Tensor:
    """The global keep mask (bool, ``shape``) of ``(seed, offset)``: True where a weight
    is kept (probability ``1 - dropout_p``)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(generator_seed(seed, offset))
    drawn = torch.rand(shape, generator=generator, dtype=torch.float32)
    return (drawn >= dropout_p).to(device)


def _global_shape(context: Any, value: TensorValue) -> list[int]:
    return [int(evaluate_scalar(extent, context.scalars)) for extent in value.shape]


def _local_mask(context: Any, instruction: SdpaFwd | SdpaBwd, operands: Operands) -> torch.Tensor:
    """This rank's slice of the global mask, ``[*N_local, H_local, L, S]``."""
    query, key = instruction.query, instruction.key
    shape = _global_shape(context, query)[:-1] + _global_shape(context, key)[-2:-1]
    seed, offset = int(operands["philox_seed"]), int(operands["philox_offset"])
    p = float(instruction.dropout_p.value)  # the verifier allows constants only
    mask = dropout_mask(seed, offset, shape, p, context.device)
    if query.sharding is not None:
        mask = slice_global_tensor(mask, query.sharding, context.rank, context.scalars)
    q, k = operands["query"], operands["key"]
    expected = [*q.shape[:-1], k.shape[-2]]
    if mask is None or list(mask.shape) != expected:
        got = None if mask is None else list(mask.shape)
        raise EvaluationError(
            f"sdpfa dropout: this rank's mask slice is {got}, but its attention weights are"
            f" {expected} (a sharded sequence dim must be gathered first)"
        )
    return mask


def _probabilities(q: torch.Tensor, k: torch.Tensor, is_causal: bool, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale (+ causal mask))`` in Float."""
    return torch.softmax(attention_scores(q, k, is_causal, scale), dim=-1)


def attention_dropout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """``(softmax(q k^T * scale) * keep / (1 - p)) v``, in the query's dtype."""
    weights = _probabilities(q, k, is_causal, scale) * keep / (1.0 - dropout_p)
    return torch.matmul(weights, v.float()).to(q.dtype)


def attention_dropout_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact gradients of :func:`attention_dropout` (the probabilities recomputed):
    ``dV = D^T dO``, ``dP = (dO V^T) * keep / (1 - p)``, ``dS = P * (dP - rowsum(dP * P))``."""
    probabilities = _probabilities(q, k, is_causal, scale)
    kept = keep / (1.0 - dropout_p)
    gf = grad.float()
    grad_value = torch.matmul((probabilities * kept).transpose(-2, -1), gf)
    grad_probabilities = torch.matmul(gf, v.float().transpose(-2, -1)) * kept
    row_terms = (grad_probabilities * probabilities).sum(dim=-1, keepdim=True)
    grad_scores = probabilities * (grad_probabilities - row_terms) * scale
    grad_query = torch.matmul(grad_scores, k.float())
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), q.float())
    return grad_query.to(q.dtype), grad_key.to(k.dtype), grad_value.to(v.dtype)


def _checked(context: Any, instruction: Any, operands: Operands, result: torch.Tensor) -> list:
    """``[result]`` after the local-shape check, copied into a preallocated ``out``."""
    return [into_out(instruction, operands, checked_result(context, instruction, result))]


# The plain (no dropout) handlers, the forward's and backward's results shared by their
# sibling instructions; the logsumexp beside a dropout output has no sibling to share with.
_run_fwd_plain = compute_handler(run_sdpa_fwd, sdpa_fwd_results)
_run_fwd_alone = compute_handler(run_sdpa_fwd)
_run_bwd_plain = compute_handler(run_sdpa_bwd, sdpa_bwd_results)


def run_sdpa_fwd_dropout(context: Any, instruction: SdpaFwd, operands: Operands) -> list:
    """``sdpfa_fwd``: with dropout, the output over this rank's mask slice."""
    if instruction.dropout_p is None:
        return _run_fwd_plain(context, instruction, operands)
    if instruction.result is SdpaFwdResult.LOGSUMEXP:
        return _run_fwd_alone(context, instruction, operands)
    q, k, v = operands["query"], operands["key"], operands["value"]
    keep = _local_mask(context, instruction, operands)
    p = float(instruction.dropout_p.value)
    scale = _scale(instruction, q.shape[-1])
    output = attention_dropout(q, k, v, keep, p, instruction.is_causal, scale)
    return _checked(context, instruction, operands, _laid_out_like(output, q))


def run_sdpa_bwd_dropout(context: Any, instruction: SdpaBwd, operands: Operands) -> list:
    """``sdpfa_bwd``: with dropout, the gradient through this rank's mask slice."""
    if instruction.dropout_p is None:
        return _run_bwd_plain(context, instruction, operands)

    def gradients() -> tuple[torch.Tensor, ...]:
        grad, q, k, v = (operands[name] for name in ("grad_output", "query", "key", "value"))
        keep = _local_mask(context, instruction, operands)
        p = float(instruction.dropout_p.value)
        scale = _scale(instruction, q.shape[-1])
        flat = attention_dropout_backward(
            _flat(grad), _flat(q), _flat(k), _flat(v), _flat(keep), p, instruction.is_causal,
            scale,
        )  # fmt: skip
        return laid_out_gradients(flat, operands)

    results = shared(context, instruction, operands, gradients)
    result = results[_GRADIENT_OF[instruction.result][0]]
    return _checked(context, instruction, operands, result)


@implements("sdpfa_philox", handler=True)
def run_sdpa_philox_dropout(context: Any, instruction: SdpaPhilox, operands: Operands) -> list:
    """``sdpfa_philox``: with dropout, a seed drawn from torch's default CPU generator (as
    the unseeded random ops draw theirs, ``hostir.run.creation``) and offset 0; without
    it (no dropout runs) 0 for both."""
    if instruction.dropout and instruction.result is PhiloxResult.SEED:
        value = torch.randint(0, 2**62, (), dtype=torch.int64)
    else:
        value = torch.zeros(context.local_shape(instruction.out), dtype=torch.int64)
    return _checked(context, instruction, operands, value)


sharing(SdpaFwd)
sharing(SdpaBwd)

ATTENTION_DROPOUT_HANDLERS: dict[type, Callable[..., list]] = {
    SdpaFwd: run_sdpa_fwd_dropout,
    SdpaBwd: run_sdpa_bwd_dropout,
    SdpaPhilox: run_sdpa_philox_dropout,
}
"""Context handlers of the attention instructions a dropout mask changes; the evaluator's
table takes them over the plain ones (``hostir.run.attention``)."""
