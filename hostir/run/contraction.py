"""The implementations of ``linear`` and ``matmul`` (declared in ``hostir.ir.contraction``,
registered with ``hostir.run.implementations``): torch's calls, and writes into a
preallocated ``out`` with ``matmul(out=)`` where torch can."""

from __future__ import annotations

from typing import Any

import torch

from hostir.ir.contraction import Linear, Matmul
from hostir.run.implementations import TorchCall, implements


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
    """``torch.matmul(a, b)`` written into ``out``. torch folds a batched product into one
    2-d product and reshapes ``out=`` to match, which a strided view cannot take (a stream
    chunk of a dim inside a 3-d output): such an ``out`` gets a copy of the result. So does
    a product with a 1-d operand: torch computes it as a 2-d product and resizes ``out=``
    to that (a deprecated resize that keeps the storage only while the sizes agree)."""
    if out.is_contiguous() and a.dim() > 1 and b.dim() > 1:
        return torch.matmul(a, b, out=out)
    return out.copy_(torch.matmul(a, b))


def linear_into(instruction: Linear, operands: dict[str, Any]) -> torch.Tensor:
    """``linear`` written into the preallocated ``out``: ``matmul(out=)`` then the bias."""
    inp, weight, bias = operands["input"], operands["weight"], operands.get("bias")
    if weight.dim() > 2:
        return operands["out"].copy_(linear(inp, weight, bias))
    out = matmul_into(inp, weight.t(), operands["out"])
    if bias is not None:
        out.add_(bias)
    return out


@implements("linear", into=linear_into, fresh=True)
def prepare_linear(instruction: Linear) -> TorchCall:
    """``linear``'s call: torch's own for a 2-d weight (its rank is declared), no frame of
    ours."""
    if len(instruction.weight.shape) == 2:
        return torch.nn.functional.linear
    return linear


def matmul_out(instruction: Matmul, operands: dict[str, Any]) -> torch.Tensor:
    """``matmul`` written into the preallocated ``out``."""
    return matmul_into(operands["lhs"], operands["rhs"], operands["out"])


@implements("matmul", into=matmul_out, fresh=True)
def prepare_matmul(instruction: Matmul) -> TorchCall:
    """``matmul``'s call: torch's, with its batching rules."""
    return torch.matmul
