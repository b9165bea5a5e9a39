"""``HostIrEvaluator``: runs a host IR program on this rank.

One loop resolves an instruction's operands, calls the instruction's handler
from a dispatch table, and binds the results; handlers never touch the
environment. Every instruction runs inside
``torch.profiler.record_function("hir::<keyword>")``. Listeners (tracing,
race checking, ...) observe each instruction before and after it runs.

An instruction whose output lives on a mesh runs only on that mesh's devices;
elsewhere its output is bound to None.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hostir.analysis.pipeline_stages import is_pipelined
from hostir.check.extent_checks import ExtentChecks
from hostir.check.verify import verify_located
from hostir.comm.agreement import BoundExtent, RankFacts, agree
from hostir.comm.communicator import Communicator
from hostir.comm.rank_text import describe_group
from hostir.comm.run_guard import occupying_world
from hostir.comm.timeouts import collective_timeout
from hostir.comm.world import default_communicator
from hostir.errors import (
    CommunicationError,
    DisagreementError,
    EvaluationError,
    ExtentError,
    HostIrError,
    InputError,
    VerifyError,
)
from hostir.ir.catalog import COMMUNICATING, declaration_of
from hostir.ir.communications import Wait
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import INT_RANGES, DType
from hostir.ir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    PipelineStage,
    ShardByStream,
    defined_values,
    keyword,
)
from hostir.ir.program_info import check_meshes_fit, program_teams, walk_instructions
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Symbol, evaluate_scalar
from hostir.ir.sharding import Mesh
from hostir.ir.values import RequestValue, StreamValue, TensorValue
from hostir.run.arguments import (
    checked_communicator,
    checked_device,
    checked_listeners,
    checked_program,
    run_inputs,
)
from hostir.run.bindings import Bindings
from hostir.run.communication_handlers import COMMUNICATION_HANDLERS
from hostir.run.compute import COMPUTE_HANDLERS
from hostir.run.context import Listener, RunContext
from hostir.run.inputs import bind_input_tensor
from hostir.run.pipelined_loops import pipelining, run_pipelined
from hostir.run.stream_handlers import STREAM_HANDLERS
from hostir.run.stream_pool import MAIN, StreamPool, stream_count

Handler = Callable[[RunContext, Any, dict[str, Any]], Sequence[Any]]


def _run_allocate(context: RunContext, instruction: Allocate, operands: dict) -> list:
    out = instruction.out
    shape = context.local_shape(out)
    return [torch.empty(shape, dtype=out.dtype.to_torch(), device=context.device)]


def _run_deallocate(context: RunContext, instruction: Deallocate, operands: dict) -> list:
    # The operand is not resolved (see _UNRESOLVED): freeing needs only the name.
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


def _compute_handler(run: Callable) -> Handler:
    def handle(context: RunContext, instruction: Any, operands: dict) -> list:
        shape = context.local_shape(instruction.out)
        result = run(instruction, operands, shape)
        if list(result.shape) != shape:
            # Operands that disagree with their declared extents (two symbolic extents
            # unified at definition, say) must not yield a silently different tensor.
            raise EvaluationError(
                f"{keyword(instruction)} produced a tensor of shape {list(result.shape)}, but"
                f" {instruction.out.name} is declared with local shape {shape} on rank"
                f" {context.rank}"
            )
        return [result]

    return handle


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
    **{cls: _compute_handler(run) for cls, run in COMPUTE_HANDLERS.items()},
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
        self._digest: str | None = None
        self._extent_checks: ExtentChecks | None = None  # built at the first run
        self._bindings = Bindings()  # what binding inputs gave, per input signature
        self._fits: set[int] = set()  # world sizes every mesh of the program fits in
        self._steps: dict[int, _Step] = {}  # by id: the program holds the instructions alive
        self._stream_pools: dict[torch.device, StreamPool] = {}
        self.streams = stream_count(streams)  # the pool's size per device
        self.pipeline = pipelining(pipeline)

    def stream_pool(self, device: torch.device) -> StreamPool:
        """This evaluator's stream pool for ``device`` (CUDA streams are reused across runs)."""
        if device not in self._stream_pools:
            self._stream_pools[device] = StreamPool(device, self.streams)
        return self._stream_pools[device]

    def run(
        self, inputs: Sequence[Any], *, timeout: float | None = None
    ) -> list[torch.Tensor | None]:
        """Binds ``inputs`` (this rank's shards), runs the program, returns this rank's outputs.

        In a world of more than one rank, the first run of each input signature starts
        with the agreement (hostir.comm.agreement): the ranks compare the program, the
        extents their inputs bind and their dtypes, and whether one failed before
        communicating, and all raise the same named error if they differ.
        ``timeout`` (seconds) bounds every wait for peers (default: ``HOSTIR_TIMEOUT``,
        else hostir.comm.timeouts.DEFAULT_TIMEOUT_S). ConcurrentRunError if another thread runs
        a program on the same world of more than one rank (see the class docstring).
        """
        inputs, inputs_error = run_inputs(inputs)  # the agreement tells the peers of it
        device = self.device or _device_of(inputs)
        communicator = self.communicator or default_communicator(device.type == "cuda")
        # Before anything communicates; left when the run ends, however it ends.
        alone = self._listening if self.listeners else None
        with occupying_world(communicator, self.digest, alone):
            return self._run(inputs, inputs_error, device, communicator, timeout)

    def _run(
        self,
        inputs: list[Any],
        inputs_error: HostIrError | None,
        device: torch.device,
        communicator: Communicator,
        timeout: float | None,
    ) -> list[torch.Tensor | None]:
        """The run, once its world is held (see :meth:`run`)."""
        if communicator.world_size not in self._fits:  # the same verdict everywhere
            check_meshes_fit(self.program, communicator.world_size)
            self._fits.add(communicator.world_size)
        context = RunContext(self, self.program, communicator, device)
        context.pipelined = self.pipeline
        context.stream_pool.start_run()  # "main" is the stream this run starts on
        failure = (
            inputs_error
            or self._set_timeout(communicator, timeout)
            or self._bind(context, inputs, device, communicator)
        )
        if communicator.world_size > 1:
            signature = _signature(inputs)
            if signature not in self._agreed:
                agree(communicator, self._facts(context, failure))
                if failure is None:
                    self._agreed.add(signature)
            elif failure is not None:  # no agreement this time: the peers learn it so
                communicator.post_failure(f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        started = time.time()
        try:
            self._prepare(communicator)
            context.run_body(self.program.body)
            for listener in self.listeners:
                listener.finish(context)
        except CommunicationError as error:
            raise _with_culprits(error, communicator, started) from error.__cause__
        except Exception as error:
            if communicator.world_size > 1:  # the peers waiting for this rank name it
                communicator.post_failure(f"{type(error).__name__}: {error}")
            raise
        finally:
            if device.type == "cuda" and context.current_stream != MAIN:
                torch.cuda.set_stream(context.stream_pool.get(MAIN))
        return [self._output(context, value) for value in self.program.outputs]

    def has_agreed(self, inputs: Sequence[Any]) -> bool:
        """Whether the ranks already agreed on a run with inputs like ``inputs`` (the next run
        with them starts without the agreement)."""
        return _signature(list(inputs)) in self._agreed

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
        """Checks the extents the inputs bound (hostir.check.extent_checks); the error instead of
        raising it (see _bind_inputs). Once per binding."""
        if self._extent_checks is None:
            self._extent_checks = ExtentChecks(self.program)
        try:
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
        if value.name not in context.tensors:
            raise EvaluationError(f"output {value.name} was never computed")
        return context.tensors[value.name]

    def run_instruction(self, instruction: Instruction, context: RunContext) -> None:
        """Resolves operands, calls the handler, binds the results."""
        step = self._steps.get(id(instruction))
        if step is None:
            step = self._steps[id(instruction)] = _Step.prepare(instruction)
        if not step.runs_on(context.rank):
            for name in step.defined:
                context.tensors[name] = None
            return
        # Whatever a handler or a listener raises becomes an EvaluationError naming the
        # instruction and rank (HostIrErrors stay what they are): the peers are told of it.
        try:
            operands = step.resolve(context)
            for listener in self.listeners:
                listener.before(instruction, context, operands)
            if _profiling():
                with _profiler_range(step.range_name):
                    results = step.handler(context, instruction, operands)
            else:
                results = step.handler(context, instruction, operands)
            tensors = context.tensors
            for index, name in step.binds:
                tensors[name] = results[index]
            if step.posts is not None:
                context.posted[step.posts] = instruction
            for listener in self.listeners:
                listener.after(instruction, context, operands)
        except Exception as error:
            failure = _failure(error, instruction, step, context)
            if failure is error:
                raise
            raise failure from error


def _failure(
    error: Exception, instruction: Instruction, step: _Step, context: RunContext
) -> Exception:
    """What a failed handler raises: HostIrErrors as they are (communication errors prefixed
    with the communication), anything else as an EvaluationError naming the instruction."""
    if isinstance(error, CommunicationError) and not isinstance(error, DisagreementError):
        return type(error)(f"{_describe_communication(instruction, context)}: {error}")
    if isinstance(error, HostIrError):
        return error
    return EvaluationError(
        f"{keyword(instruction)} {step.describe()} failed on rank {context.rank}:"
        f" {type(error).__name__}: {error}"
    )


def _profiling() -> bool:
    """Whether a torch profiler is recording (then every instruction gets a range)."""
    return torch.autograd.profiler._is_profiler_enabled


# ``record_function`` costs microseconds even when nothing records; the fast variant
# gives the same ``hir::<keyword>`` events, and ranges are only opened while profiling.
_profiler_range = getattr(torch._C._profiler, "_RecordFunctionFast", None) or (
    torch.profiler.record_function
)


class _Step:
    """An instruction prepared once for fast repeated runs: its handler, the devices
    that run it, how to resolve each operand, and which results to bind."""

    __slots__ = (
        "handler",
        "mesh",
        "rank",
        "runs",
        "defined",
        "binds",
        "range_name",
        "operands",
        "optional",
        "written",
        "posts",
    )

    @staticmethod
    def prepare(instruction: Instruction) -> _Step:
        step = _Step()
        step.handler = HANDLERS[type(instruction)]
        step.mesh = _placement(instruction)
        step.rank, step.runs = -1, True
        outs = defined_values(instruction)
        step.defined = [value.name for value in outs]
        step.binds = [
            (index, getattr(instruction, name).name)
            for index, name in enumerate(instruction.OUTS)
            if getattr(instruction, name).name in step.defined
        ]
        step.range_name = f"hir::{keyword(instruction)}"
        out = getattr(instruction, "out", None)
        step.written = out.name if getattr(instruction, "preallocated", False) else None
        names = [] if type(instruction) in _UNRESOLVED else list(instruction.INS)
        if getattr(instruction, "preallocated", False):
            names.append("out")
        step.operands = [(name, getattr(instruction, name)) for name in names]
        # Communications run on ranks that may not hold their source (a broadcast's
        # receivers); their handlers check what each rank needs.
        communicates = declaration_of(type(instruction)).kind in COMMUNICATING
        step.optional = communicates or isinstance(instruction, Wait)
        request = getattr(instruction, "request", None)
        step.posts = request.name if communicates and request is not None else None
        return step

    def runs_on(self, rank: int) -> bool:
        """Whether ``rank`` runs the instruction (it is on its mesh); remembered per rank."""
        if self.mesh is None:
            return True
        if rank != self.rank:
            self.rank, self.runs = rank, self.mesh.contains(rank)
        return self.runs

    def describe(self) -> str:
        """``defining T3`` or ``into T2_c``, for error messages."""
        if self.written is not None:
            return f"into {self.written}"
        return f"defining {', '.join(self.defined) or '-'}"

    def resolve(self, context: RunContext) -> dict[str, Any]:
        """The operands' values on this rank now."""
        resolved = {}
        for name, operand in self.operands:
            if isinstance(operand, Const):
                resolved[name] = operand.value
            else:
                resolved[name] = _resolve(operand, context, self.optional)
        return resolved


_UNRESOLVED = frozenset({Deallocate})
"""Instructions whose handlers need only names, not bound values."""


def _describe_communication(instruction: Instruction, context: RunContext) -> str:
    """``wait R2 (Allreduce defining T3 over axes (x) of a [2, 2] mesh, group ranks 0-1)``,
    for communication errors (short at any mesh size)."""
    if isinstance(instruction, Wait):
        posted = context.posted.get(instruction.request.name)
        inner = f" ({_describe_posting(posted, context)})" if posted is not None else ""
        return f"wait {instruction.request.name}{inner}"
    return _describe_posting(instruction, context)


def _describe_posting(instruction: Instruction, context: RunContext) -> str:
    out = getattr(instruction, "out", None)
    text = keyword(instruction)
    if out is not None:
        text += f" {'into' if getattr(instruction, 'preallocated', False) else 'defining'}"
        text += f" {out.name}"
    team = getattr(instruction, "team", None)
    if team is not None:
        axes = ", ".join(axis.value for axis in team.axes)
        text += f" over axes ({axes}) of a {list(team.mesh.shape)} mesh"
        group = team.group_of(context.rank)
        if group is not None:
            text += f", group {describe_group(group)}"
    return text


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


def _placement(instruction: Instruction) -> Mesh | None:
    """The mesh whose devices run ``instruction`` (None: every rank)."""
    team = getattr(instruction, "team", None)
    if team is not None:
        return team.mesh
    for name in instruction.OUTS + ("tensor",):
        value = getattr(instruction, name, None)
        if isinstance(value, TensorValue):
            return value.sharding.mesh if value.sharding is not None else None
    return None


def _resolve(operand: Any, context: RunContext, optional: bool = False) -> Any:
    if operand is None:
        return None
    if isinstance(operand, StreamValue):
        if operand.index is not None:
            index = int(evaluate_scalar(operand.index, context.scalars))
            return context.stream_pool.stream_id(index)  # iterations share the pool round-robin
        return context.tensors[operand.name]
    if isinstance(operand, TensorValue | RequestValue):
        if operand.name not in context.tensors:
            raise EvaluationError(f"{operand.name} is used before it is defined")
        tensor = context.tensors[operand.name]
        if tensor is None and not optional:
            raise EvaluationError(
                f"tensor {operand.name} is not held by rank {context.rank}"
                " (it lives on a mesh without this rank)"
            )
        return tensor
    if isinstance(operand, Const | Symbol | MeshCoordinate | BinaryExpr):
        return evaluate_scalar(operand, context.scalars)
    return operand


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
