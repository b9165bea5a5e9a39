"""The tests' child runs (tests/child_runs.py): throttle, hang rule, fork server."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest

from tests.child_runs import Python, Result, Run, Scheduler, child_environment
from tests.cpu_watch import CpuWatch, Limits, Usage
from tests.multidevice import launched_by_torchrun

pytestmark = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="starts its own processes: runs on rank 0 only",
)


def code(name: str, source: str, **options) -> Run:
    """A run of ``source`` (dedented) as ``python -c``, its tracebacks naming ``name``."""
    return Run(name, Python("code", textwrap.dedent(source), filename=name), **options)


# ---------------------------------------------------------------------------
# The throttle

TIMES = "import sys, time; print(time.time()); time.sleep(0.3); print(time.time())"


def test_no_more_ranks_run_at_once_than_the_bound(tmp_path):
    """Bound 2: runs of 1 and 2 ranks never overlap beyond 2 ranks; a run of 3 runs alone.
    Results are asked for in the reverse order of submission."""
    scheduler = Scheduler(tmp_path, bound=2)
    ranks = [1, 2, 1, 1, 3, 1, 2]
    runs = [Run(f"run{i}", (sys.executable, "-c", TIMES), ranks=n) for i, n in enumerate(ranks)]
    try:
        for run in runs:
            scheduler.submit(run)
        results = {run.name: scheduler.result(run) for run in reversed(runs)}
    finally:
        scheduler.stop()
    spans = []
    for run in runs:
        result = results[run.name]
        assert result.returncode == 0, result.describe()
        start, end = map(float, result.stdout.split())
        spans.append((start, end, run.ranks))
    for start, _, n in spans:  # at each start: the ranks running then
        running = [m for s, e, m in spans if s <= start < e]
        assert sum(running) <= 2 or running == [n], spans


def test_ranks_at_once_can_be_set(monkeypatch):
    from tests.child_runs import ranks_at_once

    monkeypatch.setenv("HOSTIR_TEST_RANKS", "5")
    assert ranks_at_once() == 5
    monkeypatch.delenv("HOSTIR_TEST_RANKS")
    assert ranks_at_once() >= 2


# ---------------------------------------------------------------------------
# Hangs, slowness and the wall-clock limit

HANGS = code(
    "hangs.py",
    """
    import time
    print("started", flush=True)
    time.sleep(60)
    """,
    limits=Limits(wall_s=60, hang_s=1),
)
BUSY = code(
    "busy.py",
    """
    import time
    start = time.process_time()
    while time.process_time() - start < 1.5:  # longer than the window, always on CPU
        pass
    print("done")
    """,
    limits=Limits(wall_s=60, hang_s=1),
)
OK_THEN_SLOW = code(
    "ok_then_slow.py",
    """
    import time
    print("rank 0/1: checked, OK", flush=True)
    time.sleep(2.5)  # a slow exit, past the wall-clock limit
    """,
    ok_world=1,
    limits=Limits(wall_s=1, hang_s=30),
)
SLOW = code(
    "slow.py",
    """
    import time
    print("rank 0/1: checked", flush=True)  # not OK: the wall-clock limit applies
    time.sleep(30)
    """,
    ok_world=1,
    limits=Limits(wall_s=1, hang_s=30),
)


@pytest.fixture(scope="module")
def limit_runs(child_runs: Scheduler) -> dict[str, Result]:
    """The four runs above, run side by side."""
    runs = [HANGS, BUSY, OK_THEN_SLOW, SLOW]
    for run in runs:
        child_runs.submit(run)
    return {run.name: child_runs.result(run) for run in runs}


def test_a_hung_run_is_stopped_and_shows_where(limit_runs):
    result = limit_runs["hangs.py"]
    assert result.killed.startswith("hung: for 1 s no process used more than 10% of a core")
    assert result.returncode == -signal.SIGABRT  # its stacks first
    assert result.stdout == "started\n"
    assert 'File "hangs.py", line 4 in <module>' in result.stderr, result.stderr


def test_a_slow_run_that_uses_cpu_is_not_a_hang(limit_runs):
    result = limit_runs["busy.py"]
    assert result.returncode == 0 and result.killed is None and result.stdout == "done\n"


def test_a_run_whose_ranks_printed_ok_is_not_stopped_for_time(limit_runs):
    result = limit_runs["ok_then_slow.py"]
    assert result.returncode == 0 and result.killed is None, result.describe()


def test_other_runs_are_stopped_at_the_wall_clock_limit(limit_runs):
    result = limit_runs["slow.py"]
    assert result.killed.startswith("over the wall-clock limit of 1 s"), result.describe()
    assert result.stdout == "rank 0/1: checked\n"
    assert result.describe().startswith("stopped: over the wall-clock limit of 1 s")


def test_cpu_watch_needs_a_whole_window_without_progress():
    asleep = lambda cpu: Usage(cpu, runnable=False)  # noqa: E731
    watch = CpuWatch(window_s=10, start=0)
    watch.sample(0, {1: asleep(0.0), 2: asleep(5.0)})
    watch.sample(9, {1: asleep(0.0), 2: asleep(5.0)})
    assert not watch.hung(9)  # less than a window since the start
    watch.sample(10, {1: asleep(0.5), 2: asleep(5.9)})
    assert watch.hung(10)  # at most 0.9 s in 10 s: 9 % of a core
    watch.sample(11, {1: asleep(0.5), 2: asleep(5.9), 3: asleep(1.5)})
    assert not watch.hung(11)  # a new process that used CPU is progress
    watch.sample(21, {1: asleep(0.5), 2: asleep(5.9), 3: asleep(1.5)})
    assert watch.hung(21)
    watch.sample(22, {1: Usage(0.5, runnable=True), 2: asleep(5.9), 3: asleep(1.5)})
    assert not watch.hung(22)  # starved of CPU, but waiting to run


# ---------------------------------------------------------------------------
# The fork server behaves like a fresh interpreter

EXITS = [
    ("import sys; sys.exit(3)", 3, ""),
    ("import sys; sys.exit('bye')", 1, "bye\n"),
    ("raise SystemExit", 0, ""),
    ("print('out')", 0, ""),
]


@pytest.mark.parametrize("source, code_, stderr", EXITS, ids=["int", "str", "none", "ok"])
def test_exit_codes_are_the_interpreters(source, code_, stderr, child_runs):
    result = child_runs.result(code(f"exit {source}", source))
    assert (result.returncode, result.stderr) == (code_, stderr)


def test_tracebacks_start_in_the_run(child_runs):
    result = child_runs.result(code("raises.md", "\n\nx = 1 / 0\n"))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "Traceback (most recent call last):",
        '  File "raises.md", line 3, in <module>',
        "ZeroDivisionError: division by zero",
    ]


ENVIRONMENT = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran"))
print(sys.argv, os.getcwd() == os.environ["EXPECTED_CWD"], sys.stdin.read() == "")
print(os.environ.get("RANK"), os.environ["EXTRA"], os.environ["PYTHONFAULTHANDLER"])
"""


def test_argv_cwd_environment_stdin_and_atexit(child_runs, monkeypatch):
    monkeypatch.setenv("RANK", "3")  # a launcher variable: not passed on
    cwd = child_environment()["PYTHONPATH"].split(os.pathsep)[0]
    script = Run(
        "environment",
        Python("script", "{dir}/env.py", ("a", "b")),
        env=(("EXTRA", "x"), ("EXPECTED_CWD", cwd)),
        files=(("env.py", ENVIRONMENT),),
    )
    result = child_runs.result(script)
    assert result.returncode == 0, result.describe()
    argv, *rest = result.stdout.splitlines()
    assert argv.endswith("env.py', 'a', 'b'] True True")
    assert rest == ["None x 1", "atexit ran"]


def test_modules_run_as_main(child_runs):
    result = child_runs.result(Run("-m json.tool", Python("module", "json.tool", ("--help",))))
    assert result.returncode == 0 and result.stdout.startswith("usage: python -m json.tool")
