"""What handlers share: for communications, the request a handler returns and the
``out`` buffer and operands it needs on this rank; for compute, the check of each result's
local shape and the copy into a preallocated ``out``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.instructions import keyword

if TYPE_CHECKING:
    from hostir.run.context import RunContext


class Request:
    """A posted communication: ``wait()`` completes it, then runs ``finish``."""

    def __init__(self, work: Any, finish: Callable[[], None] | None = None) -> None:
        self._work = work
        self._finish = finish

    def wait(self) -> None:
        """Blocks until the communication is done and ``out`` holds its result."""
        if self._work is not None:
            self._work.wait()
        if self._finish is not None:
            self._finish()
        self._work = self._finish = None


def out_buffer(context: RunContext, instruction: Any, operands: dict) -> torch.Tensor | None:
    """The tensor ``out`` will be on this rank: preallocated, fresh, or None if not held."""
    if instruction.preallocated:
        return operands.get("out")
    if not context.participates(instruction.out):
        return None
    out = instruction.out
    return torch.empty(context.local_shape(out), dtype=out.dtype.to_torch(), device=context.device)


def landing(context: RunContext, instruction: Any, out: torch.Tensor | None) -> torch.Tensor:
    """Where this rank receives ``out`` whole: ``out`` itself (the communicator receives a
    strided one into a contiguous buffer and copies it back at ``wait``), or scratch of its
    local shape on a member that does not hold ``out``."""
    if out is not None:
        return out
    shape, dtype = context.local_shape(instruction.out), instruction.out.dtype.to_torch()
    return torch.empty(shape, dtype=dtype, device=context.device)


def need(value: torch.Tensor | None, instruction: Any, role: str, context: RunContext) -> Any:
    """``value`` (the operand ``role`` of ``instruction``), or an EvaluationError saying
    this rank should hold it."""
    if value is None:
        raise EvaluationError(
            f"{type(instruction).__name__}: rank {context.rank} must hold {role}"
            f" {getattr(instruction, role).name}, but it does not"
        )
    return value


def checked_result(
    context: RunContext, instruction: Any, result: torch.Tensor, field: str = "out"
) -> torch.Tensor:
    """``result``, once checked to have the local shape of ``instruction``'s result
    ``field``: operands that disagree with their declared extents (two symbolic extents
    unified at definition, say) must not yield a silently different tensor."""
    value = getattr(instruction, field)
    shape = context.local_shape(value)
    if list(result.shape) != shape:
        raise EvaluationError(
            f"{keyword(instruction)} produced a tensor of shape {list(result.shape)}, but"
            f" {value.name} is declared with local shape {shape} on rank {context.rank}"
        )
    return result


def checked_results(context: RunContext, instruction: Any, results: Any) -> list:
    """The results of a compute instruction, in ``OUTS`` order, each checked by
    :func:`checked_result`: ``results`` is the one tensor of an op of one result, or the
    sequence of an op's several."""
    outs = type(instruction).OUTS
    if len(outs) == 1:
        return [checked_result(context, instruction, results, outs[0])]
    return [
        checked_result(context, instruction, result, field)
        for field, result in zip(outs, results, strict=True)
    ]


def into_out(instruction: Any, operands: dict, result: torch.Tensor) -> torch.Tensor:
    """``result``, or copied into the preallocated ``out``."""
    if instruction.preallocated:
        return operands["out"].copy_(result)
    return result
