"""Column-parallel first layer of an MLP on every rank: ``relu(x @ w.T + b)``.

The weight and bias are sharded over their output features, the activations
are replicated, so every rank computes its own slice of the hidden layer with
no communication. Run it on 4 local CPU ranks with::

    hostir run examples/column_parallel_mlp.py --nproc 4

or under ``torchrun --nproc-per-node 4 examples/column_parallel_mlp.py``. Rank 0
prints the host IR program; every rank checks its shard against the same slice
of a single-device torch reference and the script exits non-zero on mismatch.
"""

from __future__ import annotations

import sys

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import default_communicator

HIDDEN, FFN, TOKENS = 16, 32, 8


def define(d: int) -> tuple[FusionDefinition, list]:
    """The fusion, scheduled over a 1-d mesh of ``d`` devices."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))  # tokens: symbolic
        w = fd.define_tensor((FFN, HIDDEN))
        b = fd.define_tensor((FFN,))
        h = fd.ops.relu(fd.ops.linear(x, w, b))
        fd.add_output(h)
    x.set_device_mesh(mesh)  # replicated on every device
    for tv in (w, b):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)  # [FFN, ...] -> [d, FFN/d, ...]
        tv.axis(0).parallelize(ParallelType.mesh_x)
    return fd, [x, w, b]


def fusion(world_size: int = 4) -> FusionDefinition:
    """What ``hostir dump``, ``viz`` and ``traffic`` lower (docs/cli.md): the scheduled
    fusion for ``world_size`` ranks, not run; 4 by default, as in the run above."""
    return define(world_size)[0]


def main() -> int:
    """Runs the example on this rank; returns the exit status."""
    # Joins the launcher's process group (gloo on CPU) or is a world of one.
    world = default_communicator()
    d, rank = world.world_size, world.rank
    torch.manual_seed(0)  # the same full tensors on every rank
    x_full, w_full, b_full = torch.randn(TOKENS, HIDDEN), torch.randn(FFN, HIDDEN), torch.randn(FFN)
    fd, (x, w, b) = define(d)
    (h_local,) = fd.execute([x_full, shard_tensor(w_full, w), shard_tensor(b_full, b)])
    if rank == 0:
        print(fd.host_ir())
    expected = shard_tensor(torch.relu(x_full @ w_full.T + b_full), fd.host_ir().outputs[0], rank)
    error = (h_local - expected).abs().max().item()
    ok = torch.allclose(h_local, expected, rtol=1e-5, atol=1e-5)
    print(
        f"rank {rank}/{d}: local output {tuple(h_local.shape)}, max error {error:.2e},"
        f" {'OK' if ok else 'MISMATCH'}\n",
        end="",  # one write: ranks share the terminal or pipe, lines must not interleave
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
