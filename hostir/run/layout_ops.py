"""The implementations of ``set``, ``cast``, ``broadcast_in_dim`` and ``permute`` (declared
in ``hostir.ir.layout_ops``, registered with ``hostir.run.implementations``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from hostir.ir.layout_ops import BroadcastInDim, Cast, Permute, Set
from hostir.run.handler_common import checked_result, into_out
from hostir.run.implementations import TorchCall, implements

if TYPE_CHECKING:
    from hostir.run.context import RunContext


def copy_into(out: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``set`` or ``cast`` into a preallocated ``out``: one copy (which casts)."""
    return out.copy_(src)


@implements("set", into=lambda instruction: copy_into, fresh=True)
def prepare_set(instruction: Set) -> TorchCall:
    """``set``: a copy of the source."""
    return torch.clone


@implements("cast", into=lambda instruction: copy_into)
def prepare_cast(instruction: Cast) -> TorchCall:
    """``cast`` to the output's dtype (the source itself where it has it)."""
    return functools.partial(torch.Tensor.to, dtype=instruction.out.dtype.to_torch())


@implements("permute")
def prepare_permute(instruction: Permute) -> TorchCall:
    """``permute`` (a view)."""
    return functools.partial(torch.permute, dims=instruction.dims)


@implements("broadcast_in_dim", handler=True)
def run_broadcast_in_dim(
    context: RunContext, instruction: BroadcastInDim, operands: dict[str, Any]
) -> list[torch.Tensor]:
    """``broadcast_in_dim``: place the source's dims, then expand to the output's local
    shape (which the run knows, so this is a handler: no plain call)."""
    src, shape = operands["src"], context.local_shape(instruction.out)
    view = [1] * len(shape)
    for src_dim, out_dim in enumerate(instruction.broadcast_dims):
        view[out_dim] = src.shape[src_dim]
    result = into_out(instruction, operands, src.reshape(view).expand(shape))
    return [checked_result(context, instruction, result)]
