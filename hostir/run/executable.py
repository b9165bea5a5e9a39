"""The one run path: a program prepared for one input signature on this rank.

Every entry point runs programs through here: ``HostIrEvaluator.run`` (so a program
parsed from text or JSON, and the scripts ``hostir run`` launches) and
``FusionDefinition.execute``. The first run of an input signature
(``hostir.run.signature.call_key``) is :func:`prepare`: it checks the arguments, binds
and checks the inputs (``hostir.run.bindings``), agrees with the other ranks where
that is due (``hostir.run.agreements``: a failure before communicating is told to them
there), runs the program (compiled, or interpreted where listeners observe it) or
captures it as a CUDA graph (``hostir.run.cuda_graphs``), and makes the self-checks
(``hostir.run.self_checks``). It returns an :class:`Executable`, which the caller keeps
under the signature's key.

An executable's ``call`` is what a later call with that key runs, and nothing is checked
or bound again: where it can, the *prepared call*, which applies the kept binding and
runs the program's replay (``hostir.run.replay``; at world size 1 on the CPU that is the
replay's function and one test for a profiler); with a CUDA graph, the graph's replay;
otherwise :meth:`Executable.run`, a whole run with the binding applied. Under a torch
profiler the interpreter runs instead, its ``hir::`` range per instruction. The self-checks
wrap whichever it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from hostir.comm.communicator import Communicator
from hostir.comm.run_guard import occupying_world
from hostir.comm.timeouts import collective_timeout
from hostir.comm.world import default_communicator
from hostir.errors import CommunicationError, EvaluationError, HostIrError
from hostir.ir.mesh_names import mesh_names
from hostir.ir.values import TensorValue
from hostir.run.agreements import agree_on_run, run_facts
from hostir.run.arguments import run_inputs
from hostir.run.bindings import Binding, device_of
from hostir.run.compiled_runs import compiling
from hostir.run.context import RunContext
from hostir.run.cuda_graph_checks import check_capturable, graphing
from hostir.run.cuda_graphs import GraphedProgram
from hostir.run.self_checks import check_run, checked_call, draws_for
from hostir.run.signature import agreement_kinds
from hostir.run.stream_pool import MAIN

Call = Callable[[Sequence[Any]], list]
"""A run of a signature's inputs, returning the outputs."""


class Executable:
    """``evaluator``'s program prepared for one input signature on this rank, over
    ``communicator`` on ``device``: the ``binding`` the signature's first run made, the
    collective ``timeout`` (read when it was prepared), and :attr:`call`, what a later
    call of the signature runs (see the module docstring)."""

    def __init__(
        self,
        evaluator: Any,
        communicator: Communicator,
        device: torch.device,
        binding: Binding,
        timeout: float | None,
    ) -> None:
        self.evaluator = evaluator
        self.program = evaluator.program
        self.checks = evaluator.checks
        self.pipelines = evaluator.pipelines()  # whether a loop of it runs pipelined
        self.communicator = communicator
        self.device = device
        self.binding = binding
        self.timeout = timeout
        self.limit = collective_timeout(timeout)
        self.graph: GraphedProgram | None = None
        self.ran = False  # a run of the signature succeeded: later runs may replay
        self.call: Call = self._run_again

    def run(self, inputs: Sequence[Any], *, compiled: bool) -> list:
        """A run of this signature's ``inputs``, compiled or interpreted (then the
        evaluator's listeners observe it), with the binding applied: nothing is bound or
        agreed again, and once a run succeeded, nothing checked again (a compiled run
        replays)."""
        evaluator = self.evaluator
        alone = evaluator.listening if evaluator.run_listeners else None
        with occupying_world(self.communicator, evaluator.digest, alone):
            self.communicator.set_timeout(self.limit)
            context = evaluator.new_context(self.communicator, self.device)
            self.binding.apply(context, self.program.inputs, inputs)
            context.replays = self.ran  # the signature ran before: nothing left to check
            outputs = self.guarded(context, lambda: self.body(context, inputs, compiled))
        self.ran = True
        return outputs

    def _run_again(self, inputs: Sequence[Any]) -> list:
        """:meth:`run`, the way the evaluator runs now (interpreted under a profiler)."""
        return self.run(inputs, compiled=self.evaluator.runs_compiled())

    def body(self, context: RunContext, inputs: Sequence[Any], compiled: bool) -> list | None:
        """Runs the program's body in ``context``: the replay where the signature ran
        before and runs are compiled, else the compiled program or the interpreter. The
        outputs where the replay ran, else None (they are in ``context``)."""
        evaluator = self.evaluator
        evaluator.prepare_groups(context.communicator)
        if compiled and context.replays:
            replay = evaluator.replay_program(context.rank, context.device.type == "cpu")
            if replay is not None:
                return replay.run(context, inputs)
        evaluator.run_body(context, compiled)
        return None

    def guarded(self, context: RunContext, body: Callable[[], list | None]) -> list:
        """Runs ``body`` (see :meth:`body`), turning its failure into what the peers and
        the user must see: a communication error names the ranks that failed first; any
        failure in a world of several ranks is posted, so peers waiting for this rank
        name it. Returns the outputs."""
        communicator = context.communicator
        started = time.time() if communicator.world_size > 1 else 0.0
        try:
            outputs = body()
            communicator.run_finished(context)
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

    def prepare_call(self) -> None:
        """Sets :attr:`call` after a first run that succeeded: the prepared call where
        runs are compiled (made at the next call: a signature run once never pays for its
        replay), else :meth:`run`; the self-checks around either."""
        if self.graph is not None:
            return  # set by capture
        evaluator = self.evaluator
        if evaluator.compiled and (not evaluator.listeners or self.checks.compiled):
            self.call = self._first_prepared_call
        elif self.checks.of_runs():
            self.call = self._checked_run_again

    def _first_prepared_call(self, inputs: Sequence[Any]) -> list:
        """Makes the prepared call (the replay is generated now), keeps it as :attr:`call`
        and runs it."""
        prepared = self._prepared_call()
        checked = self.checks.of_runs()
        if prepared is None:
            self.call = self._checked_run_again if checked else self._run_again
        else:
            self.call = checked_call(self, prepared, True) if checked else prepared
        return self.call(inputs)

    def _checked_run_again(self, inputs: Sequence[Any]) -> list:
        compiled = self.evaluator.runs_compiled()
        draws = draws_for(self.checks)
        outputs = self.run(inputs, compiled=compiled)
        check_run(self, inputs, outputs, draws, compiled)
        return outputs

    def _prepared_call(self) -> Call | None:
        """The call that runs the replay with the binding applied and nothing else (see
        the module docstring); None where the program has no replay."""
        evaluator, communicator, device = self.evaluator, self.communicator, self.device
        replay = evaluator.replay_program(communicator.rank, device.type == "cpu")
        if replay is None:
            return None
        binding, limit, run_again = self.binding, self.limit, self._run_again

        def context_for_run() -> RunContext:
            context = evaluator.new_context(communicator, device, listening=False)
            context.scalars.update(binding.scalars)
            context.shape_cache = binding.shapes
            return context

        def run_alone(inputs: Sequence[Any]) -> list:
            # guarded adds nothing here: no peer to tell or name, no stream to restore (on
            # the CPU there are none; on CUDA a replay that switches streams uses its
            # context, and runs run_replay).
            if _profiler._is_profiler_enabled:  # the interpreter opens a range per instruction
                return run_again(inputs)
            return replay.run(context_for_run() if uses_context else context_for_run, inputs)

        def run_replay(inputs: Sequence[Any]) -> list:
            if _profiler._is_profiler_enabled:
                return run_again(inputs)
            context = context_for_run()
            if communicator.world_size == 1:
                return self.guarded(context, lambda: replay.run(context, inputs))
            with occupying_world(communicator, evaluator.digest, None):
                communicator.set_timeout(limit)
                return self.guarded(context, lambda: replay.run(context, inputs))

        uses_context = replay.uses_context
        if communicator.world_size == 1 and (device.type == "cpu" or not uses_context):
            return run_alone
        return run_replay

    def capture(self, inputs: list[Any]) -> list:
        """Captures the signature's run as a CUDA graph (warm-up runs, the first of them
        the compiled program checking every result's shape, then the capture of a
        compiled run, a replay: hostir.run.cuda_graphs) and replays it on ``inputs``;
        later calls replay the graph."""
        names = [value.name for value in self.program.inputs]
        graph = GraphedProgram(
            lambda given: self.run(given, compiled=True), inputs, self.device, names=names
        )
        self.graph = graph
        tensors_only = all(isinstance(given, torch.Tensor) for given in inputs)
        # The caller's key compares every input's type, shape, dtype and device (and a
        # scalar's value): a replay of tensors alone need not check them again.
        self.call = graph.replay_known if tensors_only else graph.replay
        return graph.replay(inputs)


def prepare(
    evaluator: Any,
    inputs: Any,
    *,
    timeout: float | None = None,
    compiled: bool | None = None,
    cuda_graph: bool | None = None,
) -> tuple[Executable, list]:
    """The first run of ``inputs``' signature on ``evaluator`` (a ``HostIrEvaluator``; see
    the module docstring): the executable prepared for the signature and this run's
    outputs. ``compiled`` (None: as the evaluator runs) is this run's way; ``cuda_graph``
    (None: ``HOSTIR_CUDA_GRAPH``) captures it. Raises what the run raises."""
    graphed = graphing(cuda_graph)
    compiled = evaluator.runs_compiled() if compiled is None else compiling(compiled)
    inputs, inputs_error = run_inputs(inputs)  # the agreement tells the peers of it
    device = evaluator.device or device_of(inputs)
    communicator = evaluator.communicator or default_communicator(device.type == "cuda")
    draws = None if graphed else draws_for(evaluator.checks)
    # Before anything communicates; left when the run ends, however it ends.
    alone = evaluator.listening if evaluator.run_listeners else None
    with occupying_world(communicator, evaluator.digest, alone):
        evaluator.check_fits(communicator.world_size)  # the same verdict everywhere
        context = evaluator.new_context(communicator, device)
        failure = (
            inputs_error
            or _timeout_problem(communicator, timeout)
            or (_capture_problem(evaluator, inputs, communicator) if graphed else None)
            or evaluator.input_checks.bind(context, inputs)
        )
        if communicator.world_size > 1:
            scalars = evaluator.extent_scalars
            facts = run_facts(evaluator.program, context, evaluator.digest(), failure, scalars)
            kinds, log = agreement_kinds(inputs, scalars), evaluator.agreements
            agree_on_run(communicator, evaluator.agreed_kinds, log, kinds, facts, failure)
        if failure is not None:
            raise failure
        binding = Binding(context, evaluator.program.inputs)
        executable = Executable(evaluator, communicator, device, binding, timeout)
        if not graphed:
            body = executable.body
            outputs = executable.guarded(context, lambda: body(context, inputs, compiled))
            executable.ran = True
    if graphed:
        return executable, executable.capture(inputs)
    check_run(executable, inputs, outputs, draws, compiled)
    executable.prepare_call()
    return executable, outputs


def _timeout_problem(communicator: Communicator, timeout: float | None) -> HostIrError | None:
    """Sets the collective timeout; the error instead of raising it (see prepare)."""
    try:
        communicator.set_timeout(collective_timeout(timeout))
    except HostIrError as error:
        return error
    return None


def _capture_problem(evaluator: Any, inputs: list, communicator: Communicator) -> Exception | None:
    """Why the run cannot be captured as a CUDA graph (CudaGraphError), or None."""
    try:
        check_capturable(evaluator, inputs, communicator)
    except HostIrError as error:
        return error
    return None


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
