"""Stream-loop programs against hand-written ``torch.distributed`` references.

Three programs, built with the frontend the way ``tests/lowering/test_stream_loops.py``
builds them, run by a ``hostir.HostIrEvaluator`` that is created (and prepared)
once:

- ``row-parallel``: ``x @ w.T`` with the contraction over mesh_x and the tokens
  in ``s`` stream chunks: per chunk a matmul and an Allreduce.
- ``column-permute``: a column-parallel linear fed by a stream all-gather with
  ``swizzle1d``: per chunk a CollectivePermute (ring shift) and a matmul.
- ``column-broadcast``: the same without the swizzle: per chunk a Broadcast
  (root = chunk) and a matmul.

Each program has three hand-written versions in plain ``torch.distributed`` on
the same local data with the same chunk sizes: *serialized* (post a chunk's
collective, wait, compute), *pipelined* (the software pipeline a skilled user
writes: a chunk's collective in flight while the next chunk's matmul runs,
prefetch depth 1) and the two *parts alone* (the collectives without the
matmuls, the matmuls without the collectives). Every result is checked against
ours before anything is timed. All versions run interleaved (run ``r`` starts
with version ``r mod n``), each run after a ``dist.barrier()``; a run's time is
the maximum over ranks of its ``time.perf_counter()`` wall time, and the table
reports the median over runs. ``ours / pipelined`` is the acceptance ratio;
``saved`` is the share of the serialized time a version saves;
``overhead/instr`` is (ours - serialized) divided by the number of instructions
the evaluator executes per run (counted by a ``hostir.Listener`` in a separate
run). ``A/A`` times the pipelined reference against a second copy of itself the
same way: how far from 1.00 a ratio strays by noise alone. A second table runs
the evaluator alone (a stub communicator that moves no data, tiny tensors): its
own cost per instruction. Sizes: ``small`` (overhead only), ``medium``
(compute and communication comparable), ``large`` (compute-bound: a chunk's
matmul takes longer than its collective).

Run it with::

    hostir run benchmarks/overlap.py --nproc 2
    hostir run benchmarks/overlap.py --nproc 2 -- --sizes small,medium --runs 20
    torchrun --nproc-per-node 2 benchmarks/overlap.py
    python benchmarks/overlap.py --nproc 2      # starts the ranks itself

Rank 0 prints the tables; ``--help`` lists the options (``--batch K`` times K
back-to-back calls per barrier: steady-state repetition).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

import hostir
from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir.comm.backend_hooks import CompletedWork

SIZES = {
    # name: (tokens per rank, hidden); tokens = tokens per rank * d
    "small": (8, 16),  # overhead-dominated: every tensor is a few hundred bytes
    "medium": (512, 512),  # compute and communication comparable (tokens 1024 at d = 2)
    "large": (512, 1024),  # compute-bound: a chunk's matmul takes longer than its collective
}
PROGRAMS = ("row-parallel", "column-permute", "column-broadcast")
DEFAULT_RUNS = {"small": 300, "medium": 100, "large": 40}


# -- The programs (as tests/lowering/test_stream_loops.py builds them) ------------------


def row_parallel(d: int, streams: int, hidden: int) -> tuple[FusionDefinition, list]:
    """``x @ w.T``, x ``[t, hidden]``, w ``[hidden, hidden]``: the contraction dim over
    mesh_x, the tokens of x and y in ``streams`` stream chunks."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, hidden))
        w = fd.define_tensor((hidden, hidden))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    for tv in (x, y):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, streams)
        tv.axis(0).parallelize(ParallelType.stream)
    return fd, [x, w]


def column_parallel(d: int, swizzle: bool, hidden: int) -> tuple[FusionDefinition, list]:
    """An all-gather of the tokens (sharded over mesh_x) in ``d`` stream chunks feeding
    a column-parallel linear; with ``swizzle1d`` the gather is a ring of permutes."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, hidden))
        w = fd.define_tensor((hidden, hidden))
        ag = fd.ops.set(inp)
        out = fd.ops.linear(ag, w)
        fd.add_output(out)
    for tv in (inp, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, d)
    if swizzle:
        ag.swizzle1d(0, ParallelType.mesh_x)
    ag.axis(0).parallelize(ParallelType.stream)
    return fd, [inp, w]


# -- The references ---------------------------------------------------------------------
#
# Each program has three hand-written versions: "serialized" posts each chunk's collective
# and waits for it before the next chunk (what our loops do today), "pipelined" is the
# software pipeline a skilled user writes (a chunk's collective runs while the next
# chunk's matmul does: prefetch depth 1), and "parts" runs the collectives alone and the
# matmuls alone (what a perfect overlap could hide).


def reference_row_parallel(x: torch.Tensor, w: torch.Tensor, streams: int, pipelined: bool):
    """Per chunk: matmul into the output slice and an async all-reduce of that slice;
    serialized waits for it at once, pipelined after posting the next chunk's."""
    tokens = x.shape[0]
    chunk = tokens // streams

    def run() -> torch.Tensor:
        out = torch.empty(tokens, w.shape[0], dtype=x.dtype, device=x.device)
        wt = w.t()
        pending = None
        for i in range(streams):
            rows = slice(i * chunk, (i + 1) * chunk)
            piece = torch.matmul(x[rows], wt, out=out[rows])
            work = dist.all_reduce(piece, async_op=True)
            if not pipelined:
                work.wait()
                continue
            if pending is not None:
                pending.wait()
            pending = work
        if pending is not None:
            pending.wait()
        return out

    return run


def reference_ring(x: torch.Tensor, w: torch.Tensor, rank: int, d: int, pipelined: bool):
    """Iteration i: chunk (r + i) % d arrives from that rank while ours goes to (r - i) % d
    (one batch_isend_irecv; iteration 0 is our own), then its matmul; pipelined posts
    iteration i + 1's exchange before iteration i's matmul."""
    chunk = x.shape[0]

    def post(i: int) -> tuple[torch.Tensor, list]:
        if i == 0:
            return x, []
        buf = torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, (rank - i) % d),
            dist.P2POp(dist.irecv, buf, (rank + i) % d),
        ]
        return buf, dist.batch_isend_irecv(ops)

    def run() -> torch.Tensor:
        out = torch.empty(chunk * d, w.shape[0], dtype=x.dtype, device=x.device)
        wt = w.t()
        current, works = post(0)
        for i in range(d):
            for work in works:
                work.wait()
            upcoming = post(i + 1) if pipelined and i + 1 < d else None
            src = (rank + i) % d
            torch.matmul(current, wt, out=out[src * chunk : (src + 1) * chunk])
            if i + 1 < d:
                current, works = upcoming if upcoming is not None else post(i + 1)
        return out

    return run


def reference_broadcast(x: torch.Tensor, w: torch.Tensor, rank: int, d: int, pipelined: bool):
    """Chunk i: an async broadcast from rank i (the root sends its own shard), then its
    matmul; pipelined posts chunk i + 1's broadcast before chunk i's matmul."""
    chunk = x.shape[0]

    def post(i: int) -> tuple[torch.Tensor, object]:
        buf = x if i == rank else torch.empty_like(x)
        return buf, dist.broadcast(buf, src=i, async_op=True)

    def run() -> torch.Tensor:
        out = torch.empty(chunk * d, w.shape[0], dtype=x.dtype, device=x.device)
        wt = w.t()
        current, work = post(0)
        for i in range(d):
            work.wait()
            upcoming = post(i + 1) if pipelined and i + 1 < d else None
            torch.matmul(current, wt, out=out[i * chunk : (i + 1) * chunk])
            if i + 1 < d:
                current, work = upcoming if upcoming is not None else post(i + 1)
        return out

    return run


def parts_alone(program: str, x: torch.Tensor, w: torch.Tensor, d: int, streams: int):
    """(the collectives alone, the matmuls alone) of a program, each chunk as the
    serialized reference does it."""
    rows = x.shape[0] // streams if program == "row-parallel" else x.shape[0]
    out = torch.empty(rows, w.shape[0], dtype=x.dtype, device=x.device)
    wt = w.t()
    rank = dist.get_rank()

    def communication() -> None:
        for i in range(streams if program == "row-parallel" else d):
            if program == "row-parallel":
                dist.all_reduce(out, async_op=True).wait()
            elif program == "column-broadcast":
                buf = x if i == rank else torch.empty_like(x)
                dist.broadcast(buf, src=i, async_op=True).wait()
            elif i:
                buf = torch.empty_like(x)
                ops = [
                    dist.P2POp(dist.isend, x, (rank - i) % d),
                    dist.P2POp(dist.irecv, buf, (rank + i) % d),
                ]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()

    def compute() -> None:
        for i in range(streams if program == "row-parallel" else d):
            torch.matmul(
                x[i * rows : (i + 1) * rows] if program == "row-parallel" else x, wt, out=out
            )

    return communication, compute


# -- Measuring --------------------------------------------------------------------------


class InstructionCounter(hostir.Listener):
    """Counts the instructions the evaluator executes on this rank."""

    def __init__(self) -> None:
        self.count = 0

    def after(self, instruction, context, operands) -> None:
        self.count += 1


class StubCommunicator(hostir.Communicator):
    """Pretends to be rank ``rank`` of ``world_size`` but moves no data: every
    collective completes at once. Runs the evaluator with communication taken out."""

    def _prepare(self, groups) -> None:
        pass

    def _exchange_codes(self, codes):
        return [list(codes)] * self.world_size

    def _allreduce(self, tensor, group, op):
        return CompletedWork()

    def _broadcast(self, tensor, group, root):
        return CompletedWork()

    def _permute(self, out, inp, group, send_to, recv_from):
        return CompletedWork()


@dataclass
class Row:
    """One line of the table (times in ms, overhead in µs)."""

    program: str
    size: str
    shape: str
    ours_ms: float
    serialized_ms: float
    pipelined_ms: float
    communication_ms: float
    compute_ms: float
    instructions: int
    aa_ratio: float

    @property
    def versus_pipelined(self) -> float:
        """ours / pipelined: the acceptance ratio (goal <= 1.05 at compute-bound sizes)."""
        return self.ours_ms / self.pipelined_ms

    def saved(self, ms: float) -> float:
        """The share of the serialized time that a version taking ``ms`` saves."""
        return 1 - ms / self.serialized_ms

    @property
    def overhead_us(self) -> float:
        """(ours - serialized) per instruction: the evaluator's cost where neither overlaps."""
        return (self.ours_ms - self.serialized_ms) / self.instructions * 1e3


def max_over_ranks(times: list[float]) -> list[float]:
    """Per run, the slowest rank's time (every rank gets the list)."""
    local = torch.tensor(times, dtype=torch.float64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).max(dim=0).values.tolist()


def timed(fn: Callable, batch: int) -> float:
    """Seconds one call of ``fn`` takes on this rank: ``batch`` back-to-back calls
    started after a barrier, divided by ``batch``."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(batch):
        fn()
    return (time.perf_counter() - start) / batch


def compare(versions: dict[str, Callable], warmup: int, runs: int, batch: int) -> dict[str, float]:
    """Median over runs of the max over ranks, in seconds, per version. The versions run
    interleaved: run ``r`` starts at version ``r mod n`` (none always goes first)."""
    for _ in range(warmup):
        for fn in versions.values():
            fn()
    names = list(versions)
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(timed(versions[name], batch))
    return {name: statistics.median(max_over_ranks(t)) for name, t in times.items()}


def build(
    program: str, d: int, rank: int, streams: int, tokens: int, hidden: int, device: str = "cpu"
):
    """(fusion, local inputs, references by name) for one program and size, the inputs on
    ``device``."""
    torch.manual_seed(0)  # the same full tensors on every rank
    if program == "row-parallel":
        fd, tvs = row_parallel(d, streams, hidden)
    else:
        fd, tvs = column_parallel(d, program == "column-permute", hidden)
    full = [torch.randn(tokens, hidden), torch.randn(hidden, hidden)]
    x, w = (shard_tensor(t, tv, rank).to(device) for t, tv in zip(full, tvs, strict=True))
    references = {}
    for name, pipelined in (("serialized", False), ("pipelined", True), ("again", True)):
        if program == "row-parallel":
            references[name] = reference_row_parallel(x, w, streams, pipelined)
        elif program == "column-permute":
            references[name] = reference_ring(x, w, rank, d, pipelined)
        else:
            references[name] = reference_broadcast(x, w, rank, d, pipelined)
    communication, compute = parts_alone(program, x, w, d, streams)
    return fd, [x, w], references, {"communication": communication, "compute": compute}


def measure(program: str, size: str, args: argparse.Namespace, rank: int, d: int) -> Row:
    """Builds, checks and times one program at one size."""
    per_rank, hidden = SIZES[size]
    tokens = per_rank * d
    streams = args.streams if program == "row-parallel" else d
    fd, inputs, references, parts = build(program, d, rank, streams, tokens, hidden)
    if args.entry == "execute":
        fd.execute(inputs)  # lowers once

        def ours() -> list:
            return fd.execute(inputs)

        program_ir = fd.host_ir()
    else:
        program_ir = fd.host_ir()
        evaluator = hostir.HostIrEvaluator(program_ir, communicator=hostir.default_communicator())

        def ours() -> list:
            return evaluator.run(inputs)

    (result,) = ours()
    for reference in references.values():
        torch.testing.assert_close(result, reference(), rtol=1e-4, atol=1e-4)
    counter = InstructionCounter()
    hostir.HostIrEvaluator(
        program_ir, communicator=hostir.default_communicator(), listeners=[counter]
    ).run(inputs)
    runs = args.runs if args.runs is not None else DEFAULT_RUNS[size]
    versions = {"ours": ours, **references, **parts}
    if not args.aa:
        del versions["again"]
    median = compare(versions, args.warmup, runs, args.batch)
    return Row(
        program=program,
        size=size,
        shape=f"t={tokens} h={hidden} chunks={streams}",
        ours_ms=median["ours"] * 1e3,
        serialized_ms=median["serialized"] * 1e3,
        pipelined_ms=median["pipelined"] * 1e3,
        communication_ms=median["communication"] * 1e3,
        compute_ms=median["compute"] * 1e3,
        instructions=counter.count,
        aa_ratio=median["pipelined"] / median["again"] if args.aa else float("nan"),
    )


def evaluator_alone(program: str, args: argparse.Namespace, rank: int, d: int) -> tuple:
    """(instructions, median µs per run) of the small program on a StubCommunicator:
    the evaluator's own cost, with no data moved and (almost) no compute."""
    per_rank, hidden = SIZES["small"]
    streams = args.streams if program == "row-parallel" else d
    fd, inputs, _, _ = build(program, d, rank, streams, per_rank * d, hidden)
    counter = InstructionCounter()
    hostir.HostIrEvaluator(
        fd.host_ir(), communicator=StubCommunicator(rank, d), listeners=[counter]
    ).run(inputs)
    evaluator = hostir.HostIrEvaluator(fd.host_ir(), communicator=StubCommunicator(rank, d))
    for _ in range(20):
        evaluator.run(inputs)
    times = []
    for _ in range(500):
        start = time.perf_counter()
        evaluator.run(inputs)
        times.append(time.perf_counter() - start)
    return counter.count, statistics.median(times) * 1e6


def table(rows: list[Row]) -> str:
    """The Markdown table of ``rows``."""
    lines = [
        "| program | size | ours (ms) | serialized (ms) | pipelined (ms) | ours / pipelined"
        " | saved: ours | saved: pipelined | communication alone (ms) | compute alone (ms)"
        " | overhead/instr (µs) | A/A |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.program} | {r.size} ({r.shape}) | {r.ours_ms:.3f} | {r.serialized_ms:.3f}"
            f" | {r.pipelined_ms:.3f} | {r.versus_pipelined:.2f} | {r.saved(r.ours_ms):.0%}"
            f" | {r.saved(r.pipelined_ms):.0%} | {r.communication_ms:.3f} | {r.compute_ms:.3f}"
            f" | {r.overhead_us:.1f} | {r.aa_ratio:.2f} |"
        )
    return "\n".join(lines)


# -- Command line -----------------------------------------------------------------------


SELF_LAUNCHED = "HOSTIR_OVERLAP_SELF_LAUNCHED"
"""Set when ``python benchmarks/overlap.py`` started its own ranks."""


def reproducing_command(argv: list[str], d: int) -> str:
    """The command line that started this run, as the user would type it."""
    script = os.path.relpath(sys.argv[0])
    args = " ".join(argv)
    if os.environ.get(SELF_LAUNCHED):
        return f"python {script} {args}".rstrip()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchrun --nproc-per-node {d} {script} {args}".rstrip()
    return f"hostir run {script} --nproc {d}" + (f" -- {args}" if args else "")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="small,medium,large", help="comma-separated: small,medium,large"
    )
    parser.add_argument(
        "--programs", default=",".join(PROGRAMS), help=f"comma-separated: {','.join(PROGRAMS)}"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="timed runs per size (default: small 300, medium 100, large 40)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="calls per timed run, back to back after one barrier (default 1; >1 measures"
        " steady-state repetition, with no barrier skew in each call)",
    )
    parser.add_argument(
        "--streams", type=int, default=4, help="stream chunks of row-parallel (default 4)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)"
    )
    parser.add_argument(
        "--entry",
        choices=("evaluator", "execute"),
        default="evaluator",
        help="time HostIrEvaluator.run (default) or FusionDefinition.execute",
    )
    parser.add_argument(
        "--no-aa",
        dest="aa",
        action="store_false",
        help="skip the A/A column (the pipelined reference timed against a copy of itself:"
        " the noise)",
    )
    parser.add_argument("--json", help="also write the rows to this file (rank 0)")
    parser.add_argument(
        "--nproc", type=int, default=2, help="ranks to start when no launcher started this"
    )
    args = parser.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.programs = [p for p in args.programs.split(",") if p]
    for name, known in (("size", SIZES), ("program", PROGRAMS)):
        for value in getattr(args, name + "s"):
            if value not in known:
                parser.error(f"unknown {name} {value!r}; known: {', '.join(known)}")
    if args.warmup < 3 or (args.runs is not None and args.runs < 10):
        parser.error("use at least 3 warm-up runs and 10 timed runs")
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        from hostir.comm import launcher  # no launcher: start the ranks ourselves

        os.environ[SELF_LAUNCHED] = "1"
        return launcher.launch(sys.argv[0], args.nproc, list(argv))
    torch.set_num_threads(args.threads)
    communicator = hostir.default_communicator()  # joins the gloo group
    rank, d = communicator.rank, communicator.world_size
    for size in args.sizes:
        if args.streams < 1 or SIZES[size][0] * d % args.streams:
            raise SystemExit(f"--streams {args.streams} must divide the {size} token count")
    rows = [measure(p, s, args, rank, d) for s in args.sizes for p in args.programs]
    alone = {p: evaluator_alone(p, args, rank, d) for p in args.programs}
    if rank == 0:
        command = reproducing_command(argv, d)
        print(table(rows))
        print()
        print("Evaluator alone (small size, a stub communicator that moves no data, rank 0):")
        print()
        print("| program | instructions | µs per run | µs per instruction |")
        print("|---|---:|---:|---:|")
        for program, (count, us) in alone.items():
            print(f"| {program} | {count} | {us:.0f} | {us / count:.1f} |")
        print()
        print(f"command: {command}")
        print(
            f"torch {torch.__version__}, backend {dist.get_backend()}, world size {d},"
            f" {args.threads} thread(s) per rank, {os.cpu_count()} CPU(s),"
            f" Python {platform.python_version()}, timing {args.entry},"
            f" {args.batch} call(s) per timed run"
        )
        if args.json:
            with open(args.json, "w") as f:
                alone_rows = [
                    {"program": p, "instructions": n, "us_per_run": us}
                    for p, (n, us) in alone.items()
                ]
                json.dump({"rows": [asdict(r) for r in rows], "alone": alone_rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
