"""Finding the world: the communicator ``execute`` and ``HostIrEvaluator`` use.

:func:`default_communicator` follows SPEC section 5: use the default
``torch.distributed`` group; if none exists and a launcher's variables are set
(torchrun's or Open MPI's, checked by :func:`hostir.settings.launcher_world`
before anything waits for a peer), create one; otherwise the world is this
process.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from hostir.comm.backend_hooks import backend_failure
from hostir.comm.communicator import Communicator, LocalCommunicator
from hostir.comm.timeouts import collective_timeout
from hostir.comm.torch_communicator import TorchCommunicator
from hostir.errors import SettingError
from hostir.settings import LauncherWorld, choice_setting, launcher_world, rendezvous_host

BACKEND_VARIABLE = "HOSTIR_BACKEND"
"""The backend a launcher-made default group uses: ``gloo`` or ``nccl`` (set by
``hostir run --backend``); unset: nccl for CUDA tensors, gloo otherwise."""
BACKENDS = ("gloo", "nccl")
"""The values of ``HOSTIR_BACKEND`` (and of ``hostir run --backend``)."""


def launcher_rank_and_size() -> tuple[int, int] | None:
    """(rank, world size) from torchrun's or Open MPI's variables, if set; SettingError
    naming the variable for values that cannot be (hostir.settings.launcher_world)."""
    world = launcher_world()
    return None if world is None else (world.rank, world.world_size)


def init_process_group_from_env(use_cuda: bool) -> bool:
    """Creates the default process group from launcher variables; False if none are set.

    The backend is ``HOSTIR_BACKEND`` if set (``hostir run --backend``), else nccl
    for CUDA tensors and gloo otherwise. The rendezvous address (``MASTER_ADDR``) defaults
    to this host (under Open MPI); SettingError at once if it does not resolve.
    """
    found = launcher_world()  # every variable checked before anything waits for a peer
    if found is None:
        return False
    rank, world_size = found.rank, found.world_size
    # Resolved first: torch's store would retry a name that does not resolve until the
    # timeout. Written back as checked (torch reads the variable itself).
    os.environ["MASTER_ADDR"] = rendezvous_host(default="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    backend = chosen_backend(use_cuda)
    timeout = collective_timeout()
    if backend == "nccl":
        _use_local_device(found)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    except (RuntimeError, ValueError) as error:
        where = (
            f"joining the process group ({backend}, rank {rank} of {world_size}, rendezvous at"
            f" {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']})"
        )
        raise backend_failure(where, rank, error, timeout) from error
    # The group is ours: end it before the interpreter does. Left to interpreter teardown,
    # gloo's threads are sometimes destroyed while joinable, which aborts the process
    # ("terminate called without an active exception") after a successful run.
    atexit.register(_destroy_default_group, dist.group.WORLD)
    return True


def _destroy_default_group(world: Any) -> None:
    """Destroys the default group made by :func:`init_process_group_from_env`, if it is
    still the current one."""
    if dist.is_initialized() and dist.group.WORLD is world:
        dist.destroy_process_group()


def _use_local_device(world: LauncherWorld) -> None:
    """Makes this rank's CUDA device current: the one of its local rank."""
    count = torch.cuda.device_count()
    if world.local_rank >= count:
        raise SettingError(
            f"local rank {world.local_rank} ({world.source}'s variables) needs CUDA device"
            f" {world.local_rank}, but this machine has {count}: start at most {count} ranks"
            " per machine with nccl"
        )
    torch.cuda.set_device(world.local_rank)


def chosen_backend(use_cuda: bool) -> str:
    """``HOSTIR_BACKEND`` if set, else nccl for CUDA tensors (where CUDA exists), else gloo."""
    asked = choice_setting(BACKEND_VARIABLE, BACKENDS)
    if asked is None:
        return "nccl" if use_cuda and torch.cuda.is_available() else "gloo"
    if asked == "nccl" and not torch.cuda.is_available():
        raise SettingError(
            f"{BACKEND_VARIABLE}=nccl: nccl needs CUDA, and this machine has no CUDA device"
            " (use gloo)"
        )
    return asked


_DEFAULT: dict[str, Any] = {"group": None, "communicator": None, "alone": None}
"""The communicator made for the current default process group, reused across calls so
programs prepare (and check) once per group, not once per execute; and the one for this
process alone (no group), reused for the same reason: evaluators are kept per
communicator, so a fresh one per call would build and verify the program every call."""


def _alone() -> LocalCommunicator:
    """The world of this process alone (made on first use: making it reads the timeout)."""
    if _DEFAULT["alone"] is None:
        _DEFAULT["alone"] = LocalCommunicator()
    return _DEFAULT["alone"]


_DEFAULT_LOCK = threading.Lock()
"""Two threads asking at once create the default group once."""


_DISTRIBUTED = dist.is_available()


_THREAD = threading.local()
"""A communicator this thread runs as (a rank of a simulated world: hostir.comm.simulate),
found before any process group."""


@contextmanager
def running_as(communicator: Communicator) -> Iterator[None]:
    """Within: :func:`default_communicator` answers ``communicator`` on this thread (each
    thread of a simulated world runs as its own rank)."""
    before = getattr(_THREAD, "communicator", None)
    _THREAD.communicator = communicator
    try:
        yield
    finally:
        _THREAD.communicator = before


def current_rank() -> int:
    """This thread's rank without creating any group: its communicator's where it runs as
    one (:func:`running_as`), else the default process group's, else 0."""
    mine = getattr(_THREAD, "communicator", None)
    if mine is not None:
        return mine.rank
    if _DISTRIBUTED and dist.is_initialized():
        return dist.get_rank()
    return 0


def barrier() -> None:
    """Waits until every rank of this thread's world reached it: a simulated world's
    ranks (:func:`running_as`), else the default process group's; nothing to wait for in
    a world of one process."""
    mine = getattr(_THREAD, "communicator", None)
    if mine is not None:
        if mine.world_size > 1:
            mine.barrier()
        return
    if _DISTRIBUTED and dist.is_initialized():
        dist.barrier()


def world_token() -> object:
    """What :func:`default_communicator`'s answer depends on, found cheaply: this thread's
    communicator where it runs as one (:func:`running_as`), else the default process
    group, None where there is none (this process alone). A caller that kept work for a
    communicator compares tokens to know it still applies."""
    mine = getattr(_THREAD, "communicator", None)
    if mine is not None:
        return mine
    return dist.group.WORLD if _DISTRIBUTED else None  # None until a default group exists


def default_communicator(use_cuda: bool = False) -> Communicator:
    """The communicator ``execute`` uses: the default group, made from env if needed; with
    neither, this process alone (always the same communicator). A thread running as a
    communicator (:func:`running_as`) gets that one."""
    mine = getattr(_THREAD, "communicator", None)
    if mine is not None:
        return mine
    with _DEFAULT_LOCK:
        if not dist.is_available() or not (
            dist.is_initialized() or init_process_group_from_env(use_cuda)
        ):
            return _alone()
        world = dist.group.WORLD
        if _DEFAULT["group"] is not world:
            _DEFAULT["group"], _DEFAULT["communicator"] = world, TorchCommunicator()
        return _DEFAULT["communicator"]
