"""The implementations of ``sdpfa_fwd``, ``sdpfa_bwd`` and ``sdpfa_philox``: handlers that
take the run context, because a dropout mask depends on where this rank's shard lies in
the global tensor. Without ``dropout_p`` the forward and the backward are the flash
kernels' (``hostir.run.attention``); with it, the math path below. Either way one call
gives every result of the instruction: the forward's output and logsumexp (dropout does
not change the logsumexp; it is taken of the same scores), the backward's three
gradients.

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

from typing import Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.attention import PhiloxResult, SdpaBwd, SdpaFwd, SdpaPhilox
from hostir.ir.scalars import evaluate_scalar
from hostir.ir.sharding import slice_global_tensor
from hostir.ir.values import TensorValue
from hostir.run.attention import (
    _flat,
    _laid_out_like,
    _scale,
    attention_scores,
    laid_out_gradients,
    sdpa_bwd_results,
    sdpa_fwd_results,
)
from hostir.run.creation import generator_seed
from hostir.run.handler_common import checked_result, checked_results, into_out
from hostir.run.implementations import implements

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
    # torch 2.7's philox state: the seed tensor holds (seed, offset); the offset tensor is
    # unused (hostir.ir.attention.SdpaPhilox). uint64 has no CPU arithmetic: read as int64.
    seed, offset = operands["philox_seed"].to(torch.int64).tolist()
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(q k^T * scale) * keep / (1 - p)) v`` in the query's dtype, and the
    logsumexp of the same scores (Float), which dropout does not change."""
    scores = attention_scores(q, k, is_causal, scale)
    weights = torch.softmax(scores, dim=-1) * keep / (1.0 - dropout_p)
    output = torch.matmul(weights, v.float()).to(q.dtype)
    return output, torch.logsumexp(scores, dim=-1)


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


@implements("sdpfa_fwd", handler=True)
def run_sdpa_fwd(context: Any, instruction: SdpaFwd, operands: Operands) -> list:
    """``sdpfa_fwd``: the output and the logsumexp, from the flash kernel without dropout,
    with it from the math path over this rank's mask slice."""
    if instruction.dropout_p is None:
        return checked_results(context, instruction, sdpa_fwd_results(instruction, operands))
    q, k, v = operands["query"], operands["key"], operands["value"]
    keep = _local_mask(context, instruction, operands)
    p = float(instruction.dropout_p.value)
    scale = _scale(instruction, q.shape[-1])
    output, logsumexp = attention_dropout(q, k, v, keep, p, instruction.is_causal, scale)
    return checked_results(context, instruction, (_laid_out_like(output, q), logsumexp))


@implements("sdpfa_bwd", handler=True)
def run_sdpa_bwd(context: Any, instruction: SdpaBwd, operands: Operands) -> list:
    """``sdpfa_bwd``: the three gradients, from the flash kernel without dropout, with it
    through this rank's mask slice."""
    if instruction.dropout_p is None:
        return checked_results(context, instruction, sdpa_bwd_results(instruction, operands))
    grad, q, k, v = (operands[name] for name in ("grad_output", "query", "key", "value"))
    keep = _local_mask(context, instruction, operands)
    p = float(instruction.dropout_p.value)
    scale = _scale(instruction, q.shape[-1])
    flat = attention_dropout_backward(
        _flat(grad), _flat(q), _flat(k), _flat(v), _flat(keep), p, instruction.is_causal, scale
    )
    return checked_results(context, instruction, laid_out_gradients(flat, operands))


@implements("sdpfa_philox", handler=True)
def run_sdpa_philox_dropout(context: Any, instruction: SdpaPhilox, operands: Operands) -> list:
    """``sdpfa_philox``: with dropout, the state ``(seed, 0)``, the seed drawn from torch's
    default CPU generator (as the unseeded random ops draw theirs,
    ``hostir.run.creation``); without it (no dropout runs) zeros; the offset result zeros
    (torch 2.7's unused tensor). uint64 tensors, made as int64 and cast (torch has no
    uint64 random numbers on CPU)."""
    value = torch.zeros(context.local_shape(instruction.out), dtype=torch.int64)
    if instruction.dropout and instruction.result is PhiloxResult.SEED:
        value[0] = torch.randint(0, 2**62, (), dtype=torch.int64)
    value = value.to(torch.uint64)
    return [into_out(instruction, operands, checked_result(context, instruction, value))]
