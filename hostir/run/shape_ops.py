"""Evaluator handlers of the shape ops (``hostir.ir.shape_ops``): one torch call each, on
this rank's shard (the lowering only leaves local work to them).

Each takes ``(instruction, operands, out_shape)`` as the other compute handlers
(``hostir.run.compute``): scalars arrive evaluated, ``out_shape`` is ``out``'s local shape.
"""

from __future__ import annotations

from typing import Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.shape_ops import Cat, Pad, Reshape, Slice
from hostir.run.handler_common import into_out

Operands = dict[str, Any]


def run_reshape(instruction: Reshape, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """The local shard reshaped to ``out``'s local shape (a view where torch can make one)."""
    src = operands["src"]
    if src.numel() != _numel(out_shape):
        raise EvaluationError(
            f"reshape defining {instruction.out.name}: {instruction.src.name}'s local shape"
            f" {list(src.shape)} has {src.numel()} elements, {out_shape} needs"
            f" {_numel(out_shape)}"
        )
    return into_out(instruction, operands, src.reshape(out_shape))


def _numel(shape: list[int]) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count


def run_slice(instruction: Slice, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``src.narrow(dim, start, stop - start)`` (a view)."""
    src = operands["src"]
    start, stop = int(operands["start"]), int(operands["stop"])
    extent = src.shape[instruction.dim]
    if not 0 <= start <= stop <= extent:
        raise EvaluationError(
            f"slice defining {instruction.out.name}: [{start}, {stop}) is not within dim"
            f" {instruction.dim} of {instruction.src.name}, of extent {extent}"
        )
    return into_out(instruction, operands, src.narrow(instruction.dim, start, stop - start))


def run_pad(instruction: Pad, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``torch.nn.functional.pad`` of one dim with the constant ``value``."""
    src = operands["src"]
    left, right = int(operands["left"]), int(operands["right"])
    widths = [0, 0] * (src.dim() - 1 - instruction.dim) + [left, right]
    value = operands["value"]
    if src.dtype is torch.bool:
        value = bool(value)
    elif not src.dtype.is_floating_point:
        value = int(value)
    result = torch.nn.functional.pad(src, widths, mode="constant", value=value)
    return into_out(instruction, operands, result)


def run_cat(instruction: Cat, operands: Operands, out_shape: list[int]) -> torch.Tensor:
    """``torch.cat([lhs, rhs], dim)``."""
    result = torch.cat([operands["lhs"], operands["rhs"]], instruction.dim)
    return into_out(instruction, operands, result)


SHAPE_HANDLERS = {Reshape: run_reshape, Slice: run_slice, Pad: run_pad, Cat: run_cat}
"""The shape ops' compute handlers (``hostir.run.compute.COMPUTE_HANDLERS`` takes them)."""
