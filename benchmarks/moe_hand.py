"""The expert-parallel MoE layer of examples/moe_layer.py, written by hand as torchtitan
does it, and its row in benchmarks/layers.py.

The hand-written layer (:func:`hand_moe`) is torchtitan's expert parallelism
(``torchtitan/distributed/expert_parallel.py``'s token dispatch and combine around
``torchtitan/models/moe/moe.py``'s router and experts) on CPU ranks with gloo, the best a
skilled user writes there:

- router in float32, ``torch.softmax``, ``torch.topk``; the ``t * k`` (token, choice)
  pairs sorted by expert with one stable ``argsort``, the rows picked by one
  ``index_select``, the tokens per expert by one ``bincount``;
- **one** ``all_to_all_single`` of the per-expert counts; the split sizes read to the
  host from them (torchtitan's ``.tolist()``), the rows sent by one ``all_to_all_single``
  with those splits;
- the received rows grouped by local expert (torchtitan's permute indices: one stable
  ``argsort`` of each row's local expert) and each local expert's MLP as two ``torch.mm``
  written in place (``out=``): a loop over the device's experts, never over tokens;
  torch 2.13's CPU ``_grouped_mm`` is far slower than a matmul per group (hostir/run/
  attention.py), so a CPU user loops, as torchtitan's ``_run_experts_for_loop``;
- back by the reverse ``all_to_all_single``, un-permuted by two ``index_copy_`` and
  weighted by the router's probabilities, summed over the k choices.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import moe_layer  # examples/moe_layer.py (on the path that layers.py sets)
import overlap
import torch
import torch.distributed as dist
import torch.nn.functional as F

import hostir

SIZES = {
    # name: (tokens per rank, hidden, ffn, experts), each token to TOP_K experts
    "small": (moe_layer.TOKENS, moe_layer.HIDDEN, moe_layer.FFN, moe_layer.EXPERTS),
    "medium": (512, 512, 2048, 8),
    "large": (2048, 1024, 4096, 8),
}
TOP_K = 2
RUNS = {"small": 200, "medium": 20, "large": 7}
"""Default timed runs: a large run takes 1-3 s per version on 2 shared vCPUs."""
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # torch.softmax rounds its last bit differently


def hand_moe(local: list[torch.Tensor], k: int, experts: int) -> Callable:
    """The layer on this rank's ``x [1, t, H]``, ``router [E, H]``, ``w1 [1, L, H, F]``,
    ``w2 [1, L, F, H]`` with torch and ``dist.all_to_all_single`` (module docstring);
    returns the call, whose result is this rank's output ``[1, t, H]``."""
    x, router, w1, w2 = local[0][0], local[1], local[2][0], local[3][0]
    d, per = dist.get_world_size(), w1.shape[0]
    tokens, hidden = x.shape
    # which local expert each (source, expert) block of the received counts is for
    slot_ids = torch.arange(per).repeat(d)

    def run() -> torch.Tensor:
        # route (float32) and sort the (token, choice) pairs by expert
        probs = torch.softmax(F.linear(x.float(), router), dim=-1)
        weights, chosen = torch.topk(probs, k, dim=-1, sorted=True)
        flat = chosen.view(-1)
        order = torch.argsort(flat, stable=True)
        rows = x.index_select(0, order // k)
        # counts: one exchange of the per-expert counts; splits on the host
        counts = torch.bincount(flat, minlength=d * per)
        arriving = torch.empty_like(counts)
        dist.all_to_all_single(arriving, counts)
        arriving = arriving.view(d, per)  # [source, local expert]
        in_splits = counts.view(d, per).sum(1).tolist()
        out_splits = arriving.sum(1).tolist()
        received = x.new_empty(sum(out_splits), hidden)
        dist.all_to_all_single(received, rows, out_splits, in_splits)
        # the device's experts, on its rows grouped by local expert
        grouping = torch.argsort(slot_ids.repeat_interleave(arriving.view(-1)), stable=True)
        grouped = received.index_select(0, grouping)
        y = torch.empty_like(grouped)
        start = 0
        for e, n in enumerate(arriving.sum(0).tolist()):
            if n:
                inner = F.gelu(torch.mm(grouped[start : start + n], w1[e]).float())
                torch.mm(inner.to(x.dtype), w2[e], out=y[start : start + n])
            start += n
        # combine: arrival order, back, (token, choice) order, weighted sum over choices
        sent_back = torch.empty_like(y).index_copy_(0, grouping, y)
        returned = x.new_empty(tokens * k, hidden)
        dist.all_to_all_single(returned, sent_back, in_splits, out_splits)
        combined = torch.empty_like(returned).index_copy_(0, order, returned)
        scaled = combined.view(tokens, k, hidden).float() * weights.unsqueeze(-1)
        return scaled.sum(1).to(x.dtype).unsqueeze(0)

    return run


def measure_moe(size: str, args: argparse.Namespace, rank: int, d: int, dtype: torch.dtype) -> dict:
    """Checks ours and the hand-written layer against ``moe_layer.reference`` and each
    other at ``size``, then times them (and the hand-written layer against a copy of
    itself: the A/A); the table row."""
    tokens, hidden, ffn, experts = SIZES[size]
    sizes = {"tokens": tokens, "hidden": hidden, "ffn": ffn}
    full = moe_layer.make_inputs(d, 0, dtype, experts, **sizes)
    x, router, w1, w2 = full
    local = [x[rank : rank + 1], router, w1[rank : rank + 1], w2[rank : rank + 1]]
    fd = moe_layer.define(d, dtype, TOP_K, experts, **sizes)[0]
    if args.entry == "execute":
        fd.execute(local)  # lowers and prepares once
        ours = lambda: fd.execute(local)[0]  # noqa: E731
    else:
        evaluator = hostir.HostIrEvaluator(fd.host_ir(), communicator=hostir.default_communicator())
        ours = lambda: evaluator.run(local)[0]  # noqa: E731
    versions = {
        "ours": ours,
        "hand": hand_moe(local, TOP_K, experts),
        "again": hand_moe(local, TOP_K, experts),
    }
    expected = moe_layer.reference(full, TOP_K, experts)[0][rank : rank + 1]
    tolerance = TOLERANCE if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    result = versions["ours"]()
    bitwise = torch.equal(result, expected)
    for name, version in versions.items():
        try:
            torch.testing.assert_close(version(), expected, **tolerance)
        except AssertionError as error:
            raise SystemExit(f"MoE {name} differs from moe_layer.reference: {error}") from None
    runs = args.runs if args.runs is not None else RUNS[size]
    median, cpu = compare(versions, args.warmup, runs)
    label = str(dtype).removeprefix("torch.")
    return {
        "size": f"{size} (t={tokens} H={hidden} F={ffn} E={experts} k={TOP_K}, {label})",
        "bitwise": bitwise,
        **{name: seconds * 1e3 for name, seconds in median.items()},
        "cpu": {name: seconds * 1e3 for name, seconds in cpu.items()},
    }


def compare(
    versions: dict[str, Callable], warmup: int, runs: int
) -> tuple[dict[str, float], dict[str, float]]:
    """``overlap.compare``'s medians (wall time, the slowest rank's, in seconds), and per
    version the median over runs of the CPU time every rank's process spent (summed over
    ranks, gloo's threads included). The CPU time is what the layer costs the machine: on
    a shared machine it strays far less than the wall time, which waits for whichever
    rank the scheduler set aside."""
    for _ in range(warmup):
        for fn in versions.values():
            fn()
    names = list(versions)
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        shift = run % len(names)
        for name in names[shift:] + names[:shift]:
            dist.barrier()  # as overlap.timed, the CPU clock started after it too
            start, cpu_start = time.perf_counter(), time.process_time()
            versions[name]()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(time.process_time() - cpu_start)
    wall = {name: statistics.median(overlap.max_over_ranks(t)) for name, t in walls.items()}
    cpu = {}
    for name, times in cpus.items():
        summed = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(summed)
        cpu[name] = statistics.median(summed.tolist())
    return wall, cpu


def moe_table(rows: list[dict]) -> str:
    """The MoE rows as a Markdown table (medians in ms); empty without rows."""
    if not rows:
        return ""
    lines = [
        "| MoE layer (per rank) | ours (ms) | hand (ms) | ours / hand | A/A"
        " | CPU: ours / hand | CPU: A/A | ours bitwise = reference |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cpu = r["cpu"]
        lines.append(
            f"| {r['size']} | {r['ours']:.3f} | {r['hand']:.3f} | {r['ours'] / r['hand']:.2f}"
            f" | {r['hand'] / r['again']:.2f} | {cpu['ours'] / cpu['hand']:.3f}"
            f" | {cpu['hand'] / cpu['again']:.3f} | {'yes' if r['bitwise'] else 'no'} |"
        )
    return "\n".join(lines)
