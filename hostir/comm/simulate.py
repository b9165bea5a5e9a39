"""Running a function as every rank of a simulated world, one thread per rank.

:func:`simulate` starts ``world_size`` threads; thread ``r`` runs ``fn(r)`` as rank
``r`` (``default_communicator()`` answers its
:class:`~hostir.comm.simulated_communicator.SimulatedCommunicator` there, so
``FusionDefinition.execute``, ``HostIrEvaluator.run`` and scripts written for real
ranks run unchanged), and the world (hostir.comm.simulated_world) moves data between
them, measures the traffic and names hangs. The threads share the process: what
``fn`` builds once outside (a definition, its inputs) every rank reads; what a rank
builds inside it builds for itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hostir.comm.simulated_communicator import SimulatedCommunicator
from hostir.comm.simulated_world import SimulatedWorld
from hostir.comm.world import running_as
from hostir.errors import HostIrError

MAX_SIMULATED_RANKS = 4096
"""The most ranks one simulated world runs (one thread each)."""

STACK_BYTES = 16 << 20
"""Each rank's thread stack: lowering recurses deep into large programs."""


@dataclass
class SimulatedRun:
    """What a simulated world's run gave: each rank's result of ``fn`` (None where it
    raised), each failed rank's error, the bytes measured between ranks
    (``links[s, d]``), and the run's wall time. ``peak_bytes[r]``: the most bytes rank
    ``r``'s program runs held at once; ``process_peak_bytes``: the most the ranks held
    together, each storage once (hostir.comm.simulated_memory)."""

    results: list[Any]
    errors: dict[int, BaseException]
    links: torch.Tensor
    seconds: float
    world: SimulatedWorld = field(repr=False)

    @property
    def peak_bytes(self) -> list[int]:
        """Each rank's peak bytes held by its program runs."""
        return list(self.world.memory.peak)

    @property
    def process_peak_bytes(self) -> int:
        """The peak bytes every rank's runs held together, each storage counted once."""
        return self.world.memory.process_peak

    @property
    def world_size(self) -> int:
        """The number of simulated ranks."""
        return len(self.results)

    def first_error(self) -> tuple[int, BaseException] | None:
        """(rank, error) of the lowest failed rank, None if every rank finished."""
        if not self.errors:
            return None
        rank = min(self.errors)
        return rank, self.errors[rank]

    def raise_first(self) -> None:
        """Raises the lowest failed rank's error (its traceback kept), if any."""
        found = self.first_error()
        if found is not None:
            raise found[1]


def simulate(fn: Callable[[int], Any], world_size: int, *, by_run: bool = False) -> SimulatedRun:
    """Runs ``fn(rank)`` as each rank of a simulated world of ``world_size`` ranks, all at
    once (see the module docstring); returns when every rank finished or failed.
    ``by_run``: the world also counts each program run's traffic apart (compared with the
    static count by hostir.comm.simulated_traffic)."""
    if not isinstance(world_size, int) or not 1 <= world_size <= MAX_SIMULATED_RANKS:
        raise HostIrError(
            f"a simulated world has 1 to {MAX_SIMULATED_RANKS} ranks, not {world_size!r}"
        )
    world = SimulatedWorld(world_size, by_run)
    results: list[Any] = [None] * world_size
    errors: dict[int, BaseException] = {}

    def run_rank(rank: int) -> None:
        how = "finished"
        world.start_turn(rank)
        try:
            with running_as(SimulatedCommunicator(world, rank)):
                results[rank] = fn(rank)
        except BaseException as error:  # noqa: BLE001 - a rank's failure is its result
            errors[rank] = error
            how = f"failed with {type(error).__name__}: {_first_line(error)}"
        finally:
            world.ended(rank, how)

    start = time.perf_counter()
    before = threading.stack_size()
    threading.stack_size(STACK_BYTES)
    try:
        threads = [
            threading.Thread(target=run_rank, args=(rank,), name=f"simulated-rank-{rank}")
            for rank in range(world_size)
        ]
        for thread in threads:
            thread.start()
    finally:
        threading.stack_size(before)
    world.start()
    for thread in threads:
        thread.join()
    links = world.links.clone()
    links.fill_diagonal_(0)  # a rank's copy to itself is no traffic
    return SimulatedRun(results, errors, links, time.perf_counter() - start, world)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 200 else line[:200] + "..."
