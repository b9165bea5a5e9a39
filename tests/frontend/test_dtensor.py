"""DTensors given to ``fd.execute``: refused by name at every world size (it takes local
shards), the refusal saying what to pass instead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from frontend import DeviceMesh, FusionDefinition, InputError, ParallelType, shard_tensor


@contextlib.contextmanager
def default_group() -> Iterator[None]:
    """The default process group DTensor's meshes need: the pool's at world size > 1, a
    one-rank gloo group (destroyed on exit) in the pytest process at world size 1."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sharded_add(d: int) -> FusionDefinition:
    """x + y with x sharded on dim 0 over ``d`` ranks, y replicated."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        y = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.add(x, y))
    mesh = DeviceMesh(list(range(d)))
    for tv in (x, y):
        tv.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def test_execute_refuses_dtensors_by_name(multidevice_test) -> None:
    """At every world size (at 1 rank a DTensor used to run as DTensor's own ops and come
    back a DTensor; at 2 and 4 it failed on an extent), the first DTensor is named by
    position and fusion tensor, with its placements and mesh; local shards still run."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    d, rank = multidevice_test.size, multidevice_test.rank
    fd = _sharded_add(d)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * d, 3, generator=gen), torch.randn(2 * d, 3, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        dy = distribute_tensor(y, mesh, [Replicate()])
        with pytest.raises(InputError, match=r"input 0 \(T0\) is a DTensor") as error:
            fd.execute([dx, dy])
        for fragment in ["Shard(dim=0)", "DeviceMesh", "global shape [", "dt.to_local()"]:
            assert fragment in str(error.value), str(error.value)
        tvs = fd.fusion.inputs()
        inputs = [shard_tensor(t, tv, rank) for t, tv in zip((x, y), tvs, strict=True)]
        (out,) = fd.execute(inputs)  # the refusal left no rank waiting
        torch.testing.assert_close(out, shard_tensor(x + y, fd.host_ir().outputs[0], rank))
        # a known program (same local shapes at 1 rank) does not let a DTensor through
        with pytest.raises(InputError, match=r"input 1 \(T1\) is a DTensor.*Replicate"):
            fd.execute([inputs[0], dy])
