"""CUDA-graph capture checks: whether a run is graphed, and what stops it from being captured.

:func:`graphing` reads the switch (``cuda_graph=``, else ``HOSTIR_CUDA_GRAPH``);
:func:`check_capturable` refuses, with a :class:`~hostir.errors.CudaGraphError` naming
each reason :func:`capture_problems` finds, a run that cannot be captured: no CUDA,
listeners (the race checker among them), inputs or an evaluator off CUDA, handlers from
outside hostir.run, communication other than NCCL, an NCCL too old to capture, a
blocking wait. The capture and the replay are hostir.run.cuda_graphs'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hostir.comm.communicator import Communicator
from hostir.comm.torch_communicator import TorchCommunicator
from hostir.errors import CudaGraphError, SettingError
from hostir.ir.container import HostIrContainer
from hostir.ir.host_reads import ToHost
from hostir.ir.program_info import program_teams, walk_instructions
from hostir.ir.values import TensorValue
from hostir.run.race_checker import RaceChecker
from hostir.settings import flag_setting, torch_flag

CUDA_GRAPH_VARIABLE = "HOSTIR_CUDA_GRAPH"
"""``1`` runs programs as CUDA graphs where a run asks for nothing else; ``0``, the
default, runs them eagerly."""

MIN_NCCL = (2, 9, 6)
"""The oldest NCCL that lets collectives be captured (torch refuses older ones)."""

BLOCKING_WAIT_VARIABLES = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")
"""torch's switches that make ``work.wait()`` block the host until NCCL is done: a wait
inside a capture would then query an event of the capture, which CUDA forbids."""

NEEDS_CUDA = "CUDA graphs need CUDA"


def graphing(cuda_graph: bool | None = None) -> bool:
    """Whether to run programs as CUDA graphs: ``cuda_graph`` if given, else
    ``HOSTIR_CUDA_GRAPH`` (``0`` by default); SettingError for any other setting or a
    ``cuda_graph`` that is not a bool."""
    if cuda_graph is None:
        return flag_setting(CUDA_GRAPH_VARIABLE)
    if not isinstance(cuda_graph, bool):
        raise SettingError(f"cuda_graph: expected True, False or None, got {cuda_graph!r}")
    return cuda_graph


def check_capturable(evaluator: Any, inputs: Sequence[Any], communicator: Communicator) -> None:
    """Raises CudaGraphError unless ``evaluator`` can run its program on ``inputs`` (this
    rank's) over ``communicator`` inside a CUDA graph: first if torch has no CUDA, then
    naming every reason :func:`capture_problems` finds."""
    if not torch.cuda.is_available():
        raise CudaGraphError(
            f"{NEEDS_CUDA}: torch {torch.__version__} reports no usable CUDA device on this"
            " machine; run without cuda_graph"
        )
    problems = capture_problems(evaluator, inputs, communicator)
    if problems:
        raise CudaGraphError("this run cannot be captured in a CUDA graph: " + "; ".join(problems))


def capture_problems(
    evaluator: Any, inputs: Sequence[Any], communicator: Communicator
) -> list[str]:
    """What stops ``evaluator``'s run on ``inputs`` from being captured, one phrase per
    reason (empty if nothing does), whether or not this machine has CUDA.

    ``evaluator`` is a HostIrEvaluator (read for its program, the listeners of its runs,
    its self-checks' race checker included, its device and the handlers it would call).
    Extents, loop bounds, roots and AllToAllV's split sizes come from the input signature
    and scalar inputs, except the run-time extents a program reads with ``to_host`` (a
    device-to-host sync, which a graph cannot hold: refused by name)."""
    program: HostIrContainer = evaluator.program
    return [
        *_host_read_problems(program),
        *_listener_problems(evaluator.run_listeners),
        *_device_problems(program, inputs, evaluator.device),
        *_handler_problems(evaluator),
        *_backend_problems(program, communicator),
    ]


def _host_read_problems(program: HostIrContainer) -> list[str]:
    """A ``to_host`` waits on the host for values the graph would compute (run-time
    extents: docs/run_time_extents.md says what a capacity form costs instead)."""
    return [
        f"to_host reads {i.src.name} into {i.out.name} on the host (a device-to-host sync"
        " that sizes a RaggedAllToAll): a CUDA graph replays fixed sizes and cannot wait on"
        " the host; run this program without cuda_graph"
        for i in walk_instructions(program.body)
        if isinstance(i, ToHost)
    ]


def _listener_problems(listeners: Sequence[Any]) -> list[str]:
    """Listeners run Python around each instruction, which a replay skips."""
    problems = []
    for listener in listeners:
        if isinstance(listener, RaceChecker):
            problems.append(
                "the race checker (RaceChecker, HOSTIR_CHECK_RACES) is attached: it checks"
                " each instruction on the host, and a replay runs none; check races on an"
                " uncaptured run"
            )
        else:
            problems.append(
                f"listener {type(listener).__name__} is attached: listeners observe each"
                " instruction on the host, and a replay runs none"
            )
    return problems


def _device_problems(
    program: HostIrContainer, inputs: Sequence[Any], device: torch.device | None
) -> list[str]:
    """The run must be on CUDA: its device, and every tensor input (named)."""
    if device is not None and device.type != "cuda":
        return [f"the evaluator runs on {device}, not on a CUDA device"]
    problems = []
    on_cuda = False
    for value, given in zip(program.inputs, inputs, strict=False):
        if not isinstance(value, TensorValue) or not isinstance(given, torch.Tensor):
            continue  # scalars are baked into the graph; a missing shard is None
        if given.device.type == "cuda":
            on_cuda = True
        else:
            problems.append(f"input {value.name} is on {given.device}, not on a CUDA device")
    if device is None and not on_cuda and not problems:
        problems.append(
            "no tensor input is on a CUDA device and the evaluator has no device=, so the run"
            " would be on CPU"
        )
    return problems


def _handler_problems(evaluator: Any) -> list[str]:
    """Instructions whose handler comes from outside hostir.run (docs/extending.md): hostir
    cannot tell whether it reads tensor values on the host (``.item()``, ``.tolist()``) or
    does host work a replay would skip. hostir's own handlers do neither."""
    foreign: dict[str, str] = {}
    for instruction in walk_instructions(evaluator.program.body):
        handler = evaluator.step(instruction).handler
        module = getattr(handler, "__module__", None) or "?"
        if not module.startswith("hostir.run."):
            foreign.setdefault(type(instruction).__name__, module)
    return [
        f"instruction {name} runs a handler from {module}, which may read tensor values on"
        " the host or do host work a replay skips"
        for name, module in foreign.items()
    ]


def _backend_problems(program: HostIrContainer, communicator: Communicator) -> list[str]:
    """A program that communicates between ranks must do it over NCCL, capturably."""
    if communicator.world_size == 1 or all(team.size == 1 for team in program_teams(program)):
        return []  # every collective is a local copy (Communicator's groups of one rank)
    if not isinstance(communicator, TorchCommunicator):
        return [
            f"the program communicates between ranks through {communicator!r}, and only a"
            " TorchCommunicator over NCCL can be captured"
        ]
    backend = cuda_backend()
    if backend != "nccl":
        return [
            f"the program communicates between ranks over {backend}, and only NCCL"
            " collectives can be captured (start the ranks with the nccl backend:"
            " hostir run --backend nccl)"
        ]
    return [*_nccl_version_problems(), *_blocking_wait_problems()]


def cuda_backend(backend: str | None = None) -> str:
    """The backend for CUDA tensors named by ``backend`` (default: the default process
    group's, ``dist.get_backend()``): ``nccl`` for ``nccl`` and ``cpu:gloo,cuda:nccl``."""
    backend = str(dist.get_backend()) if backend is None else backend
    if ":" not in backend:
        return backend
    by_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return by_device.get("cuda", backend)


def _nccl_version_problems() -> list[str]:
    """NCCL before 2.9.6 refuses to be captured."""
    try:
        version = tuple(torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a torch built without NCCL answers with an error
        return ["this torch has no NCCL, so its collectives cannot be captured"]
    if version < MIN_NCCL:
        shown = ".".join(str(part) for part in version)
        return [f"NCCL {shown} cannot capture collectives (2.9.6 or later can)"]
    return []


def _blocking_wait_problems() -> list[str]:
    """A blocking wait makes the host poll a captured event, which CUDA refuses."""
    return [
        f"{variable} is on: every wait would block the host, which a capture forbids"
        for variable in BLOCKING_WAIT_VARIABLES
        if torch_flag(variable)
    ]
