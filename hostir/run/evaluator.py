"""``HostIrEvaluator``: runs a host IR program on this rank.

``run`` is the entry point of the one run path (``hostir.run.executable``): the first
call of an input signature prepares an executable (binding, the ranks' agreement, the
run, a CUDA graph, the self-checks of ``hostir.run.self_checks``), kept for the
signature's later calls. The evaluator holds what its runs share: the program (checked
when it is taken in), the handlers, each instruction's prepared step, the program
compiled and its replay per rank, the stream pools, the process groups.

The interpreter resolves an instruction's operands, calls the instruction's handler
from a dispatch table, and binds the results (``hostir.run.interpreter``); handlers
never touch the environment. While a torch profiler records, every instruction runs
inside a ``hir::<keyword>`` range. Listeners (tracing, race checking, ...) observe each
instruction before and after it runs. By default a run runs the program compiled for its
rank instead (``hostir.run.compiled``: the same handlers, called from generated
straight-line code), unless listeners observe it, a profiler records, or
``HOSTIR_INTERPRET=1`` (``hostir.run.compiled_runs``).

An instruction whose output lives on a mesh runs only on that mesh's devices (a
communication: on its team's); elsewhere its output is bound to None. A rank that holds
an output never returns None for it: a rank outside a team that holds what the
communication defines raises (``hostir.run.steps.skipped_failure``), and so does a run
whose output on this rank is None.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import torch

from hostir.analysis.pipeline_stages import has_pipelined_loop, is_pipelined
from hostir.check.verify import verify_located
from hostir.comm.communicator import Communicator
from hostir.errors import ExtentError, VerifyError
from hostir.ir.container import HostIrContainer
from hostir.ir.host_reads import ToHost
from hostir.ir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    PipelineStage,
    ShardByStream,
)
from hostir.ir.program_info import check_meshes_fit, program_teams, walk_instructions
from hostir.run.agreements import AgreementLog, extent_scalars
from hostir.run.arguments import (
    checked_communicator,
    checked_device,
    checked_listeners,
    checked_program,
)
from hostir.run.bindings import InputChecks, RecentlyUsed
from hostir.run.communication_handlers import COMMUNICATION_HANDLERS
from hostir.run.compiled import CompiledProgram, compile_program
from hostir.run.compiled_runs import compiling
from hostir.run.context import Listener, RunContext
from hostir.run.executable import Executable, prepare
from hostir.run.implementations import implemented
from hostir.run.interpreter import run_step
from hostir.run.pipelined_loops import pipelining, run_pipelined
from hostir.run.ragged_exchange import run_to_host
from hostir.run.replay import ReplayProgram, replay_program
from hostir.run.self_checks import NO_CHECKS, SelfChecks, checked_checks, take_in, with_checkers
from hostir.run.signature import agreement_kinds, call_key
from hostir.run.steps import Handler, Step, profiling
from hostir.run.stream_handlers import STREAM_HANDLERS
from hostir.run.stream_pool import StreamPool, stream_count


def _run_allocate(context: RunContext, instruction: Allocate, operands: dict) -> list:
    out = instruction.out
    shape = context.local_shape(out)
    return [torch.empty(shape, dtype=out.dtype.to_torch(), device=context.device)]


def _run_deallocate(context: RunContext, instruction: Deallocate, operands: dict) -> list:
    # The operand is not resolved (see hostir.run.steps.UNRESOLVED): freeing needs only the name.
    context.tensors.pop(instruction.tensor.name, None)
    return []


def _run_shard_by_stream(context: RunContext, instruction: ShardByStream, operands: dict) -> list:
    src = operands["src"]
    size = context.local_shape(instruction.out)[instruction.axis]
    start = int(operands["index"]) * size
    if size and (start < 0 or start + size > src.shape[instruction.axis]):
        # The extent checks enumerate indices before the run; this catches what they could
        # not enumerate (torch's narrow would wrap a negative start around).
        raise ExtentError(
            f"shard_by_stream defining {instruction.out.name}: index {operands['index']} is out"
            f" of range for chunks of {size} of {instruction.src.name}'s"
            f" {src.shape[instruction.axis]} along axis {instruction.axis}"
        )
    return [src.narrow(instruction.axis, start, size)]


def _run_for_loop(context: RunContext, instruction: ForLoop, operands: dict) -> list:
    name = instruction.index.name
    if context.pipelined and is_pipelined(instruction):
        run_pipelined(context, instruction, int(operands["start"]), int(operands["stop"]))
        return []
    for index in range(int(operands["start"]), int(operands["stop"])):
        context.scalars[name] = index
        context.run_body(instruction.body)
    context.scalars.pop(name, None)
    return []


def register_handler(cls: type, handler: Handler) -> None:
    """Makes ``handler`` run instructions of ``cls`` (a class declared outside the package):
    ``handler(context, instruction, operands)`` returns the values of ``cls.OUTS`` in order
    (see docs/extending.md)."""
    HANDLERS[cls] = handler


def _runnable(instruction: Instruction) -> bool:
    """Whether a handler runs ``instruction``: its class's, or its declared op's
    implementation (an op declared outside the package needs no entry in the table)."""
    return type(instruction) in HANDLERS or implemented(instruction)


HANDLERS: dict[type, Handler] = {
    **COMMUNICATION_HANDLERS,
    **STREAM_HANDLERS,
    Allocate: _run_allocate,
    Deallocate: _run_deallocate,
    ShardByStream: _run_shard_by_stream,
    ForLoop: _run_for_loop,
    PipelineStage: lambda context, instruction, operands: [],  # the loop runs the stages
    ToHost: run_to_host,
}
"""One handler per instruction class whose ops are not declared (a declared op's instruction
runs its implementation: ``hostir.run.implementations.handler_for``)."""


_DIGESTS: dict[int, tuple[HostIrContainer, str]] = {}
"""Digests of recent programs, by identity (programs are immutable; hashing one walks all
of it), each program held: the evaluators of one program, one per rank of a simulated
world, print it once."""
MAX_DIGESTS = 64


_VERIFIED: dict[int, HostIrContainer] = {}
"""Recent programs verified already, by identity, each held (programs are immutable): the
evaluators of one program, one per rank of a simulated world, verify it once."""


def _verified(program: Any) -> bool:
    if id(program) in _VERIFIED and _VERIFIED[id(program)] is program:
        return True
    if len(_VERIFIED) >= MAX_DIGESTS:
        _VERIFIED.clear()
    return False


def program_digest(program: HostIrContainer) -> str:
    """The SHA-256 of ``program``'s text, computed once per recent program object."""
    known = _DIGESTS.get(id(program))
    if known is not None and known[0] is program:
        return known[1]
    digest = hashlib.sha256(str(program).encode()).hexdigest()
    if len(_DIGESTS) >= MAX_DIGESTS:
        _DIGESTS.clear()
    _DIGESTS[id(program)] = (program, digest)
    return digest


class HostIrEvaluator:
    """Runs ``program`` on this rank: ``HostIrEvaluator(program).run(inputs) -> outputs``.

    ``communicator`` defaults to :func:`default_communicator`. ``listeners``
    observe each instruction. ``device`` defaults to the device of the first
    tensor input (CPU if there is none). ``streams``: the stream pool's size per
    device (default ``HOSTIR_STREAMS``, else 4; ``stream(i)`` runs on pool stream
    ``i mod streams``, see ``hostir.run.stream_pool.StreamPool``). ``pipeline``: run
    loops with ``pipeline_stage`` s pipelined (default ``HOSTIR_PIPELINE``, else yes;
    see ``hostir.run.pipelined_loops``); False runs each iteration whole, in order.
    ``compiled``: run the program compiled for this rank (default: not ``HOSTIR_INTERPRET``,
    else yes; see ``hostir.run.compiled``) when no listener observes it and no profiler
    records; False runs it interpreted. ``checks``: the self-checks to make
    (``hostir.run.self_checks.SelfChecks``; default: those the ``HOSTIR_CHECK_*``
    settings ask for). ``agreements``: the log of what the ranks agreed on, shared by
    the evaluators whose programs the peers may be running (``FusionDefinition``'s;
    default: this evaluator's own).
    A wrong argument is a SettingError (VerifyError for ``program``) naming it.

    Threads: in a world of more than one rank, one thread at a time runs programs on it
    (``hostir.comm.run_guard``: a call from another thread meanwhile raises
    ConcurrentRunError). In a world of one rank, threads may run at once, this evaluator
    too: what runs share is read-only or per run, except listeners, which observe one run
    at a time (runs of an evaluator with listeners take turns).
    """

    def __init__(
        self,
        program: HostIrContainer,
        *,
        communicator: Communicator | None = None,
        listeners: Sequence[Listener] = (),
        device: torch.device | str | None = None,
        streams: int | None = None,
        pipeline: bool | None = None,
        compiled: bool | None = None,
        checks: SelfChecks | None = None,
        agreements: AgreementLog | None = None,
    ) -> None:
        if not _verified(program):
            verify_located(checked_program(program))
            _VERIFIED[id(program)] = program
        used = walk_instructions(program.body)
        missing = sorted({type(i).__name__ for i in used if not _runnable(i)})
        if missing:
            raise VerifyError(
                f"the evaluator has no handler for {', '.join(missing)}"
                " (register one with hostir.run.evaluator.register_handler, or an op's"
                " implementation with hostir.run.implementations.implements)"
            )
        self.checks = checked_checks(checks)
        take_in(program, self.checks)
        self.program = program
        self.communicator = checked_communicator(communicator)
        listeners = checked_listeners(listeners)
        # What observes an interpreted run: the listeners and the self-checks' race checker,
        # which with the compiled check observes every run's interpreted twin, and without
        # it the run itself (hostir.run.self_checks).
        self.run_listeners = with_checkers(listeners, self.checks)
        self.listeners = listeners if self.checks.compiled else self.run_listeners
        self.device = checked_device(device)
        self.agreements = AgreementLog() if agreements is None else agreements
        self.agreed_kinds: set[tuple] = set()  # input kinds the ranks agreed on
        # The scalar inputs extents read: their values are agreed on too (signature.py).
        self.extent_scalars = extent_scalars(program)
        self.listening = threading.RLock()  # listeners observe one run at a time
        self.input_checks = InputChecks(program)  # binds a signature's inputs
        self.streams = stream_count(streams)  # the pool's size per device
        self.pipeline = pipelining(pipeline)
        self.compiled = compiling(compiled)
        self._executables: RecentlyUsed[Executable] = RecentlyUsed()  # by call_key
        self._prepared_for: Communicator | None = None
        self._digest: str | None = None
        self._fits: set[int] = set()  # world sizes every mesh of the program fits in
        self._steps: dict[int, Step] = {}  # by id: the program holds the instructions alive
        self._stream_pools: dict[torch.device, StreamPool] = {}
        self._compiled: dict[tuple[int, bool], CompiledProgram] = {}  # by rank, pipelining
        # by rank, pipelining and whether on the CPU
        self._replays: dict[tuple[int, bool, bool], ReplayProgram | None] = {}
        self._unpipelined: HostIrEvaluator | None = None

    def run(
        self,
        inputs: Sequence[Any],
        *,
        timeout: float | None = None,
        compiled: bool | None = None,
        cuda_graph: bool | None = None,
    ) -> list[torch.Tensor | None]:
        """Binds ``inputs`` (this rank's shards), runs the program, returns this rank's outputs.

        In a world of more than one rank, the first run of each kind of inputs starts
        with the agreement (hostir.comm.agreement): the ranks compare the program, the
        extents their inputs bound and their dtypes, and whether one failed before
        communicating, and all raise the same named error if they differ.
        ``timeout`` (seconds) bounds every wait for peers (default: ``HOSTIR_TIMEOUT``,
        else hostir.comm.timeouts.DEFAULT_TIMEOUT_S). ConcurrentRunError if another thread runs
        a program on the same world of more than one rank (see the class docstring).
        ``compiled``: True runs this call compiled, calling no listener; False interpreted;
        None as :meth:`runs_compiled` says. ``cuda_graph`` (default ``HOSTIR_CUDA_GRAPH``,
        else False): capture the run once per input signature as a CUDA graph and replay
        it (hostir.run.cuda_graphs; inputs are copied in, outputs are fresh tensors;
        docs/cuda_graphs.md); CudaGraphError, naming why, where it cannot be captured (no
        CUDA, an input on the CPU, gloo between ranks, listeners).

        The first run of an input signature (each input's type, shape, dtype and device,
        a scalar's value; the same ``timeout``, ``cuda_graph`` and default process group)
        prepares it (hostir.run.executable); a later run of the signature runs what was
        prepared: nothing is checked or bound again, and the settings read when the
        signature was prepared hold.
        """
        key = call_key(inputs, timeout, cuda_graph)
        executable = self._executables.get(key)
        if executable is None:
            return self._prepare(key, inputs, timeout, compiled, cuda_graph)[1]
        if compiled is None:
            return executable.call(inputs)
        return executable.run(inputs, compiled=compiling(compiled))

    def executable(
        self, inputs: Sequence[Any], *, timeout: float | None = None, cuda_graph: bool | None = None
    ) -> tuple[Executable, list[torch.Tensor | None]]:
        """Runs ``inputs`` as :meth:`run` does; returns the executable of their signature
        (hostir.run.executable, prepared by this run if it is the signature's first) with
        the outputs. ``FusionDefinition.execute`` keeps it under a key of its own."""
        key = call_key(inputs, timeout, cuda_graph)
        executable = self._executables.get(key)
        if executable is None:
            return self._prepare(key, inputs, timeout, None, cuda_graph)
        return executable, executable.call(inputs)

    def _prepare(
        self,
        key: tuple | None,
        inputs: Sequence[Any],
        timeout: float | None,
        compiled: bool | None,
        cuda_graph: bool | None,
    ) -> tuple[Executable, list[torch.Tensor | None]]:
        """The first run of a signature, its executable kept under ``key`` (if any)."""
        executable, outputs = prepare(
            self, inputs, timeout=timeout, compiled=compiled, cuda_graph=cuda_graph
        )
        if key is not None:
            self._executables[key] = executable
        return executable, outputs

    def runs_compiled(self) -> bool:
        """Whether a run now runs the compiled program: the evaluator compiles
        (``compiled``), no listener observes it, and no torch profiler records."""
        return self.compiled and not self.listeners and not profiling()

    def has_agreed(self, inputs: Sequence[Any]) -> bool:
        """Whether the ranks already agreed on a run with inputs like ``inputs`` (the next run
        with them starts without the agreement)."""
        return agreement_kinds(list(inputs), self.extent_scalars) in self.agreed_kinds

    def digest(self) -> str:
        """The program's digest: the SHA-256 of its text (the same on ranks running it)."""
        if self._digest is None:
            self._digest = program_digest(self.program)
        return self._digest

    def stream_pool(self, device: torch.device) -> StreamPool:
        """This evaluator's stream pool for ``device`` (CUDA streams are reused across runs)."""
        if device not in self._stream_pools:
            self._stream_pools[device] = StreamPool(device, self.streams)
        return self._stream_pools[device]

    def compiled_program(self, rank: int) -> CompiledProgram:
        """The program compiled for ``rank`` (loops pipelined as this evaluator runs
        them), generated once; its ``source`` is what ``hostir dump --python`` prints."""
        key = (rank, self.pipeline)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = compile_program(self.program, rank, self.pipeline, self.step)
            self._compiled[key] = compiled
        return compiled

    def replay_program(self, rank: int, on_cpu: bool = False) -> ReplayProgram | None:
        """The program's replay for ``rank`` (hostir.run.replay; ``on_cpu``: for runs on
        the CPU, without the stream instructions), made once; None where it has none (a
        pipelined loop holds a loop)."""
        key = (rank, self.pipeline, on_cpu)
        if key not in self._replays:
            self._replays[key] = replay_program(
                self.program, rank, self.pipeline, self.step, on_cpu
            )
        return self._replays[key]

    # -- What a run of hostir.run.executable asks of its evaluator -------------------------

    def new_context(
        self, communicator: Communicator, device: torch.device, listening: bool = True
    ) -> RunContext:
        """The context of a run starting now (its "main" stream the current one), the
        listeners in it unless not ``listening``."""
        context = RunContext(self, self.program, communicator, device)
        context.pipelined = self.pipeline
        if listening:
            context.listeners = self.run_listeners
        context.stream_pool.start_run()
        communicator.run_started(context)
        return context

    def check_fits(self, world_size: int) -> None:
        """MeshError unless every mesh of the program fits in ``world_size`` ranks."""
        if world_size not in self._fits:
            check_meshes_fit(self.program, world_size)
            self._fits.add(world_size)

    def prepare_groups(self, communicator: Communicator) -> None:
        """Once per communicator: create every process group in program order (the
        agreement made sure every rank runs this program)."""
        if self._prepared_for is communicator:
            return
        teams = program_teams(self.program)
        communicator.prepare([group for team in teams for group in team.groups])
        self._prepared_for = communicator

    def run_body(self, context: RunContext, compiled: bool) -> None:
        """Runs the program's body compiled (no listener sees it) or interpreted."""
        if compiled:
            # A pipelined loop in it runs interpreted; its listeners would see part of a run.
            context.listeners = ()
            self.compiled_program(context.rank).run(context)
            return
        context.run_body(self.program.body)
        for listener in self.run_listeners:
            listener.finish(context)

    def pipelines(self) -> bool:
        """Whether a loop of the program runs pipelined (hostir.run.pipelined_loops)."""
        return self.pipeline and has_pipelined_loop(self.program.body)

    def unpipelined(self) -> HostIrEvaluator:
        """This evaluator's twin that runs every loop unpipelined, without listeners or
        self-checks (the pipeline check runs it: hostir.run.self_checks); made once."""
        if self._unpipelined is None:
            self._unpipelined = HostIrEvaluator(
                self.program,
                communicator=self.communicator,
                device=self.device,
                streams=self.streams,
                pipeline=False,
                compiled=self.compiled,
                checks=NO_CHECKS,
                agreements=self.agreements,
            )
        return self._unpipelined

    def step(self, instruction: Instruction) -> Step:
        """``instruction`` prepared to run (once per instruction; hostir.run.steps)."""
        step = self._steps.get(id(instruction))
        if step is None:
            step = self._steps[id(instruction)] = Step.prepare(
                instruction, HANDLERS.get(type(instruction))
            )
        return step

    def run_instruction(self, instruction: Instruction, context: RunContext) -> None:
        """Resolves operands, calls the handler, binds the results (hostir.run.interpreter)."""
        run_step(self.step(instruction), instruction, context)
