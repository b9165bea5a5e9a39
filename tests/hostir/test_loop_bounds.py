"""A loop of any trip count (issue 32): ``range(0, 10**12)`` or ``2**70`` is checked, counted
and drawn in time and memory independent of the count, and a run is refused by name before
it starts (hostir.check.loop_counts, hostir.check.index_spans, hostir.analysis.traffic).
The extent checks used to put every index of such a loop on a stack (about 250 MB/s until
the process died), and ``hostir traffic`` walked every iteration of a loop without
communication. Each test runs under ``bounded``: past 100 MB of Python heap (or a minute)
it fails instead of taking the machine's memory."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest
import torch

import hostir
from hostir import ExtentError, HostIrEvaluator, LoopBoundError, cli, to_traffic_dot
from hostir.analysis.traffic import count_traffic
from hostir.check.extent_checks import ExtentChecks
from hostir.check.loop_counts import LoopCounts

TRILLION = 10**12
TWO_TO_70 = 2**70

# A loop without communication and a loop of Allgathers whose index nothing reads: each
# iteration every rank receives the 3 blocks of 4 x 3 float32 it lacks, 144 B.
COUNTED = """%HostIrContainer {
  mesh M0 = [4] : [1]
  input T0 : float32[16, 3] @M0 {0: [x, 4]}
  T1 : float32[16, 3] @M0 {0: [x, 4]} = relu(T0)
  for j0 in range(0, N) {
    T2 : float32[16, 3] @M0 {0: [x, 4]} = neg(T1)
    deallocate T2
  }
  for j1 in range(0, N) {
    T3 : float32[16, 3] @M0, R0 = Allgather(T1, team=M0(x), axis=0)
    wait R0
    deallocate T3
  }
  output T1
}
"""

# A ring: at iteration j0 each rank sends its 48-B block j0 positions on (a copy to
# itself at j0 % 4 == 0), so the peer reads the index and each iteration is counted.
RING = """%HostIrContainer {
  mesh M0 = [4] : [1]
  input T0 : float32[16, 3] @M0 {0: [x, 4]}
  allocate T1 : float32[16, 3] @M0 {0: [x, 4]}
  for j0 in range(0, N) {
    R0 = CollectivePermute(T0, team=M0(x), send_peer=SEND, recv_peer=RECEIVE, out=T1)
    wait R0
  }
  output T1
}
""".replace("SEND", "(coord(M0, x) + j0) % 4").replace("RECEIVE", "(coord(M0, x) + 4 - j0 % 4) % 4")

# Chunk j0 % 2 of T0, relu'd into the same chunk of T1: any trip count >= 2 covers T1.
CHUNKED = """%HostIrContainer {
  input n : int64
  input T0 : float32[4, 4]
  allocate T1 : float32[4, 4]
  for j0 in range(0, STOP) {
    T0_c : float32[2, 4] = shard_by_stream(T0, axis=0, index=j0 % 2)
    T1_c : float32[2, 4] = shard_by_stream(T1, axis=0, index=j0 % 2)
    relu(T0_c, out=T1_c)
  }
  output T1
}
"""


@contextlib.contextmanager
def bounded(megabytes: int = 100, seconds: float = 60) -> Iterator[None]:
    """Fails the test (in the main thread, via SIGALRM) as soon as the Python heap traced
    by tracemalloc passes ``megabytes`` or the block runs ``seconds``: a guard that turns
    a runaway loop into a failure, not a bound the test's speed depends on. The peak must
    stay under ``megabytes``."""
    limit, done, why = megabytes << 20, threading.Event(), []
    main = threading.main_thread().ident

    def interrupt(signum, frame) -> None:
        pytest.fail(why[0] if why else "interrupted")

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while not done.wait(0.02):
            if tracemalloc.get_traced_memory()[0] > limit:
                why.append(f"the Python heap passed {megabytes} MB")
            elif time.monotonic() > deadline:
                why.append(f"still running after {seconds} s")
            if why:
                signal.pthread_kill(main, signal.SIGALRM)  # type: ignore[arg-type]
                return

    previous = signal.signal(signal.SIGALRM, interrupt)
    tracemalloc.start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        done.set()
        watcher.join()
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, previous)
    assert peak < limit, f"peak {peak} B"


def main(*args: str) -> int:
    """``hostir ARGS`` in this process; its exit code."""
    try:
        return cli.main(list(args))
    except SystemExit as exit:
        return int(exit.code or 0)


def random(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(32))


@pytest.mark.parametrize(
    ("stop", "scalar", "shown"),
    [
        ("n", TRILLION, rf"range\(0, n\) at body\[1\] would run {TRILLION} iterations \(n ="),
        (str(TWO_TO_70), 2, rf"range\(0, {TWO_TO_70}\) at body\[1\] would run {TWO_TO_70} it"),
    ],
    ids=["n=10**12", "2**70-in-the-text"],
)
def test_a_run_of_a_huge_loop_is_refused_by_name_before_it_starts(stop, scalar, shown):
    """10**12 iterations bound from a scalar input, 2**70 written in the text: refused when
    the inputs bind, naming the loop, its trip count and the limit; a short run of the same
    program (n = 3) still matches torch."""
    x = random(4, 4)
    with bounded():
        with pytest.raises(LoopBoundError, match=rf"loop j0 in {shown}.*at most 1048576 loop"):
            HostIrEvaluator(hostir.parse(CHUNKED.replace("STOP", stop))).run([scalar, x])
    (out,) = HostIrEvaluator(hostir.parse(CHUNKED.replace("STOP", "n"))).run([3, x])
    torch.testing.assert_close(out, x.relu())


def test_loop_counts_multiply_nested_loops_and_walk_only_what_reads_an_index():
    """2048 x 1024 nested iterations are past 2**20 (named at the inner loop); a triangle
    ``range(0, j0)`` is walked and stops at the limit; 1000 x 1000 is within it."""

    def counted(loops: str) -> None:
        text = f"%HostIrContainer {{\n  input T0 : float32[2]\n{loops}  output T0\n}}\n"
        LoopCounts(hostir.parse(text)).check({}, 0)

    nested = "  for j0 in range(0, A) {\n    for j1 in range(0, B) {\n    }\n  }\n"
    with bounded():
        with pytest.raises(LoopBoundError, match=r"loop j1 .* 1024 iterations for each of 2048"):
            counted(nested.replace("A", "2048").replace("B", "1024"))
        with pytest.raises(LoopBoundError, match=r"range\(0, j0\) .* \(j0 = \d+\)"):
            counted(nested.replace("A", "2000").replace("B", "j0"))
        counted(nested.replace("A", "1000").replace("B", "1000"))


def test_the_extent_checks_of_a_huge_loop_take_closed_forms():
    """The extent checks alone (as ``hostir traffic --bind`` runs them) over 10**12
    iterations: chunk ``j0 % 2`` covers T1, chunk ``j0`` is named at its last index, chunk
    0 alone leaves rows 2:4 unwritten; each computed from the index's form."""

    def check(index: str) -> None:
        text = CHUNKED.replace("STOP", "n").replace("j0 % 2", index)
        ExtentChecks(hostir.parse(text)).check({"n": TRILLION}, 0)

    last = TRILLION - 1
    with bounded():
        check("j0 % 2")
        with pytest.raises(ExtentError, match=rf"T0_c: index j0 = {last} at j0 = {last} is out"):
            check("j0")
        with pytest.raises(ExtentError, match=r"output T1 .* its elements \[2:4, 0:4\] are never"):
            check("0")


@pytest.mark.parametrize("trips", [TRILLION, TWO_TO_70])
def test_check_traffic_and_picture_of_a_huge_loop_answer_at_once(tmp_path, capsys, trips):
    """``hostir check`` and ``hostir traffic`` of loops of 10**12 (2**70) iterations, one
    without communication, one of Allgathers: counted once and multiplied (at 2**70 the
    bytes pass 2**53, what a count keeps exactly: refused by name); the picture labels the
    loop with its whole range."""
    path = tmp_path / "huge.hir"
    path.write_text(COUNTED.replace("N", str(trips)))
    program = hostir.parse(path.read_text())
    with bounded():
        assert main("check", str(path)) == 0
        code = main("traffic", str(path), "--world-size", "4")
        graph = to_traffic_dot(program, instruction_index=2)
        if trips == TRILLION:
            traffic = count_traffic(program, 4)
        else:
            with pytest.raises(hostir.HostIrError, match=r"past the 9007199254740992 a count"):
                count_traffic(program, 4)
    out, err = capsys.readouterr()
    assert f"{path}: ok (8 instructions)" in out
    last = trips - 1
    assert set(re.findall(r'label="(j1=[^"]*)"', graph.source)) == {f"j1=0..{last}: T1"}
    if trips == TWO_TO_70:
        assert code == 1 and "a count keeps exactly" in err
        return
    assert code == 0, err
    assert [int(b) for b in traffic.received] == [144 * trips] * 4
    assert traffic.by_communication["body[2].body[0]"][1:] == (trips, 144)
    assert f"144 B per iteration at most, {trips} iterations" in out


def test_a_huge_loop_whose_communications_read_its_index_is_refused_before_the_walk():
    """A ring's peer reads j0: 10**12 iterations would each be counted, so the count and
    the picture refuse by name; 4 iterations count each rank's 3 blocks sent away."""
    huge = hostir.parse(RING.replace("N", str(TRILLION)))
    expected = rf"loop j0 in range\(0, {TRILLION}\) at body\[1\] runs {TRILLION} iterations.*65536"
    with bounded():
        with pytest.raises(LoopBoundError, match=expected):
            count_traffic(huge, 4)
        with pytest.raises(LoopBoundError, match=expected):
            to_traffic_dot(huge)
    traffic = count_traffic(hostir.parse(RING.replace("N", "4")), 4)
    assert [int(b) for b in traffic.received] == [3 * 48] * 4
    assert [int(b) for b in traffic.sent] == [3 * 48] * 4
