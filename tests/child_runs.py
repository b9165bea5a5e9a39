"""Child processes of the tests: started a few ranks at a time, stopped only when hung.

Tests that start processes (tests/test_docs.py, test_cli.py, test_harness.py)
describe each one as a ``Run`` and ask the session's ``child_runs`` fixture (a
``Scheduler``) for its ``Result``. What the scheduler guarantees:

- **Throttle.** At most ``ranks_at_once()`` ranks run at once: a run counts
  as its ``ranks`` (1 for a script, N for ``hostir run --nproc N``; the
  launcher itself mostly waits and is not counted), and a run with more ranks
  than the bound runs alone. The bound is max(2, the cores this process may
  use), changed by ``HOSTIR_TEST_RANKS``. The runs are CPU-bound (starting
  torch alone costs a second of CPU per process), so more at once only makes
  each one slower and the machine's load higher; two at least, so that a
  rank waiting for its peer leaves the other core something to do.
- **Order.** Runs start in the order they were submitted, except that a run
  a test waits for starts next. Waiting for one run keeps starting and
  finishing the others, so tests may ask for results in any order.
- **A hang is told from slowness** by the rule of tests/cpu_watch.py applied
  to the run's process group (every process it started): a run none of
  whose processes used more than 10 % of a core, or was waiting to run, for
  ``HOSTIR_TEST_HANG_S`` (30) s is hung; ``HOSTIR_TEST_TIMEOUT`` (300) s of
  wall-clock time from its start is the backstop. A run whose ranks all
  printed ``rank R/N: ... OK`` (see ``Run.ok_world``) has done its work and
  is never stopped by the wall-clock limit, only by the hang rule.
- **A stopped run says why.** ``Result.killed`` holds the reason, and the
  output is kept. Children run with ``PYTHONFAULTHANDLER=1`` and a stopped
  run gets SIGABRT first, so each of its Python processes writes its
  threads' stacks to its stderr; SIGKILL follows 3 s later.

Python commands (``Python``) are forks of one fork server per session
(tests/fork_server.py) that has imported torch and the project once: a fork
costs milliseconds where a fresh interpreter costs a second. A command given
as an argv tuple runs as a fresh process.

**Process groups, not sessions.** Each run is a process group of its own, so
a stop reaches every process it started (``hostir run``'s ranks included),
but it stays in pytest's session. Linux with autogroup scheduling shares CPU
between sessions first: on the 2-core test machine (kernel 6.18), beside two
``yes > /dev/null`` loops started from pytest's shell, ``import torch`` took
132 s in a new session and 1.6 s in a new process group of the same session.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.cpu_watch import (
    CpuWatch,
    Limits,
    Usage,
    default_limits,
    usage_by_process_group,
    usage_of_processes,
)
from tests.program_recorder import RECORD_VARIABLE, RUN_VARIABLE

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
POLL_S = 0.02
"""How often a waiting test checks whether runs have finished."""
SAMPLE_S = 1.0
"""How often the CPU used by running runs is read (for the hang rule)."""
ABORT_GRACE_S = 3.0
"""How long a stopped run has to write its stacks after SIGABRT, before SIGKILL."""
UNSAFE = re.compile(r"[^\w.-]+")
"""Characters a run's name loses in its folder's name."""
RANK_OK = re.compile(r"^rank (\d+)/(\d+): .*\bOK$")
LAUNCHER_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
LAUNCHER_PREFIXES = ("MASTER_", "TORCHELASTIC_", "ROLE_", "GROUP_", "OMPI_COMM_WORLD_")
OUTPUT_VARIABLES = {"HOSTIR_DUMP", "HOSTIR_TRACEBACK"}
"""Variables that change what hostir prints: never passed on to a child."""


def ranks_at_once() -> int:
    """The throttle's bound: HOSTIR_TEST_RANKS, else max(2, the cores we may use)."""
    if "HOSTIR_TEST_RANKS" in os.environ:
        return max(1, int(os.environ["HOSTIR_TEST_RANKS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, cores or 1)


def child_environment(**extra: str) -> dict[str, str]:
    """Ours minus launcher variables (a child is a world of its own) and the variables
    that change hostir's output; the repository root first on PYTHONPATH; Python's
    fault handler on (stacks on SIGABRT); then ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARIABLES | OUTPUT_VARIABLES and not k.startswith(LAUNCHER_PREFIXES)
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass(frozen=True)
class Python:
    """A Python command for the fork server: ``python -c target`` (kind "code", compiled
    as ``filename``), ``python target`` ("script") or ``python -m target`` ("module"),
    followed by ``args``."""

    kind: str
    target: str
    args: tuple[str, ...] = ()
    filename: str = "<string>"


@dataclasses.dataclass(frozen=True)
class Run:
    """A child process run from the repository root.

    ``command`` is a ``Python`` command or the argv of a fresh process; ``{dir}``
    in its arguments, script or module (not in code) stands for the run's folder,
    where ``files`` (name, text) are written first. ``ranks``: how many CPU-bound
    processes it runs at once. ``ok_world``: if set, the run has done its work
    once ranks 0 .. ok_world-1 have each printed ``rank R/ok_world: ... OK``.
    ``env``: variables added to ``child_environment()``. ``limits``: None for
    ``default_limits()``.
    """

    name: str
    command: Python | tuple[str, ...]
    ranks: int = 1
    ok_world: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    limits: Limits | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """How a run ended: exit code (negative: killed by that signal), its output, its
    folder, and why it was stopped (None if it ended by itself)."""

    returncode: int
    stdout: str
    stderr: str
    folder: pathlib.Path
    killed: str | None = None

    def describe(self) -> str:
        ending = f"stopped: {self.killed}" if self.killed else f"exit code {self.returncode}"
        return f"{ending}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def ranks_ok(stdout: str, world: int) -> set[int]:
    """The ranks that printed ``rank R/world: ... OK`` on a line of their own."""
    matches = (RANK_OK.match(line) for line in stdout.splitlines())
    return {int(m[1]) for m in matches if m and int(m[2]) == world}


# ---------------------------------------------------------------------------
# Starting runs


class ForkServer:
    """The client of tests/fork_server.py: one server process, forks on request."""

    def __init__(self, folder: pathlib.Path, limits: Limits) -> None:
        self.log = folder / "fork_server.log"
        self.limits = limits
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.fork_server"],
                cwd=REPO_ROOT,
                env=child_environment(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                process_group=0,  # not a session: see "Process groups" in the module docstring
            )

    def fork(self, request: dict) -> int:
        """Sends one request; returns the pid of the child that runs it."""
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()
        start = time.monotonic()
        watch = CpuWatch(self.limits.hang_s, start)  # the first answer waits for its imports
        while not select.select([self.process.stdout], [], [], SAMPLE_S)[0]:
            now = time.monotonic()
            watch.sample(now, usage_of_processes([self.process.pid]))
            if watch.hung(now) or now - start > self.limits.wall_s:
                raise RuntimeError(f"the fork server does not answer; its log: {self.log}")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server died: {self.log.read_text()}")
        return int(line)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Closes its stdin (it kills its children left and exits), then waits for it."""
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Started:
    """A run in progress: its process (the leader of its process group) and its CPU watch."""

    def __init__(self, run: Run, folder: pathlib.Path, server: ForkServer | None) -> None:
        self.run = run
        self.folder = folder
        self.limits = run.limits or default_limits()
        folder.mkdir(parents=True)
        for name, text in run.files:
            (folder / name).write_text(text)
        self.stdout_path, self.stderr_path = folder / "stdout", folder / "stderr"
        self.status_path = folder / "status"
        env = child_environment(**dict(run.env))
        if env.get(RECORD_VARIABLE):  # name the run: it often runs on behalf of many tests
            env.pop("PYTEST_CURRENT_TEST", None)
            env[RUN_VARIABLE] = run.name
        self.server = server if isinstance(run.command, Python) else None
        self.popen: subprocess.Popen | None = None
        if isinstance(run.command, Python):
            self.pid = server.fork(self._request(run.command, env))
        else:
            with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
                self.popen = subprocess.Popen(
                    [self._expand(arg) for arg in run.command],
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    process_group=0,  # its own group: a stop reaches all it starts
                )
            self.pid = self.popen.pid
        self.start = time.monotonic()
        self.watch = CpuWatch(self.limits.hang_s, self.start)
        self.killed: str | None = None

    def _expand(self, text: str) -> str:
        return text.replace("{dir}", str(self.folder))

    def _request(self, command: Python, env: dict[str, str]) -> dict:
        first = {"code": "-c", "script": command.target, "module": command.target}[command.kind]
        target = command.target if command.kind == "code" else self._expand(command.target)
        return {
            "kind": command.kind,
            "target": target,  # code is passed as it is: "{dir}" may be Python there
            "filename": command.filename,
            "argv": [self._expand(first), *map(self._expand, command.args)],
            "cwd": str(REPO_ROOT),
            "env": env,
            "stdout": str(self.stdout_path),
            "stderr": str(self.stderr_path),
            "status": str(self.status_path),
        }

    def poll(self) -> int | None:
        """The exit code once the run's leader has exited, else None."""
        if self.popen is not None:
            return self.popen.poll()
        if self.status_path.exists():
            return int(self.status_path.read_text())
        return None

    def check(self, now: float, usage: dict[int, Usage]) -> None:
        """Applies the hang rule and the wall-clock limit; stops the run if it broke one."""
        self.watch.sample(now, usage)
        if self.watch.hung(now):
            self.stop(self.limits.describe_hang())
        elif now - self.start > self.limits.wall_s and not self._all_ok():
            self.stop(self.limits.describe_wall())

    def _all_ok(self) -> bool:
        world = self.run.ok_world
        stdout = self.stdout_path.read_text(errors="replace")
        return world is not None and ranks_ok(stdout, world) == set(range(world))

    def stop(self, reason: str | None) -> None:
        """SIGABRT to every process of the run (stacks), SIGKILL if they are still there."""
        self.killed = self.killed or reason
        for sig in (signal.SIGABRT, signal.SIGKILL):
            try:
                os.killpg(self.pid, sig)
            except OSError:  # all gone
                return
            deadline = time.monotonic() + ABORT_GRACE_S
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if self.poll() is not None:
                return

    def result(self, returncode: int) -> Result:
        stdout, stderr = _read(self.stdout_path), _read(self.stderr_path)
        return Result(returncode, stdout, stderr, self.folder, self.killed)


def _read(path: pathlib.Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# ---------------------------------------------------------------------------
# The scheduler


class Scheduler:
    """Starts submitted runs a few ranks at a time and hands out their results."""

    def __init__(self, folder: pathlib.Path, bound: int) -> None:
        self.folder = folder
        self.bound = bound
        self.queue: list[Run] = []
        self.running: dict[str, Started] = {}
        self.done: dict[str, Result] = {}
        self._server: ForkServer | None = None
        self._folders = 0
        self._next_sample = 0.0

    def submit(self, run: Run) -> None:
        """Queues ``run`` unless it is queued, running or done already (names are keys)."""
        if run.name not in self.done and run.name not in self.running and run not in self.queue:
            self.queue.append(run)

    def result(self, run: Run) -> Result:
        """Waits for ``run`` (submitting it, and starting it next, if need be)."""
        self.submit(run)
        if run in self.queue:
            self.queue.remove(run)
            self.queue.insert(0, run)
        while run.name not in self.done:
            self.step()
            if run.name not in self.done:
                time.sleep(POLL_S)
        return self.done[run.name]

    def forget(self, runs: list[Run]) -> None:
        """Drops queued runs nobody will ask for; stops running ones; frees results."""
        for run in runs:
            if run in self.queue:
                self.queue.remove(run)
            if run.name in self.running:
                self.running.pop(run.name).stop("no test needs it any more")
            self.done.pop(run.name, None)

    def stop(self) -> None:
        """Stops every run still going, and the fork server."""
        self.queue.clear()
        for started in self.running.values():
            started.stop(None)
        self.running.clear()
        if self._server is not None:
            self._server.close()

    def step(self) -> None:
        """Collects finished runs, applies the limits, and starts what fits."""
        for name, started in list(self.running.items()):
            code = started.poll()
            if code is None and started.server is not None and not started.server.alive:
                code = -signal.SIGKILL
                started.killed = f"the fork server died (its log: {started.server.log})"
            if code is not None:
                self.done[name] = started.result(code)
                del self.running[name]
        now = time.monotonic()
        if now >= self._next_sample and self.running:
            self._next_sample = now + SAMPLE_S
            groups = usage_by_process_group()
            for started in list(self.running.values()):
                started.check(now, groups.get(started.pid, {}))
        self._start_what_fits()

    def _start_what_fits(self) -> None:
        while self.queue:
            busy = sum(started.run.ranks for started in self.running.values())
            run = self.queue[0]
            if self.running and busy + run.ranks > self.bound:
                return
            self.queue.pop(0)
            self._folders += 1
            folder = self.folder / f"{self._folders:03d}_{UNSAFE.sub('_', run.name)}"
            server = self._fork_server() if isinstance(run.command, Python) else None
            self.running[run.name] = Started(run, folder, server)

    def _fork_server(self) -> ForkServer:
        if self._server is None or not self._server.alive:
            self._server = ForkServer(self.folder, default_limits())
        return self._server


@pytest.fixture(scope="session")
def child_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    """The session's scheduler of child runs (see the module docstring)."""
    scheduler = Scheduler(tmp_path_factory.mktemp("runs"), ranks_at_once())
    yield scheduler
    scheduler.stop()
