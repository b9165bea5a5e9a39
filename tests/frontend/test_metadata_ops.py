"""nvFuser's metadata ops ``broadcast(arg, is_broadcast_dim)``, ``size(arg, dim)`` and
``shape(arg)``: against torch on random data, unsharded and with a sharded dim (which
moves with its dim, no communication), and refused by name when misused."""

from __future__ import annotations

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import HostIrError


@pytest.mark.world_sizes(1, 2, 4)
def test_broadcast_size_and_shape_keep_the_sharded_dim_local(multidevice_test) -> None:
    """``x`` [4, 2d] sharded on dim 1: broadcast to [1, 4, 2d], expanded to [3, 4, 2d]
    with a shape made of ``shape(x)`` and ``size(x, 1)``, scaled by ``size(x, 1)``: every
    rank computes its columns, nothing is communicated."""
    d, rank = multidevice_test.size, multidevice_test.rank
    x = torch.randn(4, 2 * d, generator=torch.Generator().manual_seed(31))
    with FusionDefinition() as fd:
        tv = fd.define_tensor((4, 2 * d))
        wide = fd.ops.broadcast(tv, [True, False, False])
        rows, columns = fd.ops.shape(tv)
        assert columns.value == fd.ops.size(tv, -1).value == 2 * d
        expanded = fd.ops.broadcast_in_dim(wide, [3, rows, fd.ops.size(tv, 1)], [0, 1, 2])
        out = fd.ops.mul(expanded, fd.ops.size(tv, 1))
        fd.add_output(out)
    mesh = DeviceMesh(torch.arange(d))
    for value, dim in ((tv, 1), (out, 2)):
        value.set_device_mesh(mesh)
        value.outer_split(dim, d)
        value.axis(dim).parallelize(ParallelType.mesh_x)
    (result,) = fd.execute([shard_tensor(x, tv, rank)])
    want = x[None].expand(3, 4, 2 * d) * (2 * d)
    torch.testing.assert_close(result, shard_tensor(want, out, rank))
    text = str(fd.host_ir())
    assert "broadcast_in_dim" in text and "Allgather" not in text, text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([True, False], r"keeps 1 dims, but T0 has 2: one False per dim"),
        ("TF", r"is_broadcast_dim must be a list of bools, got 'TF'"),
        ([True, 1, False], r"is_broadcast_dim\[1\] must be True or False, got 1"),
    ],
)
def test_a_bad_is_broadcast_dim_is_refused_by_name(flags, message) -> None:
    with pytest.raises(HostIrError, match=message):
        with FusionDefinition() as fd:
            x = fd.define_tensor((4, 6))
            fd.add_output(fd.ops.broadcast(x, flags))


def test_size_of_a_dim_out_of_range_is_refused_by_name() -> None:
    with pytest.raises(HostIrError, match=r"size: dim 2 is out of range for T0, which has 2"):
        with FusionDefinition() as fd:
            x = fd.define_tensor((4, 6))
            fd.ops.size(x, 2)
            fd.add_output(x)
