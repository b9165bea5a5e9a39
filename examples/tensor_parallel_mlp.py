"""A Megatron-style tensor-parallel MLP: ``relu(x @ w1.T + b1) @ w2.T + b2``.

The first linear is column-parallel (``w1``, ``b1`` sharded over their output
features), the second row-parallel (``w2`` sharded over its input features),
so each rank computes a partial result and one Allreduce sums them; the
second bias is added after it. Run on 4 local CPU ranks with::

    hostir run examples/tensor_parallel_mlp.py --nproc 4

Rank 0 prints the host IR program; every rank checks its output against a
single-device torch reference and the script exits non-zero on a mismatch.
"""

from __future__ import annotations

import sys

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

HIDDEN, FFN, TOKENS = 16, 64, 8


def ffn(d: int) -> int:
    """The hidden features on ``d`` devices: ``FFN``, or ``d`` where more devices than that
    share them (each holds at least one row of ``w1``; ``--simulate 1024`` runs need it)."""
    return max(FFN, d)


def unscheduled(features: int) -> tuple[FusionDefinition, list]:
    """The MLP with ``features`` hidden features, not yet scheduled; (fusion, its inputs
    x, w1, b1, w2, b2)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        w1 = fd.define_tensor((features, HIDDEN))
        b1 = fd.define_tensor((features,))
        w2 = fd.define_tensor((HIDDEN, features))
        b2 = fd.define_tensor((HIDDEN,))
        h = fd.ops.relu(fd.ops.linear(x, w1, b1))
        fd.add_output(fd.ops.linear(h, w2, b2))
    return fd, [x, w1, b1, w2, b2]


def define(d: int) -> tuple[FusionDefinition, list]:
    """The MLP, scheduled over a 1-d mesh of ``d`` devices."""
    mesh = DeviceMesh(torch.arange(d))
    fd, (x, w1, b1, w2, b2) = unscheduled(ffn(d))
    for tv in (x, b2):
        tv.set_device_mesh(mesh)  # replicated
    for tv, dim in ((w1, 0), (b1, 0), (w2, 1)):
        tv.set_device_mesh(mesh)
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)
    return fd, [x, w1, b1, w2, b2]


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def main() -> int:
    """Runs the example on this rank; returns the exit status."""
    world = default_communicator()  # joins the launcher's process group, if any
    d, rank = world.world_size, world.rank
    torch.manual_seed(0)  # the same full tensors on every rank
    features = ffn(d)
    shapes = [(TOKENS, HIDDEN), (features, HIDDEN), (features,), (HIDDEN, features), (HIDDEN,)]
    full = [torch.randn(shape) for shape in shapes]
    fd, tvs = define(d)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip(full, tvs, strict=True)])
    if rank == 0:
        print(fd.host_ir())
    x, w1, b1, w2, b2 = full
    expected = torch.relu(x @ w1.T + b1) @ w2.T + b2
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
