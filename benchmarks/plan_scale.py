"""How planning and lowering scale: with the number of devices, and with the fusion's size.

Two tables, printed as Markdown:

- **Resharding on large meshes.** For each mesh (256, 1024 and 4096 devices) and
  each pair of distributions (``PAIRS``, and ``EXCHANGES``: those planned as one
  AllToAllV over every mesh axis), the time to plan the resharding of one tensor and
  emit its host IR (``plan_resharding`` + ``emit_resharding``, caches cleared
  first, with Python's cycle collector paused as lowering runs them:
  ``hostir.check.collector.collector_paused``), the length of the program's text,
  and what ``explain`` reports (collectives, peak temporaries against the
  bound). Medians of ``--repeat``
  runs. A case that takes longer than ``--limit`` seconds is stopped and shown as
  ``> limit``. The CPU column is the same region in the planning thread's CPU time
  (``time.thread_time``): on a shared machine the wall clock also counts what other
  jobs take.
- **Lowering a fusion of N ops.** A chain of pointwise ops with a ``linear``
  every 50 ops, its inputs sharded over 4 devices (so every linear reduces
  partial sums), lowered with ``FusionDefinition.host_ir`` for N = 10, 100, 1000
  and 3000.

Run it with::

    python benchmarks/plan_scale.py
    python benchmarks/plan_scale.py --meshes 16x16x16,64x64 --ops 10,100,1000
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir import Const, DType, Mesh, TensorValue
from lowering.redistribution.distribution import parse_notation

MESHES = ("16x16", "32x32", "16x16x16", "32x32x4", "64x64", "8x8x64")
PAIRS = {
    2: (("S0S1", "S1S0"), ("S0S1", "RR"), ("PS0", "S0R"), ("S0R", "RS0"), ("PP", "S0S1")),
    3: (
        ("S0S1S0", "S1S0R"),
        ("S0S1S0", "RRR"),
        ("PS0S1", "S0S1R"),
        ("S0RS1", "S1RS0"),
        ("S0S0S0", "S1S1S1"),
    ),
}
EXCHANGES = {
    # Reshardings planned as one AllToAllV over every mesh axis (issue 24, item 6), those
    # with replicas in the source (the planner costs each member apart) among them.
    2: (("S1S1", "S0R"), ("S0R", "S1S1"), ("S0S0", "S1S0")),
    3: (
        ("S1S0R", "S0RS1"),
        ("RRS1", "S0S1S0"),
        ("RRS0", "S1S0R"),
        ("RS0R", "S0S0S0"),
        ("RS0R", "S0RS0"),
    ),
}
OPS = (10, 100, 1000, 3000)


def _mesh(text: str) -> Mesh:
    shape = tuple(int(s) for s in text.split("x"))
    return Mesh(devices=tuple(range(math.prod(shape))), shape=shape)


def _value(name: str, notation: str, mesh: Mesh, shape: tuple[int, ...]) -> TensorValue:
    distribution = parse_notation(notation, mesh, ndim=len(shape))
    return TensorValue(
        name=name,
        dtype=DType.FLOAT32,
        shape=tuple(Const(value=e) for e in shape),
        sharding=distribution.to_sharding(shape),
    )


def plan_case(mesh_text: str, source: str, target: str) -> tuple[float, float, int, str]:
    """(seconds to plan and emit, the same in this thread's CPU time, characters of program
    text, explain's summary line). The CPU time leaves out what other jobs on a shared
    machine take from the wall clock."""
    from hostir.check.collector import collector_paused
    from lowering.emit_resharding import emit_resharding
    from lowering.redistribution.plan_resharding import plan_resharding

    mesh = _mesh(mesh_text)
    shape = (4 * len(mesh.devices), 4 * len(mesh.devices))  # every dim divides over any axes
    src, dst = _value("src", source, mesh, shape), _value("dst", target, mesh, shape)
    plan_resharding.cache_clear()
    start, cpu_start = time.perf_counter(), time.thread_time()
    with collector_paused():  # as lowering plans it
        plan = plan_resharding(src, dst)
        body = emit_resharding(plan, src, dst, iter(range(1000)))
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
    from hostir import HostIrContainer

    text = str(HostIrContainer(inputs=(src,), outputs=(dst,), body=tuple(body)))
    summary = plan.explain().splitlines()
    line = next((s for s in summary if "peak temporaries" in s), "")
    return elapsed, cpu, len(text), line


def _run_with_limit(limit: float, *args: object) -> tuple | None:
    """``plan_case(*args)`` in a child process, None if it ran over ``limit`` seconds."""
    with multiprocessing.get_context("fork").Pool(1) as pool:
        result = pool.apply_async(plan_case, args)
        try:
            return result.get(timeout=limit)
        except multiprocessing.TimeoutError:
            pool.terminate()
            return None


def chain_fusion(ops: int) -> FusionDefinition:
    """``ops`` pointwise ops with a linear every 50, inputs sharded over 4 devices."""
    mesh = DeviceMesh(torch.arange(4))
    with FusionDefinition() as fd:
        x = fd.define_tensor((16, 64))
        w = fd.define_tensor((64, 64))
        value = x
        for k in range(ops):
            if k % 50 == 49:
                value = fd.ops.linear(value, w)
            else:
                value = fd.ops.relu(value) if k % 2 else fd.ops.add(value, x)
        fd.add_output(value)
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, 4)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    return fd


def lowering_seconds(ops: int) -> float:
    fd = chain_fusion(ops)
    start = time.perf_counter()
    fd.host_ir()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default=",".join(MESHES))
    parser.add_argument("--ops", default=",".join(map(str, OPS)))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--limit", type=float, default=20.0, help="seconds per case")
    args = parser.parse_args()
    print(
        "| mesh | devices | from | to | plan + emit (ms) | CPU (ms) | program text (chars)"
        " | explain |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mesh_text in args.meshes.split(","):
        mesh = _mesh(mesh_text)
        for source, target in PAIRS[len(mesh.shape)] + EXCHANGES[len(mesh.shape)]:
            runs = [_run_with_limit(args.limit, mesh_text, source, target)]
            if runs[0] is not None:
                runs += [
                    _run_with_limit(args.limit, mesh_text, source, target)
                    for _ in range(args.repeat - 1)
                ]
            if any(r is None for r in runs):
                time_text, cpu_text, size, line = f"> {args.limit * 1000:.0f}", "-", "-", "-"
            else:
                time_text = f"{statistics.median(r[0] for r in runs) * 1000:.1f}"
                cpu_text = f"{statistics.median(r[1] for r in runs) * 1000:.1f}"
                size, line = runs[0][2], runs[0][3]
            devices = len(mesh.devices)
            print(
                f"| {mesh_text} | {devices} | {source} | {target} | {time_text} | {cpu_text} |"
                f" {size} | {line} |",
                flush=True,
            )
    print()
    print("| ops | lowering (ms) |")
    print("|---|---|")
    for ops in (int(n) for n in args.ops.split(",")):
        seconds = statistics.median(lowering_seconds(ops) for _ in range(args.repeat))
        print(f"| {ops} | {seconds * 1000:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
