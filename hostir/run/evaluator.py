"""``HostIrEvaluator``: runs a host IR program on this rank.

The interpreter resolves an instruction's operands, calls the instruction's handler
from a dispatch table, and binds the results; handlers never touch the
environment. While a torch profiler records, every instruction runs inside a
``hir::<keyword>`` range. Listeners (tracing, race checking, ...) observe each
instruction before and after it runs. By default a run runs the program compiled
for its rank instead (``hostir.run.compiled``: the same handlers, called from
generated straight-line code), unless listeners observe it, a profiler records, or
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
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir.analysis.pipeline_stages import is_pipelined
from hostir.check.extent_checks import ExtentChecks
from hostir.check.loop_counts import LoopCounts
from hostir.check.verify import verify_located
from hostir.comm.agreement import BoundExtent, RankFacts, agree, restate
from hostir.comm.communicator import Communicator
from hostir.comm.run_guard import occupying_world
from hostir.comm.timeouts import collective_timeout
from hostir.comm.world import default_communicator
from hostir.errors import (
    CommunicationError,
    EvaluationError,
    ExtentError,
    HostIrError,
    InputError,
    VerifyError,
)
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import INT_RANGES, DType
from hostir.ir.indexing import TopK
from hostir.ir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    PipelineStage,
    ShardByStream,
)
from hostir.ir.mesh_names import mesh_names
from hostir.ir.program_info import check_meshes_fit, program_teams, walk_instructions
from hostir.ir.scalars import Symbol
from hostir.ir.values import TensorValue
from hostir.run.arguments import (
    checked_communicator,
    checked_device,
    checked_listeners,
    checked_program,
    run_inputs,
)
from hostir.run.attention_dropout import ATTENTION_DROPOUT_HANDLERS
from hostir.run.bindings import MAX_SIGNATURES, Bindings, call_key
from hostir.run.communication_handlers import COMMUNICATION_HANDLERS
from hostir.run.compiled import CompiledProgram, compile_program
from hostir.run.compiled_runs import compiling
from hostir.run.compute import COMPUTE_HANDLERS
from hostir.run.context import Listener, RunContext
from hostir.run.creation import CREATION_HANDLERS
from hostir.run.handler_common import compute_handler
from hostir.run.indexing import run_topk, topk_results
from hostir.run.inputs import bind_input_tensor
from hostir.run.pipelined_loops import pipelining, run_pipelined
from hostir.run.replay import ReplayProgram, replay_program
from hostir.run.shared_results import op_key, sibling_counts
from hostir.run.steps import Handler, Step, profiling, skipped_failure, step_failure
from hostir.run.stream_handlers import STREAM_HANDLERS
from hostir.run.stream_pool import MAIN, StreamPool, stream_count


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


HANDLERS: dict[type, Handler] = {
    **COMMUNICATION_HANDLERS,
    **STREAM_HANDLERS,
    Allocate: _run_allocate,
    Deallocate: _run_deallocate,
    ShardByStream: _run_shard_by_stream,
    ForLoop: _run_for_loop,
    PipelineStage: lambda context, instruction, operands: [],  # the loop runs the stages
    **{cls: compute_handler(run) for cls, run in COMPUTE_HANDLERS.items()},
    **CREATION_HANDLERS,
    **ATTENTION_DROPOUT_HANDLERS,  # over the plain sdpfa handlers: a mask needs the rank
    TopK: compute_handler(run_topk, topk_results),  # values and indices computed once
}
"""One handler per instruction class."""


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
    records; False runs it interpreted.
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
    ) -> None:
        verify_located(checked_program(program))
        used = {type(i) for i in walk_instructions(program.body)}
        missing = sorted(cls.__name__ for cls in used if cls not in HANDLERS)
        if missing:
            raise VerifyError(
                f"the evaluator has no handler for {', '.join(missing)}"
                " (register one with hostir.run.evaluator.register_handler)"
            )
        self.program = program
        self.communicator = checked_communicator(communicator)
        self.listeners = checked_listeners(listeners)
        self.device = checked_device(device)
        self._listening = threading.RLock()  # listeners observe one run at a time
        self._prepared_for: Communicator | None = None
        self._agreed: set[tuple] = set()  # input signatures the ranks agreed on
        # Set by the caller (FusionDefinition) when the ranks agreed on runs of another
        # program of the same definition, which the peers may be running: then, as after
        # an agreed run of this one, a run that fails before communicating announces its
        # failure and raises at once instead of waiting (hostir.comm.agreement).
        self.agreed_elsewhere = False
        self._digest: str | None = None
        self._extent_checks: ExtentChecks | None = None  # built at the first run
        self._loop_counts: LoopCounts | None = None  # built at the first run
        self._bindings = Bindings()  # what binding inputs gave, per input signature
        self._fits: set[int] = set()  # world sizes every mesh of the program fits in
        self._steps: dict[int, Step] = {}  # by id: the program holds the instructions alive
        self._stream_pools: dict[torch.device, StreamPool] = {}
        self._siblings: Counter | None = None  # instructions per shared op (shared_results)
        self._prepared_runs: dict[tuple, Callable] = {}  # run()'s prepared calls by call_key
        self.streams = stream_count(streams)  # the pool's size per device
        self.pipeline = pipelining(pipeline)
        self.compiled = compiling(compiled)
        self._compiled: dict[tuple[int, bool], CompiledProgram] = {}  # by rank, pipelining
        # by rank, pipelining and whether on the CPU
        self._replays: dict[tuple[int, bool, bool], ReplayProgram | None] = {}

    def siblings(self, instruction: Instruction) -> int:
        """How many instructions of the program compute ``instruction``'s op, itself
        included (hostir.run.shared_results; counted at the first ask)."""
        if self._siblings is None:
            self._siblings = sibling_counts(self.program)
        return self._siblings.get(op_key(instruction), 1)

    def stream_pool(self, device: torch.device) -> StreamPool:
        """This evaluator's stream pool for ``device`` (CUDA streams are reused across runs)."""
        if device not in self._stream_pools:
            self._stream_pools[device] = StreamPool(device, self.streams)
        return self._stream_pools[device]

    def run(
        self,
        inputs: Sequence[Any],
        *,
        timeout: float | None = None,
        compiled: bool | None = None,
    ) -> list[torch.Tensor | None]:
        """Binds ``inputs`` (this rank's shards), runs the program, returns this rank's outputs.

        In a world of more than one rank, the first run of each input signature starts
        with the agreement (hostir.comm.agreement): the ranks compare the program, the
        extents their inputs bind and their dtypes, and whether one failed before
        communicating, and all raise the same named error if they differ.
        ``timeout`` (seconds) bounds every wait for peers (default: ``HOSTIR_TIMEOUT``,
        else hostir.comm.timeouts.DEFAULT_TIMEOUT_S). ConcurrentRunError if another thread runs
        a program on the same world of more than one rank (see the class docstring).
        ``compiled``: True runs this call compiled, calling no listener; False interpreted;
        None as :meth:`runs_compiled` says (the frontend's check of the two uses this).

        A call of a signature that already ran (each input a tensor of the same type,
        shape, dtype and device, the same ``timeout`` and default process group; no
        ``compiled``, no listeners) runs the signature's prepared call
        (:meth:`prepared_call`), as ``FusionDefinition.execute`` does: nothing is checked
        or bound again, and the settings read when the signature was prepared hold.
        """
        key = call_key(inputs, timeout) if compiled is None and not self.listeners else None
        again = self._prepared_runs.get(key) if key is not None else None
        if again is not None and not profiling():
            return again(inputs)
        outputs = self._first_run(inputs, timeout, compiled)
        if key is not None and len(self._prepared_runs) < MAX_SIGNATURES:
            prepared = self.prepared_call(inputs, timeout)
            if prepared is not None:
                self._prepared_runs[key] = prepared
        return outputs

    def _first_run(
        self, inputs: Sequence[Any], timeout: float | None, compiled: bool | None
    ) -> list[torch.Tensor | None]:
        """:meth:`run` without a prepared call: inputs checked and bound (or the binding
        of their signature applied), the agreement where it is due, the program run."""
        compiled = self.runs_compiled() if compiled is None else compiling(compiled)
        inputs, inputs_error = run_inputs(inputs)  # the agreement tells the peers of it
        device = self.device or _device_of(inputs)
        communicator = self.communicator or default_communicator(device.type == "cuda")
        # Before anything communicates; left when the run ends, however it ends.
        alone = self._listening if self.listeners else None
        with occupying_world(communicator, self.digest, alone):
            return self._run(inputs, inputs_error, device, communicator, timeout, compiled)

    def _run(
        self,
        inputs: list[Any],
        inputs_error: HostIrError | None,
        device: torch.device,
        communicator: Communicator,
        timeout: float | None,
        compiled: bool,
    ) -> list[torch.Tensor | None]:
        """The run, once its world is held (see :meth:`run`)."""
        if communicator.world_size not in self._fits:  # the same verdict everywhere
            check_meshes_fit(self.program, communicator.world_size)
            self._fits.add(communicator.world_size)
        context = RunContext(self, self.program, communicator, device)
        context.pipelined = self.pipeline
        context.listeners = self.listeners
        context.stream_pool.start_run()  # "main" is the stream this run starts on
        failure = (
            inputs_error
            or self._set_timeout(communicator, timeout)
            or self._bind(context, inputs, device, communicator)
        )
        if communicator.world_size > 1:
            signature = _signature(inputs)
            if signature not in self._agreed:
                # A rank refusing a new signature after the ranks agreed on others does not
                # wait: its peers may be running one of those (hostir.comm.agreement).
                wait = not (self._agreed or self.agreed_elsewhere)
                agreed = agree(communicator, self._facts(context, failure), wait=wait)
                if failure is None:
                    self._agreed.add(signature)
                else:  # the ranks' one account where they failed for different reasons
                    restate(failure, agreed)
            elif failure is not None:  # no agreement this time: the peers learn it so
                communicator.post_failure(f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure

        def body() -> list | None:
            self._prepare(communicator)
            on_cpu = context.device.type == "cpu"
            replay = (
                self.replay_program(context.rank, on_cpu) if compiled and context.replays else None
            )
            if replay is not None:  # this signature ran before: nothing left to check
                return replay.run(context, inputs)
            self._run_body(context, compiled)
            return None

        return self._guarded(context, body)

    def _guarded(self, context: RunContext, body: Callable[[], list | None]) -> list:
        """Runs ``body`` (a replay returns the outputs; a run of the body, None), turning
        its failure into what the peers and the user must see: a communication error
        names the ranks that failed first; any failure in a world of several ranks is
        posted, so peers waiting for this rank name it. Returns the outputs."""
        communicator = context.communicator
        started = time.time() if communicator.world_size > 1 else 0.0
        try:
            outputs = body()
        except CommunicationError as error:
            raise _with_culprits(error, communicator, started) from error.__cause__
        except Exception as error:
            if communicator.world_size > 1:  # the peers waiting for this rank name it
                communicator.post_failure(f"{type(error).__name__}: {error}")
            raise
        finally:
            if context.device.type == "cuda" and context.current_stream != MAIN:
                torch.cuda.set_stream(context.stream_pool.get(MAIN))
        if outputs is not None:
            return outputs
        return [self._output(context, value) for value in self.program.outputs]

    def prepared_call(
        self, inputs: Sequence[Any], timeout: float | None = None, *, compiled: bool | None = None
    ) -> Callable[[Sequence[Any]], list] | None:
        """A call that runs this program again on inputs of ``inputs``' signature, which
        ran before, doing only what a run of a known signature must: hold the world
        (several ranks), apply the kept binding, set the timeout (read now), run the
        replay (hostir.run.replay). None where a run must do more: the signature has not
        run (or bound) yet, the runs are not compiled, listeners observe them, or the
        program has no replay. The caller keeps it per signature and checks that the
        inputs it passes have the signature (their shapes, dtypes and devices) and that
        the default communicator is still this evaluator's. ``compiled=True`` prepares
        the call even where runs are interpreted, calling no listener (as ``run``'s)."""
        if not (compiled if compiled is not None else self.compiled and not self.listeners):
            return None
        inputs = list(inputs)
        device = self.device or _device_of(inputs)
        communicator = self.communicator or default_communicator(device.type == "cuda")
        signature = self._bindings.signature(inputs, device, communicator)
        binding = self._bindings.get(signature)
        known = communicator.world_size == 1 or _signature(inputs) in self._agreed
        replay = self.replay_program(communicator.rank, device.type == "cpu")
        if binding is None or not known or replay is None or self._prepared_for is not communicator:
            return None
        limit = collective_timeout(timeout)

        def context_for_run() -> RunContext:
            context = RunContext(self, self.program, communicator, device)
            context.pipelined = self.pipeline
            context.stream_pool.start_run()
            context.scalars.update(binding.scalars)
            context.shape_cache = binding.shapes
            return context

        def run_again(inputs: Sequence[Any]) -> list:
            if profiling():  # the interpreter opens a range per instruction
                return self.run(inputs, timeout=timeout)
            context = context_for_run()
            if communicator.world_size == 1:
                return self._guarded(context, lambda: replay.run(context, inputs))
            with occupying_world(communicator, self.digest, None):
                communicator.set_timeout(limit)
                return self._guarded(context, lambda: replay.run(context, inputs))

        def run_alone(inputs: Sequence[Any]) -> list:
            # _guarded adds nothing here: no peer to tell or name, no stream to restore
            # (on the CPU there are none; on CUDA a replay that switches streams uses its
            # context, and runs run_again).
            if torch.autograd.profiler._is_profiler_enabled:  # as profiling() says
                return self.run(inputs, timeout=timeout)
            return replay.run(context_for_run() if uses_context else context_for_run, inputs)

        uses_context = replay.uses_context
        if communicator.world_size == 1 and (device.type == "cpu" or not uses_context):
            return run_alone
        return run_again

    def _run_body(self, context: RunContext, compiled: bool) -> None:
        """Runs the program's body compiled (no listener sees it) or interpreted."""
        if compiled:
            # A pipelined loop in it runs interpreted; its listeners would see part of a run.
            context.listeners = ()
            self.compiled_program(context.rank).run(context)
            return
        context.run_body(self.program.body)
        for listener in self.listeners:
            listener.finish(context)

    def runs_compiled(self) -> bool:
        """Whether a run now runs the compiled program: the evaluator compiles
        (``compiled``), no listener observes it, and no torch profiler records."""
        return self.compiled and not self.listeners and not profiling()

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

    def has_agreed(self, inputs: Sequence[Any]) -> bool:
        """Whether the ranks already agreed on a run with inputs like ``inputs`` (the next run
        with them starts without the agreement)."""
        return _signature(list(inputs)) in self._agreed

    def has_agreed_any(self) -> bool:
        """Whether the ranks agreed on a run of this evaluator's program (so that, after a
        failure, the peers may be running it rather than agreeing on a first run)."""
        return bool(self._agreed)

    def digest(self) -> str:
        """The program's digest: the SHA-256 of its text (the same on ranks running it)."""
        if self._digest is None:
            self._digest = hashlib.sha256(str(self.program).encode()).hexdigest()
        return self._digest

    @staticmethod
    def _set_timeout(communicator: Communicator, timeout: float | None) -> HostIrError | None:
        """Sets the collective timeout; the error instead of raising it (see _bind_inputs)."""
        try:
            communicator.set_timeout(collective_timeout(timeout))
        except HostIrError as error:
            return error
        return None

    def _bind(
        self,
        context: RunContext,
        inputs: list[Any],
        device: torch.device,
        communicator: Communicator,
    ) -> HostIrError | None:
        """Binds and checks the inputs, or applies what binding inputs of the same signature
        gave before (hostir.run.bindings); the error instead of raising it."""
        signature = self._bindings.signature(inputs, device, communicator)
        binding = self._bindings.get(signature)
        if binding is not None:
            binding.apply(context, self.program.inputs, inputs)
            context.replays = True  # this signature ran before: nothing left to check
            return None
        failure = self._bind_inputs(context, inputs) or self._check_extents(context)
        if failure is None:
            self._bindings.keep(signature, context, self.program.inputs)
        return failure

    def _bind_inputs(self, context: RunContext, inputs: list[Any]) -> HostIrError | None:
        """Binds every input; the first error instead of raising it (the agreement tells
        the other ranks about it before this rank raises it)."""
        if len(inputs) != len(self.program.inputs):
            names = ", ".join(v.name for v in self.program.inputs)
            return InputError(
                f"expected {len(self.program.inputs)} inputs ({names}), got {len(inputs)}"
            )
        try:
            for value, given in zip(self.program.inputs, inputs, strict=True):
                self._bind_input(context, value, given)
        except HostIrError as error:
            return error
        for value in self.program.inputs:
            tensor = context.tensors.get(value.name)
            if isinstance(tensor, torch.Tensor) and not _same_device(tensor.device, context.device):
                return InputError(
                    f"input {value.name} is on {tensor.device}, but this run is on"
                    f" {context.device} (the device of the first tensor input, or the"
                    " evaluator's device): pass every tensor on one device"
                )
        return None

    def _check_extents(self, context: RunContext) -> HostIrError | None:
        """Checks the loops' trip counts and the extents the inputs bound
        (hostir.check.loop_counts, hostir.check.extent_checks); the error instead of raising
        it (see _bind_inputs). Once per binding."""
        if self._loop_counts is None:
            self._loop_counts = LoopCounts(self.program)
        if self._extent_checks is None:
            self._extent_checks = ExtentChecks(self.program)
        try:
            self._loop_counts.check(context.scalars, context.rank)
            self._extent_checks.check(context.scalars, context.rank)
        except HostIrError as error:
            return error
        return None

    def _facts(self, context: RunContext, failure: HostIrError | None) -> RankFacts:
        """What this rank is about to run, for the agreement."""
        if failure is not None:
            return RankFacts.failed(failure, self.digest())
        extents: dict[str, BoundExtent] = {}
        dtypes = []
        for value in self.program.inputs:
            tensor = context.tensors.get(value.name) if isinstance(value, TensorValue) else None
            if tensor is None:
                continue
            dtypes.append((value.name, value.dtype.value))
            for dim, extent in enumerate(value.shape):
                if isinstance(extent, Symbol) and extent.name not in extents:
                    bound = int(context.scalars[extent.name])
                    extents[extent.name] = BoundExtent(extent.name, value.name, dim, bound)
        return RankFacts(
            digest=self.digest(), extents=tuple(extents.values()), dtypes=tuple(dtypes)
        )

    def _prepare(self, communicator: Communicator) -> None:
        """Once per communicator: create every process group in program order (the
        agreement made sure every rank runs this program)."""
        if self._prepared_for is communicator:
            return
        teams = program_teams(self.program)
        communicator.prepare([group for team in teams for group in team.groups])
        self._prepared_for = communicator

    def _bind_input(self, context: RunContext, value: Any, given: Any) -> None:
        if isinstance(value, ScalarInput):
            if isinstance(given, torch.Tensor) or not isinstance(given, int | float | bool):
                raise InputError(
                    f"input {value.name} is a {value.dtype.value} scalar,"
                    f" got {type(given).__name__}"
                )
            context.scalars[value.name] = coerce_scalar(value, given)
            return
        if not context.participates(value):
            context.tensors[value.name] = None
            return
        context.tensors[value.name] = bind_input_tensor(value, given, context.scalars)

    def _output(self, context: RunContext, value: TensorValue) -> torch.Tensor | None:
        """``value``'s tensor on this rank: None only where the rank does not hold it."""
        if value.name not in context.tensors:
            raise EvaluationError(f"output {value.name} was never computed")
        tensor = context.tensors[value.name]
        if tensor is None and context.participates(value):
            mesh = value.sharding.mesh if value.sharding is not None else None
            where = "every rank" if mesh is None else f"mesh {mesh_names(self.program).name(mesh)}"
            raise EvaluationError(
                f"rank {context.rank} holds output {value.name} (it is on {where}), but the"
                f" instruction defining it gave it no value there; expected a tensor"
            )
        return tensor

    def step(self, instruction: Instruction) -> Step:
        """``instruction`` prepared to run (once per instruction; hostir.run.steps)."""
        step = self._steps.get(id(instruction))
        if step is None:
            step = self._steps[id(instruction)] = Step.prepare(
                instruction, HANDLERS[type(instruction)]
            )
        return step

    def run_instruction(self, instruction: Instruction, context: RunContext) -> None:
        """Resolves operands, calls the handler, binds the results."""
        step = self.step(instruction)
        if not step.runs_on(context.rank):
            failure = skipped_failure(instruction, context.rank, context.program)
            if failure is not None:  # this rank holds what it would leave None
                raise failure
            for name in step.defined:
                context.tensors[name] = None
            return
        # Whatever a handler or a listener raises becomes an EvaluationError naming the
        # instruction and rank (HostIrErrors stay what they are): the peers are told of it.
        try:
            operands = step.resolve(context)
            listeners = context.listeners
            for listener in listeners:
                listener.before(instruction, context, operands)
            if profiling():
                with _profiler_range(step.range_name):
                    results = step.handler(context, instruction, operands)
            else:
                results = step.handler(context, instruction, operands)
            tensors = context.tensors
            for index, name in step.binds:
                tensors[name] = results[index]
            if step.posts is not None:
                context.posted[step.posts] = instruction
            for listener in listeners:
                listener.after(instruction, context, operands)
        except Exception as error:
            failure = step_failure(error, instruction, step, context)
            if failure is error:
                raise
            raise failure from error


# ``record_function`` costs microseconds even when nothing records; the fast variant
# gives the same ``hir::<keyword>`` events, and ranges are only opened while profiling.
_profiler_range = getattr(torch._C._profiler, "_RecordFunctionFast", None) or (
    torch.profiler.record_function
)


NOTICE_SLACK_S = 5.0
"""Failures posted this long before a run started still count as its cause (a peer may
fail its first instruction before this rank enters the run)."""


def _with_culprits(
    error: CommunicationError, communicator: Communicator, started: float
) -> CommunicationError:
    """``error``, naming the ranks that posted a failure since this run started (their
    failure is why this rank's communication failed)."""
    culprits = communicator.failures_since(started - NOTICE_SLACK_S)
    if not culprits:
        return error
    rank, message = culprits[0]
    return type(error)(f"{error}; rank {rank} failed first: {message}")


def _signature(inputs: Sequence[Any]) -> tuple:
    """What the agreement is keyed on: each input's kind, local shape and dtype."""
    return tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in inputs
    )


def coerce_scalar(value: ScalarInput, given: int | float | bool) -> int | float | bool:
    """``given`` as a Python value of ``value``'s declared dtype (an int passed for a
    float input becomes a float, so results have the declared dtype)."""
    if value.dtype is DType.BOOL:
        if not isinstance(given, bool):
            raise InputError(f"input {value.name} is a bool scalar, got {given!r}")
        return given
    if value.dtype in (DType.INT64, DType.INT32):
        if isinstance(given, float) and not given.is_integer():
            raise InputError(f"input {value.name} is an {value.dtype.value} scalar, got {given!r}")
        low, high = INT_RANGES[value.dtype]
        if not low <= int(given) <= high:
            raise InputError(
                f"input {value.name} is an {value.dtype.value} scalar, got {given!r}, outside"
                f" its range [{low}, {high}]"
            )
        return int(given)
    try:
        return float(given)
    except OverflowError:  # an int beyond a float's range
        raise InputError(
            f"input {value.name} is a {value.dtype.value} scalar, got an int too large for it"
        ) from None


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` are one device (``cuda`` without an index is the current one)."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _device_of(inputs: Sequence[Any]) -> torch.device:
    for given in inputs:
        if isinstance(given, torch.Tensor):
            return given.device
    return torch.device("cpu")
