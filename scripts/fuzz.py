"""Long runs of the differential fuzzer (tests/fuzz): random fusions and schedules on
1-, 2- and 3-d meshes, each run on every rank and checked against the single-device
torch reference.

    python3 scripts/fuzz.py --ranks 4 --cases 2000 --seed 0
    python3 scripts/fuzz.py --ranks 8 --cases 500 --seed 10000 --report fuzz8.txt
    python3 scripts/fuzz.py --ranks 4 --only 17,123      # rerun some seeds
    python3 scripts/fuzz.py --ranks 8 --cases 200 --seed 90000 --ragged-only
    hostir run scripts/fuzz.py --nproc 4 -- --cases 200  # under the built-in launcher

By default the script starts its own ranks (spawned CPU processes in a gloo group),
so that a case that hangs or kills a rank is recorded as a crash after ``--timeout``
seconds and the ranks are restarted for the next case. Under a launcher (``RANK`` and
``WORLD_SIZE`` set) every process is one rank and a hang stops the run.

At the end it prints a summary (ok / refused / wrong / crash, overall and per mesh
dim, op and schedule feature), the refusals grouped by message, and for every wrong
or crashed case its seed, its message, a reproduction shrunk from it (the fusion
and schedule as code; fewer outputs, schedule blocks and steps while the failure
stays) and the host IR program. The exit code is 1 if any case was wrong or crashed.

A long run, step by step:

1. Pick seeds never run before. A case is a function of (seed, world size) only, so
   the same seeds give the same cases; the suite runs 23 of 0-77, 257, NEW_OP_SEEDS and
   the seeds of issue 35's ops and extents at 4 ranks and 40 of 1000-1057, 90134 and
   90313 at 8 (tests/fuzz/test_fuzz.py's KEPT_SEEDS and PINNED_SEEDS),
   docs/reliability.md lists the ranges of earlier long runs. Take a fresh range (a
   round number above the last one used, e.g. ``--seed 200000``) and note it with the
   results in docs/reliability.md.
2. Run both world sizes, writing the report to a file:

       python3 scripts/fuzz.py --ranks 4 --cases 1000 --seed S --report fuzz4.txt
       python3 scripts/fuzz.py --ranks 8 --cases 1000 --seed S --report fuzz8.txt

   On the 2-core CI machine, shared (load about 11), 200 cases at 4 ranks (seeds
   5000-5199) took 56 s and 100 at 8 ranks (6000-6099) 38 s: about 16 s (4 ranks) and
   21 s (8 ranks) to start the ranks, then about 0.05 s (4 ranks) and 0.15 s (8 ranks)
   per case. So 1000 cases take about 1.5 min at 4 ranks and 3 min at 8, plus the
   failures: each crash or hang restarts the ranks (15-20 s; a hang first waits
   ``--timeout``), and shrinking a crash restarts them for every try that crashes too
   (up to 80 tries, 8 minutes for 3 crashed cases at 8 ranks). ``--no-shrink`` gives a
   fast first pass; shrink the failures afterwards with ``--only``.
   ``--ragged-only`` runs only the ragged cases (about one in five; symbolic extents
   that a split may not divide, tests/fuzz/generate.py): the same seeds, the others
   skipped.
3. Read the report: ``wrong`` and ``crash`` must be 0. Every refusal is grouped by
   message with a few seeds: a new group is a schedule the project refuses by name,
   worth a look (a refusal that should have run), not a failure. The ``ragged*`` and
   ``one_per_device`` rows count the cases whose symbolic extents the splits may not
   divide: those must end ok or refused (ExtentError, or the frontend's ScheduleError),
   never wrong. The ``bad_index`` row counts the cases given bad index data
   (tests/fuzz/new_ops.py): all must be refused, by an IndexDataError on every rank
   or by a refusal before the run; likewise ``bad_scalar`` (a scalar extent the program
   cannot run with: an ``ExtentError`` or ``BoundRequirementError`` on every rank) and
   ``bad_counts`` (run-time counts an exchange cannot use: a ``RunTimeExtentError``). The
   ``exchange*`` and ``scalar*`` rows count issue 35's cases.
4. For a failure, the report has the seed, a reproduction shrunk from it (a
   self-contained fusion, schedule and torch reference: paste it into a test) and its
   host IR. Rerun it alone with ``--only SEED`` (add ``--no-shrink`` to see the full
   case), fix it, and add the reproduction to tests/lowering/test_fuzz_regressions.py
   with the seed and world size in its docstring.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Iterator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("HOSTIR_CHECK_RACES", "1")  # as the test suite runs programs
os.environ.setdefault("HOSTIR_CHECK_ROUND_TRIP", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hostir.comm.simulate import simulate  # noqa: E402
from hostir.comm.simulated_traffic import compare_traffic  # noqa: E402
from tests.fuzz.case import Case, render, shrink_candidates  # noqa: E402
from tests.fuzz.generate import generate  # noqa: E402
from tests.fuzz.run import (  # noqa: E402
    CRASH,
    WRONG,
    Outcome,
    make_case,
    refusal_report,
    run_case,
    summary_table,
)

GROUP_TIMEOUT = datetime.timedelta(seconds=30)
MAX_SHRINK_RUNS = 80


# ---------------------------------------------------------------------------
# Spawned ranks


def worker_main(rank: int, size: int, port: int, conn) -> None:
    """One rank: join the group, then run the cases the parent sends until it sends None."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=GROUP_TIMEOUT)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size))
    conn.send("ready")
    while (case := conn.recv()) is not None:
        conn.send(run_case(case, rank, size))
    dist.destroy_process_group()
    os._exit(0)


class SpawnedRanks:
    """``size`` spawned ranks; restarted after a case crashes, hangs or kills one."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size, self.timeout = size, timeout
        self.procs: list = []
        self.conns: list = []
        self.restarts = 0

    def start(self) -> None:
        store = dist.TCPStore("127.0.0.1", 0, self.size, is_master=True, wait_for_workers=False)
        self.store = store  # the parent hosts the store, as the test pool does
        context = multiprocessing.get_context("spawn")
        for rank in range(self.size):
            parent, child = context.Pipe()
            proc = context.Process(
                target=worker_main, args=(rank, self.size, store.port, child), daemon=True
            )
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        for conn in self.conns:
            if not conn.poll(180) or conn.recv() != "ready":
                raise RuntimeError("the ranks did not start")

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs, self.conns = [], []

    def run(self, case: Case) -> Outcome:
        if not self.procs:
            self.start()
        for conn in self.conns:
            conn.send(case)
        replies, problem = self._collect()
        outcome = replies.get(0)
        if problem is None and any(r != outcome for r in replies.values()):
            problem = "ranks report different outcomes"
        if problem is not None:
            message = problem + ("" if outcome is None else f"; rank 0 said: {outcome.message}")
            outcome = Outcome(case.seed, case.world_size, CRASH, message, "", case.features)
        if outcome.status == CRASH:
            self.stop()  # collectives may be left half done: start afresh
            self.restarts += 1
        return outcome

    def _collect(self) -> tuple[dict[int, Outcome], str | None]:
        deadline = time.monotonic() + self.timeout
        replies: dict[int, Outcome] = {}
        while len(replies) < self.size:
            pending = [r for r in range(self.size) if r not in replies]
            waitables = [self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending]
            ready = multiprocessing.connection.wait(waitables, max(deadline - time.monotonic(), 0))
            if not ready:
                return replies, f"hang: ranks {pending} did not finish in {self.timeout:g} s"
            for rank in pending:
                try:
                    if self.conns[rank] in ready and self.conns[rank].poll():
                        replies[rank] = self.conns[rank].recv()
                        continue
                except (EOFError, OSError):
                    pass
                if self.procs[rank].sentinel in ready or not self.procs[rank].is_alive():
                    self.procs[rank].join(5)
                    code = self.procs[rank].exitcode
                    return replies, f"abort: rank {rank} died (exit code {code})"
        return replies, None


class LaunchedRanks:
    """This process is one rank of a launcher's world (``hostir run``, torchrun)."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.restarts = 0

    def run(self, case: Case) -> Outcome:
        return run_case(case, self.rank, self.size)

    def stop(self) -> None:
        dist.destroy_process_group()


class SimulatedRanks:
    """``size`` ranks of a simulated world in this process (hostir.comm.simulate), one
    world per case: a hang is named by the world at once, and each program run's measured
    traffic must equal its static count (a difference is a wrong result)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.restarts = 0
        self.runs_compared = 0
        self.runs_skipped: list[str] = []

    def run(self, case: Case) -> Outcome:
        made = make_case(case)  # built and lowered once: every rank runs the one definition
        run = simulate(lambda rank: run_case(case, rank, self.size, made), self.size, by_run=True)
        failed = run.first_error()
        if failed is not None:
            rank, error = failed
            text = "".join(traceback.format_exception(error))
            return Outcome(
                case.seed, case.world_size, CRASH, f"rank {rank}: {text}", "", case.features
            )
        outcome = run.results[0]
        if any(r != outcome for r in run.results):
            message = f"ranks report different outcomes; rank 0 said: {outcome.message}"
            return Outcome(case.seed, case.world_size, CRASH, message, "", case.features)
        compared = compare_traffic(run.world)
        self.runs_compared += len(compared.matched)
        self.runs_skipped += compared.skipped
        if compared.mismatched and outcome.status != CRASH:
            message = "measured traffic differs from the static count: " + compared.mismatched[0]
            return Outcome(case.seed, case.world_size, WRONG, message, "", case.features)
        return outcome

    def stop(self) -> None:
        """Nothing to stop: each case had its own world."""


# ---------------------------------------------------------------------------
# Driving a run


def shrink(case: Case, failure: Outcome, ranks) -> tuple[Case, Outcome]:
    """A smaller case failing the same way (same status), by greedy one-step removals."""
    runs = 0
    progress = True
    while progress and runs < MAX_SHRINK_RUNS:
        progress = False
        for candidate in shrink_candidates(case):
            runs += 1
            outcome = ranks.run(candidate)
            if outcome.status == failure.status:
                case, failure, progress = candidate, outcome, True
                break
            if runs >= MAX_SHRINK_RUNS:
                break
    return case, failure


def cases_to_run(args, world_size: int) -> Iterator[Case]:
    """The cases of ``--only``, else of ``--cases`` seeds from ``--seed`` (with
    ``--ragged-only``, the first ``--cases`` ragged ones from ``--seed`` on)."""
    if args.only:
        yield from (generate(seed, world_size) for seed in args.only)
        return
    if not args.ragged_only:
        yield from (generate(seed, world_size) for seed in range(args.seed, args.seed + args.cases))
        return
    found = 0
    for seed in itertools.count(args.seed):
        case = generate(seed, world_size)
        if "ragged" in case.features:
            found += 1
            yield case
        if found == args.cases:
            return


def run_all(args, ranks, world_size: int, log) -> list[tuple[Outcome, Case, Outcome]]:
    """Runs every case; returns (outcome, shrunk case, its outcome) per case."""
    results = []
    start = time.monotonic()
    for count, case in enumerate(cases_to_run(args, world_size), 1):
        seed = case.seed
        outcome = ranks.run(case)
        small, small_outcome = case, outcome
        if outcome.status in (WRONG, CRASH):
            log(f"seed {seed}: {outcome.status}: {outcome.message.splitlines()[-1][:200]}")
            if args.shrink:
                small, small_outcome = shrink(case, outcome, ranks)
        results.append((outcome, small, small_outcome))
        if count % args.progress == 0:
            elapsed = time.monotonic() - start
            done = [r[0].status for r in results]
            counts = " ".join(f"{s} {done.count(s)}" for s in ("ok", "refused", "wrong", "crash"))
            log(f"{count} cases in {elapsed:.0f} s: {counts}")
    return results


def report(results, world_size: int, elapsed: float, restarts: int) -> str:
    outcomes = [r[0] for r in results]
    lines = [
        f"fuzz: {len(outcomes)} cases at {world_size} ranks in {elapsed:.0f} s"
        f" ({restarts} rank restarts)",
        "",
        summary_table(outcomes),
        "",
        "refused, by message:",
        refusal_report(outcomes),
    ]
    for outcome, small, small_outcome in results:
        if outcome.status not in (WRONG, CRASH):
            continue
        lines += [
            "",
            "=" * 100,
            f"seed {outcome.seed} (world size {world_size}): {outcome.status}",
            outcome.message.rstrip(),
            f"--- reproduction (shrunk; {small_outcome.status}: "
            f"{small_outcome.message.splitlines()[-1][:300] if small_outcome.message else ''})",
            render(small).rstrip(),
            "--- host IR of the reproduction",
            small_outcome.program.rstrip() or "(not lowered)",
        ]
    return "\n".join(lines)


def traffic_note(ranks: SimulatedRanks) -> str:
    """What the simulated run compared of the traffic: runs matched, runs not compared."""
    reasons: dict[str, int] = {}
    for skipped in ranks.runs_skipped:
        reason = skipped.split(": ", 1)[1].split(" (")[0]
        reasons[reason] = reasons.get(reason, 0) + 1
    shown = "; ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    return (
        f"\n\ntraffic: {ranks.runs_compared} program runs measured = the static count"
        f" (any difference is counted wrong above); not compared: {shown or 'none'}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4, help="world size (spawned ranks)")
    parser.add_argument(
        "--simulate",
        type=int,
        metavar="N",
        help="run each case on N ranks of a simulated world in this process instead"
        " (measured traffic checked against the static count)",
    )
    parser.add_argument("--cases", type=int, default=200, help="number of seeds to run")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument(
        "--only",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="comma-separated seeds to run instead",
    )
    parser.add_argument(
        "--ragged-only",
        action="store_true",
        help="run only ragged cases (symbolic extents that splits may not divide)",
    )
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per case")
    parser.add_argument("--no-shrink", dest="shrink", action="store_false")
    parser.add_argument("--progress", type=int, default=100, help="log every N cases")
    parser.add_argument("--report", help="also write the report to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.simulate is not None:
        ranks = SimulatedRanks(args.simulate)
    elif launched:
        ranks = LaunchedRanks()
    else:
        ranks = SpawnedRanks(args.ranks, args.timeout)
    world_size = ranks.size
    is_main = args.simulate is not None or not launched or ranks.rank == 0

    def log(text: str) -> None:
        if is_main:
            print(text, file=sys.stderr, flush=True)

    start = time.monotonic()
    try:
        results = run_all(args, ranks, world_size, log)
    finally:
        ranks.stop()
    text = report(results, world_size, time.monotonic() - start, ranks.restarts)
    if args.simulate is not None:
        text += traffic_note(ranks)
    if is_main:
        print(text)
        if args.report:
            pathlib.Path(args.report).write_text(text + "\n")
    return int(any(r[0].status in (WRONG, CRASH) for r in results))


if __name__ == "__main__":
    sys.exit(main())
