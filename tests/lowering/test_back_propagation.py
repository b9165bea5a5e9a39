"""Back-propagation of device splits (``lowering.propagate_sharding``, as nvFuser's
``PropagateShardingsPass``): an intermediate takes its consumer's split of a data axis it
leaves unsplit, unless the user scheduled it."""

from __future__ import annotations

import re

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor


def _collectives(text: str) -> list[str]:
    """The names of the collectives of host IR text, in order."""
    return re.findall(r"= ([A-Z]\w+)\(", text)


@pytest.mark.world_sizes(1, 2, 4)
@pytest.mark.parametrize("user_placed", [False, True], ids=["propagated", "user_placed"])
def test_a_row_parallel_linear_before_a_sequence_split_add(multidevice_test, user_placed):
    """Sequence parallelism's residual add: ``x + linear(h, w)`` with ``x`` split on the
    sequence and ``w`` on the contraction. The linear's result takes the sequence split
    from the add, so its partial sums are reduced by one ReduceScatter (nvFuser's
    transformer test expects that layout); placed on the mesh by the user without a split,
    it stays whole: one Allreduce."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(11)
    x, h, w = (
        torch.randn(*shape, generator=generator)
        for shape in ((4 * d, 8), (4 * d, 4 * d), (8, 4 * d))
    )
    with FusionDefinition() as fd:
        tx, th, tw = (
            fd.define_tensor((4 * d, 8)),
            fd.define_tensor((4 * d, 4 * d)),
            fd.define_tensor((8, 4 * d)),
        )
        projected = fd.ops.linear(th, tw)
        out = fd.ops.add(tx, projected)
        fd.add_output(out)
        fd.add_output(projected)
    for tv in (tx, th, tw):
        tv.set_device_mesh(mesh)
    for tv, dim in ((tx, 0), (th, 1), (tw, 1)):
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)
    if user_placed:
        projected.set_device_mesh(mesh)
    inputs = [shard_tensor(t, tv, rank) for t, tv in ((x, tx), (h, th), (w, tw))]
    got_out, got_projected = fd.execute(inputs)
    want_projected = torch.nn.functional.linear(h, w)
    rows = slice(4 * rank, 4 * rank + 4)  # propagated tensors: this rank's sequence rows
    torch.testing.assert_close(got_out, (x + want_projected)[rows])
    torch.testing.assert_close(
        got_projected, want_projected if user_placed else want_projected[rows]
    )
    if d > 1:
        expected = ["Allreduce"] if user_placed else ["ReduceScatter"]
        assert _collectives(str(fd.host_ir())) == expected
