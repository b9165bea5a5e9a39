"""What a handler sees of a run: ``RunContext`` (bound values, rank, device, streams) and
the ``Listener`` interface that observes instructions.

Handlers and listeners import this module, not the evaluator: the evaluator
builds a ``RunContext`` per run and hands it to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hostir.ir.instructions import Instruction
from hostir.ir.program_info import run_time_symbols
from hostir.ir.scalars import RANK
from hostir.ir.values import TensorValue, local_shape, value_symbols
from hostir.run.stream_pool import MAIN, StreamPool

if TYPE_CHECKING:
    from hostir.comm.communicator import Communicator
    from hostir.ir.container import HostIrContainer


class Runner(Protocol):
    """What a run needs of its evaluator: one instruction at a time, and a stream pool."""

    def run_instruction(self, instruction: Instruction, context: RunContext) -> None:
        """Resolves operands, calls the handler, binds the results."""

    def stream_pool(self, device: torch.device) -> StreamPool:
        """The stream pool for ``device``."""


class RunContext:
    """The state of one run: bound tensors and scalars, rank, device, current stream."""

    def __init__(
        self,
        runner: Runner,
        program: HostIrContainer,
        communicator: Communicator,
        device: torch.device,
    ):
        self.runner = runner
        self.program = program
        self.communicator = communicator
        self.device = device
        self.tensors: dict[str, torch.Tensor | None] = {}
        self.scalars: dict[str, int | float | bool] = {RANK: communicator.rank}
        self.current_stream: Any = MAIN
        self.posted: dict[str, Instruction] = {}  # request name -> the communication defining it
        self.pipelined = True  # run pipeline stages interleaved (hostir.run.pipelined_loops)
        self.listeners: Sequence[Listener] = ()  # what observes the instructions run
        # local shapes by value; shared by the runs of one input signature (run.bindings)
        self.shape_cache: dict[int, tuple[TensorValue, list[int]]] = {}
        # bound from a signature that ran before: a compiled run may replay (hostir.run.replay)
        self.replays = False
        self.stream_pool = runner.stream_pool(device)
        self.run_time_symbols = run_time_symbols(program)

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.communicator.rank

    def local_shape(self, value: TensorValue) -> list[int]:
        """The shape of this rank's shard of ``value``.

        Cached for the run, and for later runs of the same input signature: shapes
        depend only on the extents bound from the inputs (never on loop indices), and
        loops ask for the same shapes every iteration. A value whose extents read a
        run-time extent (bound by an instruction as it runs) is never cached.
        """
        cached = self.shape_cache.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        shape = local_shape(value, self.scalars)
        if not (self.run_time_symbols and value_symbols(value) & self.run_time_symbols):
            self.shape_cache[id(value)] = (value, shape)
        return shape

    def participates(self, value: TensorValue) -> bool:
        """Whether this rank holds a shard of ``value``."""
        return value.sharding is None or value.sharding.mesh.contains(self.rank)

    def run_body(self, body: Sequence[Instruction]) -> None:
        """Runs ``body`` in this context (loops call back here)."""
        for instruction in body:
            self.runner.run_instruction(instruction, self)


class Listener:
    """Observes execution; subclass and override what you need."""

    def before(self, instruction: Instruction, context: RunContext, operands: dict) -> None:
        """Called before ``instruction`` runs on this rank; ``operands`` are its resolved
        inputs by field name (tensors, scalars, stream ids, requests)."""

    def after(self, instruction: Instruction, context: RunContext, operands: dict) -> None:
        """Called after ``instruction`` ran on this rank; its results are bound in
        ``context.tensors`` by name."""

    def finish(self, context: RunContext) -> None:
        """Called once after the body ran, before the outputs are returned."""
