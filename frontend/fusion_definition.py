"""``FusionDefinition``: the nvFuser-style entry point.

Define inputs and ops inside ``with FusionDefinition() as fd:``, schedule the
tensors (meshes, splits, parallelization), then ``fd.execute(local_inputs)``.
Execution always goes through host IR: the fusion is lowered once per input
signature and the program is run by ``hostir.HostIrEvaluator`` (the programs and
evaluators of the ``hostir.run.bindings.MAX_SIGNATURES`` most recently used signatures
are kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from frontend.arguments import (
    MAX_EXTENT,
    as_list,
    check_bool,
    contiguity_flags,
    int_list,
    is_int,
    scalar_constant,
    scalar_dtype,
    shown,
)
from frontend.errors import DefinitionError, InputError
from frontend.execute_args import (
    check_execute_arguments,
    check_scalar_inputs,
    integer_limits,
    nvfuser_keywords,
    uses_cuda,
)
from frontend.exprs import ScalarVal
from frontend.fusion import Fusion
from frontend.iter_domain import IterDomain, IterType
from frontend.ops import Ops
from frontend.sharding import validate_schedule
from frontend.strides import builder_sizes, stride_order_of, tensor_descriptor
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, HostIrContainer, HostIrEvaluator, default_communicator
from hostir.analysis.pipeline_stages import has_pipelined_loop
from hostir.comm.agreement import RankFacts, agree, restate
from hostir.comm.timeouts import collective_timeout
from hostir.errors import HostIrError, SettingError
from hostir.ir.program_info import check_meshes_fit
from hostir.run.bindings import MAX_SIGNATURES, RecentlyUsed, call_key
from hostir.run.compiled_runs import check_compiled_outputs, compiled_checking_enabled
from hostir.run.cuda_graphs import GraphedProgram, check_capturable, graphing
from hostir.run.inputs import bind_input_tensor
from hostir.run.pipelined_loops import check_same_outputs, pipeline_checking_enabled
from hostir.run.race_checker import RaceChecker, race_checking_enabled
from hostir.settings import choice_setting
from hostir.text.round_trip import check_round_trip, round_trip_checking_enabled


class FusionDefinition:
    """Records a fusion, then lowers and runs it (``execute``) on every rank."""

    def __init__(self) -> None:
        self._fusion = Fusion()
        self.ops = Ops(self._fusion)
        self._finalized = False
        self._integer_limits: dict[str, list] = {}  # set when the definition is finished
        # The most recently used MAX_SIGNATURES signatures' programs, evaluators and graphs
        # (hostir.run.bindings.RecentlyUsed). Dropping one is safe on several ranks: the
        # ranks drop the same signatures when their calls repeat the same signatures in the
        # same order, which the agreement (once per evaluator) already needs.
        self._programs: RecentlyUsed[HostIrContainer] = RecentlyUsed()
        self._evaluators: RecentlyUsed[HostIrEvaluator] = RecentlyUsed()
        self._prepared_calls: dict[tuple, Any] = {}  # by call_key: see execute
        self._last_call: tuple[tuple, Any] | None = None  # the latest one run, with its key
        self._graphs: RecentlyUsed[GraphedProgram] = RecentlyUsed()  # by the evaluator's key
        self._last_program: tuple[int, HostIrContainer] | None = None  # (schedule version, it)
        self.lowering_count = 0
        """How many times this definition was lowered (once per input signature)."""

    # ----- context -----
    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._finalize()

    def _finalize(self) -> None:
        if not self._fusion.outputs():
            raise DefinitionError("the fusion has no outputs; call fd.add_output(tensor)")
        self._finalized = True
        self._fusion.finished = True
        self._integer_limits = integer_limits(self._fusion)

    @property
    def fusion(self) -> Fusion:
        """The recorded fusion (``inputs()``, ``outputs()``, printable)."""
        return self._fusion

    # ----- definition -----
    def define_tensor(
        self,
        shape: Sequence[int] | None = None,
        contiguity: bool | Sequence[bool | None] | None = None,
        dtype: DataType | torch.dtype = DataType.Float,
        is_cpu: bool = False,
        stride_order: Sequence[int] | None = None,
        *,
        sizes: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        static_sizes: bool = False,
    ) -> TensorView:
        """A fusion input of global ``shape`` (-1: symbolic extent, 1: broadcast), with
        nvFuser's keywords and order: ``contiguity`` (one flag or one per dim, None for a
        broadcast dim; nvFuser gives them in allocation order), ``dtype``, ``is_cpu`` (a CPU
        scalar tensor of shape ``[]``, such as an attention seed or offset) and
        ``stride_order`` (dim ``i`` is ``rank - 1 - stride_order[i]``-th outermost).

        Or nvFuser's other form, ``define_tensor(sizes=..., strides=..., dtype=...,
        static_sizes=False, is_cpu=False)``: contiguity and stride order are read from the
        strides; every size but 1 is symbolic unless ``static_sizes``.

        The layout is recorded, not enforced: hostir runs torch ops, which take any strides
        (docs/frontend_api.md).
        """
        self._check_open("define_tensor")
        is_cpu = check_bool(DefinitionError, "define_tensor", "is_cpu", is_cpu)
        static_sizes = check_bool(DefinitionError, "define_tensor", "static_sizes", static_sizes)
        if sizes is not None or strides is not None:
            shape, contiguity, stride_order = _from_strides(
                shape, contiguity, stride_order, sizes, strides, static_sizes
            )
        elif static_sizes:
            raise DefinitionError(
                "define_tensor: static_sizes goes with sizes and strides; with shape, give -1"
                " for a symbolic extent"
            )
        shape = as_list(DefinitionError, "define_tensor", "shape", shape, "ints")
        if is_cpu and shape:
            raise DefinitionError(
                f"define_tensor: is_cpu=True is for a CPU scalar tensor of shape [] (a seed or"
                f" an offset), got shape {shown(shape)}: a CPU tensor with dims is not"
                " supported (nvFuser refuses it too)"
            )
        axes = []
        for dim, size in enumerate(shape):
            if not is_int(size) or not (size == -1 or 1 <= size <= MAX_EXTENT):
                raise DefinitionError(
                    f"define_tensor: dim {dim} of shape {shown(shape)} must be a positive int"
                    f" (at most {MAX_EXTENT}) or -1"
                )
            if size == -1:
                axes.append(IterDomain(self._fusion.new_symbol()))
            else:
                iter_type = IterType.BROADCAST if size == 1 else IterType.ITERATION
                axes.append(IterDomain(Const(value=size), iter_type))
        dtype = DataType.of(dtype)
        flags = contiguity_flags(DefinitionError, "define_tensor", contiguity, len(shape))
        order = stride_order_of(len(shape), stride_order)
        tv = self._fusion.new_tensor(dtype, axes)
        tv.contiguity = flags
        tv.stride_order = order
        tv.is_cpu = is_cpu
        self._fusion.add_input(tv)
        return tv

    def from_pytorch(self, tensor: torch.Tensor, static_sizes: bool = False) -> TensorView:
        """A fusion input shaped like ``tensor``, as nvFuser's ``fd.from_pytorch``: its
        dtype, its layout (read from its strides), every size but 1 symbolic unless
        ``static_sizes``; a 0-dim CPU tensor is a CPU scalar (``is_cpu``). Unlike nvFuser, a
        CPU tensor with dims is accepted: hostir runs on CPU ranks too."""
        self._check_open("from_pytorch")
        if not isinstance(tensor, torch.Tensor):
            raise DefinitionError(f"from_pytorch: expected a torch.Tensor, got {shown(tensor)}")
        return self.define_tensor(
            sizes=tensor.size(),
            strides=tensor.stride(),
            dtype=DataType.of(tensor.dtype),
            static_sizes=static_sizes,
            is_cpu=tensor.device.type == "cpu" and tensor.ndim == 0,
        )

    def define_scalar(
        self,
        value: int | float | bool | DataType | torch.dtype | None = None,
        dtype: DataType | torch.dtype | None = None,
    ) -> ScalarVal:
        """A scalar: a constant if ``value`` is given, else an input bound at execute.

        Without ``dtype`` it is the dtype of ``value`` (bool: Bool, int: Int, float or
        None: Double). A constant must be exact in its dtype: 1.5 as an Int, or 2**40 as an
        Int32, is refused (it would be truncated or wrap around); floats may be inf or nan.
        As in nvFuser, ``define_scalar(DataType.Int)`` (a dtype alone) is an input of that
        dtype.
        """
        self._check_open("define_scalar")
        if isinstance(value, DataType | torch.dtype) and dtype is None:
            value, dtype = None, value  # nvFuser's define_scalar(dtype) form
        dtype = scalar_dtype(value, dtype)
        if value is not None:
            value = scalar_constant(value, dtype)
        scalar = self._fusion.new_scalar(dtype, value)
        if value is None:
            self._fusion.add_input(scalar)
        return scalar

    def add_output(self, tv: TensorView) -> None:
        """Makes ``tv`` an output of the fusion."""
        self._check_open("add_output")
        if isinstance(tv, TensorView) and tv.fusion is not self._fusion:
            owner = tv.fusion.describe() if tv.fusion is not None else "no FusionDefinition"
            raise DefinitionError(
                f"add_output: {tv.name} is not a tensor of this fusion ({self._fusion.describe()})"
                f": it belongs to another FusionDefinition ({owner})"
            )
        if not isinstance(tv, TensorView):
            raise DefinitionError(f"add_output: {shown(tv)} is not a tensor of this fusion")
        self._fusion.add_output(tv)

    def _check_open(self, method: str) -> None:
        if self._finalized:
            raise DefinitionError(f"{method}: the fusion definition is already finished")

    # ----- lowering and execution -----
    def host_ir(self, world_size: int | None = None) -> HostIrContainer:
        """The host IR program ``execute`` runs: the last one run if the schedule has not
        changed since, else a fresh lowering; with ``world_size``, checked to fit a world of
        that many ranks."""
        if world_size is not None and (not is_int(world_size) or world_size < 1):
            raise SettingError(
                f"host_ir: world_size must be a positive int (or None), got {shown(world_size)}"
            )
        version = self._fusion.schedule.version
        if self._last_program is None or self._last_program[0] != version:
            self._last_program = (version, self._lower())
        program = self._last_program[1]
        if world_size is not None:
            check_meshes_fit(program, world_size)
        return program

    @nvfuser_keywords  # nvFuser's keywords; any other refused by name
    def execute(
        self,
        inputs: Sequence[Any],
        *,
        _enable_options: Sequence[str] = (),
        _disable_options: Sequence[str] = (),
        device: torch.device | str | None = None,
        timeout: float | None = None,
        cuda_graph: bool | None = None,
    ) -> list[torch.Tensor | None]:
        """Runs the fusion on this rank's local shards; returns this rank's output shards.

        The fusion is lowered once per input signature and schedule: changing the
        schedule after an execute lowers it again. The programs, evaluators and CUDA
        graphs of the 64 most recently used signatures are kept
        (hostir.run.bindings.MAX_SIGNATURES); a signature dropped is lowered and prepared
        again when it comes back. ``timeout`` (seconds) bounds every wait for other ranks
        (default: ``HOSTIR_TIMEOUT``, else five minutes); see docs/reliability.md.

        A call with tensor inputs of a signature that already ran (their types, shapes,
        dtypes and devices, the schedule and the default process group unchanged; no
        ``device``, ``timeout`` or options) runs the prepared call kept for it
        (``HostIrEvaluator.prepared_call``): no argument checks, no binding, no
        settings read (they were read when the signature was prepared; see
        docs/benchmarks.md, "Host cost").

        ``cuda_graph`` (default ``HOSTIR_CUDA_GRAPH``, else False): capture the run once
        per input signature as a CUDA graph and replay it (hostir.run.cuda_graphs; inputs
        are copied in, outputs are fresh tensors; docs/cuda_graphs.md). CudaGraphError,
        naming why, where the run cannot be captured: no CUDA, an input on the CPU, gloo
        between ranks, listeners.
        """
        if device is None and timeout is None and not _enable_options and not _disable_options:
            key = call_key(inputs, self._fusion.schedule.version, cuda_graph)
            last = self._last_call  # the same signature again: compared, not hashed
            if last is not None and last[0] == key:
                return last[1](inputs)
            again = self._prepared_calls.get(key)
            if again is not None:
                self._last_call = (key, again)
                return again(inputs)
        communicator = default_communicator(uses_cuda(inputs))
        # Until the inputs are known to be fine: whether the peers are about to agree on a
        # first run (see _tell_peers), as when this definition has never run.
        first = not self._evaluators
        try:
            checked = check_execute_arguments(
                inputs, device, timeout, _enable_options, _disable_options
            )
            inputs, device = checked.inputs, checked.device
            graphed = graphing(cuda_graph)
            key = (
                self._fusion.schedule.version,
                tuple(_signature(x) for x in inputs),
                str(device),
            )
            known = self._evaluators.get(key)
            first = known is None or not known.has_agreed(inputs)
            evaluator = self._evaluator(key, inputs, communicator, device, timeout)
            # Every run: the signature of an int input is its type, not its value.
            check_scalar_inputs(self._fusion, self._integer_limits, inputs)
            if graphed:
                check_capturable(evaluator, inputs, communicator)
        except Exception as error:  # a bug too: the peers must not wait for this rank
            _tell_peers(error, communicator, first, wait=not self._has_agreed(communicator))
            raise
        fast = device is None and timeout is None and not _enable_options and not _disable_options
        if graphed:
            return self._graphed(evaluator, key, inputs, timeout, cuda_graph if fast else False)
        checking = pipeline_checking_enabled() or compiled_checking_enabled()
        draws = torch.random.get_rng_state() if checking else None
        outputs = evaluator.run(inputs, timeout=timeout)
        if fast:
            self._prepare_call(evaluator, inputs, cuda_graph)
        if pipeline_checking_enabled() and has_pipelined_loop(evaluator.program.body):
            again = HostIrEvaluator(
                evaluator.program, communicator=communicator, device=device, pipeline=False
            )
            check_same_outputs(
                outputs, _drawing_again(draws, lambda: again.run(inputs, timeout=timeout))
            )
        if compiled_checking_enabled():  # the same evaluator, the other way: nothing rebuilt
            compiled = evaluator.runs_compiled()
            other = _drawing_again(
                draws, lambda: evaluator.run(inputs, timeout=timeout, compiled=not compiled)
            )
            check_compiled_outputs(outputs, other, compiled)
        return outputs

    def _has_agreed(self, communicator: Any) -> bool:
        """Whether the ranks of ``communicator`` agreed on a run of this definition: after a
        failure, the peers may then be running that signature rather than agreeing on a
        first run (hostir.comm.agreement)."""
        return any(
            evaluator.has_agreed_any()
            for evaluator in self._evaluators.values()
            if evaluator.communicator is communicator
        )

    def _graphed(
        self,
        evaluator: HostIrEvaluator,
        key: tuple,
        inputs: list[Any],
        timeout: float | None,
        keep_as: bool | None | object,
    ) -> list[torch.Tensor | None]:
        """Runs ``inputs`` as the CUDA graph captured for their signature (``key``),
        capturing it on the first call (hostir.run.cuda_graphs: warm-up runs, then the
        capture of a compiled run); keeps the graph's replay as the prepared call for
        ``execute``'s fast path unless ``keep_as`` is False (the call passed a device,
        timeout or options)."""
        graph = self._graphs.get(key)
        if graph is None:
            graph = GraphedProgram(
                lambda given: evaluator.run(given, timeout=timeout, compiled=True),
                inputs,
                evaluator.device or _first_device(inputs),
                names=[v.name for v in self._fusion.inputs()],
            )
            self._graphs[key] = graph
        prepared_key = call_key(inputs, self._fusion.schedule.version, keep_as)
        if keep_as is not False and prepared_key is not None:
            # The key compares every input's type, shape, dtype and device: the replay
            # need not check them again.
            self._prepared_calls[prepared_key] = graph.replay_known
        return graph.replay(inputs)

    def _prepare_call(
        self, evaluator: HostIrEvaluator, inputs: list[Any], cuda_graph: bool | None
    ) -> None:
        """Keeps the evaluator's prepared call for ``inputs``' signature, where it has one,
        so the next call with the signature runs it (see :meth:`execute`). With
        ``HOSTIR_CHECK_COMPILED`` the kept call compares every run with an interpreted
        one. (Every call's own check already runs the replay: its compiled run of the
        signature the interpreted run just bound replays.)"""
        key = call_key(inputs, self._fusion.schedule.version, cuda_graph)
        if key is None or len(self._prepared_calls) >= MAX_SIGNATURES:
            return
        if pipeline_checking_enabled() and has_pipelined_loop(evaluator.program.body):
            return  # every call runs the check of pipelined against unpipelined loops
        checking = compiled_checking_enabled()
        # Checked, the call is prepared even where the race checker listens (the suite):
        # its interpreted twin runs with the listeners.
        again = evaluator.prepared_call(inputs, compiled=True if checking else None)
        if again is None:
            return
        if checking:
            again = _checked_against_interpreter(again, evaluator)
        self._prepared_calls[key] = again

    def _evaluator(
        self,
        key: tuple,
        inputs: list[Any],
        communicator: Any,
        device: torch.device | None,
        timeout: float | None,
    ) -> HostIrEvaluator:
        """The evaluator for ``key`` (schedule version, input signature, device), lowering
        and checking what it needs the first time."""
        if not self._finalized:
            self._finalize()
        program = self._programs.get(key[:2])
        if program is None:
            self._check_input_count(inputs)
            for tv in self._fusion.tensors():
                validate_schedule(tv, {})  # what constant extents show, before lowering
            program = self._lower()
            self._validate(inputs, communicator.rank, program)
            self._programs[key[:2]] = program
        self._last_program = (key[0], program)
        if choice_setting("HOSTIR_DUMP", ("host_ir",)) and communicator.rank == 0:
            print(program, flush=True)
        # One evaluator per program and device: it prepares process groups only once.
        evaluator = self._evaluators.get(key)
        if evaluator is None or evaluator.communicator is not communicator:
            listeners = [RaceChecker()] if race_checking_enabled() else []
            evaluator = HostIrEvaluator(
                program, communicator=communicator, device=device, listeners=listeners
            )
            self._evaluators[key] = evaluator
        evaluator.agreed_elsewhere = self._has_agreed(communicator)
        return evaluator

    def _check_input_count(self, inputs: list[Any]) -> None:
        expected = self._fusion.inputs()
        if len(inputs) != len(expected):
            names = ", ".join(v.name for v in expected)
            raise InputError(
                f"execute: expected {len(expected)} inputs ({names}), got {len(inputs)}"
            )

    def _lower(self) -> HostIrContainer:
        """A fresh lowering of the fusion to a host IR program (``execute``, ``host_ir``)."""
        # The frontend's one reach into lowering (SPEC section 2), late because lowering
        # imports frontend: at module level the import would close a circle between them.
        from lowering import lower_fusion

        self.lowering_count += 1
        program = lower_fusion(self._fusion)
        if round_trip_checking_enabled():
            program = check_round_trip(program)  # run the parsed copy: the text is complete
        return program

    def _validate(self, inputs: list[Any], rank: int, program: HostIrContainer) -> None:
        """Checks inputs against the program's inputs (the user's schedule, or for an input
        left unscheduled the sharding propagated to it) and the schedule against the extents.

        Inputs of tensors whose mesh does not hold ``rank`` are ignored, as SPEC says.
        """
        env: dict = {}
        input_errors = []
        for value, declared, given in zip(
            self._fusion.inputs(), program.inputs, inputs, strict=True
        ):
            if not isinstance(value, TensorView):
                continue
            mesh = declared.sharding.mesh if declared.sharding is not None else None
            if mesh is None or rank in mesh.devices:
                try:
                    bind_input_tensor(declared, given, env)
                except InputError as error:
                    # Symbols bind before the checks fail; a schedule error found with
                    # them says more (which split does not divide) than the input error.
                    input_errors.append(error)
        for tv in self._fusion.tensors():
            validate_schedule(tv, env)
        if input_errors:
            raise input_errors[0]


def _tell_peers(error: Exception, communicator: Any, first: bool, wait: bool) -> None:
    """Lets the other ranks know this rank stops with ``error`` before it runs: through the
    agreement they are entering (a signature this rank has not run yet), else through a
    failure notice that names this rank in their communication errors. ``wait``: wait for
    the agreement (a first run of the definition: the peers are entering it too, and the
    ranks that failed agree on one message, given to ``error``); else announce the failure
    and return at once (the peers may be running a signature agreed on before:
    hostir.comm.agreement)."""
    if communicator.world_size == 1:
        return
    if not first:
        communicator.post_failure(f"{type(error).__name__}: {error}")
        return
    try:
        communicator.set_timeout(collective_timeout())
    except HostIrError:
        pass  # a bad HOSTIR_TIMEOUT: the communicator keeps the timeout it has
    restate(error, agree(communicator, RankFacts.failed(error), wait=wait))


def _first_device(inputs: list[Any]) -> torch.device:
    """The device of the first tensor input (the run's device when none is given)."""
    return next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))


def _checked_against_interpreter(again: Any, evaluator: HostIrEvaluator) -> Any:
    """``again``, each run compared bitwise with the program run interpreted
    (``HOSTIR_CHECK_COMPILED``)."""

    def checked(inputs: Sequence[Any]) -> list:
        draws = torch.random.get_rng_state()
        outputs = again(inputs)
        if not compiled_checking_enabled():  # a profiler records: no second run's events
            return outputs
        other = _drawing_again(draws, lambda: evaluator.run(inputs, compiled=False))
        check_compiled_outputs(outputs, other, True)
        return outputs

    return checked


def _drawing_again(draws: torch.Tensor, run: Callable[[], list]) -> list:
    """``run()`` with torch's default generator as it was (``draws``) before the run it
    checks, so that an unseeded random op draws the same seed again
    (``hostir.run.creation``); the generator is left as the checked run left it."""
    after = torch.random.get_rng_state()
    torch.random.set_rng_state(draws)
    try:
        return run()
    finally:
        torch.random.set_rng_state(after)


def _signature(value: Any) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    return (type(value).__name__,)


def _from_strides(
    shape: Any, contiguity: Any, stride_order: Any, sizes: Any, strides: Any, static_sizes: bool
) -> tuple[list[int], list[bool | None], list[int]]:
    """``define_tensor``'s shape, contiguity and stride order from its ``sizes`` and
    ``strides`` form (nvFuser's), refusing a mix of the two forms."""
    mixed = [
        name
        for name, given in (
            ("shape", shape),
            ("contiguity", contiguity),
            ("stride_order", stride_order),
        )
        if given is not None
    ]
    if mixed:
        raise DefinitionError(
            f"define_tensor: give either shape (with contiguity and stride_order) or sizes and"
            f" strides, not both: got sizes/strides with {', '.join(mixed)}"
        )
    if sizes is None or strides is None:
        missing = "sizes" if sizes is None else "strides"
        raise DefinitionError(f"define_tensor: sizes and strides go together; {missing} is missing")
    sizes = int_list(DefinitionError, "define_tensor", "sizes", sizes)
    strides = int_list(DefinitionError, "define_tensor", "strides", strides)
    if len(sizes) != len(strides):
        raise DefinitionError(
            f"define_tensor: {len(sizes)} sizes {shown(sizes)} but {len(strides)} strides"
            f" {shown(strides)}"
        )
    for dim, stride in enumerate(strides):
        if stride < 0:
            raise DefinitionError(
                f"define_tensor: strides[{dim}] = {stride}: a negative stride is not supported"
            )
    flags, order = tensor_descriptor(sizes, strides)
    return builder_sizes(sizes, static_sizes), flags, order
