"""A column-parallel linear fed by a swizzled stream all-gather, for the ``hostir`` CLI tests.

``fusion(world_size)`` follows the SCRIPT convention of docs/cli.md, so
``hostir dump``/``viz`` can lower it without running it. Run as a script
(``hostir run tests/data/cli_column_parallel.py --nproc 2``) it executes the
fusion on every rank, checks the result, and prints one ``rank R/N: OK`` line
per rank; it does not print the program (``HOSTIR_DUMP=host_ir`` does).
"""

from __future__ import annotations

import sys

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor

HIDDEN, FFN, TOKENS = 8, 16, 4


def fusion(world_size: int) -> FusionDefinition:
    """The scheduled fusion for a 1-d mesh of ``world_size`` devices: what ``hostir dump``
    and ``hostir viz`` lower."""
    return define(world_size)[0]


def define(d: int) -> tuple[FusionDefinition, list]:
    """``x @ w.T + b`` with ``w`` and ``b`` sharded over output features and ``x`` over
    tokens, gathered chunk by chunk with one CollectivePermute per stream iteration;
    also returns the input tensors, for ``shard_tensor``."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        w = fd.define_tensor((FFN, HIDDEN))
        b = fd.define_tensor((FFN,))
        gathered = fd.ops.set(x)
        fd.add_output(fd.ops.linear(gathered, w, b))
    for tv in (x, w, b):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, d)
    gathered.swizzle1d(0, ParallelType.mesh_x)
    gathered.axis(0).parallelize(ParallelType.stream)
    return fd, [x, w, b]


def main() -> int:
    """Executes the fusion on this rank (a world of one without a launcher)."""
    from hostir import default_communicator

    world = default_communicator()
    d, rank = world.world_size, world.rank
    torch.manual_seed(0)
    x, w, b = torch.randn(TOKENS * d, HIDDEN), torch.randn(FFN, HIDDEN), torch.randn(FFN)
    fd, tvs = define(d)
    (y,) = fd.execute([shard_tensor(t, tv) for t, tv in zip((x, w, b), tvs, strict=True)])
    expected = shard_tensor(x @ w.T + b, fd.host_ir().outputs[0])
    ok = torch.allclose(y, expected, rtol=1e-4, atol=1e-4)
    # One write: the ranks share a pipe, and their lines must not interleave.
    print(f"rank {rank}/{d}: {'OK' if ok else 'MISMATCH'}\n", end="", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
