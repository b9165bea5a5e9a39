"""Communicators: the evaluator's only door to other ranks.

The evaluator talks to other ranks through a :class:`Communicator`, so tests
and simulations can substitute their own. :func:`default_communicator` follows
SPEC section 5: use the default ``torch.distributed`` group; if none exists and
a launcher's variables are set, create one; otherwise the world is this process.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from hostir.errors import CommunicationError

DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)
"""How long a collective may block before it fails instead of hanging."""


class Communicator:
    """This process's place in the world: its rank and the number of ranks."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


class LocalCommunicator(Communicator):
    """A world of one process (rank 0 of 1): no other ranks to talk to."""

    def __init__(self) -> None:
        super().__init__(rank=0, world_size=1)


class TorchCommunicator(Communicator):
    """The ranks of the default ``torch.distributed`` process group."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise CommunicationError("torch.distributed is not initialized")
        super().__init__(rank=dist.get_rank(), world_size=dist.get_world_size())


def launcher_rank_and_size() -> tuple[int, int] | None:
    """(rank, world size) from torchrun's or Open MPI's variables, if set."""
    for rank_var, size_var in (
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return None


def init_process_group_from_env(use_cuda: bool) -> bool:
    """Creates the default process group from launcher variables; False if none are set.

    nccl is used for CUDA tensors, gloo otherwise. Under Open MPI the rendezvous
    address defaults to this host.
    """
    found = launcher_rank_and_size()
    if found is None:
        return False
    rank, world_size = found
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    backend = "nccl" if use_cuda and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(
            os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0))
        )
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=DEFAULT_TIMEOUT)
    return True


def default_communicator(use_cuda: bool = False) -> Communicator:
    """The communicator ``execute`` uses: the default group, made from env if needed."""
    if dist.is_available() and (dist.is_initialized() or init_process_group_from_env(use_cuda)):
        return TorchCommunicator()
    return LocalCommunicator()
