"""What a loop of a huge trip count costs the tools that read it: time and memory.

For loops of ``2**21`` (just past what a call may run), ``10**12`` and ``2**70``
iterations, each in this process and from a fresh start of its objects:

- ``check``: ``hostir check FILE.hir`` (parse and verify), through ``hostir.cli.main``;
- ``traffic``: ``hostir traffic FILE.hir --world-size 4`` of a loop without
  communication and a loop of Allgathers (counted once, multiplied);
- ``picture``: ``to_traffic_dot`` of the Allgather loop (labelled with its range);
- ``extents``: the extent checks alone (what ``hostir traffic --bind`` runs) of a
  chunked loop over that many iterations (closed forms);
- ``run``: ``HostIrEvaluator(program).run`` of the chunked loop, refused by name
  (``LoopBoundError``) when the inputs bind.

After one warm-up of each at 2 iterations, prints a Markdown table: the wall time,
the peak of the Python heap (tracemalloc) and how much the process's peak resident
memory grew (``ru_maxrss``), and each outcome.
The load average is printed before and after: other work on a shared machine
inflates the times. Run it with::

    python benchmarks/huge_loops.py
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import torch

import hostir
from hostir import HostIrEvaluator, cli, to_traffic_dot
from hostir.check.extent_checks import ExtentChecks

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

CHUNKED = """%HostIrContainer {
  input T0 : float32[4, 4]
  allocate T1 : float32[4, 4]
  for j0 in range(0, N) {
    T0_c : float32[2, 4] = shard_by_stream(T0, axis=0, index=j0 % 2)
    T1_c : float32[2, 4] = shard_by_stream(T1, axis=0, index=j0 % 2)
    relu(T0_c, out=T1_c)
  }
  output T1
}
"""


def measure(work: Callable[[], str]) -> tuple[float, float, float, str]:
    """(seconds, peak Python heap in MB, growth of the peak RSS in MB, outcome)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    start = time.perf_counter()
    try:
        outcome = work()
    except hostir.HostIrError as error:
        outcome = f"{type(error).__name__}: {str(error)[:60]}..."
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return seconds, peak / 2**20, grown / 1024, outcome


def cli_output(*args: str) -> str:
    """``hostir ARGS``'s exit code and its output's last line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(list(args))
    return f"exit {code}: {out.getvalue().strip().splitlines()[-1][:60]}"


def cases(trips: int, folder: pathlib.Path) -> dict[str, Callable[[], str]]:
    """The measured operations on loops of ``trips`` iterations."""
    path = folder / f"counted_{trips}.hir"
    path.write_text(COUNTED.replace("N", str(trips)))
    chunked = CHUNKED.replace("N", str(trips))
    x = torch.randn(4, 4)

    def picture() -> str:
        graph = to_traffic_dot(hostir.parse(path.read_text()), instruction_index=2)
        return f"{len(graph.source)} characters of DOT"

    def extents() -> str:
        ExtentChecks(hostir.parse(chunked)).check({}, 0)
        return "passed"

    def run() -> str:
        HostIrEvaluator(hostir.parse(chunked)).run([x])
        return "ran"

    return {
        "check": lambda: cli_output("check", str(path)),
        "traffic": lambda: cli_output("traffic", str(path), "--world-size", "4"),
        "picture": picture,
        "extents": extents,
        "run": run,
    }


def main() -> None:
    print(f"load average before: {os.getloadavg()}")
    print("| iterations | operation | time (s) | Python heap peak (MB) | RSS peak growth (MB) |")
    print("|---|---|---|---|---|")
    outcomes = []
    with tempfile.TemporaryDirectory() as folder:
        for work in cases(2, pathlib.Path(folder)).values():
            measure(work)  # warm up: first imports, first compiles
        for trips in (2**21, 10**12, 2**70):
            for name, work in cases(trips, pathlib.Path(folder)).items():
                seconds, heap, rss, outcome = measure(work)
                print(f"| {trips} | {name} | {seconds:.3f} | {heap:.2f} | {rss:.1f} |")
                outcomes.append(f"{trips} {name}: {outcome}")
    print(f"load average after: {os.getloadavg()}")
    print("\n".join(outcomes))


if __name__ == "__main__":
    main()
