"""The implementations of ``linear`` and ``matmul`` (declared in ``hostir.ir.contraction``,
registered with ``hostir.run.implementations``): torch's calls, and their writes into a
preallocated ``out`` (a stream chunk) in place with ``matmul(out=)`` and ``addmm(out=)``
where torch writes there."""

from __future__ import annotations

import torch

from hostir.ir.contraction import Linear, Matmul
from hostir.run.implementations import TorchCall, WriteCall, implements


def linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``torch.nn.functional.linear`` with leading weight dims (``hostir.ir.contraction``):
    ``[*I, K] x [*W, N, K] (+ [N] or [*W, N]) -> [*W, *I, N]``, one product of the
    weight's ``*W * N`` rows."""
    if weight.dim() == 2:
        return torch.nn.functional.linear(input, weight, bias)
    leading, (n, k) = weight.shape[:-2], weight.shape[-2:]
    batch = input.dim() - 1
    flat = torch.nn.functional.linear(input, weight.reshape(-1, k))  # [*I, W * N]
    out = flat.reshape(*input.shape[:-1], *leading, n)
    out = out.movedim(tuple(range(batch, batch + len(leading))), tuple(range(len(leading))))
    if bias is not None:
        if bias.dim() > 1:  # [*W, N]: broadcast over *I
            bias = bias.reshape(*leading, *[1] * batch, n)
        out = out + bias
    return out.contiguous()


def matmul_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` written into ``out``, in place with ``matmul(out=)`` where
    torch writes there: a product of two matrices into any ``out`` (torch's mm takes a
    strided ``out``, such as a stream chunk of a column range, as the BLAS's leading
    dimension), a batched product into a contiguous ``out``. torch folds a batched
    product into one 2-d product and reshapes ``out=`` to match, which a strided view
    cannot take (a stream chunk of a dim inside a 3-d output): such an ``out`` gets a
    copy of the result. So does a product with a 1-d operand: torch computes it as a 2-d
    product and resizes ``out=`` to that (a deprecated resize that keeps the storage only
    while the sizes agree)."""
    if a.dim() > 1 and b.dim() > 1 and (out.is_contiguous() or a.dim() == b.dim() == 2):
        return torch.matmul(a, b, out=out)
    return out.copy_(torch.matmul(a, b))


def write_linear(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``linear`` with a 2-d weight written into ``out``, as ``torch.nn.functional.linear``
    computes it, so a chunk holds what that call gives on the chunk's operands: with a
    bias, one ``addmm`` (the bias is its added term) for a 2-d input, and for a larger
    contiguous one flattened to 2-d where ``out`` is contiguous too; else ``matmul`` (see
    :func:`matmul_into`), then the bias added in place."""
    if bias is None:
        return matmul_into(input, weight.t(), out)
    if input.dim() == 2:
        return torch.addmm(bias, input, weight.t(), out=out)
    if input.is_contiguous() and out.is_contiguous():
        rows = input.reshape(-1, input.shape[-1])
        torch.addmm(bias, rows, weight.t(), out=out.view(-1, out.shape[-1]))
        return out
    return matmul_into(input, weight.t(), out).add_(bias)


def linear_into(instruction: Linear) -> WriteCall | None:
    """``linear``'s write into a preallocated ``out``: :func:`write_linear` for a 2-d
    weight; None (a copy of :func:`linear`'s result) with leading weight dims."""
    return write_linear if len(instruction.weight.shape) == 2 else None


@implements("linear", into=linear_into, fresh=True)
def prepare_linear(instruction: Linear) -> TorchCall:
    """``linear``'s call: torch's own for a 2-d weight (its rank is declared), no frame of
    ours."""
    if len(instruction.weight.shape) == 2:
        return torch.nn.functional.linear
    return linear


def write_matmul(out: torch.Tensor, lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``matmul`` written into ``out`` (:func:`matmul_into`)."""
    return matmul_into(lhs, rhs, out)


@implements("matmul", into=lambda instruction: write_matmul, fresh=True)
def prepare_matmul(instruction: Matmul) -> TorchCall:
    """``matmul``'s call: torch's, with its batching rules."""
    return torch.matmul
