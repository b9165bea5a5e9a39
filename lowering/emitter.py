"""The shared state and op emission used by ``emit_host_ir`` and the stream loops."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping

from hostir import Set, TensorValue
from hostir.ir.host_reads import RaggedExchange
from hostir.ir.instructions import Instruction
from hostir.ir.scalars import symbols_of
from lowering.emit_resharding import emit_resharding
from lowering.emit_run_time import emit_ragged_exchange
from lowering.redistribution.plan_resharding import plan_resharding
from lowering.snapshot import LoweringFusion, LoweringOp


def bind_values(instruction: Instruction, values: Mapping[str, TensorValue]) -> Instruction:
    """``instruction`` with every tensor field replaced by the final value of that name."""
    changes = {
        field.name: values[getattr(instruction, field.name).name]
        for field in dataclasses.fields(instruction)
        if isinstance(getattr(instruction, field.name), TensorValue)
    }
    return dataclasses.replace(instruction, **changes)


def layout_of(value: TensorValue) -> object:
    """What must match for two values to meet without communication."""
    sharding = value.sharding
    if sharding is None:
        return None
    return (
        sharding.mesh,
        tuple(tuple(p.axis for p in parts) for parts in sharding.dims),
        sharding.partial,
    )


class Emitter:
    """Program-wide emission state: final values, request and loop numbering."""

    def __init__(self, fusion: LoweringFusion) -> None:
        self.fusion = fusion
        self.tensors = {tensor.name: tensor for tensor in fusion.tensors}
        self.values = {tensor.name: tensor.value() for tensor in fusion.tensors}
        self.requests: Iterator[int] = itertools.count()
        self.loops: Iterator[int] = itertools.count()
        self.main_stream_defined = False
        """Whether ``main = get_current_stream()`` was emitted (by the first stream loop)."""
        self.chunk_names: set[str] = set()
        """The names stream loops gave their chunks (a name is defined once per program)."""
        self.chunked: set[str] = set()
        """The tensors stream loops read or wrote chunk by chunk."""
        self.host_reads: dict[str, object] = {}
        """The host value each counts tensor was read into (one ``to_host`` per tensor)."""
        self.run_time_extents: set[str] = {s.name for s in fusion.scalar_inputs} | {
            name
            for tensor in fusion.tensors
            if tensor.name in fusion.inputs
            for extent in self.values[tensor.name].shape
            for name in symbols_of(extent)
        }
        """The symbols bound before the next exchange: the inputs', then the run-time
        extents emitted exchanges bind."""

    def emit_op(
        self, op: LoweringOp, values: Mapping[str, TensorValue], preallocated: bool = False
    ) -> list[Instruction]:
        """The instructions of ``op`` with its tensors bound to ``values``; with
        ``preallocated`` its output exists already and is written in place. An op of
        several results is one instruction, emitted with its first result (the others'
        LoweringOps give none; ``values`` binds every result)."""
        if op.group is not None and op.result > 0:
            return []
        instruction = bind_values(op.instruction, values)
        if isinstance(instruction, RaggedExchange):
            return emit_ragged_exchange(
                instruction, self.requests, self.host_reads, self.run_time_extents
            )
        if isinstance(instruction, Set) and layout_of(instruction.src) != layout_of(
            instruction.out
        ):
            plan = plan_resharding(instruction.src, instruction.out)
            return emit_resharding(
                plan, instruction.src, instruction.out, self.requests, preallocated
            )
        if preallocated:
            instruction = dataclasses.replace(instruction, preallocated=True)
        return [instruction]
