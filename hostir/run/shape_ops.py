"""The implementations of ``reshape``, ``slice``, ``pad`` and ``cat`` (declared in
``hostir.ir.shape_ops``, registered with ``hostir.run.implementations``): one torch call
each, on this rank's shard (the lowering only leaves local work to them).

``slice``, ``pad`` and ``cat`` are plain calls on their operands (scalars arrive
evaluated); ``reshape`` reads ``out``'s local shape from the run, so it is a handler.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.shape_ops import Cat, Pad, Reshape, Slice
from hostir.run.handler_common import checked_result, into_out
from hostir.run.implementations import TorchCall, implements

if TYPE_CHECKING:
    from hostir.run.context import RunContext

Operands = dict[str, Any]


def reshaped(instruction: Reshape, src: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """The local shard ``src`` reshaped to ``out``'s local ``shape`` (a view where torch can
    make one); EvaluationError if the element counts differ."""
    count = 1
    for extent in shape:
        count *= extent
    if src.numel() != count:
        raise EvaluationError(
            f"reshape defining {instruction.out.name}: {instruction.src.name}'s local shape"
            f" {list(src.shape)} has {src.numel()} elements, {shape} needs {count}"
        )
    return src.reshape(shape)


@implements("reshape", handler=True)
def run_reshape(context: RunContext, instruction: Reshape, operands: Operands) -> list:
    """``reshape`` to ``out``'s local shape, which the run knows (so a handler)."""
    shape = context.local_shape(instruction.out)
    result = into_out(instruction, operands, reshaped(instruction, operands["src"], shape))
    return [checked_result(context, instruction, result)]


def narrowed(instruction: Slice, src: torch.Tensor, start: Any, stop: Any) -> torch.Tensor:
    """``src.narrow(dim, start, stop - start)`` (a view); EvaluationError if ``[start,
    stop)`` is not within the dim."""
    start, stop = int(start), int(stop)
    extent = src.shape[instruction.dim]
    if not 0 <= start <= stop <= extent:
        raise EvaluationError(
            f"slice defining {instruction.out.name}: [{start}, {stop}) is not within dim"
            f" {instruction.dim} of {instruction.src.name}, of extent {extent}"
        )
    return src.narrow(instruction.dim, start, stop - start)


@implements("slice")
def prepare_slice(instruction: Slice) -> TorchCall:
    """``slice``: a view of the elements ``start <= i < stop`` of ``dim``."""
    return functools.partial(narrowed, instruction)


def padded(instruction: Pad, src: torch.Tensor, left: Any, right: Any, value: Any) -> torch.Tensor:
    """``torch.nn.functional.pad`` of ``dim`` with the constant ``value`` (of the tensor's
    kind)."""
    widths = [0, 0] * (src.dim() - 1 - instruction.dim) + [int(left), int(right)]
    if src.dtype is torch.bool:
        value = bool(value)
    elif not src.dtype.is_floating_point:
        value = int(value)
    return torch.nn.functional.pad(src, widths, mode="constant", value=value)


@implements("pad")
def prepare_pad(instruction: Pad) -> TorchCall:
    """``pad`` of one dim."""
    return functools.partial(padded, instruction)


@implements("cat")
def prepare_cat(instruction: Cat) -> TorchCall:
    """``torch.cat([lhs, rhs], dim)``."""
    dim = instruction.dim
    return lambda lhs, rhs: torch.cat([lhs, rhs], dim)
