"""The arguments of ``HostIrEvaluator`` and of its ``run``, checked by name.

A wrong argument is a :class:`~hostir.errors.HostIrError` naming it and saying
what was expected, when the evaluator is built or the run starts, never a
``TypeError`` or a torch ``RuntimeError`` from deep inside a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hostir.comm.communicator import Communicator
from hostir.errors import InputError, SettingError, VerifyError
from hostir.ir.container import HostIrContainer

LISTENER_METHODS = ("before", "after", "finish")


def checked_program(program: object) -> HostIrContainer:
    """``program`` if it is a HostIrContainer; VerifyError naming what it is otherwise."""
    if not isinstance(program, HostIrContainer):
        raise VerifyError(
            "HostIrEvaluator: program must be a HostIrContainer (from hostir.parse,"
            f" HostIrContainer.from_json or FusionDefinition.host_ir()), got"
            f" {type(program).__name__}"
        )
    return program


def checked_device(device: object) -> torch.device | None:
    """``device`` as a torch.device (None stays None: the inputs' device); SettingError for
    text torch cannot read, another type, or a CUDA device this machine lacks."""
    if device is None:
        return None
    if not isinstance(device, str | torch.device):
        raise SettingError(
            f"device: expected a torch.device or a name like 'cpu' or 'cuda:0', got"
            f" {type(device).__name__}"
        )
    try:
        found = torch.device(device)
    except RuntimeError as error:
        said = _first_line(error)
        if len(said) > 100:  # torch lists every device type it knows: the name says enough
            said = "not a device type torch knows"
        raise SettingError(
            f"device={device!r}: expected a device name like 'cpu' or 'cuda:0' ({said})"
        ) from None
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (found.index or 0) >= count:
            raise SettingError(
                f"device={device!r}: this machine has {count} CUDA device(s)"
                + (f" (cuda:0 to cuda:{count - 1})" if count else "")
            )
    return found


def checked_listeners(listeners: object) -> tuple[Any, ...]:
    """``listeners`` as a tuple; SettingError unless it is a sequence of objects with the
    ``hostir.Listener`` methods (before, after, finish)."""
    if isinstance(listeners, str | bytes) or not isinstance(listeners, Sequence):
        raise SettingError(
            f"listeners: expected a list of hostir.Listener, got {type(listeners).__name__}"
        )
    for index, listener in enumerate(listeners):
        lacking = [m for m in LISTENER_METHODS if not callable(getattr(listener, m, None))]
        if lacking:
            raise SettingError(
                f"listeners[{index}] ({type(listener).__name__}) has no {', '.join(lacking)}"
                " method: subclass hostir.Listener"
            )
    return tuple(listeners)


def checked_communicator(communicator: object) -> Communicator | None:
    """``communicator`` if it is None or a Communicator; SettingError otherwise."""
    if communicator is not None and not isinstance(communicator, Communicator):
        raise SettingError(
            "communicator: expected a hostir.Communicator (or None: the default one), got"
            f" {type(communicator).__name__}"
        )
    return communicator


def run_inputs(inputs: object) -> tuple[list[Any], InputError | None]:
    """The inputs of a run as a list, and the error for anything but a list or tuple (then
    the list is empty): a tensor, a string or a dict would otherwise be iterated into
    rows, characters or keys. The error is returned, not raised, so that the agreement
    tells the other ranks about it."""
    if isinstance(inputs, list | tuple):
        return list(inputs), None
    return [], InputError(
        "run: inputs must be a list or tuple of this rank's inputs (one per program input),"
        f" got {type(inputs).__name__}"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
