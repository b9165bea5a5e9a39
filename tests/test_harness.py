"""Tests of the multi-rank harness (tests/multidevice.py) and of ``hostir run``."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from hostir import cli
from hostir.comm import launcher
from tests.child_runs import Python, Run, child_environment
from tests.multidevice import MultiDeviceTest, launched_by_torchrun

pytest_plugins = ["pytester"]

# Tests that start processes of their own run once, not once per torchrun rank.
once = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="starts its own processes: runs on rank 0 only",
)


def without_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes child processes plain (not torchrun ranks) even when we run under torchrun."""
    exact = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    prefixes = ("MASTER_", "TORCHELASTIC_", "ROLE_", "GROUP_")
    for name in list(os.environ):
        if name in exact or name.startswith(prefixes):
            monkeypatch.delenv(name)


# ---------------------------------------------------------------------------
# Multi-rank tests: these run at world sizes 1, 2 and 4 (or the torchrun world)


@pytest.mark.real_ranks(reason="checks the pool's torch.distributed process group itself")
def test_all_reduce_matches_local_sum(multidevice_test):
    d, rank = multidevice_test.size, multidevice_test.rank
    torch.manual_seed(0)  # the same data on every rank: each can compute the reference
    data = torch.randn(d, 64)
    mine = data[rank].clone().to(multidevice_test.device)
    if d > 1:
        dist.all_reduce(mine)
    torch.testing.assert_close(mine.cpu(), data.sum(0))


@pytest.mark.real_ranks(reason="checks the pool's torch.distributed process group itself")
def test_attributes_agree_with_torch_distributed(multidevice_test):
    t = multidevice_test
    assert 0 <= t.rank < t.size and 0 <= t.local_rank < t.local_size <= t.size
    if not dist.is_initialized():
        assert (t.size, t.rank) == (1, 0)
        return
    assert (dist.get_world_size(), dist.get_rank()) == (t.size, t.rank)
    assert int(os.environ["RANK"]) == t.rank and int(os.environ["WORLD_SIZE"]) == t.size
    assert int(os.environ["LOCAL_RANK"]) == t.local_rank
    ranks = [None] * t.size
    dist.all_gather_object(ranks, t.rank)
    assert ranks == list(range(t.size))


@pytest.mark.world_sizes(2)
def test_world_sizes_marker_selects_two(multidevice_test):
    assert multidevice_test.size == 2


@pytest.mark.skipif(launched_by_torchrun(), reason="checks plain-pytest parametrization")
def test_world_sizes_parametrize_ids(request):
    names = {item.name for item in request.session.items}
    assert "test_world_sizes_marker_selects_two[ws2]" in names
    assert not {"test_world_sizes_marker_selects_two[ws1]"} & names
    assert {f"test_all_reduce_matches_local_sum[ws{n}]" for n in (1, 2, 4)} <= names


@pytest.mark.real_ranks(reason="checks the pool's torch.distributed process group itself")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_gather_with_parameter(multidevice_test, dtype):
    d, rank = multidevice_test.size, multidevice_test.rank
    mine = torch.full((3,), rank + 1, dtype=dtype, device=multidevice_test.device)
    gathered = [torch.empty_like(mine) for _ in range(d)]
    if d > 1:
        dist.all_gather(gathered, mine)
    else:
        gathered = [mine]
    expected = torch.arange(1, d + 1, dtype=dtype).repeat_interleave(3)
    assert torch.cat(gathered).dtype == dtype
    assert torch.equal(torch.cat(gathered).cpu(), expected)


def test_tmp_path_works_on_every_rank(multidevice_test, tmp_path):
    # One directory for all ranks in a pool, one per process under torchrun: so
    # each rank keeps to its own files.
    rank = multidevice_test.rank
    mine = tmp_path / f"rank{rank}.pt"
    torch.save(torch.arange(4) * rank, mine)
    multidevice_test.barrier()
    assert torch.equal(torch.load(mine), torch.arange(4) * rank)


def test_shard_tensor_1d_uses_the_rank():
    class FakeMesh:
        def shard_tensor(self, t, dim, rank):
            return t.chunk(2, dim)[rank]

    fixture = MultiDeviceTest(2, 1, 2, 1, torch.device("cpu"))
    shard = fixture.shard_tensor_1d(torch.arange(6).reshape(2, 3), 0, FakeMesh())
    assert shard.tolist() == [[3, 4, 5]]


# ---------------------------------------------------------------------------
# Failures: reported per rank, never a hang (an inner pytest run)

INNER_TESTS = """
import os, time, pytest, torch, torch.distributed as dist

pytestmark = pytest.mark.world_sizes(2)

@pytest.mark.rank_timeout(hang=1)  # rank 0 is given up on 1 s after rank 1's error
def test_rank1_raises(multidevice_test):
    if multidevice_test.rank == 1:
        raise ValueError("boom on one rank")
    dist.barrier()  # rank 0 waits for a peer that never comes

def test_rank1_dies(multidevice_test):
    if multidevice_test.rank == 1:
        os._exit(3)

def test_fresh_pool_after_failures(multidevice_test):
    x = torch.ones(1)
    dist.all_reduce(x)
    assert x.item() == 2

def test_monkeypatch_in_a_worker(multidevice_test, monkeypatch):
    monkeypatch.setenv("HOSTIR_INNER_MARK", str(multidevice_test.rank))
    assert os.environ["HOSTIR_INNER_MARK"] == str(multidevice_test.rank)

def test_monkeypatch_was_undone(multidevice_test):
    assert "HOSTIR_INNER_MARK" not in os.environ

def test_skip_in_worker(multidevice_test):
    pytest.skip("skipped inside a worker")

class TestInClass:
    def test_method(self, multidevice_test):
        assert multidevice_test.size == 2

def test_bad_assert(multidevice_test):
    assert multidevice_test.rank + 40 == 41

@pytest.mark.rank_timeout(hang=1)
def test_every_rank_hangs(multidevice_test):
    time.sleep(60)

@pytest.mark.rank_timeout(hang=1)
def test_slow_rank_is_not_a_hang(multidevice_test):
    if multidevice_test.rank == 0:
        start = time.process_time()
        while time.process_time() - start < 1.5:  # 1.5 s of CPU: longer than the window
            pass
    dist.barrier()  # rank 1 waits, using no CPU, for the slow rank 0

def test_pools_stop_after_their_last_test(request):
    from tests.multidevice import _POOLS
    assert request.config.stash[_POOLS] == {}
"""


@once
def test_failing_rank_is_reported_without_hanging(pytester, monkeypatch):
    """Failures, deaths and hangs are reported per rank, with the stacks of silent ranks;
    a rank that is slow (using CPU) is not taken for a hung one; a pool stops after the
    last test of its size; a monkeypatch fixture's changes in a worker end with its test."""
    without_launcher_variables(monkeypatch)
    monkeypatch.setenv("PYTHONPATH", child_environment()["PYTHONPATH"])
    monkeypatch.setenv("HOSTIR_TEST_HANG_S", "4")  # the window of the tests without a marker
    pytester.makepyfile(test_inner=INNER_TESTS)
    # In process: the inner session's pools fork from this session's warm fork server, so
    # neither an interpreter nor a fork server (importing torch) starts for it.
    start = time.monotonic()
    result = pytester.runpytest_inprocess("-p", "tests.multidevice", "-rs", "-v")
    elapsed = time.monotonic() - start
    result.assert_outcomes(failed=4, passed=6, skipped=1)
    out = result.stdout.str()
    assert "rank 1: ValueError" in out and "boom on one rank" in out
    assert "rank 0: no reply after the failure above" in out
    assert "in test_rank1_raises" in out  # the stuck rank's stack: where it waits
    assert "rank 1: worker process died (exit code 3)" in out
    assert "skipped inside a worker" in out
    assert "assert (0 + 40) == 41" in out  # assertion rewriting works in the workers
    assert "rank 0: no reply: hung: for 1 s no process used more than 10% of a core" in out
    assert "in test_every_rank_hangs" in out
    assert "test_inner.py::test_slow_rank_is_not_a_hang[ws2] PASSED" in out
    assert "test_inner.py::test_monkeypatch_was_undone[ws2] PASSED" in out
    assert elapsed < 60  # far below the 300 s wall-clock limit a missed hang would wait for


# ---------------------------------------------------------------------------
# hostir run (the built-in launcher)

ALL_REDUCE_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(x)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(str(x.item()))
dist.destroy_process_group()
"""


@once
def test_cli_run_all_reduce(tmp_path, child_runs):
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    args = ("run", str(script), "--nproc", "2", "--", str(tmp_path))
    done = child_runs.result(Run("hostir run all_reduce", Python("module", "hostir.cli", args), 2))
    assert done.returncode == 0 and not done.killed, done.describe()
    assert [float((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)] == [3.0, 3.0]


def test_cli_missing_script_is_a_one_line_error(child_runs):
    args = ("run", "no_such_script.py", "--nproc", "2")
    done = child_runs.result(Run("hostir run missing", Python("module", "hostir.cli", args)))
    assert done.returncode != 0
    assert done.stderr == "hostir: error: script not found: no_such_script.py\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", __file__, "--nproc", "0"], "--nproc must be at least 1, got 0"),
        (["run", __file__], "one of the arguments --nproc --simulate is required"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
    ids=["nproc-0", "no-nproc", "unknown-command"],
)
def test_cli_usage_errors_are_one_line(args, message, capsys):
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own errors exit
        code = exc.code
    assert code != 0
    err = capsys.readouterr().err
    assert err.startswith("hostir: error: ") and err.count("\n") == 1 and message in err


def test_cli_passes_arguments_after_double_dash_to_the_script():
    ours, theirs = cli.split_extra_args(["run", "s.py", "--nproc", "2", "--", "--x", "--"])
    assert (ours, theirs) == (["run", "s.py", "--nproc", "2"], ["--x", "--"])


@once
def test_launcher_stops_the_other_ranks_when_one_fails(tmp_path, monkeypatch):
    without_launcher_variables(monkeypatch)
    script = tmp_path / "one_fails.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\ntime.sleep(60)\n"
    )
    start = time.monotonic()
    assert launcher.launch(str(script), 3, []) == 3
    assert time.monotonic() - start < 30
