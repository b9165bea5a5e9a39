"""What the agreement before a program's first run costs, and that steady state pays nothing.

Three measurements on every rank, the table printed by rank 0:

- ``groups``: creating hostir's own process groups the first time (the agreement's
  gloo group and the world group), once per process.
- ``first run``: the agreement itself, a fresh evaluator's first run minus the
  steady-state run time (an all-gather of 4 int64s per rank on the agreement group).
- ``steady``: a run of the same program after the first, against the same run without
  its signature's key lookup (the executable prepared for the signature called directly,
  hostir.run.executable: the agreement adds nothing to a later run); ``A/A`` times the
  steady run against itself: the noise of the machine.

Times are medians over ``--runs`` runs, each the maximum over ranks, after a barrier;
A and B alternate (ABBA). The program is a row-parallel linear (one Allreduce).

Run it with::

    hostir run benchmarks/agreement.py --nproc 4
    hostir run benchmarks/agreement.py --nproc 8 -- --runs 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

import hostir
from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor


def row_parallel(d: int) -> tuple[FusionDefinition, list]:
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 64))
        w = fd.define_tensor((64, 64))
        fd.add_output(fd.ops.linear(x, w))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    return fd, [x, w]


def timed(call) -> float:
    """The wall time of ``call`` on the slowest rank, after a barrier (seconds)."""
    dist.barrier()
    start = time.perf_counter()
    call()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    communicator = hostir.default_communicator()
    d, rank = communicator.world_size, communicator.rank
    torch.manual_seed(0)
    fd, tvs = row_parallel(d)
    inputs = [
        shard_tensor(t, tv)
        for t, tv in zip((torch.randn(8, 64), torch.randn(64, 64)), tvs, strict=True)
    ]
    program = fd.host_ir()

    groups = timed(lambda: hostir.HostIrEvaluator(program).run(inputs))  # creates the groups
    warm = hostir.HostIrEvaluator(program)
    warm.run(inputs)
    first, steady, bare, again = [], [], [], []
    for k in range(args.runs):
        first.append(timed(lambda: hostir.HostIrEvaluator(program).run(inputs)))
        pair = [("steady", lambda: warm.run(inputs)), ("bare", lambda: bare_run(warm, inputs))]
        for name, call in pair if k % 2 == 0 else reversed(pair):
            (steady if name == "steady" else bare).append(timed(call))
        again.append(timed(lambda: warm.run(inputs)))
    if rank == 0:
        med = {
            name: statistics.median(v) * 1e6
            for name, v in (("first", first), ("steady", steady), ("bare", bare), ("again", again))
        }
        print(f"world {d}, {args.runs} runs, medians of the slowest rank (us)")
        print("| measure | time (us) |")
        print("|---|---|")
        print(f"| groups (once per process) | {groups * 1e6:.0f} |")
        print(f"| first run of a new evaluator | {med['first']:.0f} |")
        print(f"| agreement (first run - steady) | {med['first'] - med['steady']:.0f} |")
        print(f"| steady run | {med['steady']:.0f} |")
        print(f"| steady run without the key lookup | {med['bare']:.0f} |")
        print(f"| steady / without | {med['steady'] / med['bare']:.3f} |")
        print(f"| A/A (steady / steady) | {med['steady'] / med['again']:.3f} |")
    return 0


def bare_run(evaluator, inputs):
    """A steady-state run without the key lookup: the signature's executable's call."""
    (executable,) = evaluator._executables.values()
    return executable.call(inputs)


if __name__ == "__main__":
    sys.exit(main())
