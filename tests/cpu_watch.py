"""Telling a hung process from a slow one, by the CPU time it uses.

A process that is working keeps using CPU however busy the machine is: Linux
gives every runnable process a share of a core, so with load L on C cores
each one gets about C/L of a core, and while it waits for its share it is
seen runnable. A process that is hung (a deadlocked collective, a rank
waiting for a dead peer, a sleep) sleeps in the kernel and uses little: the
threads of gloo, the TCP store and a launcher wake now and then. A fresh pool
worker uses 0.1 % of a core idle; one that has joined 30 gloo groups 1.6 %
(each group keeps a thread that wakes every few milliseconds).

**The rule.** A watched group of processes (a run's process tree, a pool's
ranks that have not answered) is *hung* when, over the last ``window_s``
seconds, none of its processes used more than ``MIN_SHARE`` (10 %) of one
core and none was seen runnable (state R, or D: waiting for a core or the
disk) in the samples taken meanwhile, about one a second. The share is six
times what an idle worker uses; a working process gets more until the load
exceeds 10 per core, and beyond that, starved, it is seen waiting to run. A
busy-looping hang is not caught by this rule; wall-clock limits, kept
generous, are the backstop for it.

CPU time and state are read from ``/proc/<pid>/stat`` (user + system time,
plus that of reaped children, so a child that exits counts for its parent).
Where there is no ``/proc`` (macOS, Windows) nothing is ever found hung and
only the wall-clock limits apply.

The limits themselves (``Limits``) come from the environment:
``HOSTIR_TEST_HANG_S`` (the window, default 30 s) and ``HOSTIR_TEST_TIMEOUT``
(the wall-clock backstop, default 300 s).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import NamedTuple

PROC = "/proc"
CAN_READ_CPU = os.path.exists(f"{PROC}/self/stat")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_SHARE = 0.10
"""Share of one core below which a process that is not runnable counts as making no progress."""
HANG_S = 30.0
"""Default window of the hang rule; ``HOSTIR_TEST_HANG_S`` changes it."""
WALL_S = 300.0
"""Default wall-clock backstop; ``HOSTIR_TEST_TIMEOUT`` changes it."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """When to give up on a run: ``hang_s`` seconds without CPU progress, or
    ``wall_s`` seconds in all."""

    wall_s: float = WALL_S
    hang_s: float = HANG_S

    def describe_hang(self) -> str:
        return (
            f"hung: for {self.hang_s:g} s no process used more than {MIN_SHARE:.0%} of a core "
            "or was waiting to run (HOSTIR_TEST_HANG_S changes this window)"
        )

    def describe_wall(self) -> str:
        return f"over the wall-clock limit of {self.wall_s:g} s (HOSTIR_TEST_TIMEOUT changes it)"


def default_limits() -> Limits:
    """The limits set by HOSTIR_TEST_TIMEOUT and HOSTIR_TEST_HANG_S, else the defaults."""
    return Limits(
        wall_s=float(os.environ.get("HOSTIR_TEST_TIMEOUT", WALL_S)),
        hang_s=float(os.environ.get("HOSTIR_TEST_HANG_S", HANG_S)),
    )


class Usage(NamedTuple):
    """What a process has used so far, and whether it is runnable right now."""

    cpu_s: float
    runnable: bool


def _read_stat(pid: int | str) -> tuple[int, Usage] | None:
    """The process group and usage of ``pid`` from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    fields = data.rpartition(b")")[2].split()  # the name may hold spaces and parentheses
    # fields[0] is stat field 3 (state), [2] field 5 (process group); utime, stime,
    # cutime and cstime are fields 14 to 17.
    cpu = sum(int(value) for value in fields[11:15]) / CLOCK_TICKS
    return int(fields[2]), Usage(cpu, fields[0] in (b"R", b"D"))


def usage_of_processes(pids: list[int]) -> dict[int, Usage]:
    """The usage of each of ``pids`` that still exists."""
    if not CAN_READ_CPU:
        return {}
    found = {}
    for pid in pids:
        stat = _read_stat(pid)
        if stat is not None:
            found[pid] = stat[1]
    return found


def usage_by_process_group() -> dict[int, dict[int, Usage]]:
    """For each process group, the usage of each of its processes.

    A run started as a process group of its own is its whole process tree,
    orphans included, unless one of them starts a group of its own.
    """
    if not CAN_READ_CPU:
        return {}
    groups: dict[int, dict[int, Usage]] = collections.defaultdict(dict)
    for name in os.listdir(PROC):
        if name.isdigit():
            stat = _read_stat(name)
            if stat is not None:
                groups[stat[0]][int(name)] = stat[1]
    return groups


class CpuWatch:
    """Samples of what a group of processes uses; says when the group has hung."""

    def __init__(self, window_s: float, start: float) -> None:
        self.window_s = window_s
        self.start = start
        self._samples: collections.deque[tuple[float, dict[int, Usage]]] = collections.deque()

    def sample(self, now: float, usage: dict[int, Usage]) -> None:
        """Records the usage of each process of the group at time ``now``."""
        self._samples.append((now, usage))
        # Keep one sample at least a window old: the baseline to compare with.
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def hung(self, now: float) -> bool:
        """True when, for a whole window, no process used more than MIN_SHARE of a core
        and none was seen runnable."""
        if not CAN_READ_CPU or len(self._samples) < 2 or now - self.start < self.window_s:
            return False
        (then, before), (_, latest) = self._samples[0], self._samples[-1]
        if then > now - self.window_s or not latest:
            return False  # no sample old enough yet, or nothing left to watch
        seen = [usage for _, sample in list(self._samples)[1:] for usage in sample.values()]
        if any(usage.runnable for usage in seen):
            return False
        allowed = MIN_SHARE * (now - then)
        # A process born since the baseline counts all it used: it did start.
        baseline = {pid: usage.cpu_s for pid, usage in before.items()}
        return all(u.cpu_s - baseline.get(pid, 0.0) <= allowed for pid, u in latest.items())
