"""Transformer blocks and a MoE layer against the same written by hand with ``torch.distributed``.

Three layers of ``examples/``, on the same local shards of the same random inputs:

- ``tensor-parallel`` (examples/tensor_parallel_block.py: Megatron's block, heads and the
  MLP's 4E sharded, 2 Allreduces): ours against the block by hand (``F.layer_norm``,
  ``F.linear``, ``F.scaled_dot_product_attention(is_causal=True)``, ``F.gelu(tanh)`` and
  two ``dist.all_reduce``).
- ``sequence-parallel`` (examples/sequence_parallel_block.py: the same block with the
  activations sharded over the sequence, an Allgather loop before QKV and MLP0 in one
  chunk per rank, a ReduceScatter loop after the out-projection and MLP1 in 2 chunks of
  each rank's tokens): ours in pipelined stream loops against (a) the same program run
  unpipelined (``HostIrEvaluator(pipeline=False)``), (b) the same block without loops
  (``define(loops=False)``: one Allgather and one ReduceScatter each) and the block by
  hand, chunked the same way, (c) software-pipelined as a skilled user writes it (chunk
  ``i + 1``'s ``dist.broadcast`` posted before chunk ``i``'s matmul; chunk ``j``'s
  ``reduce_scatter_single`` waited after chunk ``j + 1``'s matmul, then its bias,
  residual and layernorm) and (d) the same by hand unpipelined (each wait right after
  its post).
- ``moe`` (examples/moe_layer.py: the expert-parallel MoE layer, tokens dispatched by
  run-time counts): ours against the layer by hand as torchtitan writes it
  (benchmarks/moe_hand.py: ``dist.all_to_all_single`` of the per-expert counts, then of
  the tokens with the split sizes on the host, a matmul per local expert, and back), both
  checked against ``moe_layer.reference`` first (``--moe-dtypes`` adds bfloat16).

The method is benchmarks/overlap.py's, whose ``compare`` this uses: every version's
output is checked against ours (and ours against the single-device torch reference)
before anything is timed; the versions run interleaved, each run after a
``dist.barrier()``; a run's time is the slowest rank's; the tables give medians over
runs. ``A/A`` times the hand-written (pipelined) block against a second copy of
itself: how far a ratio strays from 1.00 by noise alone. ``saved`` is
``1 - ours / unpipelined``. "ours" is ``HostIrEvaluator.run`` on an evaluator created
once (``--entry execute``: ``fd.execute`` on a known signature). Sizes: ``small`` (each
example's own sizes: overhead), ``medium`` and ``large`` (compute-bound on CPU: a
chunk's matmul takes longer than its collective); float32, batch 2.

Run it with::

    hostir run benchmarks/layers.py --nproc 2
    hostir run benchmarks/layers.py --nproc 4 -- --sizes medium --runs 20
    python benchmarks/layers.py --nproc 2      # starts the ranks itself

Rank 0 prints the tables; ``--help`` lists the options.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import moe_hand  # noqa: E402  (benchmarks/moe_hand.py: the MoE layer by hand, its row)
import overlap  # noqa: E402  (benchmarks/overlap.py: compare, the method)
import sequence_parallel_block as sp  # noqa: E402
import tensor_parallel_block as tp  # noqa: E402

import hostir  # noqa: E402
from frontend import shard_tensor  # noqa: E402

SIZES = {
    # name: (sequence, embedding) of the tensor-parallel block, then of the sequence-parallel
    "small": ((tp.SEQUENCE, tp.EMBEDDING), (sp.SEQUENCE, sp.EMBEDDING)),  # overhead
    "medium": ((512, 256), (512, 256)),
    "large": ((1024, 512), (1024, 512)),
}
DEFAULT_RUNS = {"small": 200, "medium": 60, "large": 30}  # the MoE's: moe_hand.RUNS
BLOCKS = ("tensor-parallel", "sequence-parallel", "moe")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # f32 sums over up to 4E terms in another order
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# -- The blocks by hand -----------------------------------------------------------------


def hand_tensor_parallel(local: list[torch.Tensor], heads: int) -> Callable:
    """The tensor-parallel block on this rank's shards with torch's ops and two
    all-reduces, in :func:`tensor_parallel_block.define`'s order of additions."""
    x, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b, ln1_w, ln1_b = local[:9]
    mlp0_w, mlp0_b, mlp1_w, mlp1_b = local[9:]
    b, s, e = x.shape
    head = e // heads

    def run() -> torch.Tensor:
        qkv = F.linear(F.layer_norm(x, (e,), ln0_w, ln0_b, tp.EPS), qkv_w, qkv_b)
        q, k, v = (t.transpose(1, 2) for t in qkv.view(b, s, -1, 3 * head).split(head, -1))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        projected = F.linear(attention.transpose(1, 2).reshape(b, s, -1), proj_w)
        dist.all_reduce(projected)
        x1 = x + (projected + proj_b)
        hidden = F.linear(F.layer_norm(x1, (e,), ln1_w, ln1_b, tp.EPS), mlp0_w, mlp0_b)
        mlp = F.linear(F.gelu(hidden, approximate="tanh"), mlp1_w)
        dist.all_reduce(mlp)
        return x1 + (mlp + mlp1_b)

    return run


def _gather(shard: torch.Tensor, out: torch.Tensor, compute: Callable, pipelined: bool) -> None:
    """``out[:, rank i's tokens] = compute(rank i's shard)`` for every rank i, rank i's
    shard arriving by one ``dist.broadcast`` from i; ``pipelined`` posts the next
    broadcast before this chunk's ``compute``."""
    rank, d, tokens = dist.get_rank(), dist.get_world_size(), shard.shape[1]

    def post(i: int) -> tuple[torch.Tensor, object]:
        buf = shard if i == rank else torch.empty_like(shard)
        return buf, dist.broadcast(buf, src=i, async_op=True)

    current, work = post(0)
    for i in range(d):
        work.wait()
        upcoming = post(i + 1) if pipelined and i + 1 < d else None
        out[:, i * tokens : (i + 1) * tokens] = compute(current)
        if i + 1 < d:
            current, work = upcoming if upcoming is not None else post(i + 1)


def _scatter(
    full: torch.Tensor, weight: torch.Tensor, finish: Callable, chunks: int, pipelined: bool
) -> None:
    """``finish(j, reduced)`` for every chunk j of this rank's tokens, ``reduced`` that
    chunk of the sum over ranks of ``full @ weight.T`` (one ``reduce_scatter_single``
    per chunk, of chunk j of every rank's tokens); ``pipelined`` finishes chunk j after
    chunk j + 1's matmul."""
    d, (b, s, k) = dist.get_world_size(), full.shape
    part = s // d // chunks
    blocks = full.view(b, d, chunks, part, k)

    def post(j: int) -> tuple[int, torch.Tensor, object]:
        # rank-major: the reduce-scatter hands rank r the r-th of d equal pieces
        sums = F.linear(blocks[:, :, j], weight).transpose(0, 1).contiguous()
        reduced = torch.empty(b, part, weight.shape[0])
        return j, reduced, REDUCE_SCATTER(reduced.view(-1), sums.view(-1), async_op=True)

    pending = []
    for j in range(chunks):
        pending.append(post(j))
        while len(pending) > (1 if pipelined else 0):
            done, reduced, work = pending.pop(0)
            work.wait()
            finish(done, reduced)
    for done, reduced, work in pending:
        work.wait()
        finish(done, reduced)


def hand_sequence_parallel(
    local: list[torch.Tensor], heads: int, chunks: int, pipelined: bool
) -> Callable:
    """The sequence-parallel block on this rank's shards, chunked as ours: each gather in
    one broadcast per rank (:func:`_gather`), each reduce-scatter in ``chunks`` chunks
    of every rank's tokens (:func:`_scatter`), software-pipelined or not."""
    x, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b, ln1_w, ln1_b = local[:9]
    mlp0_w, mlp0_b, mlp1_w, mlp1_b = local[9:]
    b, tokens, e = x.shape  # this rank's tokens
    s, head, part = tokens * dist.get_world_size(), e // heads, tokens // chunks

    def residual0(j: int, reduced: torch.Tensor, x1, normed) -> None:
        rows = slice(j * part, (j + 1) * part)
        x1[:, rows] = x[:, rows] + (reduced + proj_b)
        normed[:, rows] = F.layer_norm(x1[:, rows], (e,), ln1_w, ln1_b, tp.EPS)

    def residual1(j: int, reduced: torch.Tensor, x1, out) -> None:
        rows = slice(j * part, (j + 1) * part)
        out[:, rows] = x1[:, rows] + (reduced + mlp1_b)

    def run() -> torch.Tensor:
        qkv = torch.empty(b, s, qkv_w.shape[0])
        normed = F.layer_norm(x, (e,), ln0_w, ln0_b, tp.EPS)
        _gather(normed, qkv, lambda t: F.linear(t, qkv_w, qkv_b), pipelined)
        q, k, v = (t.transpose(1, 2) for t in qkv.view(b, s, -1, 3 * head).split(head, -1))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attention = attention.transpose(1, 2).reshape(b, s, -1)
        x1, normed, out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        _scatter(attention, proj_w, lambda j, r: residual0(j, r, x1, normed), chunks, pipelined)
        hidden = torch.empty(b, s, mlp0_w.shape[0])
        gelu = lambda t: F.gelu(F.linear(t, mlp0_w, mlp0_b), approximate="tanh")  # noqa: E731
        _gather(normed, hidden, gelu, pipelined)
        _scatter(hidden, mlp1_w, lambda j, r: residual1(j, r, x1, out), chunks, pipelined)
        return out

    return run


# -- Building, checking and timing ------------------------------------------------------


def ours(fd, local: list[torch.Tensor], args: argparse.Namespace, **options) -> Callable:
    """A call of our program on ``local``: the prepared evaluator (with ``options``) or,
    with ``--entry execute`` and no options, ``fd.execute``."""
    if args.entry == "execute" and not options:
        fd.execute(local)  # lowers and prepares once: the timed calls hit a known signature
        return lambda: fd.execute(local)[0]
    evaluator = hostir.HostIrEvaluator(
        fd.host_ir(), communicator=hostir.default_communicator(), **options
    )
    return lambda: evaluator.run(local)[0]


def check(versions: dict[str, Callable], expected: torch.Tensor) -> None:
    """Every version's output against ``expected`` (ours' output); raises on a mismatch."""
    for name, version in versions.items():
        try:
            torch.testing.assert_close(version(), expected, **TOLERANCE)
        except AssertionError as error:
            raise SystemExit(f"{name} differs from ours: {error}") from None


def measure_tensor_parallel(size: str, args: argparse.Namespace, rank: int, d: int) -> dict:
    """Checks and times the tensor-parallel block at ``size``; the table row."""
    sequence, embedding = SIZES[size][0]
    full = tp.random_inputs(torch.float32, 0, tp.input_specs(tp.BATCH, sequence, embedding))
    fd, tvs = tp.define(d, sequence=sequence, embedding=embedding)
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    versions = {"ours": ours(fd, local, args)}
    result = versions["ours"]()
    torch.testing.assert_close(result, tp.reference(full), **TOLERANCE)
    versions["hand"] = hand_tensor_parallel(local, tp.HEADS)
    versions["again"] = hand_tensor_parallel(local, tp.HEADS)
    check(versions, result)
    median = overlap.compare(versions, args.warmup, runs(size, args), 1)
    return {
        "size": f"{size} (B={tp.BATCH} S={sequence} E={embedding} H={tp.HEADS})",
        **{name: seconds * 1e3 for name, seconds in median.items()},
    }


def measure_sequence_parallel(size: str, args: argparse.Namespace, rank: int, d: int) -> dict:
    """Checks and times the sequence-parallel block and its variants at ``size``."""
    sequence, embedding = SIZES[size][1]
    full = sp.random_inputs(torch.float32, 0, sequence, embedding)
    fd, tvs = sp.define(d, sequence=sequence, embedding=embedding)
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    unlooped, _ = sp.define(d, sequence=sequence, embedding=embedding, loops=False)
    chunks = sp.SCATTER_CHUNKS
    versions = {
        "ours": ours(fd, local, args),
        "unpipelined": ours(fd, local, args, pipeline=False),
        "no loops": ours(unlooped, local, args, pipeline=False),
        "hand": hand_sequence_parallel(local, sp.HEADS, chunks, pipelined=True),
        "hand unpipelined": hand_sequence_parallel(local, sp.HEADS, chunks, pipelined=False),
        "again": hand_sequence_parallel(local, sp.HEADS, chunks, pipelined=True),
    }
    result = versions["ours"]()
    expected = shard_tensor(sp.reference(full), fd.host_ir().outputs[0], rank)
    torch.testing.assert_close(result, expected, **TOLERANCE)
    check(versions, result)
    median = overlap.compare(versions, args.warmup, runs(size, args), 1)
    return {
        "size": f"{size} (B={sp.BATCH} S={sequence} E={embedding} H={sp.HEADS})",
        **{name: seconds * 1e3 for name, seconds in median.items()},
    }


def runs(size: str, args: argparse.Namespace) -> int:
    """Timed runs at ``size``: ``--runs`` or the size's default."""
    return args.runs if args.runs is not None else DEFAULT_RUNS[size]


def tables(tp_rows: list[dict], sp_rows: list[dict]) -> str:
    """The two Markdown tables (medians in ms), each where it has rows."""
    lines = [
        "| tensor-parallel block | ours (ms) | hand (ms) | ours / hand | A/A |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in tp_rows:
        lines.append(
            f"| {r['size']} | {r['ours']:.3f} | {r['hand']:.3f} | {r['ours'] / r['hand']:.2f}"
            f" | {r['hand'] / r['again']:.2f} |"
        )
    sp_lines = [
        "| sequence-parallel block | ours: pipelined loops (ms) | ours: unpipelined (ms)"
        " | ours: no loops (ms) | saved vs unpipelined | saved vs no loops"
        " | hand: pipelined (ms) | hand: unpipelined (ms) | hand: saved"
        " | ours / hand pipelined | A/A |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sp_rows:
        sp_lines.append(
            f"| {r['size']} | {r['ours']:.3f} | {r['unpipelined']:.3f} | {r['no loops']:.3f}"
            f" | {1 - r['ours'] / r['unpipelined']:.1%} | {1 - r['ours'] / r['no loops']:.1%}"
            f" | {r['hand']:.3f} | {r['hand unpipelined']:.3f}"
            f" | {1 - r['hand'] / r['hand unpipelined']:.1%} | {r['ours'] / r['hand']:.2f}"
            f" | {r['hand'] / r['again']:.2f} |"
        )
    parts = [table for table, rows in ((lines, tp_rows), (sp_lines, sp_rows)) if rows]
    return "\n\n".join("\n".join(part) for part in parts)


# -- Command line -----------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,medium,large", help="comma-separated")
    parser.add_argument(
        "--blocks", default="tensor-parallel,sequence-parallel,moe", help="comma-separated"
    )
    parser.add_argument(
        "--moe-dtypes", default="float32", help="comma-separated: float32,bfloat16 (MoE only)"
    )
    parser.add_argument(
        "--runs", type=int, default=None, help="timed runs per size (default: 200, 60, 30)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)"
    )
    parser.add_argument(
        "--entry",
        choices=("evaluator", "execute"),
        default="evaluator",
        help="time HostIrEvaluator.run (default) or FusionDefinition.execute as ours",
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="ranks to start when no launcher started this"
    )
    args = parser.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.blocks = [b for b in args.blocks.split(",") if b]
    args.moe_dtypes = [getattr(torch, t) for t in args.moe_dtypes.split(",") if t]
    for name, known in (("size", SIZES), ("block", BLOCKS)):
        for value in getattr(args, name + "s"):
            if value not in known:
                parser.error(f"unknown {name} {value!r}; known: {', '.join(known)}")
    if args.warmup < 1 or (args.runs is not None and args.runs < 3):
        parser.error("use at least 1 warm-up run and 3 timed runs")
    return args


def main(argv: list[str]) -> int:
    """Starts the ranks (without a launcher) or measures on this rank; rank 0 prints."""
    args = parse_args(argv)
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        from hostir.comm import launcher  # no launcher: start the ranks ourselves

        os.environ[overlap.SELF_LAUNCHED] = "1"  # for overlap.reproducing_command
        return launcher.launch(sys.argv[0], args.nproc, list(argv))
    torch.set_num_threads(args.threads)
    communicator = hostir.default_communicator()  # joins the gloo group
    rank, d = communicator.rank, communicator.world_size
    load = os.getloadavg()
    tp_rows, sp_rows, moe_rows = [], [], []
    for size in args.sizes:
        if "tensor-parallel" in args.blocks:
            tp_rows.append(measure_tensor_parallel(size, args, rank, d))
        if "sequence-parallel" in args.blocks:
            sp_rows.append(measure_sequence_parallel(size, args, rank, d))
        if "moe" in args.blocks:
            moe_rows += [moe_hand.measure_moe(size, args, rank, d, t) for t in args.moe_dtypes]
    if rank == 0:
        print("\n\n".join(filter(None, [tables(tp_rows, sp_rows), moe_hand.moe_table(moe_rows)])))
        print()
        print(f"command: {overlap.reproducing_command(argv, d)}")
        print(
            f"torch {torch.__version__}, backend {dist.get_backend()}, world size {d},"
            f" {args.threads} thread(s) per rank, {os.cpu_count()} CPU(s),"
            f" Python {platform.python_version()}, ours = {args.entry}, float32,"
            f" load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
        )
    dist.barrier()
    # hostir ends its groups, then the default group it made, at exit (in that order);
    # destroying the default group here first sometimes aborted a rank at exit
    # ("terminate called without an active exception") after --entry execute.
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
