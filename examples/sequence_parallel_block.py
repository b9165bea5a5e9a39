"""The transformer block of ``tensor_parallel_block.py`` made sequence-parallel, its
communication in pipelined stream loops (Megatron's sequence parallelism, nvFuser's
``parallelism="sequence_parallel"`` of tests/python/multidevice/test_transformer.py with
the overlap of its test_overlap.py):

    x1  = x + proj(attention(qkv(layernorm0(x))))
    out = x1 + linear1(tanh_gelu(linear0(layernorm1(x1))))

The activations ``x``, ``x1`` and ``out`` are sharded over their sequence dim, so the
layernorms and residuals run on each rank's tokens. Each column-parallel linear (QKV,
MLP0) reads the whole sequence: an **Allgather loop** gathers it chunk by chunk (a
``set`` into a tensor whose sequence dim is split into ``gather_chunks`` stream chunks),
each iteration receiving one chunk, one Broadcast from its owner (``gather_chunks`` a
multiple or divisor of the rank count: a slice of one rank's tokens, or several ranks'
tokens), or with ``swizzle1d`` one CollectivePermute from a ring neighbour, while the
previous chunk's linear runs. The loop ends before attention, which needs the sequence
whole. Each row-parallel linear (the out-projection, MLP1) computes partial sums that
a **ReduceScatter loop** reduces back to sequence shards chunk by chunk (its output's
sequence dim split ``[x, stream]`` into ``scatter_chunks`` chunks of each rank's
tokens), each chunk's ReduceScatter under the next chunk's linear, and the bias,
residual and the next layernorm run on each reduced chunk in the same loop. Run on 4
local CPU ranks with::

    hostir run examples/sequence_parallel_block.py --nproc 4

(1, 2, 4 or 8 ranks: the rank count must divide the 8 heads.) Rank 0 prints the host IR
program; every rank runs the block in float32 with ``swizzle1d`` and in bf16 without,
then, at the tensor-parallel example's sizes, the block saving what its backward reads and
the backward of ``tensor_parallel_block_backward.py`` scheduled sequence-parallel (4
Allgathers, 2 ReduceScatters and 6 Allreduces of the replicated weights' gradients),
checks every gradient's shard against torch autograd, and checks its shard of the output
against
the single-device torch reference of ``tensor_parallel_block.py`` and that every
Allgather and ReduceScatter sits inside a pipelined loop (on one rank, that none is
issued: each team has one device, so every chunk is a local copy), and the script exits
non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import tensor_parallel_block as tp
import tensor_parallel_block_backward as tpb
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

BATCH, SEQUENCE, EMBEDDING, HEADS = 2, 64, 32, 8
"""A longer sequence and more heads than the tensor-parallel example's, so that 8 ranks
hold a head each and their shards of the sequence still split into 8 chunks (tests lower
it at 8 ranks with 2, 4 and 8 chunks)."""
GATHER_CHUNKS, SCATTER_CHUNKS = None, 2
"""The chunk counts of the run: Allgather loops in one chunk per rank (None), ReduceScatter
loops in 2 chunks of each rank's tokens."""
SEQUENCE_SHARDED = {"x": 1}
"""Inputs sharded otherwise than in :data:`tensor_parallel_block.INPUTS`: ``x`` over its
sequence dim; the weights and biases are sharded as there."""


def inputs(
    sequence: int = SEQUENCE, embedding: int = EMBEDDING
) -> list[tuple[str, tuple[int, ...], int | None]]:
    """The block's inputs (name, shape, sharded dim) for ``sequence`` tokens of
    ``embedding`` features: ``tensor_parallel_block.input_specs``, ``x`` sequence-sharded."""
    return [
        (name, shape, SEQUENCE_SHARDED.get(name, dim))
        for name, shape, dim in tp.input_specs(BATCH, sequence, embedding)
    ]


def define(
    d: int,
    dtype: torch.dtype = torch.float32,
    *,
    gather_chunks: int | None = GATHER_CHUNKS,
    scatter_chunks: int = SCATTER_CHUNKS,
    swizzle: bool = False,
    sequence: int = SEQUENCE,
    embedding: int = EMBEDDING,
    heads: int = HEADS,
    loops: bool = True,
    saved: bool = False,
) -> tuple[FusionDefinition, list]:
    """The block in ``dtype`` over a 1-d mesh of ``d`` devices, its gathers in stream loops
    of ``gather_chunks`` chunks (None: ``d``; with ``swizzle``, rotated by ``swizzle1d``,
    which takes ``d`` only) and its reduce-scatters in loops of ``scatter_chunks`` chunks
    of each rank's tokens, for ``sequence`` tokens of ``embedding`` features; returns the
    fusion and its inputs' tensors, in :func:`inputs`' order. Without ``loops`` the same
    block has no stream loops: one Allgather and one ReduceScatter each (what
    benchmarks/layers.py compares the loops with). With ``saved`` it also outputs what the
    backward reads, as ``tensor_parallel_block.define`` does (its ``SAVED``, in order;
    ``x1`` and the layernorms' means and rstds sequence-sharded)."""
    b, s, e, h = BATCH, sequence, embedding, heads
    dt = DataType.from_torch(dtype)
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        specs = inputs(sequence, embedding)
        tvs = [fd.define_tensor(shape, dtype=dt) for _, shape, _ in specs]
        x, ln0_w, ln0_b, qkv_w, qkv_b, proj_w, proj_b = tvs[:7]
        ln1_w, ln1_b, mlp0_w, mlp0_b, mlp1_w, mlp1_b = tvs[7:]
        x_float = tp._cast(fd, x, DataType.Float)
        normed, ln0_mean, ln0_rstd = tp._layernorm(fd, x_float, ln0_w, ln0_b, [b, s, e])
        normed = tp._cast(fd, normed, dt)
        gathered0 = fd.ops.set(normed)  # the Allgather loop's chunks
        qkv = fd.ops.linear(gathered0, qkv_w, qkv_b)  # [b, s, 3e], 3e sharded
        heads = fd.ops.reshape(qkv, [b, s, h, 3 * e // h])
        q, k, v = (
            fd.ops.permute(
                fd.ops.slice(heads, [0, 0, 0, i * e // h], [b, s, h, (i + 1) * e // h]),
                [0, 2, 1, 3],
            )
            for i in range(3)
        )  # [b, h, s, e/h]: the loop ends here, attention reads them whole
        causal = fd.define_scalar(True, dtype=DataType.Bool)
        sdpa, logsumexp, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=causal)
        attention = fd.ops.reshape(fd.ops.permute(sdpa, [0, 2, 1, 3]), [b, s, e])
        projected = fd.ops.linear(attention, proj_w)  # the ReduceScatter loop's sums
        x1 = fd.ops.add(x_float, tp._cast(fd, fd.ops.add(projected, proj_b), DataType.Float))
        normed, ln1_mean, ln1_rstd = tp._layernorm(fd, x1, ln1_w, ln1_b, [b, s, e])
        gathered1 = fd.ops.set(tp._cast(fd, normed, dt))
        linear0 = fd.ops.linear(gathered1, mlp0_w, mlp0_b)  # [b, s, 4e], 4e sharded
        hidden = tp._cast(fd, fd.ops.gelu(tp._cast(fd, linear0, DataType.Float), "tanh"), dt)
        mlp = fd.ops.linear(hidden, mlp1_w)
        out = fd.ops.add(x1, tp._cast(fd, fd.ops.add(mlp, mlp1_b), DataType.Float))
        fd.add_output(tp._cast(fd, out, dt))
        if saved:
            tp.add_saved(
                fd,
                {
                    "ln0_mean": ln0_mean,
                    "ln0_rstd": ln0_rstd,
                    "qkv": qkv,
                    "attention": sdpa,
                    "logsumexp": logsumexp,
                    "philox_seed": seed,
                    "philox_offset": offset,
                    "x1": x1,
                    "ln1_mean": ln1_mean,
                    "ln1_rstd": ln1_rstd,
                    "linear0": linear0,
                },
            )
    tp.shard_inputs(tvs, [dim for _, _, dim in specs], mesh)
    for gathered in (gathered0, gathered1):
        gathered.set_device_mesh(mesh)
        if not loops:
            continue  # replicated: one Allgather
        gathered.outer_split(1, d if gather_chunks is None else gather_chunks)
        if swizzle:
            gathered.swizzle1d(1, ParallelType.mesh_x)
        gathered.axis(1).parallelize(ParallelType.stream)
    for summed in (projected, mlp):  # sequence [x, stream, tokens / (d chunks)]
        summed.set_device_mesh(mesh)
        summed.outer_split(1, d)
        summed.axis(1).parallelize(ParallelType.mesh_x)
        if not loops:
            continue  # one ReduceScatter
        summed.outer_split(2, scatter_chunks)
        summed.axis(2).parallelize(ParallelType.stream)
    return fd, tvs


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def random_inputs(
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    sequence: int = SEQUENCE,
    embedding: int = EMBEDDING,
) -> list[torch.Tensor]:
    """Full inputs as ``tensor_parallel_block.random_inputs`` makes them, at these sizes."""
    return tp.random_inputs(dtype, seed, tp.input_specs(BATCH, sequence, embedding))


def reference(full: list[torch.Tensor]) -> torch.Tensor:
    """``tensor_parallel_block.reference`` with this block's heads: the block on one
    device with torch's ops."""
    return tp.reference(full, heads=HEADS)


COLLECTIVES = ("Allgather", "Broadcast", "CollectivePermute", "ReduceScatter")
"""What the block's loops issue: three kinds of gather, then the scatter."""


def communication_in_loops(program: str, devices: int) -> bool:
    """Whether every Allgather, Broadcast, CollectivePermute and ReduceScatter of the
    program's text sits in a pipelined loop, and at least one of each direction does;
    on one device (``devices == 1``), whether the program issues no collective at all
    (each team has one device: every chunk is a local copy, docs/communication.md)."""
    if devices == 1:
        lines = [line.strip() for line in program.splitlines()]
        issued = [f"= {kind}(" for kind in (*COLLECTIVES, "Allreduce")]
        return not any(line.startswith("wait ") or any(i in line for i in issued) for line in lines)
    loops, pipelined, gathers, scatters = 0, set(), 0, 0
    for line in program.splitlines():
        text = line.strip()
        if text.startswith("for j"):
            loops += 1
        elif text.startswith("pipeline_stage("):
            pipelined.add(loops)
        communicates = any(f"= {kind}(" in text for kind in COLLECTIVES[:3])
        scatters += "= ReduceScatter(" in text
        gathers += communicates
        if (
            (communicates or "= ReduceScatter(" in text)
            and line.startswith("  ")
            and not line.startswith("    ")
        ):
            return False  # at the top level of the program: outside every loop
    return gathers > 0 and scatters > 0 and bool(pipelined)


BACKWARD_COLLECTIVES = {"Allgather": 4, "ReduceScatter": 2, "Allreduce": 6}
"""The sequence-parallel backward's collectives at more than one rank: the output's and
the first residual's gradients gathered for the row-parallel linears' backward, and the
layernorms' inputs for the column-parallel weight gradients (4 Allgathers); the column-
parallel input gradients, partial over the features, reduce-scattered back to sequence
shards (2); the gradients of the 6 replicated weights and biases (layernorms, projection
and MLP1 biases), each summed over the rank's tokens, Allreduced (6)."""


def saving_forward(d: int, dtype: torch.dtype = torch.float32) -> tuple[FusionDefinition, list]:
    """The block in stream loops at the tensor-parallel example's sizes (the backward's),
    with the tensors the backward reads among its outputs."""
    return define(d, dtype, sequence=tp.SEQUENCE, heads=tp.HEADS, saved=True)


def run_backward(dtype: torch.dtype) -> bool:
    """Runs :func:`saving_forward` and then the block's backward scheduled sequence-parallel
    (``tensor_parallel_block_backward.define_backward(sequence_parallel=True)``) on this
    rank, checks every gradient's shard against autograd and prints one line; returns
    whether all matched and the backward had :data:`BACKWARD_COLLECTIVES`."""
    world = default_communicator()
    d, rank = world.world_size, world.rank
    grads, expected, backward = tpb.run_both(d, rank, dtype, forward_define=saving_forward)
    text = str(backward.host_ir())
    counts = {kind: text.count(f" = {kind}(") for kind in BACKWARD_COLLECTIVES}
    ok = not tpb.mismatches(grads, expected, dtype) and counts == (
        BACKWARD_COLLECTIVES if d > 1 else dict.fromkeys(counts, 0)
    )
    print(
        f"rank {rank}/{d}: {str(dtype).removeprefix('torch.')} backward, {len(grads)}"
        f" gradients, {counts}, {'OK' if ok else 'MISMATCH'}\n",
        end="",
        flush=True,
    )
    return ok


def run(dtype: torch.dtype, swizzle: bool) -> bool:
    """Runs the block on this rank in ``dtype``, checks it and prints one line; returns
    whether the output matched and the communication sat in pipelined loops."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    full = random_inputs(dtype)
    fd, tvs = define(d, dtype, swizzle=swizzle)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, tvs, strict=True)])
    program = str(fd.host_ir())
    if rank == 0 and dtype == torch.float32:
        print(program)
    expected = shard_tensor(reference(full), fd.host_ir().outputs[0], rank)
    error = (y.float() - expected.float()).abs().max().item()
    close = y.dtype == dtype and torch.allclose(
        y.float(), expected.float(), **tp.tolerance(expected)
    )
    ok = close and communication_in_loops(program, d)
    print(
        f"rank {rank}/{d}: {str(dtype).removeprefix('torch.')}"
        f"{' swizzled' if swizzle else ''} output shard {tuple(y.shape)},"
        f" {program.count('for j') // 2} stream loops, max error {error:.2e},"
        f" {'OK' if ok else 'MISMATCH'}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return ok


def main() -> int:
    """Runs the example in float32 with ``swizzle1d`` and in bf16 without, then the
    backward in both dtypes, on this rank; returns the exit status."""
    # float32 swizzled and bf16 not: the other two runs of the test file at 1, 2, 4 ranks
    results = [run(torch.float32, True), run(torch.bfloat16, False)]
    results += [run_backward(dtype) for dtype in (torch.float32, torch.bfloat16)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
