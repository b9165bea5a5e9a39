"""The torch call of each reduction op (declared in ``hostir.ir.reductions``), keyed by name,
and the ops' implementation (``hostir.run.implementations``).

:func:`reduction_call` builds the call a ``Reduction`` instruction makes on its local
data: ``sum`` and ``prod`` accumulate in the result's dtype (torch's ``dtype=`` casts the
operand first, as nvFuser's ``dtype`` argument and its Int rule for integers do);
``max`` and ``min`` keep the operand's dtype. A reduction over a sharded dim computes the
rank's partial result; the collective lowering adds combines the partials.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from hostir.ir.reductions import REDUCTION_DECLS, REDUCTION_OPS, Reduction
from hostir.run.implementations import implements, run_declared

TorchCall = Callable[[torch.Tensor], torch.Tensor]


def _prod(
    src: torch.Tensor, dim: tuple[int, ...], keepdim: bool, dtype: torch.dtype
) -> torch.Tensor:
    """``torch.prod`` over several dims: torch's takes one dim, so one at a time, the last
    first (the earlier dims keep their indices when keepdim is False)."""
    result = src.to(dtype)
    for d in sorted((d % src.dim() for d in dim), reverse=True):
        result = torch.prod(result, d, keepdim=keepdim)
    return result


_TORCH_CALLS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": lambda src, dim, keepdim, dtype: torch.sum(src, dim, keepdim, dtype=dtype),
    "prod": _prod,
    "max": lambda src, dim, keepdim, dtype: torch.amax(src, dim, keepdim),
    "min": lambda src, dim, keepdim, dtype: torch.amin(src, dim, keepdim),
}
"""The torch call of each declared reduction, on (src, dims, keepdim, result dtype)."""

if set(_TORCH_CALLS) != set(REDUCTION_OPS):  # a declaration without its call, or the reverse
    raise ImportError(f"torch calls {sorted(_TORCH_CALLS)} != reductions {sorted(REDUCTION_OPS)}")


def reduction_into(instruction: Reduction) -> Callable[..., torch.Tensor] | None:
    """``write(out, src)``: ``instruction``'s reduction written into ``out`` in place
    (torch's ``out=``: ``sum`` and ``prod`` with the result's dtype, ``amax``/``amin``,
    whose ``out`` has the source's dtype, else None: a copy), computing what
    :func:`reduction_call`'s call does; ``prod`` over several dims writes its last
    one-dim product there."""
    op, dims, keepdim = instruction.op.value, instruction.dims, instruction.keepdim
    dtype = instruction.out.dtype.to_torch()
    if op == "sum":
        return lambda out, src: torch.sum(src, dims, keepdim, dtype=dtype, out=out)
    if op == "prod" and dims:
        return functools.partial(_prod_into, dim=dims, keepdim=keepdim, dtype=dtype)
    if op == "prod" or instruction.src.dtype is not instruction.out.dtype:
        return None
    reduce = torch.amax if op == "max" else torch.amin
    return lambda out, src: reduce(src, dims, keepdim, out=out)


def _prod_into(
    out: torch.Tensor, src: torch.Tensor, dim: tuple[int, ...], keepdim: bool, dtype: torch.dtype
) -> torch.Tensor:
    """:func:`_prod` with its last product written into ``out``."""
    result = src.to(dtype)
    ordered = sorted((d % src.dim() for d in dim), reverse=True)
    for d in ordered[:-1]:
        result = torch.prod(result, d, keepdim=keepdim)
    return torch.prod(result, ordered[-1], keepdim=keepdim, out=out)


@implements(*REDUCTION_DECLS, into=reduction_into, fresh=True)
def reduction_call(instruction: Reduction) -> TorchCall:
    """The torch call ``instruction`` makes on its source tensor."""
    return functools.partial(
        _TORCH_CALLS[instruction.op.value],
        dim=instruction.dims,
        keepdim=instruction.keepdim,
        dtype=instruction.out.dtype.to_torch(),
    )


def run_reduction(instruction: Reduction, operands: dict, out_shape: list[int]) -> torch.Tensor:
    """A reduction of the local data (written into ``out`` if preallocated)."""
    return run_declared(instruction, operands, out_shape)
