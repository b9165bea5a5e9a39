"""The arguments of ``FusionDefinition.execute``, checked before anything is lowered or run.

A bad argument raises a named error (``InputError`` for the inputs, ``SettingError`` for
the device and the timeout, ``DefinitionError`` for the options) that ``execute`` also
tells the other ranks, so that none of them waits for this one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from frontend.arguments import INT_RANGES, as_list, check_fits, is_int, shown
from frontend.errors import DefinitionError, InputError
from frontend.exprs import ScalarVal
from frontend.fusion import Fusion
from frontend.sharding import validate_schedule
from frontend.tensor_view import TensorView
from frontend.types import DataType
from hostir.comm.timeouts import collective_timeout
from hostir.errors import SettingError
from hostir.ir.container import HostIrContainer
from hostir.run.arguments import checked_device
from hostir.run.inputs import bind_input_tensor, dtensor_class

ENABLE_OPTIONS = {
    "host_ir_lowering": "always on: every fusion is lowered to a host IR program",
}
"""The ``_enable_options`` nvFuser's stream-parallel programs pass, and what they mean here."""

DISABLE_OPTIONS = {
    "infer_contiguity": "no effect: the ops run as torch ops, which take any strides, so"
    " nothing is compiled for an inferred contiguity",
    "resize_scheduler": "no effect: hostir has no resize scheduler (slice, pad and cat run"
    " as torch ops); nvFuser's transformer backward passes it",
}
"""The ``_disable_options`` they pass, and what they mean here."""


NVFUSER_FLAGS = {
    "save_repro_inputs": "keeps the inputs for fd.last_repro_script(); hostir writes no repro"
    " scripts (`hostir dump` prints the program a fusion runs)",
    "override_user_schedule": "runs nvFuser's automatic scheduler instead of the user's;"
    " hostir has no automatic scheduler",
    "capture_debug_output": "keeps nvFuser's debug output (fd.last_debug_output()); hostir"
    " has none to capture (HOSTIR_DUMP=host_ir prints the program)",
    "print_repro": "prints a repro script; hostir writes none",
    "profile": "profiles the kernels nvFuser compiles (fd.profile()); hostir compiles none:"
    " record with torch.profiler, which sees every host IR instruction (docs/streams.md)",
}
"""``execute`` keywords of nvFuser's (``nvfuser_direct`` and the older ``nvfuser``
frontend) that have no meaning here, with what they do there: accepted as False, their
default, and refused by name as True."""


def nvfuser_keywords(execute: Callable[..., Any]) -> Callable[..., Any]:
    """``execute`` taking nvFuser's keywords as well: each of :data:`NVFUSER_FLAGS` as False
    (refused as True, with why), and any other unknown keyword refused with the list of
    the known ones (DefinitionError, where Python's TypeError would name none). A call
    without keywords goes straight through."""
    known = [
        name
        for name, parameter in inspect.signature(execute).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]

    @functools.wraps(execute)
    def checked(self: Any, *arguments: Any, **keywords: Any) -> Any:
        if not keywords:
            return execute(self, *arguments)
        for name in [name for name in keywords if name not in known]:
            if name not in NVFUSER_FLAGS:
                raise DefinitionError(
                    f"execute: unknown keyword argument {name!r}; execute takes {known}, and"
                    f" nvFuser's {sorted(NVFUSER_FLAGS)} as False (docs/frontend_api.md)"
                )
            flag = keywords.pop(name)
            if flag is not False:
                raise DefinitionError(
                    f"execute: {name}={shown(flag)} is not supported (only False, the default):"
                    f" in nvFuser it {NVFUSER_FLAGS[name]}"
                )
        return execute(self, *arguments, **keywords)

    return checked


@dataclass(frozen=True)
class ExecuteArguments:
    """``execute``'s arguments once checked: the inputs as a list, the device resolved."""

    inputs: list[Any]
    device: torch.device | None


def uses_cuda(inputs: Any) -> bool:
    """Whether ``inputs`` (checked or not) hold a CUDA tensor: it picks the communicator."""
    if not isinstance(inputs, list | tuple):
        return False
    return any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)


def check_execute_arguments(
    inputs: Any, device: Any, timeout: Any, enable: Any, disable: Any
) -> ExecuteArguments:
    """Checks every argument of ``execute`` but the inputs' contents (the program's input
    checks read those); raises a named error for the first bad one."""
    if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
        raise InputError(
            "execute: inputs must be a list or tuple with one tensor or scalar per fusion"
            f" input, got {shown(inputs) if not isinstance(inputs, torch.Tensor) else 'a Tensor'}"
        )
    _check_options("_enable_options", enable, ENABLE_OPTIONS)
    _check_options("_disable_options", disable, DISABLE_OPTIONS)
    _check_timeout(timeout)
    return ExecuteArguments(inputs=list(inputs), device=_device(device))


def _check_options(which: str, options: Any, known: dict[str, str]) -> None:
    for option in as_list(DefinitionError, "execute", which, options, "option names"):
        if not isinstance(option, str) or option not in known:
            raise DefinitionError(
                f"execute: unknown option {shown(option)} in {which}; known there:"
                f" {sorted(known)} (see docs/streams.md)"
            )


def _check_timeout(timeout: Any) -> None:
    """Refuses a timeout that is not a number of seconds hostir can wait (SettingError)."""
    collective_timeout(timeout)


def _device(device: Any) -> torch.device | None:
    """``device`` as a ``torch.device`` (None: the device of the inputs); an int is a CUDA
    device's index, as in nvFuser. The evaluator's own check names what is wrong."""
    if is_int(device) and device >= 0:
        device = torch.device("cuda", device)
    try:
        return checked_device(device)
    except SettingError as error:
        raise SettingError(f"execute: {error}") from None


def integer_limits(fusion: Fusion) -> dict[str, list[tuple[DataType, str]]]:
    """For each scalar input of ``fusion``, the integer dtypes its value must fit, each with
    what needs it: its own dtype (Int or Int32) and the dtype of every integer result it is
    computed in (an Int input added to an Int32 tensor is computed in int32)."""
    limits: dict[str, list[tuple[DataType, str]]] = {}
    for value in fusion.inputs():
        if isinstance(value, ScalarVal):
            own = [(value.dtype, "its dtype")] if value.dtype in INT_RANGES else []
            limits[value.name] = own
    for expr in fusion.exprs():
        for dtype in dict.fromkeys(tv.dtype for tv in expr.outputs()):
            if dtype not in INT_RANGES:
                continue
            for operand in expr.inputs():
                if isinstance(operand, ScalarVal) and operand.name in limits:
                    why = f"the dtype of {expr.describe()}, which it is computed in"
                    limits[operand.name].append((dtype, why))
    return {name: found for name, found in limits.items() if found}


def check_scalar_inputs(
    fusion: Fusion, limits: dict[str, list[tuple[DataType, str]]], inputs: list[Any]
) -> None:
    """Refuses an int given for a scalar input that does not fit a dtype of ``limits``: in
    the kernel it would wrap around (torch does not check), or overflow inside torch."""
    for value, given in zip(fusion.inputs(), inputs, strict=False):
        if not isinstance(value, ScalarVal) or not is_int(given):
            continue
        for dtype, why in limits.get(value.name, []):
            check_fits(InputError, f"input {value.name}", "the value", given, dtype, f", {why}")


def refuse_dtensors(fusion: Fusion, inputs: Sequence[Any]) -> None:
    """InputError for the first DTensor in ``inputs``, naming its position, the fusion's
    tensor it is given for, its placements and mesh, and what to pass instead: ``execute``
    takes this rank's local shards (a DTensor is a ``torch.Tensor`` of its global shape,
    whose ops would run as DTensor's own and return DTensors)."""
    dtensor = dtensor_class()
    if dtensor is None:
        return
    names = [value.name for value in fusion.inputs()]
    for index, given in enumerate(inputs):
        if not isinstance(given, dtensor):
            continue
        name = f" ({names[index]})" if index < len(names) else ""
        raise InputError(
            f"execute: input {index}{name} is a DTensor (placements {tuple(given.placements)}"
            f" on {given.device_mesh!r}, global shape {list(given.shape)}); execute takes"
            " this rank's local shards as plain tensors: pass dt.to_local() where the"
            " placements match the fusion's schedule of that input (fd.host_ir().inputs[i]"
            " shows it; shard_tensor(full, fd.host_ir().inputs[i]) gives the shard), or call"
            " execute_with_dtensors(fd, dtensors), which takes DTensors and returns DTensors"
        )


def check_input_count(fusion: Fusion, inputs: list[Any]) -> None:
    """InputError unless ``inputs`` has one value per fusion input."""
    expected = fusion.inputs()
    if len(inputs) != len(expected):
        names = ", ".join(v.name for v in expected)
        raise InputError(f"execute: expected {len(expected)} inputs ({names}), got {len(inputs)}")


def validate_inputs(fusion: Fusion, inputs: list[Any], rank: int, program: HostIrContainer) -> None:
    """Checks inputs against ``program``'s inputs (the user's schedule, or for an input left
    unscheduled the sharding propagated to it) and the schedule against the extents.

    Inputs of tensors whose mesh does not hold ``rank`` are ignored, as SPEC says.
    """
    env: dict = {}
    input_errors = []
    for value, declared, given in zip(fusion.inputs(), program.inputs, inputs, strict=True):
        if not isinstance(value, TensorView):
            continue
        mesh = declared.sharding.mesh if declared.sharding is not None else None
        if mesh is None or mesh.contains(rank):
            try:
                bind_input_tensor(declared, given, env)
            except InputError as error:
                # Symbols bind before the checks fail; a schedule error found with them
                # says more (which split does not divide) than the input error.
                input_errors.append(error)
    for tv in fusion.tensors():
        validate_schedule(tv, env)
    if input_errors:
        raise input_errors[0]
