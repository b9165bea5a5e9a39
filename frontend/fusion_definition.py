"""``FusionDefinition``: the nvFuser-style entry point.

Define inputs and ops inside ``with FusionDefinition() as fd:``, schedule the
tensors (meshes, splits, parallelization), then ``fd.execute(local_inputs)``.
Execution always goes through host IR: the fusion is lowered once per kind of inputs
and the program is run by ``hostir.HostIrEvaluator``, on the one run path
(``hostir.run.executable``): ``execute`` checks its arguments and lowers; a known input
signature is a key lookup and its executable's call (the programs, evaluators and
executables of the ``hostir.run.bindings.MAX_SIGNATURES`` most recently used signatures
are kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from frontend.arguments import (
    MAX_EXTENT,
    as_list,
    check_bool,
    contiguity_flags,
    is_int,
    scalar_constant,
    scalar_dtype,
    shown,
)
from frontend.errors import DefinitionError
from frontend.execute_args import (
    check_execute_arguments,
    check_input_count,
    check_scalar_inputs,
    integer_limits,
    nvfuser_keywords,
    refuse_dtensors,
    uses_cuda,
    validate_inputs,
)
from frontend.exprs import ScalarVal
from frontend.fusion import Fusion
from frontend.iter_domain import IterDomain, IterType
from frontend.ops import Ops
from frontend.sharding import validate_schedule
from frontend.simulated import execute_simulated
from frontend.strides import layout_from_strides, stride_order_of
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir import Const, HostIrContainer, HostIrEvaluator, default_communicator
from hostir.comm.simulate import SimulatedRun
from hostir.errors import HostIrError, SettingError
from hostir.ir.program_info import check_meshes_fit
from hostir.run.agreements import AgreementLog, refuse_before_run
from hostir.run.bindings import RecentlyUsed
from hostir.run.cuda_graph_checks import graphing
from hostir.run.executable import Executable
from hostir.run.self_checks import SelfChecks
from hostir.run.signature import call_key, input_kinds
from hostir.settings import choice_setting
from hostir.text.round_trip import check_round_trip, round_trip_checking_enabled


class FusionDefinition:
    """Records a fusion, then lowers and runs it (``execute``) on every rank."""

    def __init__(self) -> None:
        self._fusion = Fusion()
        self.ops = Ops(self._fusion)
        self._finalized = False
        self._integer_limits: dict[str, list] = {}  # set when the definition is finished
        # The most recently used MAX_SIGNATURES signatures' programs, evaluators and
        # executables (hostir.run.bindings.RecentlyUsed). Dropping one is safe on several
        # ranks: the ranks drop the same signatures when their calls repeat the same
        # signatures in the same order, which the agreement (once per evaluator and kind of
        # inputs) already needs.
        self._programs: RecentlyUsed[HostIrContainer] = RecentlyUsed()  # by version, kinds
        self._validated: set[tuple] = set()  # (version, kinds, id of a communicator)
        self._evaluators: RecentlyUsed[HostIrEvaluator] = RecentlyUsed()  # ... and device
        self._executables: RecentlyUsed[Executable] = RecentlyUsed()  # by execute's key
        # What the ranks agreed on, for every program of this definition: a rank failing
        # on one tells peers that may be running another (hostir.run.agreements).
        self._agreements = AgreementLog()
        self._last_program: tuple[int, HostIrContainer] | None = None  # (schedule version, it)
        self.lowering_count = 0
        """How many times this definition was lowered (once per kind of inputs and schedule)."""

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
            shape, contiguity, stride_order = layout_from_strides(
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

    def execute(self, inputs: Sequence[Any], **options: Any) -> list[torch.Tensor | None]:
        """Runs the fusion on this rank's local shards; returns this rank's output shards.

        ``options``, with nvFuser's names: ``device`` (default: the inputs' device; an int
        is a CUDA device's index), ``timeout``, ``cuda_graph``, ``_enable_options`` and
        ``_disable_options``, and nvFuser's other keywords as False (any other refused by
        name, frontend.execute_args).

        The fusion is lowered once per kind of inputs (each tensor's shape, dtype and
        device type, each scalar's type) and schedule: changing the schedule after an
        execute lowers it again. The programs, evaluators and prepared signatures of the
        64 most recently used signatures are kept (hostir.run.bindings.MAX_SIGNATURES); a
        signature dropped is lowered and prepared again when it comes back. ``timeout``
        (seconds) bounds every wait for other ranks (default: ``HOSTIR_TIMEOUT``, else five
        minutes); see docs/reliability.md.

        A call of a signature that already ran (its inputs' types, shapes, dtypes and
        devices, its scalars' values, the options, the schedule and the default process
        group unchanged) looks its key up and runs the executable kept for it
        (hostir.run.executable): no argument checks, no binding, no settings read (they
        were read when the signature was prepared; see docs/benchmarks.md, "Host cost").

        ``cuda_graph`` (default ``HOSTIR_CUDA_GRAPH``, else False): capture the run once
        per input signature as a CUDA graph and replay it (hostir.run.cuda_graphs; inputs
        are copied in, outputs are fresh tensors; docs/cuda_graphs.md). CudaGraphError,
        naming why, where the run cannot be captured: no CUDA, an input on the CPU, gloo
        between ranks, listeners.
        """
        key = call_key(inputs, self._fusion.schedule.version, *options.items())
        try:
            executable = self._executables.get(key)
        except TypeError:  # an option's value is not hashable (a list): no key
            key = executable = None
        if executable is not None:
            return executable.call(inputs)
        return self._first_call(key, inputs, **options)

    def execute_simulated(self, inputs: Any, *, world_size: int, **options: Any) -> SimulatedRun:
        """Runs the fusion as every rank of a simulated world of ``world_size`` ranks in
        this process (frontend.simulated, docs/simulated_world.md): ``inputs`` are the
        unsharded tensors, each rank taking its shard by the schedule, or a function of
        the rank giving that rank's inputs; ``options`` as :meth:`execute` takes them.
        Returns a ``SimulatedRun``: ``results[r]``, rank ``r``'s outputs; ``errors``, each
        failed rank's error; ``links[s, d]``, the bytes rank ``s`` sent rank ``d``."""
        return execute_simulated(self, inputs, world_size, **options)

    @nvfuser_keywords  # nvFuser's keywords; any other refused by name
    def _first_call(
        self,
        key: tuple | None,
        inputs: Sequence[Any],
        *,
        _enable_options: Sequence[str] = (),
        _disable_options: Sequence[str] = (),
        device: torch.device | str | None = None,
        timeout: float | None = None,
        cuda_graph: bool | None = None,
    ) -> list[torch.Tensor | None]:
        """:meth:`execute` of a signature not run before (``key``: its key, None where it
        has none): the arguments checked, the program lowered for the kind of inputs if
        it was not, and the run prepared by the program's evaluator; the executable kept."""
        communicator = default_communicator(uses_cuda(inputs))
        # Until the inputs are known to be fine: whether the peers are about to agree on a
        # first run (see refuse_before_run), as when this definition has never run.
        first = not self._evaluators
        try:
            checked = check_execute_arguments(
                inputs, device, timeout, _enable_options, _disable_options
            )
            inputs, device = checked.inputs, checked.device
            refuse_dtensors(self._fusion, inputs)  # at one rank too, where it would run
            graphing(cuda_graph)  # a bad value, before anything runs
            kinds = input_kinds(inputs)
            evaluator_key = (self._fusion.schedule.version, kinds, str(device))
            known = self._evaluators.get(evaluator_key)
            first = known is None or not known.has_agreed(inputs)
            evaluator = self._evaluator(evaluator_key, inputs, communicator, device)
            # Every first call of a scalar value: its limits (a known key holds the value).
            check_scalar_inputs(self._fusion, self._integer_limits, inputs)
        except Exception as error:  # a bug too: the peers must not wait for this rank
            wait = not self._agreements.agreed_on(communicator)
            refuse_before_run(error, communicator, first=first, wait=wait)
            raise
        executable, outputs = evaluator.executable(inputs, timeout=timeout, cuda_graph=cuda_graph)
        if key is not None:
            self._executables[key] = executable
        return outputs

    def _evaluator(
        self, key: tuple, inputs: list[Any], communicator: Any, device: torch.device | None
    ) -> HostIrEvaluator:
        """The evaluator for ``key`` (schedule version, kinds of inputs, device), lowering
        and checking what it needs the first time."""
        if not self._finalized:
            self._finalize()
        program = self._programs.get(key[:2])
        if isinstance(program, HostIrError):  # this schedule and kinds failed to lower
            raise program.with_traceback(None)
        if program is None:
            check_input_count(self._fusion, inputs)
            for tv in self._fusion.tensors():
                validate_schedule(tv, {})  # what constant extents show, before lowering
            try:
                program = self._lower()
            except HostIrError as error:
                # Lowering is a function of the definition, its schedule and the kinds of
                # inputs: the next call with them fails alike without lowering again (a
                # simulated world's ranks all call with them).
                self._programs[key[:2]] = error
                raise
            self._programs[key[:2]] = program
        # Once per program and communicator: each rank checks its own inputs against the
        # program it lowered (a simulated world's ranks share one lowering).
        validated = (key[:2], id(communicator))
        if validated not in self._validated:
            validate_inputs(self._fusion, inputs, communicator.rank, program)
            self._validated.add(validated)
        self._last_program = (key[0], program)
        if choice_setting("HOSTIR_DUMP", ("host_ir",)) and communicator.rank == 0:
            print(program, flush=True)
        # One evaluator per program and device: it prepares process groups only once.
        evaluator = self._evaluators.get(key)
        if evaluator is None or evaluator.communicator is not communicator:
            # _lower checked the round trip already (and runs the parsed copy)
            checks = replace(SelfChecks.from_settings(), round_trip=False)
            evaluator = HostIrEvaluator(
                program,
                communicator=communicator,
                device=device,
                checks=checks,
                agreements=self._agreements,
            )
            self._evaluators[key] = evaluator
        return evaluator

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
