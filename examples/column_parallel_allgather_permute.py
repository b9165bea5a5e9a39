"""A column-parallel linear fed by a stream-parallel all-gather, as a ring of permutes.

The activations ``x`` arrive sharded over their tokens; the linear ``x @ w.T +
b`` is column-parallel (``w`` and ``b`` sharded over their output features),
so it needs the whole ``x``. Instead of one Allgather before the matmul, the
gathered tensor is split into one stream chunk per rank and swizzled with
``swizzle1d``: iteration ``j`` of the stream loop on rank ``r`` computes with
chunk ``(r + j) % d`` while it arrives by one CollectivePermute (receive from
``(r + j) % d``, send to ``(r - j) % d``; iteration 0 is a local copy), so each
rank sends ``d - 1`` messages and the matmul of one chunk overlaps the transfer
of the next. See docs/streams.md. Run on 4 local CPU ranks with::

    hostir run examples/column_parallel_allgather_permute.py --nproc 4

Rank 0 prints the host IR program; every rank checks its output shard against
the same slice of a single-device torch reference and the script exits
non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

HIDDEN, FFN, TOKENS = 16, 32, 8


def define(d: int, swizzle: bool = True) -> tuple[FusionDefinition, list]:
    """The linear and its stream all-gather (swizzled unless ``swizzle`` is False), over a
    1-d mesh of ``d`` devices."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))  # tokens: symbolic
        w = fd.define_tensor((FFN, HIDDEN))
        b = fd.define_tensor((FFN,))
        gathered = fd.ops.set(x)  # the all-gather of x, one chunk per stream iteration
        fd.add_output(fd.ops.linear(gathered, w, b))  # not scheduled: inherits
    for tv in (x, w, b):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)  # x over tokens; w and b over output features
        tv.axis(0).parallelize(ParallelType.mesh_x)
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, d)  # [tokens] -> [d, tokens/d]: one chunk per rank
    if swizzle:
        gathered.swizzle1d(0, ParallelType.mesh_x)  # iteration j: chunk (j + r) % d
    gathered.axis(0).parallelize(ParallelType.stream)
    return fd, [x, w, b]


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def main(swizzle: bool = True) -> int:
    """Runs the example on this rank; returns the exit status."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    torch.manual_seed(0)  # the same full tensors on every rank
    shapes = [(TOKENS, HIDDEN), (FFN, HIDDEN), (FFN,)]
    full = [torch.randn(shape) for shape in shapes]
    fd, tvs = define(d, swizzle)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, tvs, strict=True)])
    if rank == 0:
        print(fd.host_ir())
    x, w, b = full
    expected = shard_tensor(x @ w.T + b, fd.host_ir().outputs[0])  # this rank's columns
    error = (y - expected).abs().max().item()
    ok = torch.allclose(y, expected, rtol=1e-4, atol=1e-4)
    print(
        f"rank {rank}/{d}: output {tuple(y.shape)}, max error {error:.2e},"
        f" {'OK' if ok else 'MISMATCH'}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
