"""The implementations of the creation ops (declared in ``hostir.ir.creation``, registered
with ``hostir.run.implementations``): ``full``, ``iota``, ``uniform`` and ``normal``, each a
handler taking the run context.

They read no tensor; where ``out`` is sharded, a rank makes its own slice. ``full``
fills its local shape. ``iota`` and the random ops compute the global tensor and keep
this rank's slice of it (``hostir.ir.sharding.slice_global_tensor``), so that every
shard equals the same slice of the single-device result: the cost is the global tensor
on every rank, which a seeded random result needs anyway (torch's CPU generator cannot
skip ahead to a shard's first element).

A seeded random op seeds a fresh ``torch.Generator`` from ``(seed, offset)`` alone, so
equal seeds give equal tensors on every rank and every run. Unseeded, each run draws
the seed from torch's default CPU generator (as nvFuser draws its philox seed from
ATen's default generator): ``torch.manual_seed`` makes it reproducible, and ranks agree
while their default generators are in the same state (they are at start, and after the
same ``torch.manual_seed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.creation import Distribution, Full, Iota, Random
from hostir.ir.dtypes import DType
from hostir.ir.scalars import evaluate_scalar
from hostir.ir.sharding import slice_global_tensor
from hostir.ir.values import TensorValue
from hostir.run.handler_common import checked_result, into_out
from hostir.run.implementations import implements

_MIX = (6364136223846793005, 1442695040888963407)
"""Odd multipliers (Knuth's MMIX LCG) mixing a seed and an offset into one generator
seed: offsets of one seed give unrelated streams."""


def generator_seed(seed: int, offset: int) -> int:
    """The ``torch.Generator`` seed of a random op's ``(seed, offset)`` (64 bits)."""
    return (seed * _MIX[0] + offset * _MIX[1]) % 2**64


def _global_shape(context: Any, out: TensorValue) -> list[int]:
    return [int(evaluate_scalar(extent, context.scalars)) for extent in out.shape]


def _local_slice(context: Any, out: TensorValue, full: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the global ``full`` (all of it if ``out`` is not sharded)."""
    if out.sharding is None:
        return full
    return slice_global_tensor(full, out.sharding, context.rank, context.scalars)


def _cast_value(value: int | float | bool, dtype: DType) -> int | float | bool:
    """``value`` as the Python type of ``dtype`` (nvFuser casts the fill value to the
    dtype: a float truncates towards zero into an integer dtype)."""
    if dtype is DType.BOOL:
        return bool(value)
    if dtype in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16):
        return float(value)
    return int(value)


def run_full(context: Any, instruction: Full, operands: dict) -> torch.Tensor:
    """``full``: this rank's local shape filled with the value."""
    out = instruction.out
    value = _cast_value(operands["fill_value"], out.dtype)
    shape = context.local_shape(out)
    return torch.full(shape, value, dtype=out.dtype.to_torch(), device=context.device)


def run_iota(context: Any, instruction: Iota, operands: dict) -> torch.Tensor:
    """``iota``: ``start + i * step`` for this rank's global indices ``i``."""
    out = instruction.out
    dtype = out.dtype.to_torch()
    (length,) = _global_shape(context, out)
    start = _cast_value(operands["start"], out.dtype)
    step = _cast_value(operands["step"], out.dtype)
    if step == 0:  # the frontend refuses a constant 0; a scalar input is checked here
        raise EvaluationError(f"iota defining {out.name}: step must not be 0")
    full = torch.arange(length, dtype=dtype, device=context.device) * step + start
    return _local_slice(context, out, full.to(dtype))


_FLOATS = {DType.FLOAT64: torch.float64}
"""The dtype a random op draws in, by result dtype: Double in Double, else Float (torch's
CPU generator draws Half and BFloat16 through Float too)."""


def run_random(context: Any, instruction: Random, operands: dict) -> torch.Tensor:
    """``uniform`` / ``normal``: the global tensor drawn, this rank's slice kept."""
    out = instruction.out
    seed, offset = operands.get("seed"), operands.get("offset")
    if seed is None:
        seed, offset = int(torch.randint(0, 2**62, (), dtype=torch.int64)), 0
    generator = torch.Generator(device=context.device)
    generator.manual_seed(generator_seed(int(seed), int(offset)))
    draw_dtype = _FLOATS.get(out.dtype, torch.float32)
    shape = _global_shape(context, out)
    a, b = float(operands["a"]), float(operands["b"])
    if instruction.distribution is Distribution.UNIFORM:
        drawn = torch.rand(shape, generator=generator, dtype=draw_dtype, device=context.device)
        full = drawn * (b - a) + a
    else:
        drawn = torch.randn(shape, generator=generator, dtype=draw_dtype, device=context.device)
        full = drawn * b + a
    return _local_slice(context, out, full.to(out.dtype.to_torch()))


def _handler(run: Callable[[Any, Any, dict], torch.Tensor]) -> Callable[..., list]:
    """The handler of ``run``: checks the local shape and writes into a preallocated
    ``out``."""

    def handle(context: Any, instruction: Any, operands: dict) -> list:
        result = checked_result(context, instruction, run(context, instruction, operands))
        return [into_out(instruction, operands, result)]

    handle.__name__ = handle.__qualname__ = f"{run.__name__}_handler"
    return handle


# The ops' implementations (their declarations: hostir.ir.creation): handlers, taking the
# run context (a rank's slice depends on its rank).
implements("full", handler=True)(_handler(run_full))
implements("iota", handler=True)(_handler(run_iota))
implements("uniform", "normal", handler=True)(_handler(run_random))
