"""What hostir costs on the host per call: ``fd.execute`` against the same work by hand.

Programs, each at three sizes:

- ``mlp``: the README's tensor-parallel MLP (examples/tensor_parallel_mlp.py: a
  column-parallel linear, relu, a row-parallel linear, one Allreduce, the bias),
  tokens x hidden x ffn.
- ``chain``: a 100-instruction pointwise chain (relu, neg, 50 times) on tokens x hidden.
- ``row-parallel``, ``column-permute``, ``column-broadcast``: the stream-loop programs
  of benchmarks/overlap.py (on 2 ranks or more only: their references call
  ``torch.distributed``), against its pipelined hand-written versions.

``ours`` is ``FusionDefinition.execute`` on this rank's shards, called again and again
with new tensors of one signature (what a layer in a model loop does): the program runs
compiled (hostir.run.compiled), the default. ``interp`` is the same with the program
interpreted instruction by instruction (``HOSTIR_INTERPRET=1`` when its evaluator is
built). ``hand`` is the
same torch ops (and ``torch.distributed`` collectives) written by hand, the way a
skilled user would: no checks, no copies. ``A/A`` times ``hand`` against a second copy
of itself: how far from 1.00 a ratio strays by noise alone. The versions run
interleaved (run ``r`` starts at version ``r mod n``); a run is ``--batch`` calls after
a barrier, its time the slowest rank's; the table shows medians over ``--runs`` runs.
``host/instr`` is (ours - hand) divided by the instructions the program runs.

World size 1 runs with no process group (as a single-device user does)::

    python benchmarks/host_overhead.py
    hostir run benchmarks/host_overhead.py --nproc 2
    python benchmarks/host_overhead.py --sizes small --runs 9

Every result is checked against the hand-written one before anything is timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overlap  # noqa: E402  (benchmarks/overlap.py: the stream-loop programs)
import tensor_parallel_mlp  # noqa: E402  (the README's MLP)

from frontend import FusionDefinition, shard_tensor  # noqa: E402
from hostir import Listener, default_communicator  # noqa: E402

SIZES = {
    # name: (tokens, hidden, ffn) for mlp; (tokens, hidden) for chain and stream loops
    "small": (8, 16, 64),
    "medium": (64, 256, 1024),
    "large": (256, 1024, 4096),
}
CHAIN_LENGTH = 50  # relu and neg each time: 100 instructions
STREAM_PROGRAMS = ("row-parallel", "column-permute", "column-broadcast")
INTERPRET = "HOSTIR_INTERPRET"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _slowest(times: list[float]) -> list[float]:
    """Per run, the slowest rank's time."""
    if not dist.is_initialized():
        return times
    local = torch.tensor(times, dtype=torch.float64)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.stack(gathered).max(dim=0).values.tolist()


def compare(versions: dict[str, Callable], runs: int, batch: int) -> dict[str, float]:
    """Median over runs of the slowest rank's seconds per call, per version."""
    for fn in versions.values():  # warm up
        for _ in range(3):
            fn()
    names = list(versions)
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            _barrier()
            start = time.perf_counter()
            for _ in range(batch):
                versions[name]()
            times[name].append((time.perf_counter() - start) / batch)
    return {name: statistics.median(_slowest(t)) for name, t in times.items()}


class _Counter(Listener):
    def __init__(self) -> None:
        self.count = 0

    def after(self, instruction, context, operands) -> None:
        self.count += 1


def instructions_run(fd: FusionDefinition, inputs: list) -> int:
    """How many instructions one run executes on this rank (loops counted per iteration)."""
    from hostir import HostIrEvaluator

    counter = _Counter()
    HostIrEvaluator(fd.host_ir(), listeners=[counter]).run(inputs)
    return counter.count


# -- the programs: (fusion, this rank's inputs, the hand-written version) ----------------


def mlp(size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable]:
    tokens, hidden, ffn = SIZES[size]
    tensor_parallel_mlp.HIDDEN, tensor_parallel_mlp.FFN = hidden, ffn
    fd, tvs = tensor_parallel_mlp.define(d)
    generator = torch.Generator().manual_seed(0)
    shapes = [(tokens, hidden), (ffn, hidden), (ffn,), (hidden, ffn), (hidden,)]
    full = [torch.randn(s, generator=generator) / s[-1] ** 0.5 for s in shapes]
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    x, w1, b1, w2, b2 = local
    linear = torch.nn.functional.linear

    def hand() -> torch.Tensor:
        partial = linear(torch.relu(linear(x, w1, b1)), w2)
        if d > 1:
            dist.all_reduce(partial)
        return partial + b2

    return fd, local, hand


def chain(size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable]:
    tokens, hidden = SIZES[size][:2]
    with FusionDefinition() as fd:
        value = fd.define_tensor((-1, hidden))
        out = value
        for _ in range(CHAIN_LENGTH):
            out = fd.ops.neg(fd.ops.relu(out))
        fd.add_output(out)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1))

    def hand() -> torch.Tensor:
        out = x
        for _ in range(CHAIN_LENGTH):
            out = torch.neg(torch.relu(out))
        return out

    return fd, [x], hand


def stream_loop(program: str, size: str, d: int, rank: int):
    tokens, hidden = SIZES[size][:2]
    fd, local, references, _ = overlap.build(program, d, rank, 4, tokens * d, hidden)
    return fd, local, references["pipelined"], references["again"]


# -- measuring ------------------------------------------------------------------------


def build(name: str, size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable]:
    """The fusion, this rank's inputs, the hand-written version and its A/A copy."""
    if name in STREAM_PROGRAMS:
        return stream_loop(name, size, d, rank)
    fd, inputs, hand = (mlp if name == "mlp" else chain)(size, d, rank)
    return fd, inputs, hand, hand


def interpreted(name: str, size: str, d: int, rank: int, inputs: list) -> FusionDefinition:
    """The same fusion, its evaluator built (at the first execute) to interpret."""
    fd = build(name, size, d, rank)[0]
    old = os.environ.get(INTERPRET)
    os.environ[INTERPRET] = "1"
    try:
        fd.execute(inputs)
    finally:
        if old is None:
            del os.environ[INTERPRET]
        else:
            os.environ[INTERPRET] = old
    return fd


def measure(name: str, size: str, d: int, rank: int, runs: int, batch: int) -> dict:
    fd, inputs, hand, again = build(name, size, d, rank)
    (ours,) = fd.execute(inputs)
    torch.testing.assert_close(ours, hand(), rtol=1e-4, atol=1e-4)
    slow = interpreted(name, size, d, rank, inputs)
    versions = {
        "ours": lambda: fd.execute(inputs),
        "interp": lambda: slow.execute(inputs),
        "hand": hand,
        "again": again,
    }
    medians = compare(versions, runs, batch)
    count = instructions_run(fd, inputs)
    return {
        "program": name,
        "size": size,
        "instructions": count,
        "ours_us": medians["ours"] * 1e6,
        "interp_us": medians["interp"] * 1e6,
        "hand_us": medians["hand"] * 1e6,
        "ratio": medians["ours"] / medians["hand"],
        "aa": medians["again"] / medians["hand"],
        "per_instruction_us": (medians["ours"] - medians["hand"]) / count * 1e6,
    }


def table(rows: list[dict], d: int) -> str:
    lines = [
        f"world size {d}, {platform.machine()}, torch {torch.__version__},"
        f" {torch.get_num_threads()} threads",
        "| program | size | instructions | ours (µs) | interp (µs) | hand (µs) | ours / hand |"
        " interp / hand | A/A | host/instr (µs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['size']} | {r['instructions']} | {r['ours_us']:.1f} |"
            f" {r['interp_us']:.1f} | {r['hand_us']:.1f} | {r['ratio']:.2f} |"
            f" {r['interp_us'] / r['hand_us']:.2f} | {r['aa']:.2f} |"
            f" {r['per_instruction_us']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,medium,large")
    parser.add_argument("--programs", default="mlp,chain," + ",".join(STREAM_PROGRAMS))
    parser.add_argument("--runs", type=int, default=11, help="timed runs per version")
    parser.add_argument("--batch", type=int, default=0, help="calls per run (0: by size)")
    args = parser.parse_args(argv)
    world = default_communicator()  # the launcher's group, if any; else this process alone
    d, rank = world.world_size, world.rank
    rows = []
    for name in args.programs.split(","):
        if name in STREAM_PROGRAMS and d < 2:
            continue  # their hand-written versions call torch.distributed
        for size in args.sizes.split(","):
            batch = args.batch or {"small": 200, "medium": 20, "large": 3}[size]
            rows.append(measure(name, size, d, rank, args.runs, batch))
    if rank == 0:
        print(table(rows, d))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
