"""The simulated world against PyTorch's LocalTensor mode, on the README's MLP.

The same program, ``relu(x @ w1.T + b1) @ w2.T + b2`` with ``w1``/``b1`` column-parallel
and ``w2`` row-parallel over a 1-d mesh of N ranks (examples/tensor_parallel_mlp.py;
hidden 16, FFN ``max(64, N)`` so every rank holds at least one row, 8 tokens), run for
every rank in one process and every rank's output checked against the single-device
reference, two ways:

- **ours**: ``fd.execute_simulated(full_inputs, world_size=N)`` on the example's
  ``define(N)`` (hostir.comm.simulate: one thread per rank, each rank's ``fd.execute``);
- **LocalTensor**: DTensor under ``torch.distributed._local_tensor.LocalTensorMode``, as
  PyTorch's own tests run it (``LocalDTensorTestBase``): the fake process group, the
  mesh built with the mode off (``init_device_mesh``), then inside
  ``LocalTensorMode(frozenset(range(N)))`` ``distribute_tensor`` of each input
  (``Replicate`` for x and b2, ``Shard(0)`` for w1 and b1, ``Shard(1)`` for w2) and the
  MLP with ``F.linear``; the output redistributed to ``Replicate`` and each rank's local
  tensor (``LocalTensor._local_tensors[r]``) compared with the reference.

Each measurement is a fresh child process (this script with ``--child``), so set-up is
included: the interpreter and its imports, building the definition or the mesh,
distributing the inputs, the run, the check. The parent takes the child's wall time and
its peak RSS (``os.wait4``'s rusage: that child alone); the child reports its phases.
``--script`` also times ``hostir run examples/tensor_parallel_mlp.py --simulate N`` (each
rank runs the whole script: its own definition, lowering and print). ``--meshes`` runs
benchmarks/simulated_meshes.py's 2-d and 3-d meshes at 64 and 512 ranks. ``--profile N``
profiles ours in this process (cProfile in every rank's thread, merged with
``pstats.Stats.add``) and prints where the time goes.

Run from the repository root::

    PYTHONPATH=. python3 benchmarks/simulated_world.py --sizes 8 128 1024 --reps 3 --script --meshes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

STARTED = time.perf_counter()  # the child's imports are timed from here
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDDEN, TOKENS = 16, 8


def mlp_inputs(n: int) -> list:
    """The full inputs (x, w1, b1, w2, b2) for ``n`` ranks, the same on both sides."""
    import torch

    features = max(64, n)
    generator = torch.Generator().manual_seed(0)
    shapes = [(TOKENS, HIDDEN), (features, HIDDEN), (features,), (HIDDEN, features), (HIDDEN,)]
    return [torch.randn(s, generator=generator) for s in shapes]


def _reference(full: list):
    import torch

    x, w1, b1, w2, b2 = full
    return torch.relu(x @ w1.T + b1) @ w2.T + b2


def child_ours(n: int) -> dict:
    """One run of ours at ``n`` ranks in this (fresh) process; its phases in seconds."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import tensor_parallel_mlp

    imported = time.perf_counter()
    full = mlp_inputs(n)
    expected = _reference(full)
    fd, _ = tensor_parallel_mlp.define(n)
    defined = time.perf_counter()
    run = fd.execute_simulated(full, world_size=n)
    ran = time.perf_counter()
    run.raise_first()
    wrong = [
        r for r in range(n) if not torch.allclose(run.results[r][0], expected, rtol=1e-4, atol=1e-4)
    ]
    return {
        "import": imported - STARTED,
        "setup": defined - imported,
        "run": ran - defined,
        "wrong": wrong,
    }


def child_localtensor(n: int) -> dict:
    """One run of DTensor under LocalTensor mode at ``n`` ranks in this (fresh) process."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    imported = time.perf_counter()
    full = mlp_inputs(n)
    expected = _reference(full)
    dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
    mesh = init_device_mesh("cpu", (n,))  # built with the mode off, as PyTorch's tests do
    meshed = time.perf_counter()
    placements = [Replicate(), Shard(0), Shard(0), Shard(1), Replicate()]
    with LocalTensorMode(frozenset(range(n))):
        x, w1, b1, w2, b2 = (
            distribute_tensor(t, mesh, [p]) for t, p in zip(full, placements, strict=True)
        )
        distributed = time.perf_counter()
        y = F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
        local = y.redistribute(mesh, [Replicate()]).to_local()
    ran = time.perf_counter()
    per_rank = local._local_tensors  # what each simulated rank holds
    wrong = [r for r in range(n) if not torch.allclose(per_rank[r], expected, rtol=1e-4, atol=1e-4)]
    dist.destroy_process_group()
    return {
        "import": imported - STARTED,
        "mesh": meshed - imported,
        "distribute": distributed - meshed,
        "run": ran - distributed,
        "setup": distributed - imported,
        "wrong": wrong,
    }


def child_mesh(shape: tuple[int, ...]) -> dict:
    """One run of benchmarks/simulated_meshes.py's MLP on ``shape`` in this process."""
    from benchmarks.simulated_meshes import run_mlp

    imported = time.perf_counter()
    done = run_mlp(shape)
    return {
        "import": imported - STARTED,
        "setup": done.define_s,
        "run": done.run_s,
        "wrong": done.wrong_ranks,
    }


def measure_child(argv: list[str]) -> dict:
    """Runs ``argv`` as a child: its wall seconds, its own peak RSS in MB (``os.wait4``
    reaps it and gives its rusage; RUSAGE_CHILDREN would be the maximum over all children
    so far), its exit code and, for a ``--child`` run, the phases it printed."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT)
    # files, not pipes: a child that fills one pipe while we read the other would stall
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        child = subprocess.Popen(argv, cwd=ROOT, stdout=out_file, stderr=err_file, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = code = os.waitstatus_to_exitcode(status)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    result = {"wall": wall, "code": code, "rss_mb": usage.ru_maxrss / 1024}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if lines:
        result.update(json.loads(lines[-1]))
    if child.returncode != 0:
        result["err"] = err[-2000:]
    return result


def _me(*args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), *args]


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _spread(runs: list[dict]) -> str:
    walls = [r["wall"] for r in runs]
    if len(walls) < 2:
        return "1 run"
    spread = (max(walls) - min(walls)) / statistics.median(walls)
    return f"{min(walls):.1f}-{max(walls):.1f}, {spread:.0%}"


def _check(name: str, runs: list[dict]) -> None:
    for r in runs:
        if r["code"] != 0 or r.get("wrong"):
            raise SystemExit(f"{name}: a run failed or differs: {r}")


def compare(sizes: list[int], reps: int, lt_reps: int, script: bool) -> list[str]:
    """The side-by-side table (Markdown lines) of ours and LocalTensor at ``sizes``."""
    rows = [
        "| ranks | ours: wall s (A/A spread) | ours: after imports s | ours peak MB | "
        "LocalTensor: wall s | LT: after imports s (mesh + distribute, forward) | LT peak MB | "
        "wall ratio | after-imports ratio | peak ratio |"
        + (" `hostir run --simulate`: wall s, peak MB |" if script else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if script else ""),
    ]
    for n in sizes:
        ours = [measure_child(_me("--child", "ours", str(n))) for _ in range(reps)]
        _check(f"ours at {n}", ours)
        our_wall = _median(ours, "wall")
        our_work = _median(ours, "setup") + _median(ours, "run")
        mine = f"| {n} | {our_wall:.1f} ({_spread(ours)}) | {our_work:.2f} | "
        mine += f"{_median(ours, 'rss_mb'):.0f} | "
        if lt_reps == 0:  # ours alone (LocalTensor measured before, unchanged since)
            row = mine + "- | - | - | - | - | - |"
        else:
            count = lt_reps if n >= 512 else max(lt_reps, reps)
            theirs = [measure_child(_me("--child", "localtensor", str(n))) for _ in range(count)]
            _check(f"LocalTensor at {n}", theirs)
            lt_wall = _median(theirs, "wall")
            lt_setup, lt_run = _median(theirs, "setup"), _median(theirs, "run")
            plural = "s" if len(theirs) > 1 else ""
            row = mine + (
                f"{lt_wall:.1f} ({len(theirs)} run{plural}) | "
                f"{lt_setup + lt_run:.2f} ({lt_setup:.2f}, {lt_run:.2f}) | "
                f"{_median(theirs, 'rss_mb'):.0f} | {lt_wall / our_wall:.1f}x | "
                f"{(lt_setup + lt_run) / our_work:.1f}x | "
                f"{_median(theirs, 'rss_mb') / _median(ours, 'rss_mb'):.2f}x |"
            )
        if script:
            cmd = [sys.executable, "-m", "hostir.cli", "run", "examples/tensor_parallel_mlp.py"]
            ran = measure_child([*cmd, "--simulate", str(n)])
            _check(f"hostir run --simulate {n}", [ran])
            row += f" {ran['wall']:.1f}, {ran['rss_mb']:.0f} |"
        rows.append(row)
        print(rows[-1], flush=True)
    return rows


def meshes(shapes: list[str]) -> list[str]:
    """The 2-d and 3-d meshes' table: wall, peak RSS, the run's seconds, every rank OK."""
    rows = [
        "| mesh | ranks | wall s (fresh process) | peak MB | define s | execute_simulated s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for text in shapes:
        ran = measure_child(_me("--child", "mesh", text))
        _check(f"mesh {text}", [ran])
        n = 1
        for s in text.split("x"):
            n *= int(s)
        rows.append(
            f"| {text} | {n} | {ran['wall']:.1f} | {ran['rss_mb']:.0f} | {ran['setup']:.2f} | "
            f"{ran['run']:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    """Parses the command line; a ``--child`` run prints its phases as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[8, 128, 1024])
    parser.add_argument("--reps", type=int, default=3, help="runs of ours per size (median)")
    parser.add_argument(
        "--lt-reps", type=int, default=1, help="LocalTensor runs at >= 512 (0: ours alone)"
    )
    parser.add_argument(
        "--script", action="store_true", help="also hostir run --simulate (--profile: that path)"
    )
    parser.add_argument("--meshes", nargs="*", help="mesh shapes, e.g. 8x8 4x4x4 16x32 8x8x8")
    parser.add_argument("--profile", type=int, help="profile ours at this many ranks")
    parser.add_argument("--profile-out", help="with --profile: write the merged stats here")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, size = args.child
        if kind == "mesh":
            phases = child_mesh(tuple(int(s) for s in size.split("x")))
        else:
            phases = (child_ours if kind == "ours" else child_localtensor)(int(size))
        print(json.dumps(phases))
        return 0
    if args.profile:
        from benchmarks.simulated_profile import profile

        print(profile(args.profile, script=args.script, dump=args.profile_out))
        return 0
    print(f"load average {os.getloadavg()}", flush=True)
    lines = compare(args.sizes, args.reps, args.lt_reps, args.script) if args.sizes else []
    if args.meshes:
        lines += ["", *meshes(args.meshes)]
    print("\n".join(lines))
    print(f"load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
