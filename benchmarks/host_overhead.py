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
same work (torch ops and ``torch.distributed`` collectives) written by hand, the way a
skilled user would: no checks, no copies; for the MLP at one rank the three calls
``F.linear`` with its bias, ``relu``, ``F.linear`` with its bias. ``same ops`` is the
program's own torch calls by hand, where they differ from ``hand`` (the MLP's program
adds the second bias after the row-parallel linear's Allreduce, a fourth call at one
rank): ``ours / same ops`` is the per-call cost of hostir alone. ``A/A`` times ``hand``
against a second copy of itself: how far from 1.00 a ratio strays by noise alone. The
versions run interleaved (run ``r`` starts at version ``r mod n``); a run is ``--batch`` calls after
a barrier, its time the slowest rank's; the table shows medians over ``--runs`` runs.
``host/instr`` is (ours - hand) divided by the instructions the program runs.

World size 1 runs with no process group (as a single-device user does)::

    python benchmarks/host_overhead.py
    hostir run benchmarks/host_overhead.py --nproc 2
    python benchmarks/host_overhead.py --sizes small --runs 9
    python benchmarks/host_overhead.py --sizes small --threads 1  # a busy machine

On a CUDA GPU (``--device cuda``, the default where torch has CUDA) the inputs live on
the GPU, each run ends with ``torch.cuda.synchronize()``, and three more versions run:
``graph`` is ``fd.execute(..., cuda_graph=True)`` (hostir.run.cuda_graphs: the inputs
copied into static buffers, a replay, the outputs cloned); ``hand graph`` is the
hand-written version captured in a ``torch.cuda.CUDAGraph`` by hand and called the same
way (one multi-tensor copy in, ``replay()``, a clone out: torch.compile's reduce-overhead
contract); ``replay`` is that graph's ``replay()`` alone, the inputs written in place by
the caller (the least a CUDA graph can cost). Stream programs at world size 1 need a
process group (their references call ``torch.distributed``)::

    python benchmarks/host_overhead.py --device cuda
    torchrun --nproc-per-node 1 benchmarks/host_overhead.py --device cuda

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


DEVICE = "cpu"
"""Where the inputs live (``--device``)."""


def _barrier() -> None:
    _synchronize()
    if dist.is_initialized():
        dist.barrier()


def _synchronize() -> None:
    """Waits for the GPU's queued work (nothing on the CPU): a timed run ends when its
    kernels have run, not when the host has queued them."""
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


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
            _synchronize()
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


def mlp(size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable, Callable]:
    """The MLP, this rank's inputs, the hand-written version and the program's own torch
    calls by hand. At one rank the hand-written version is the three torch calls a user
    writes (``F.linear`` with its bias, ``relu``, ``F.linear`` with its bias); the program
    adds the second bias after the row-parallel linear's Allreduce (at one rank a copy
    instead: a one-device team issues no collective), so its own calls are four (the
    second linear, then ``add``), the copy aside. On several ranks
    both are the same: the partial sums reduced, then the bias added."""
    tokens, hidden, ffn = SIZES[size]
    tensor_parallel_mlp.HIDDEN, tensor_parallel_mlp.FFN = hidden, ffn
    fd, tvs = tensor_parallel_mlp.define(d)
    generator = torch.Generator().manual_seed(0)
    shapes = [(tokens, hidden), (ffn, hidden), (ffn,), (hidden, ffn), (hidden,)]
    full = [torch.randn(s, generator=generator) / s[-1] ** 0.5 for s in shapes]
    local = [shard_tensor(t, tv, rank).to(DEVICE) for t, tv in zip(full, tvs, strict=True)]
    x, w1, b1, w2, b2 = local
    linear = torch.nn.functional.linear

    def same() -> torch.Tensor:
        partial = linear(torch.relu(linear(x, w1, b1)), w2)
        if d > 1:
            dist.all_reduce(partial)
        return partial + b2

    def hand() -> torch.Tensor:
        return linear(torch.relu(linear(x, w1, b1)), w2, b2)

    return fd, local, hand if d == 1 else same, same


def chain(size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable, Callable]:
    tokens, hidden = SIZES[size][:2]
    with FusionDefinition() as fd:
        value = fd.define_tensor((-1, hidden))
        out = value
        for _ in range(CHAIN_LENGTH):
            out = fd.ops.neg(fd.ops.relu(out))
        fd.add_output(out)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def hand() -> torch.Tensor:
        out = x
        for _ in range(CHAIN_LENGTH):
            out = torch.neg(torch.relu(out))
        return out

    return fd, [x], hand, hand


def stream_loop(program: str, size: str, d: int, rank: int):
    tokens, hidden = SIZES[size][:2]
    fd, local, references, _ = overlap.build(program, d, rank, 4, tokens * d, hidden, DEVICE)
    return fd, local, references["pipelined"], references["again"]


# -- measuring ------------------------------------------------------------------------


def build(name: str, size: str, d: int, rank: int) -> tuple[FusionDefinition, list, Callable]:
    """The fusion, this rank's inputs, the hand-written version, its A/A copy and the
    program's own torch calls by hand (the hand-written version where they are the same)."""
    if name in STREAM_PROGRAMS:
        fd, inputs, hand, again = stream_loop(name, size, d, rank)
        return fd, inputs, hand, again, hand
    fd, inputs, hand, same = (mlp if name == "mlp" else chain)(size, d, rank)
    return fd, inputs, hand, hand, same


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


def hand_graphed(hand: Callable, inputs: list) -> tuple[Callable, Callable]:
    """``hand`` captured in a CUDA graph by hand: (a call as ours is made: copy the
    caller's tensors in, replay, clone the output; the replay alone). ``hand`` reads
    ``inputs`` (its closure), which become the graph's static inputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream, as torch's CUDA-graph notes say
            hand()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = hand()
    callers = [t.clone() for t in inputs]  # the caller's own tensors, new each call

    def call() -> torch.Tensor:
        torch._foreach_copy_(inputs, callers)
        graph.replay()
        return static_out.clone()

    return call, graph.replay


def measure(name: str, size: str, d: int, rank: int, runs: int, batch: int) -> dict:
    fd, inputs, hand, again, same = build(name, size, d, rank)
    (ours,) = fd.execute(inputs)
    torch.testing.assert_close(ours, hand(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours, same(), rtol=1e-4, atol=1e-4)
    slow = interpreted(name, size, d, rank, inputs)
    versions = {
        "ours": lambda: fd.execute(inputs),
        "interp": lambda: slow.execute(inputs),
        "hand": hand,
        "again": again,
    }
    if same is not hand:
        versions["same"] = same
    if DEVICE.startswith("cuda"):
        versions.update(_graph_versions(name, fd, inputs, hand))
    medians = compare(versions, runs, batch)
    count = instructions_run(fd, inputs)
    graphs = {
        key: medians[version] * 1e6
        for key, version in (
            ("graph_us", "graph"),
            ("hand_graph_us", "hand graph"),
            ("replay_us", "replay"),
        )
        if version in medians
    }
    return {
        **graphs,
        "program": name,
        "size": size,
        "instructions": count,
        "ours_us": medians["ours"] * 1e6,
        "interp_us": medians["interp"] * 1e6,
        "hand_us": medians["hand"] * 1e6,
        "ratio": medians["ours"] / medians["hand"],
        "same_us": medians.get("same", medians["hand"]) * 1e6,
        "aa": medians["again"] / medians["hand"],
        "per_instruction_us": (medians["ours"] - medians["hand"]) / count * 1e6,
    }


def _graph_versions(name: str, fd: FusionDefinition, inputs: list, hand: Callable) -> dict:
    """The CUDA-graph versions of one program (those that capture: a refusal is printed)."""
    versions: dict[str, Callable] = {}
    try:
        (graphed,) = fd.execute(inputs, cuda_graph=True)
        torch.testing.assert_close(graphed, hand(), rtol=1e-4, atol=1e-4)
        versions["graph"] = lambda: fd.execute(inputs, cuda_graph=True)
    except Exception as error:  # reported, not timed
        print(f"{name}: graph: {type(error).__name__}: {error}", file=sys.stderr)
    try:
        call, replay = hand_graphed(hand, inputs)
        torch.testing.assert_close(call(), hand(), rtol=1e-4, atol=1e-4)
        versions["hand graph"], versions["replay"] = call, replay
    except Exception as error:
        print(f"{name}: hand graph: {type(error).__name__}: {error}", file=sys.stderr)
    return versions


def graph_table(rows: list[dict]) -> str:
    """The CUDA-graph columns, where any ran."""
    lines = [
        "| program | size | ours (µs) | graph (µs) | hand (µs) | hand graph (µs) | replay (µs)"
        " | ours / hand | graph / hand graph | graph / replay |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for r in rows:
        graph, hand_graph = r.get("graph_us", nan), r.get("hand_graph_us", nan)
        replay = r.get("replay_us", nan)
        lines.append(
            f"| {r['program']} | {r['size']} | {r['ours_us']:.1f} | {graph:.1f} |"
            f" {r['hand_us']:.1f} | {hand_graph:.1f} | {replay:.1f} | {r['ratio']:.2f} |"
            f" {graph / hand_graph:.2f} | {graph / replay:.2f} |"
        )
    return "\n".join(lines)


def table(rows: list[dict], d: int) -> str:
    lines = [
        f"world size {d}, {platform.machine()}, torch {torch.__version__},"
        f" {torch.get_num_threads()} threads, device {_device_name()}",
        "| program | size | instructions | ours (µs) | interp (µs) | hand (µs) | ours / hand |"
        " interp / hand | A/A | host/instr (µs) | same ops (µs) | ours / same ops |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['size']} | {r['instructions']} | {r['ours_us']:.1f} |"
            f" {r['interp_us']:.1f} | {r['hand_us']:.1f} | {r['ratio']:.2f} |"
            f" {r['interp_us'] / r['hand_us']:.2f} | {r['aa']:.2f} |"
            f" {r['per_instruction_us']:.2f} | {r['same_us']:.1f} |"
            f" {r['ours_us'] / r['same_us']:.2f} |"
        )
    return "\n".join(lines)


def _device_name() -> str:
    if DEVICE.startswith("cuda"):
        return f"{DEVICE} ({torch.cuda.get_device_name()})"
    return DEVICE


def main(argv: list[str]) -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,medium,large")
    parser.add_argument("--programs", default="mlp,chain," + ",".join(STREAM_PROGRAMS))
    parser.add_argument("--runs", type=int, default=11, help="timed runs per version")
    parser.add_argument("--batch", type=int, default=0, help="calls per run (0: by size)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch's intra-op threads (0: torch's default); 1 steadies a shared machine",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the inputs live: cpu or cuda (default: cuda where torch has it)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = default_communicator()  # the launcher's group, if any; else this process alone
    d, rank = world.world_size, world.rank
    DEVICE = args.device
    if DEVICE == "cuda":
        DEVICE = f"cuda:{torch.cuda.current_device()}"
    rows = []
    for name in args.programs.split(","):
        if name in STREAM_PROGRAMS and not dist.is_initialized():
            continue  # their hand-written versions call torch.distributed
        for size in args.sizes.split(","):
            # a GPU queues the work, so even the large size is host-bound for a while
            by_size = {"small": 200, "medium": 20, "large": 3}
            if DEVICE.startswith("cuda"):
                by_size = {"small": 200, "medium": 100, "large": 30}
            batch = args.batch or by_size[size]
            rows.append(measure(name, size, d, rank, args.runs, batch))
    if rank == 0:
        print(table(rows, d))
        if any("graph_us" in row or "hand_graph_us" in row for row in rows):
            print()
            print(graph_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
