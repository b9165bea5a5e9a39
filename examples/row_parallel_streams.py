"""A row-parallel linear whose tokens are split into stream chunks: ``x @ w.T + b``.

``x`` and ``w`` are sharded over the contraction dim (the linear's input
features), so each rank computes partial sums that an Allreduce adds up; ``b``
is replicated and added after it. The tokens of ``x`` are split into
``STREAMS`` stream chunks and the output inherits the split, so the stream loop
runs, per chunk, the partial matmul, one Allreduce of that chunk and the bias
add, and the matmul of one chunk overlaps the Allreduce of the previous one.
See docs/streams.md. Run on 4 local CPU ranks with::

    hostir run examples/row_parallel_streams.py --nproc 4

Rank 0 prints the host IR program; every rank checks its output against a
single-device torch reference and the script exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

HIDDEN, FFN, TOKENS, STREAMS = 16, 32, 8, 4


def define(d: int) -> tuple[FusionDefinition, list]:
    """The linear, sharded over a 1-d mesh of ``d`` devices and split into stream chunks."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, FFN))  # tokens: symbolic
        w = fd.define_tensor((HIDDEN, FFN))
        b = fd.define_tensor((HIDDEN,))
        fd.add_output(fd.ops.linear(x, w, b))  # not scheduled: inherits
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)  # the contraction dim: row parallelism
        tv.axis(1).parallelize(ParallelType.mesh_x)
    b.set_device_mesh(mesh)  # replicated
    x.outer_split(0, STREAMS)  # loop [tokens, d, FFN/d] -> [STREAMS, tokens/STREAMS, d, FFN/d]
    x.axis(0).parallelize(ParallelType.stream)  # the output inherits the stream split
    return fd, [x, w, b]


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def main() -> int:
    """Runs the example on this rank; returns the exit status."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    torch.manual_seed(0)  # the same full tensors on every rank
    shapes = [(TOKENS, FFN), (HIDDEN, FFN), (HIDDEN,)]
    full = [torch.randn(shape) for shape in shapes]
    fd, tvs = define(d)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, tvs, strict=True)])
    if rank == 0:
        print(fd.host_ir())
    x, w, b = full
    expected = x @ w.T + b  # replicated: every rank holds all of it
    error = (y - expected).abs().max().item()
    ok = torch.allclose(y, expected, rtol=1e-4, atol=1e-4)
    print(
        f"rank {rank}/{d}: output {tuple(y.shape)} in {STREAMS} stream chunks,"
        f" max error {error:.2e}, {'OK' if ok else 'MISMATCH'}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
