"""Telling a hung process from a slow one, by the CPU time it uses.

A process that is working keeps using CPU however busy the machine is: Linux
gives every runnable process a share of a core within about a second, so with
load L on C cores each one gets about C/L of a core. A process that is hung (a
deadlocked collective, a rank waiting for a dead peer, a sleep) sits in the
kernel and uses almost none: the threads of gloo, the TCP store and a launcher
wake now and then, about 0.1 % of a core per process (measured on 8 idle pool
workers: 0.25 s of CPU in 30 s).

**The rule.** A watched group of processes (a run's process tree, a pool's
ranks that have not answered) is *hung* when, over the last ``window_s``
seconds, none of its processes used more than ``MIN_SHARE`` (2 %) of one core.
With 30 s windows that is 0.6 s of CPU: ten times what an idle process uses,
and reached by a working process until the load exceeds about 100 per core.
A busy-looping hang is not caught by this rule; wall-clock limits, kept
generous, are the backstop for it.

CPU time is read from ``/proc/<pid>/stat`` (user + system time, plus that of
reaped children, so a child that exits counts for its parent). Where there is
no ``/proc`` (macOS, Windows) nothing is ever found hung and only the
wall-clock limits apply.

The limits themselves (``Limits``) come from the environment:
``HOSTIR_TEST_HANG_S`` (the window, default 30 s) and ``HOSTIR_TEST_TIMEOUT``
(the wall-clock backstop, default 300 s).
"""

from __future__ import annotations

import collections
import dataclasses
import os

PROC = "/proc"
CAN_READ_CPU = os.path.exists(f"{PROC}/self/stat")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_SHARE = 0.02
"""Share of one core below which a process counts as making no progress."""
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
            f"hung: no process used more than {MIN_SHARE:.0%} of a core for {self.hang_s:g} s "
            "(HOSTIR_TEST_HANG_S changes this window)"
        )

    def describe_wall(self) -> str:
        return f"over the wall-clock limit of {self.wall_s:g} s (HOSTIR_TEST_TIMEOUT changes it)"


def default_limits() -> Limits:
    """The limits set by HOSTIR_TEST_TIMEOUT and HOSTIR_TEST_HANG_S, else the defaults."""
    return Limits(
        wall_s=float(os.environ.get("HOSTIR_TEST_TIMEOUT", WALL_S)),
        hang_s=float(os.environ.get("HOSTIR_TEST_HANG_S", HANG_S)),
    )


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    return data.rpartition(b")")[2].split()  # the name may hold spaces and parentheses


def _cpu_of(fields: list[bytes]) -> float:
    # fields[0] is stat field 3 (state); utime, stime, cutime, cstime are fields 14 to 17.
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def cpu_of_processes(pids: list[int]) -> dict[int, float]:
    """CPU seconds used so far by each of ``pids`` that still exists."""
    if not CAN_READ_CPU:
        return {}
    found = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            found[pid] = _cpu_of(fields)
    return found


def cpu_by_session() -> dict[int, dict[int, float]]:
    """For each session id, the CPU seconds used so far by each of its processes.

    A run started in a session of its own (``start_new_session``, ``setsid``)
    is its whole process tree, orphans included, unless one of them starts a
    session of its own.
    """
    if not CAN_READ_CPU:
        return {}
    sessions: dict[int, dict[int, float]] = collections.defaultdict(dict)
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None:
            sessions[int(fields[3])][int(name)] = _cpu_of(fields)
    return sessions


class CpuWatch:
    """Samples of the CPU used by a group of processes; says when the group has hung."""

    def __init__(self, window_s: float, start: float) -> None:
        self.window_s = window_s
        self.start = start
        self._samples: collections.deque[tuple[float, dict[int, float]]] = collections.deque()

    def sample(self, now: float, cpu: dict[int, float]) -> None:
        """Records the CPU seconds of each process of the group at time ``now``."""
        self._samples.append((now, cpu))
        # Keep one sample at least a window old: the baseline to compare with.
        while len(self._samples) > 1 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def hung(self, now: float) -> bool:
        """True when no process has used more than MIN_SHARE of a core for a whole window."""
        if not CAN_READ_CPU or len(self._samples) < 2 or now - self.start < self.window_s:
            return False
        (then, before), (_, latest) = self._samples[0], self._samples[-1]
        if then > now - self.window_s or not latest:
            return False  # no sample old enough yet, or nothing left to watch
        allowed = MIN_SHARE * (now - then)
        # A process born since the baseline counts all it used: it did start.
        return all(used - before.get(pid, 0.0) <= allowed for pid, used in latest.items())
