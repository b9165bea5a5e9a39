"""Evaluator handlers of the attention and MoE instructions (``hostir.ir.attention``).

Attention runs torch's flash-attention kernels: on CPU
``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``; on CUDA
``aten._scaled_dot_product_flash_attention`` and its ``_backward`` where that kernel
computes the op as documented (:func:`cuda_flash`: Half or BFloat16, head dims it takes,
no causal mask over fewer queries than keys), and otherwise (Float, which CUDA's flash
kernel does not take, among them) the same computation written with matmuls
(:func:`attention_math`, :func:`attention_math_backward`). Batch dims before
``[H, L, E]`` are flattened into one, as nvFuser's ``SdpaFwdOp::evaluate`` does. Results
take their reference input's layout (the output the query's, each gradient its input's),
as nvFuser lays out ``sdpfa_fwd``'s output like the query.

``grouped_mm`` and ``embedding_fwd``'s implementations are registered here with
``hostir.run.implementations``, each a torch call that checks its offsets or indices first
(``hostir.run.index_checks``), so a replay making the call directly checks them too.
``sdpfa_fwd``'s, ``sdpfa_bwd``'s and ``sdpfa_philox``'s, which a dropout mask makes depend
on the rank, are in ``hostir.run.attention_dropout``; the computations without dropout
are here (:func:`sdpa_fwd_results`, :func:`sdpa_bwd_results`: every result of one kernel
call).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hostir.ir.attention import EmbeddingFwd, GroupedMm, SdpaBwd, SdpaFwd
from hostir.run.implementations import TorchCall, implements
from hostir.run.index_checks import check_indices, check_offsets

Operands = dict[str, Any]


def _scale(instruction: SdpaFwd | SdpaBwd, head_dim: int) -> float:
    """The score scale: the instruction's constant, else ``1 / sqrt(E)``."""
    if instruction.scale is None:
        return 1.0 / math.sqrt(head_dim)
    return float(instruction.scale.value)  # the verifier allows constants only


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``[*N, H, L, E]`` as ``[prod(N), H, L, E]``."""
    return t.reshape(-1, *t.shape[-3:])


def _laid_out_like(result: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``result`` (of ``reference``'s shape) with ``reference``'s strides when those are
    dense (``empty_like`` keeps them), as nvFuser's ``relayoutByTensorView``."""
    if result.stride() == reference.stride():
        return result
    return torch.empty_like(reference, requires_grad=False).copy_(result)


def _causal_mask(rows: int, columns: int, device: torch.device) -> torch.Tensor:
    """True where query row ``i`` may attend key column ``j`` (``j <= i``, top-left
    aligned, as torch's ``is_causal``)."""
    return torch.ones(rows, columns, dtype=torch.bool, device=device).tril()


def attention_scores(
    q: torch.Tensor, k: torch.Tensor, is_causal: bool, scale: float
) -> torch.Tensor:
    """``q k^T * scale`` in Float, ``-inf`` where the causal mask hides a key: what the
    matmul forms of attention (:func:`attention_math`, its backward, dropout) softmax."""
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(~_causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return scores


def attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and its logsumexp written with matmuls, in Float (CUDA Float operands)."""
    scores = attention_scores(q, k, is_causal, scale)
    logsumexp = torch.logsumexp(scores, dim=-1)
    probabilities = torch.exp(scores - logsumexp.unsqueeze(-1))
    return torch.matmul(probabilities, v.float()).to(q.dtype), logsumexp


def attention_math_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`attention_math` from its saved logsumexp (flash
    attention's backward: ``dS = P * (dP - rowsum(dO * O))``)."""
    qf, kf, vf, gf = q.float(), k.float(), v.float(), grad.float()
    scores = attention_scores(q, k, is_causal, scale)
    probabilities = torch.exp(scores - logsumexp.unsqueeze(-1))
    grad_value = torch.matmul(probabilities.transpose(-2, -1), gf)
    grad_probabilities = torch.matmul(gf, vf.transpose(-2, -1))
    row_terms = (gf * out.float()).sum(dim=-1, keepdim=True)
    grad_scores = probabilities * (grad_probabilities - row_terms) * scale
    grad_query = torch.matmul(grad_scores, kf)
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), qf)
    return grad_query.to(q.dtype), grad_key.to(k.dtype), grad_value.to(v.dtype)


FLASH_HEAD_DIMS = 256
"""The largest head dim CUDA's flash kernels take (a multiple of 8)."""


def cuda_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> bool:
    """Whether CUDA's flash kernel computes this attention as documented: Half or
    BFloat16, one head dim, a multiple of 8 up to :data:`FLASH_HEAD_DIMS`, and, when causal,
    as many queries as keys. The kernel aligns a causal mask to the bottom-right corner
    when ``L != S`` (FlashAttention-2), where torch's ``is_causal`` (and this op, on every
    device) aligns it top-left: row ``i`` sees keys ``0..i``. torch's own SDPA dispatch
    declines the flash kernel there too (``check_flash_causal_non_square_seqlens``)."""
    return (
        q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] == v.shape[-1]
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= FLASH_HEAD_DIMS
        and not (is_causal and q.shape[-2] != k.shape[-2])
    )


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, logsumexp) of attention on 4-d ``[N, H, L, E]`` operands, by device."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, scale=scale
        )
    if cuda_flash(q, k, v, is_causal):
        results = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal, return_debug_mask=False, scale=scale
        )
        return results[0], results[1]
    return attention_math(q, k, v, is_causal, scale)


def attention_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_query, grad_key, grad_value) on 4-d operands, by device (as the forward)."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, logsumexp, 0.0, is_causal, scale=scale
        )
    if cuda_flash(q, k, v, is_causal):
        # No dropout ran: the philox state is not read.
        seed = torch.zeros(2, dtype=torch.uint64, device=q.device)
        offset = torch.zeros((), dtype=torch.uint64, device=q.device)
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, logsumexp, None, None, q.shape[-2], k.shape[-2], 0.0,
            is_causal, seed, offset, scale=scale,
        )  # fmt: skip
    return attention_math_backward(grad, q, k, v, out, logsumexp, is_causal, scale)


def sdpa_fwd_results(instruction: SdpaFwd, operands: Operands) -> tuple[torch.Tensor, ...]:
    """Both results of ``sdpfa_fwd`` without dropout, from one kernel call, in ``OUTS``
    order: the output (laid out like the query) and the logsumexp (Float)."""
    q, k, v = operands["query"], operands["key"], operands["value"]
    scale = _scale(instruction, q.shape[-1])
    output, logsumexp = attention_forward(
        _flat(q), _flat(k), _flat(v), instruction.is_causal, scale
    )
    output = _laid_out_like(output.reshape(q.shape[:-1] + v.shape[-1:]), q)
    return output, logsumexp.reshape(q.shape[:-1]).float()


def laid_out_gradients(
    gradients: tuple[torch.Tensor, ...], operands: Operands
) -> tuple[torch.Tensor, ...]:
    """The flat gradients of query, key and value, each shaped and laid out like its
    input."""
    laid_out = []
    for gradient, source in zip(gradients, ("query", "key", "value"), strict=True):
        reference = operands[source]
        laid_out.append(_laid_out_like(gradient.reshape(reference.shape), reference))
    return tuple(laid_out)


def sdpa_bwd_results(instruction: SdpaBwd, operands: Operands) -> tuple[torch.Tensor, ...]:
    """The three gradients of ``sdpfa_bwd`` without dropout (query's, key's, value's), from
    one kernel call, each laid out like its input."""
    names = ("grad_output", "query", "key", "value", "output")
    grad, q, k, v, out = (_flat(operands[name]) for name in names)
    logsumexp = operands["logsumexp"].reshape(q.shape[:-1])
    scale = _scale(instruction, q.shape[-1])
    gradients = attention_backward(grad, q, k, v, out, logsumexp, instruction.is_causal, scale)
    return laid_out_gradients(gradients, operands)


def grouped_mm(
    mat1: torch.Tensor, mat2: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch._grouped_mm`` on CUDA where torch has it and takes these operands, else the
    same product group by group (``_grouped_mm`` wants 16-byte aligned strides and
    pointers: it refuses a ``[M, 5]`` BFloat16 operand, which the op accepts; on the CPU,
    torch 2.13's ``_grouped_mm`` took 0.2 s for what one matmul per group does in 1 ms).
    ``out``, for the rows form, is where the result goes (the batched form's slice)."""
    if mat1.is_cuda and hasattr(torch, "_grouped_mm") and _aligned(mat1) and _aligned(mat2):
        result = torch._grouped_mm(mat1, mat2, offsets)
        return result if out is None else out.copy_(result)
    return _grouped_mm_loop(mat1, mat2, offsets, out)


def _aligned(t: torch.Tensor) -> bool:
    """Whether ``t``'s data pointer and its strides but the unit one are multiples of 16
    bytes (what ``torch._grouped_mm`` requires)."""
    size = t.element_size()
    strides = [stride * size for stride in t.stride() if stride != 1]
    return t.data_ptr() % 16 == 0 and all(stride % 16 == 0 for stride in strides)


def _grouped_mm_loop(
    mat1: torch.Tensor, mat2: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None
) -> torch.Tensor:
    """``torch._grouped_mm``'s three forms, one matmul per group (rows past the last
    offset are zeros; torch leaves them unwritten)."""
    ends = [int(end) for end in offsets.tolist()]
    starts = [0] + ends[:-1]
    groups = list(zip(starts, ends, strict=True))
    if mat1.dim() == 2 and mat2.dim() == 3:  # groups of mat1's rows
        if out is None:
            out = mat1.new_empty(mat1.shape[0], mat2.shape[-1])
        # each group's product written in place: no temporary and no copy per group, and
        # only the rows past the last group zeroed (a MoE layer's matmuls are most of its
        # time; a zeroed buffer and a copy per group cost it 10% on the CPU)
        for g, (start, end) in enumerate(groups):
            torch.mm(mat1[start:end], mat2[g], out=out[start:end])
        out[ends[-1] if ends else 0 :].zero_()
        return out
    if mat1.dim() == 3 and mat2.dim() == 2:  # groups of mat2's columns
        out = mat1.new_zeros(mat1.shape[1], mat2.shape[-1])
        for g, (start, end) in enumerate(groups):
            out[:, start:end] = mat1[g] @ mat2[:, start:end]
        return out
    return torch.stack([mat1[:, s:e] @ mat2[s:e] for s, e in groups])  # groups of K


_GROUPED_DIM = {(2, 3): ("mat1", 0), (3, 2): ("mat2", 1), (2, 2): ("mat1", 1)}
"""The operand and dim whose extent ``grouped_mm``'s offsets split, by the operands'
ranks: mat1's rows, mat2's columns, or the contraction."""


@implements("grouped_mm", fresh=True)
def prepare_grouped_mm(instruction: GroupedMm) -> TorchCall:
    """``grouped_mm`` on the local operands, its offsets checked against the dim they
    split (whole on every rank)."""
    if instruction.offsets.ndim == 2:
        return _batched_grouped(instruction)
    role, dim = _GROUPED_DIM[(instruction.mat1.ndim, instruction.mat2.ndim)]
    name = getattr(instruction, role).name

    def grouped(mat1: torch.Tensor, mat2: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        extent = (mat1, mat2)[role == "mat2"].shape[dim]
        check_offsets(instruction, "offsets", offsets, name, dim, extent)
        return grouped_mm(mat1, mat2, offsets)

    return grouped


def _batched_grouped(instruction: GroupedMm) -> TorchCall:
    """The batched rows form: each local batch's rows form, its offsets checked against
    its rows."""
    name = instruction.mat1.name

    def batched(mat1: torch.Tensor, mat2: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # each batch's product into its slice of one result (stacking them copied it all)
        out = mat1.new_empty(mat1.shape[0], mat1.shape[1], mat2.shape[-1])
        for b in range(mat1.shape[0]):
            check_offsets(instruction, "offsets", offsets[b], name, 1, mat1.shape[1])
            grouped_mm(mat1[b], mat2[b], offsets[b], out[b])
        return out

    return batched


@implements("embedding_fwd", fresh=True)
def prepare_embedding_fwd(instruction: EmbeddingFwd) -> TorchCall:
    """``embedding_fwd``: rows of the weight picked by the indices, which must be rows of
    it (``padding_idx`` changes only the gradient: its index is a row like the others)."""
    weight_name = instruction.weight.name

    def embedding(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        check_indices(instruction, "input", input, weight_name, 0, len(weight))
        return torch.nn.functional.embedding(input, weight)

    return embedding
