"""The stages of a software-pipelined loop, read off its body's ``pipeline_stage``
markers, and what a pipelined loop holds in flight (``hostir.run.pipelined_loops`` runs
them; the traffic analysis and its pictures read them)."""

from __future__ import annotations

from collections.abc import Sequence

from hostir.analysis.exchanges import local_elements
from hostir.ir.instructions import (
    ForLoop,
    Instruction,
    PipelineStage,
    ShardByStream,
    defined_values,
)
from hostir.ir.program_info import walk_instructions
from hostir.ir.values import TensorValue


def stages(body: Sequence[Instruction]) -> list[tuple[int, tuple[Instruction, ...]]]:
    """The stages of a loop body, each with its lag behind the first stage."""
    found: list[tuple[int, tuple[Instruction, ...]]] = []
    lag, current = 0, []
    for instruction in body:
        if isinstance(instruction, PipelineStage):
            found.append((lag, tuple(current)))
            lag, current = lag + instruction.depth, []
        else:
            current.append(instruction)
    found.append((lag, tuple(current)))
    return found


def is_pipelined(loop: ForLoop) -> bool:
    """Whether ``loop``'s body has a ``pipeline_stage`` of its own."""
    return any(isinstance(i, PipelineStage) for i in loop.body)


def has_pipelined_loop(body: Sequence[Instruction]) -> bool:
    """Whether any loop in ``body`` (nested ones too) is pipelined."""
    return any(isinstance(i, ForLoop) and is_pipelined(i) for i in walk_instructions(body))


def in_flight(loop: ForLoop, env: dict) -> tuple[int, int] | None:
    """(how many iterations' values are alive at once, the bytes of the tensors one
    iteration allocates on a rank) for a pipelined ``loop``: an iteration's values live
    until its last stage ran, so at total depth ``d`` up to ``d + 1`` iterations hold
    theirs. Views (``shard_by_stream``) and writes into existing buffers allocate
    nothing. None when an extent is not bound in ``env``."""
    iterations = 1 + stages(loop.body)[-1][0]  # the last stage's lag
    total = 0
    for instruction in walk_instructions(loop.body):
        if isinstance(instruction, ShardByStream):
            continue
        for value in defined_values(instruction):
            if isinstance(value, TensorValue):
                elements = local_elements(value, env)
                if elements is None:
                    return None
                total += elements * value.dtype.to_torch().itemsize
    return iterations, total
