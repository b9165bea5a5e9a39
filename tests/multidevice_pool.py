"""The worker pools of the multi-rank harness (the pytest plugin is tests/multidevice.py).

- ``MultiDeviceTest``: what a multi-rank test sees of its world (the
  ``multidevice_test`` fixture's value); ``PoolStandIn``: the fixture's value in
  the pytest process while the test itself runs in a pool.
- Worker side (``worker_main``, ``run_job``): each spawned worker joins its
  pool's gloo group, then runs jobs (a test module, its path, the test's
  qualified name, its arguments and its node id, pickled) until told to stop,
  importing test modules by name with pytest's assertion rewriting.
- Parent side (``WorkerPool``, ``format_failures``): N workers for one world
  size, with the group's TCP store hosted by the parent, and the per-rank
  report of a failed run.

Workers are forked from multiprocessing's fork server, which imports torch
and the project once (``PRELOAD``) for all pools of the session: a worker
costs tens of milliseconds instead of a second of importing torch, and a
broken pool is cheap to replace. (Where there is no fork server, workers
are spawned.) Workers therefore see the environment the pytest process had
when the first pool started.

Limits (``collect``) tell a hang from slowness with the rule of
tests/cpu_watch.py, applied to the ranks that have not answered: they are
given up on when none of them used more than 10 % of a core, or was waiting
to run, for the hang window (``Limits.hang_s``, 30 s by default), or for ``GRACE_S`` once one
rank has failed (the others are then usually blocked in a collective it
left); the wall-clock limit (``Limits.wall_s``, 300 s) is only a backstop.
Before a pool is given up on, each silent worker writes its Python stacks
(``faulthandler`` on SIGUSR1), and the report shows where it was stuck.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import faulthandler
import importlib
import importlib.util
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.cpu_watch import CpuWatch, Limits, usage_of_processes

FIXTURE = "multidevice_test"
GRACE_S = 10.0
"""Once one rank has failed, the others are given up on after this long without CPU progress."""
SAMPLE_S = 1.0
"""How often the CPU used by ranks that have not answered is read."""
STACKS_WAIT_S = 2.0
"""How long silent workers may take to write their stacks."""
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.distributed.tensor")
PRELOAD += (__name__, "hostir", "frontend", "lowering")
"""Modules the workers' fork server imports once (names that fail to import are skipped).
DTensor's (tests/frontend/test_dtensor.py, tests/lowering/test_distribution.py at 2, 4
and 8 ranks) import torch._dynamo at their first ``DTensor.from_local``: about a second
of CPU per worker, 8 s of the 3-d mesh test's 14 s on 8 ranks of 2 cores, paid once here."""


@dataclasses.dataclass(frozen=True)
class MultiDeviceTest:
    """What a multi-rank test sees of its world: sizes, ranks and device."""

    size: int
    rank: int
    local_size: int
    local_rank: int
    device: torch.device

    def shard_tensor(self, t: torch.Tensor, tv: Any) -> torch.Tensor | None:
        """This rank's shard of the unsharded ``t`` as laid out by TensorView ``tv``."""
        import frontend  # lazily: the harness must not depend on the frontend

        piece = frontend.shard_tensor(t, tv, rank=self.rank)
        return None if piece is None else piece.to(self.device)  # None: rank outside the mesh

    def shard_tensor_1d(self, t: torch.Tensor, dim: int, mesh: Any) -> torch.Tensor | None:
        """This rank's shard of ``t`` split along ``dim`` over the devices of ``mesh``."""
        piece = mesh.shard_tensor(t, dim, rank=self.rank)
        return None if piece is None else piece.to(self.device)

    def barrier(self) -> None:
        """Waits for every rank; a no-op in a world of one process."""
        from hostir.comm.world import barrier  # lazily, as shard_tensor's frontend

        barrier()


@dataclasses.dataclass(frozen=True)
class PoolStandIn:
    """The fixture's value in the pytest process at world size > 1.

    The test itself runs in the workers, which swap in their own
    :class:`MultiDeviceTest`; only ``size`` is meaningful here (for fixtures
    that build, say, a mesh from it).
    """

    size: int

    def __getattr__(self, name: str) -> Any:
        # Only called for missing attributes; dunders (pickle probes) get the plain error.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{FIXTURE}.{name} is only available inside the test function: at world size "
            f"{self.__dict__.get('size')} the test runs in worker processes, fixtures run in "
            "the pytest process"
        )


# ---------------------------------------------------------------------------
# Worker side: runs in each spawned process of a pool


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a spawned worker needs to join its pool's process group."""

    rank: int
    size: int
    port: int
    sys_path: list[str]
    stacks: str
    """The file this worker writes its Python stacks to on SIGUSR1."""
    collective_timeout_s: float


_STACKS_FILE = None
"""Kept open for faulthandler, which writes to it from a signal handler."""


def worker_main(spec: WorkerSpec, conn: multiprocessing.connection.Connection) -> None:
    """Entry point of a pool worker: join the group, then run jobs until told to stop."""
    global _STACKS_FILE
    # Ctrl-C reaches the whole process group; the parent handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STACKS_FILE = open(spec.stacks, "w")  # open for the process's lifetime
    faulthandler.register(signal.SIGUSR1, file=_STACKS_FILE, all_threads=True)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    try:
        fixture = _join_group(spec)
    except BaseException as exc:  # report instead of dying silently
        conn.send(("error", type(exc).__name__, "".join(traceback.format_exception(exc))))
        return
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv_bytes()
        except EOFError:  # the parent is gone
            break
        if not job:  # the empty message means: shut down
            break
        conn.send(run_job(pickle.loads(job), fixture))
    dist.destroy_process_group()
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: with torch loaded it takes about a second.
    os._exit(0)


def _exit_with_parent() -> None:
    """Ends this worker when the pytest process dies, even mid-test (no orphans)."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    os._exit(1)


def _join_group(spec: WorkerSpec) -> MultiDeviceTest:
    """Sets up this worker like a torchrun rank and joins the pool's gloo group."""
    sys.path[:] = spec.sys_path
    torch.set_num_threads(1)  # N ranks share a few cores
    os.environ.update(
        RANK=str(spec.rank),
        WORLD_SIZE=str(spec.size),
        LOCAL_RANK=str(spec.rank),
        LOCAL_WORLD_SIZE=str(spec.size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.port),
    )
    store = dist.TCPStore("127.0.0.1", spec.port, spec.size, is_master=False)
    # As long as the harness's wall-clock limit: a slow peer is never declared dead
    # before the harness would give up; hung ones are found sooner by the hang rule.
    timeout = datetime.timedelta(seconds=spec.collective_timeout_s)
    dist.init_process_group(
        "gloo", store=store, rank=spec.rank, world_size=spec.size, timeout=timeout
    )
    cpu = torch.device("cpu")
    return MultiDeviceTest(spec.size, spec.rank, spec.size, spec.rank, cpu)


def run_job(job: tuple, fixture: MultiDeviceTest) -> tuple:
    """Runs one test function; returns ("ok",), ("skip"|"xfail", reason) or an error.

    ``PYTEST_CURRENT_TEST`` names the test meanwhile, as pytest does in its own process
    (the program recorder, tests/program_recorder.py, reads it)."""
    *call, nodeid = job
    os.environ["PYTEST_CURRENT_TEST"] = f"{nodeid} (call)"
    try:
        return _run_function(*call, fixture)
    finally:
        os.environ.pop("PYTEST_CURRENT_TEST", None)


def _run_function(
    module_name: str, module_path: str, qualname: str, kwargs: dict, fixture: MultiDeviceTest
) -> tuple:
    try:
        function = _load_function(module_name, module_path, qualname)
        kwargs = {k: fixture if isinstance(v, PoolStandIn) else v for k, v in kwargs.items()}
        try:
            function(**kwargs)
        finally:
            # A monkeypatch fixture arrives pickled and patches this worker: undo it here
            # (pytest undoes only the parent's copy), or later tests inherit its changes.
            for value in kwargs.values():
                if isinstance(value, pytest.MonkeyPatch):
                    value.undo()
    except pytest.skip.Exception as exc:
        return ("skip", exc.msg)
    except pytest.xfail.Exception as exc:
        return ("xfail", exc.msg)
    except BaseException as exc:
        # Drop this frame: the traceback should start in the test.
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
        return ("error", type(exc).__name__, "".join(lines))
    return ("ok", BROKEN_WORLD) if world_broken() else ("ok",)


BROKEN_WORLD = "broken world"
"""Marks the reply of a test after which hostir refuses to communicate (a fault test that
timed out a collective): the pool is replaced before the next test."""


def world_broken() -> bool:
    """Whether hostir's process groups failed in this worker (hostir then refuses to
    communicate, so the pool must start afresh)."""
    module = sys.modules.get("hostir.comm.torch_groups")
    return module is not None and module.GROUPS.failure is not None


def _load_function(module_name: str, module_path: str, qualname: str) -> Any:
    """The test function (a bound method for tests in classes) named by a job."""
    obj = sys.modules.get(module_name) or _import_test_module(module_name, module_path)
    *owners, name = qualname.split(".")
    for owner in owners:
        obj = getattr(obj, owner)
    if isinstance(obj, type):
        obj = obj()  # pytest makes a fresh instance per test, so do we
    return getattr(obj, name)


def _import_test_module(module_name: str, module_path: str) -> Any:
    """Imports a test module with pytest's assertion rewriting, as pytest itself does.

    Rewriting makes a failed ``assert a == b`` on a worker show the values.
    """
    package = module_name.rpartition(".")[0]
    if package:
        importlib.import_module(package)
    source = pathlib.Path(module_path).read_bytes()
    tree = ast.parse(source, filename=module_path)
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, source, module_path)
    except ImportError:  # private API: plain asserts still work without it
        pass
    spec = importlib.util.spec_from_file_location(module_name, module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        exec(compile(tree, module_path, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# ---------------------------------------------------------------------------
# Parent side: the pool of workers for one world size


def _context() -> multiprocessing.context.BaseContext:
    """The fork server context (set up to preload torch), else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))  # effective until the server starts
    return context


class WorkerPool:
    """N worker processes, one per rank, sharing a gloo group.

    The parent hosts the group's TCP store, so the port is bound by the time a
    worker connects: two sessions on one machine cannot race for it.
    ``silence`` says why ranks missing from the last ``collect`` did not answer,
    and ``stacks`` where each of them was (its Python stacks).
    """

    def __init__(self, size: int, limits: Limits) -> None:
        self.size = size
        self.broken = False
        self.silence = ""
        self.stacks: dict[int, str] = {}
        self._folder = tempfile.mkdtemp(prefix=f"hostir-pool{size}-")
        self._store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        context = _context()
        self._conns = []
        self._procs = []
        for rank in range(size):
            stacks = os.path.join(self._folder, f"stacks{rank}.txt")
            spec = WorkerSpec(rank, size, self._store.port, list(sys.path), stacks, limits.wall_s)
            parent_end, child_end = context.Pipe()
            proc = context.Process(target=worker_main, args=(spec, child_end), daemon=True)
            proc.start()
            child_end.close()
            self._conns.append(parent_end)
            self._procs.append(proc)

    def wait_ready(self, limits: Limits) -> str | None:
        """Waits until every worker has joined the group; else says why they could not."""
        replies = self.collect(limits)
        if len(replies) == self.size and all(reply[0] == "ready" for reply in replies.values()):
            return None
        self.broken = True
        failures = format_failures(replies, self.size, self.silence, self.stacks)
        return f"could not start {self.size} workers:\n{failures}"

    def submit(self, job: bytes) -> None:
        """Sends one pickled job to every rank."""
        for conn in self._conns:
            conn.send_bytes(job)

    def collect(self, limits: Limits) -> dict[int, tuple]:
        """Each rank's reply; ranks missing from the result did not answer (see ``silence``).

        The ranks that have not answered are given up on when they hang (the
        rule of tests/cpu_watch.py over ``limits.hang_s``, or over GRACE_S once
        a rank has reported anything but success: the others are then likely
        blocked in a collective the failed rank left), or at ``limits.wall_s``.
        The window starts afresh at each answer: until then the others may
        have been waiting, idle, for the rank that answered.
        """
        start = time.monotonic()
        watch = CpuWatch(limits.hang_s, start)
        replies: dict[int, tuple] = {}
        failed = False
        self.silence, self.stacks = "", {}
        while len(replies) < self.size:
            pending = [r for r in range(self.size) if r not in replies]
            waitables = [self._conns[r] for r in pending] + [
                self._procs[r].sentinel for r in pending
            ]
            ready = multiprocessing.connection.wait(waitables, SAMPLE_S)
            answered = [
                r for r in pending if self._conns[r] in ready or self._procs[r].sentinel in ready
            ]
            for rank in answered:
                replies[rank] = self._receive(rank)
                failed = failed or replies[rank][0] not in ("ok", "ready")
            now = time.monotonic()
            if answered:  # the others may have been waiting for it: a new window starts
                watch = CpuWatch(min(GRACE_S, limits.hang_s) if failed else limits.hang_s, now)
            pending = [r for r in range(self.size) if r not in replies]
            watch.sample(now, usage_of_processes([self._procs[r].pid for r in pending]))
            if pending and watch.hung(now):
                self.silence = _describe_hang(watch.window_s, limits, failed)
            elif pending and now - start > limits.wall_s:
                self.silence = limits.describe_wall()
            if self.silence:
                self.stacks = self._dump_stacks(pending)
                break
        if len(replies) < self.size or any(reply[0] == "died" for reply in replies.values()):
            self.broken = True
        if any(BROKEN_WORLD in reply[1:] for reply in replies.values()):
            self.broken = True
        return replies

    def _receive(self, rank: int) -> tuple:
        """The reply of a rank whose pipe or process became ready."""
        conn, proc = self._conns[rank], self._procs[rank]
        try:
            if conn.poll():
                return conn.recv()
        except (EOFError, OSError):
            pass
        proc.join(1)
        return ("died", f"worker process died (exit code {proc.exitcode})")

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Each silent rank's Python stacks, written by faulthandler on SIGUSR1."""
        paths = {rank: pathlib.Path(self._folder, f"stacks{rank}.txt") for rank in ranks}
        for rank in ranks:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except OSError:  # gone
                paths.pop(rank)
        deadline = time.monotonic() + STACKS_WAIT_S
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:  # until every file has stopped growing
            time.sleep(0.1)
            now = {rank: path.stat().st_size for rank, path in paths.items() if path.exists()}
            if now == sizes and all(now.values()) and len(now) == len(paths):
                break
            sizes = now
        return {rank: path.read_text(errors="replace") for rank, path in paths.items()}

    def request_stop(self) -> None:
        """Asks idle workers to leave the group and exit (stuck ones will not hear it)."""
        for conn in self._conns:
            try:
                conn.send_bytes(b"")
            except OSError:  # already dead
                pass

    def shutdown(self) -> None:
        """Stops the workers: politely if they are idle, by force if they are stuck."""
        self.request_stop()
        deadline = time.monotonic() + (0 if self.broken else 5)
        for proc in self._procs:
            proc.join(max(deadline - time.monotonic(), 0))
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        shutil.rmtree(self._folder, ignore_errors=True)
        self.broken = True


def _describe_hang(window_s: float, limits: Limits, failed: bool) -> str:
    if failed:
        return (
            f"no reply after the failure above, and no CPU used for {window_s:g} s "
            "(probably blocked in a collective)"
        )
    return (
        f"no reply: {limits.describe_hang()}; a test that waits on purpose for longer "
        "can say so with @pytest.mark.rank_timeout(hang=seconds)"
    )


def format_failures(
    replies: dict[int, tuple], size: int, silence: str, stacks: dict[int, str]
) -> str:
    """One block per rank that failed, died or did not answer, each prefixed ``rank R:``;
    a rank that did not answer says why (``silence``) and shows its stacks.

    Errors come first: a rank that did not answer is usually waiting for them.
    """
    errors = [f"rank {r}: {e[1]}\n{e[2].rstrip()}" for r, e in replies.items() if e[0] == "error"]
    deaths = [f"rank {r}: {e[1]}" for r, e in replies.items() if e[0] == "died"]
    silent = []
    for rank in range(size):
        if rank not in replies:
            where = stacks.get(rank, "").strip()
            silent.append(f"rank {rank}: {silence}" + (f"\nits stacks:\n{where}" if where else ""))
    return "\n\n".join(sorted(errors) + sorted(deaths) + silent)
