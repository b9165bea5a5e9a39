"""``hostir run SCRIPT --simulate N``: a script run as every rank of a simulated world.

Each rank's thread runs the script as ``__main__`` (``runpy``), with ``sys.argv`` the
script and its arguments, so a script written for ``hostir run --nproc N`` or torchrun
runs unchanged: ``default_communicator()`` and ``shard_tensor`` answer the thread's
rank. A rank's ``sys.exit(code)`` is its exit code; an exception prints its traceback
and is code 1, as a process would. The run's code is that of the rank that failed
first for a reason of its own (a rank that failed because a peer did says so:
launcher's consequences), as the local launcher names it. After the ranks, a summary
of the traffic the world measured and of the memory the ranks held is printed to
stderr.
"""

from __future__ import annotations

import os
import runpy
import statistics
import sys
import traceback

from hostir.analysis.traffic import per_rank_lines
from hostir.comm.launcher import RankFailure
from hostir.comm.simulate import SimulatedRun, simulate

MAX_TRACEBACKS = 4
"""How many failed ranks' tracebacks a run prints (the lowest ranks; the rest are counted)."""


def run_script(script: str, world_size: int, args: list[str]) -> tuple[int, SimulatedRun]:
    """Runs ``script`` as ``world_size`` simulated ranks; (exit code, the run)."""
    sys.argv = [script, *args]
    folder = os.path.dirname(os.path.abspath(script))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # as `python SCRIPT` finds the script's neighbours

    def rank_main(rank: int) -> int:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            return _exit_code(exit_.code)
        return 0

    run = simulate(rank_main, world_size)
    failures = _failures(run)
    for failure, error in failures[:MAX_TRACEBACKS]:
        if error is not None:
            text = "".join(traceback.format_exception(error))
            print(f"[rank {failure.rank}] {text}", end="", file=sys.stderr, flush=True)
    if len(failures) > MAX_TRACEBACKS:
        print(f"({len(failures) - MAX_TRACEBACKS} more ranks failed)", file=sys.stderr)
    print(summary(run), file=sys.stderr, flush=True)
    if not failures:
        return 0, run
    causes = [f for f, _ in failures if not f.is_consequence] or [f for f, _ in failures]
    print(f"hostir: {causes[0].describe()} (simulated)", file=sys.stderr, flush=True)
    return causes[0].code, run


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): printed, exit code 1
    return 1


def _failures(run: SimulatedRun) -> list[tuple[RankFailure, BaseException | None]]:
    """Each failed rank (lowest first) as the launcher describes it, with its error."""
    found = []
    for rank in range(run.world_size):
        error = run.errors.get(rank)
        if error is not None:
            line = f"{type(error).__module__}.{type(error).__name__}: {error}".splitlines()[0]
            found.append((RankFailure(rank, 1, line), error))
        elif run.results[rank]:
            found.append((RankFailure(rank, run.results[rank], ""), None))
    return found


def summary(run: SimulatedRun) -> str:
    """The measured traffic of a simulated run: bytes received and sent per rank (min,
    median, max), the busiest link, the total, and the run's wall time."""
    lines = [f"hostir: simulated {run.world_size} ranks in {run.seconds:.2f} s"]
    lines += [f"  {line}" for line in per_rank_lines(run.links)]
    flat = int(run.links.argmax())
    source, destination = divmod(flat, run.world_size)
    most = int(run.links[source, destination])
    link = f"rank {source} -> rank {destination}, {most} B" if most else "none"
    lines.append(f"  busiest link: {link}; total {int(run.links.sum())} B")
    peaks = run.peak_bytes
    lines.append(
        f"  memory held by a rank's runs at peak: min {min(peaks)} B, median"
        f" {int(statistics.median(peaks))} B, max {max(peaks)} B; by the process, each buffer"
        f" once: {run.process_peak_bytes} B (the ranks' peaks add up to {sum(peaks)} B)"
    )
    return "\n".join(lines)
