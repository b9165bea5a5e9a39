"""Multi-rank tests: one test file, run by plain ``pytest`` or under ``torchrun``.

This module is the pytest plugin (hooks, the ``multidevice_test`` fixture, the
``world_sizes`` marker, the torchrun mode); the worker pools it runs tests on
are in tests/multidevice_pool.py.

A test asks for the ``multidevice_test`` fixture and, optionally, the world
sizes it supports::

    @pytest.mark.world_sizes(2, 4)          # default (1, 2, 4)
    def test_x(multidevice_test):
        ...  # collectives on the default torch.distributed group

Plain ``pytest`` (no launcher variables): each such test is parametrized over
its world sizes (ids ``ws1``, ``ws2``, ...). World size 1 runs in the pytest
process with no process group. World size N > 1 runs the test function in a
pool of N persistent worker processes joined in a gloo group (forked from a
fork server that has imported torch once, see tests/multidevice_pool.py); the
pool is started on first use and reused until the last selected test of its
size is done, or until a test leaves it broken (a rank stuck, dead or timed
out), in which case the next test of that size gets a fresh one.

Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) every process is
one rank: the default group is created at session start (nccl with CUDA, else
gloo), tests run directly, and those whose world sizes exclude the real one are
skipped.

Rules for test authors, so that both modes behave the same:

- At world size 1 (plain pytest) there is no process group: guard collectives
  with ``if d > 1`` or use ``multidevice_test.barrier()``.
- Fixtures run in the pytest process and their values are pickled to the
  workers: parameters and fixtures must be picklable (no lambdas, no
  ``monkeypatch``/``capsys``), and fixtures may read ``multidevice_test.size``
  but not its rank.
- ``tmp_path`` is one directory shared by the ranks of a pool but a separate
  one per process under torchrun: each rank keeps to its own files.
- Workers keep their state between tests (random generator, imported
  modules): seed explicitly, e.g. ``torch.manual_seed(0)`` in the test.
- A test must fail or pass on all ranks together; if one rank fails the others
  are given up on once they have used no CPU for 10 s (blocked, usually in a
  collective the failed rank left), and the pool is stopped.

Time limits tell a hang from slowness (tests/cpu_watch.py), so a busy machine
makes tests slower but never fails them: a run (or a pool's start) is given
up on when none of its ranks that have not answered used more than 10 % of a
core, or was waiting to run, for the hang window (30 s; ``HOSTIR_TEST_HANG_S``, or per test
``@pytest.mark.rank_timeout(hang=seconds)`` for a test that waits on purpose), or
at the wall-clock backstop (300 s; ``HOSTIR_TEST_TIMEOUT``, or per test
``@pytest.mark.rank_timeout(seconds)``). The report then shows each silent rank's
Python stacks. The pools' gloo groups time out collectives after the default
wall-clock limit, so a slow peer is never declared dead before that.

Under torchrun none of this applies: the default group's timeout is
``HOSTIR_TEST_TIMEOUT`` or 120 s, as before, and tests have no other limit.
"""

from __future__ import annotations

import datetime
import os
import pickle
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.cpu_watch import Limits, default_limits
from tests.multidevice_pool import (
    FIXTURE,
    MultiDeviceTest,
    PoolStandIn,
    WorkerPool,
    format_failures,
)
from tests.multidevice_simulated import run_simulated, simulating

DEFAULT_WORLD_SIZES = (1, 2, 4)
TORCHRUN_TIMEOUT_S = 120.0
"""Timeout of the default group under torchrun unless HOSTIR_TEST_TIMEOUT is set."""
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


# ---------------------------------------------------------------------------
# Modes and markers


def launched_by_torchrun() -> bool:
    """True when this process is one rank started by torchrun (or a similar launcher)."""
    return all(var in os.environ for var in LAUNCHER_VARS)


def world_sizes_of(node: Any) -> tuple[int, ...]:
    """The world sizes a test declares with ``@pytest.mark.world_sizes``, else the default."""
    marker = node.get_closest_marker("world_sizes")
    if marker is None:
        return DEFAULT_WORLD_SIZES
    sizes = tuple(marker.args)
    if not sizes or not all(isinstance(n, int) and n >= 1 for n in sizes):
        raise pytest.UsageError(f"{node.nodeid}: world_sizes takes positive ints, got {sizes}")
    return sizes


def limits_of(item: pytest.Item) -> Limits:
    """The limits of a pool run of ``item``: those of its timeout marker (wall-clock
    seconds, and ``hang=`` seconds), else HOSTIR_TEST_TIMEOUT and HOSTIR_TEST_HANG_S."""
    limits = default_limits()
    marker = item.get_closest_marker("rank_timeout")
    if marker is None:
        return limits
    wall = marker.args[0] if marker.args else marker.kwargs.get("timeout", limits.wall_s)
    return Limits(wall_s=float(wall), hang_s=float(marker.kwargs.get("hang", limits.hang_s)))


def world_fixture() -> MultiDeviceTest:
    """The fixture for this process's rank in the real (launcher-made) world."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
    return MultiDeviceTest(
        size=dist.get_world_size(),
        rank=dist.get_rank(),
        local_size=int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())),
        local_rank=local_rank,
        device=device,
    )


def init_launcher_group() -> None:
    """Creates the default group from torchrun's variables unless one already exists."""
    if dist.is_initialized():
        return
    backend = "gloo"
    if torch.cuda.is_available():
        backend = "nccl"
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    timeout = float(os.environ.get("HOSTIR_TEST_TIMEOUT", TORCHRUN_TIMEOUT_S))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))


# ---------------------------------------------------------------------------
# pytest hooks


_POOLS = pytest.StashKey[dict]()
_LAST_USERS = pytest.StashKey[dict]()
"""Test id -> the world sizes whose pool no later selected test uses."""


def pytest_configure(config: pytest.Config) -> None:
    """Registers the markers and the (empty) pool registry."""
    config.addinivalue_line(
        "markers", "world_sizes(*sizes): world sizes a multi-rank test runs at (default 1, 2, 4)"
    )
    config.addinivalue_line(
        "markers",
        "rank_timeout(seconds, hang=seconds): wall-clock limit and hang window of a multi-rank "
        "test run in worker processes",
    )
    config.addinivalue_line(
        "markers",
        "real_ranks: needs a torch.distributed process group; skipped in a simulated world"
        " (HOSTIR_TEST_SIMULATE, tests/multidevice_simulated.py)",
    )
    config.stash[_POOLS] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under torchrun, joins the default process group once for the whole session."""
    if launched_by_torchrun():
        init_launcher_group()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stops every pool (and, under torchrun, leaves the process group)."""
    pools = config.stash.get(_POOLS, {}).values()
    for pool in pools:
        pool.request_stop()  # first all of them, so that they exit in parallel
    for pool in pools:
        pool.shutdown()
    config.stash[_POOLS] = {}
    if launched_by_torchrun() and dist.is_initialized():
        dist.destroy_process_group()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrizes multi-rank tests over their world sizes (plain pytest only)."""
    if FIXTURE not in metafunc.fixturenames or launched_by_torchrun():
        return
    sizes = world_sizes_of(metafunc.definition)
    metafunc.parametrize(FIXTURE, sizes, indirect=True, ids=[f"ws{n}" for n in sizes])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under torchrun, skips multi-rank tests that do not support the real world size."""
    if not launched_by_torchrun():
        return
    size = int(os.environ["WORLD_SIZE"])
    for item in items:
        sizes = world_sizes_of(item)
        if FIXTURE in getattr(item, "fixturenames", ()) and size not in sizes:
            reason = f"needs world size in {sizes}, running at {size}"
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Notes, for each world size, the last selected test that runs on its pool."""
    last = {}
    for item in session.items:
        size = _pool_size(item)
        if size > 1:
            last[size] = item.nodeid
    users: dict[str, list[int]] = {}
    for size, nodeid in last.items():
        users.setdefault(nodeid, []).append(size)
    session.config.stash[_LAST_USERS] = users


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stops the pools no later test needs. Idle workers are not free: each gloo group
    they joined keeps a thread that wakes every few milliseconds (a 4-rank pool holds
    about 35 groups by the end of the suite)."""
    for size in item.config.stash.get(_LAST_USERS, {}).get(item.nodeid, ()):
        pool = item.config.stash[_POOLS].pop(size, None)
        if pool is not None:
            pool.shutdown()


def _pool_size(item: pytest.Item) -> int:
    """The world size a test runs at in plain pytest (1: in this process)."""
    if launched_by_torchrun() or FIXTURE not in getattr(item, "fixturenames", ()):
        return 1
    return item.callspec.params.get(FIXTURE, 1) if hasattr(item, "callspec") else 1


@pytest.fixture
def multidevice_test(request: pytest.FixtureRequest) -> MultiDeviceTest | PoolStandIn:
    """This rank's view of the world the test runs in (see the module docstring)."""
    if launched_by_torchrun():
        return world_fixture()
    size = getattr(request, "param", 1)
    if size == 1:
        return MultiDeviceTest(1, 0, 1, 0, torch.device("cpu"))
    return PoolStandIn(size)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs a world-size-N test on the N workers of a pool instead of in this process."""
    size = _pool_size(pyfuncitem)
    if size == 1:
        return None
    if simulating():
        run_simulated(pyfuncitem, size)
        return True
    job = _pickle_job(pyfuncitem)
    limits = limits_of(pyfuncitem)
    pool = _pool(pyfuncitem.config, size, limits)
    try:
        pool.submit(job)
        replies = pool.collect(limits)
    except BaseException:  # Ctrl-C: the workers are busy, stop them without waiting
        pool.broken = True
        raise
    finally:
        if pool.broken:  # stuck or dead ranks: free them now, start afresh next time
            pyfuncitem.config.stash[_POOLS].pop(size).shutdown()
    _report(replies, pool)
    return True


def _pool(config: pytest.Config, size: int, limits: Limits) -> WorkerPool:
    """The pool for ``size``, started if there is none (yet, or since the last one broke)."""
    pools = config.stash[_POOLS]
    if size in pools:
        return pools[size]
    pool = WorkerPool(size, default_limits())
    try:
        problem = pool.wait_ready(limits)
    except BaseException:  # Ctrl-C while starting
        pool.broken = True
        pool.shutdown()
        raise
    if problem:
        pool.shutdown()
        pytest.fail(problem, pytrace=False)
    pools[size] = pool
    return pool


def _pickle_job(item: pytest.Function) -> bytes:
    """The job message for ``item``; fails the test clearly if an argument cannot be sent."""
    kwargs = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    for name, value in kwargs.items():
        problem = _pickling_problem(value)
        if problem:
            pytest.fail(
                f"argument {name!r} of {item.nodeid} cannot be sent to the worker processes "
                f"({problem}); multi-rank tests take only picklable parameters and fixtures",
                pytrace=False,
            )
    module = item.module
    job = (module.__name__, module.__file__, item.function.__qualname__, kwargs, item.nodeid)
    return pickle.dumps(job)


def _pickling_problem(value: Any) -> str | None:
    """Why ``value`` cannot be pickled, or None if it can."""
    try:
        pickle.dumps(value)
    except Exception as exc:  # pickle raises several types (PicklingError, TypeError, ...)
        return str(exc)
    return None


def _report(replies: dict[int, tuple], pool: WorkerPool) -> None:
    """Turns the ranks' replies into this test's outcome in the pytest process."""
    size = pool.size
    failed = len(replies) < size or any(r[0] in ("error", "died") for r in replies.values())
    if failed:
        failures = format_failures(replies, size, pool.silence, pool.stacks)
        message = f"failed at world size {size}:\n{failures}"
        if pool.broken:
            message += "\n\n(the worker pool was stopped; the next test starts a fresh one)"
        pytest.fail(message, pytrace=False)
    skips = [reply[1] for reply in replies.values() if reply[0] == "skip"]
    if skips:
        raise _skip_at_item(skips[0])
    xfails = [reply[1] for reply in replies.values() if reply[0] == "xfail"]
    if xfails:
        pytest.xfail(xfails[0])


def _skip_at_item(reason: str) -> BaseException:
    """A skip that pytest reports at the test's location rather than at this file's."""
    try:
        return pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without that (private) option
        return pytest.skip.Exception(reason)
