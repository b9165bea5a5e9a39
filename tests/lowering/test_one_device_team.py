"""On a one-device team no collective is issued (issue 34 item 1; docs/communication.md,
"From a fusion to collectives"): a resharding step or a stream loop's gather whose team
has one device is a local copy (``set``), checked by the profiler's events (no ``gloo:``
event, no ``hir::`` collective or wait) and against torch on random data."""

from __future__ import annotations

import pytest
import torch

import hostir
from frontend import DeviceMesh, FusionDefinition, ParallelType

ISSUED = tuple(f"hir::{kind.__name__}" for kind in hostir.COLLECTIVES) + ("hir::wait", "gloo:")


def _shard(tv, mesh: DeviceMesh, dim: int, parallel_type=ParallelType.mesh_x) -> None:
    if tv.device_mesh is None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


def _events(fd: FusionDefinition, inputs: list) -> tuple[list, list[str]]:
    """Runs ``fd`` once to warm up, then under the profiler: (outputs, event names)."""
    fd.execute(inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        outputs = fd.execute(inputs)
    return outputs, [event.name for event in prof.events()]


def _partial_sum_and_gather(mesh: DeviceMesh, d: int) -> tuple[FusionDefinition, list]:
    """``sum(x, [1])`` of ``x`` sharded on dim 1 (partial sums), replicated; and
    ``relu(x)`` replicated (a gather after it)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6 * d))
        total = fd.ops.sum(x, [1])
        relu = fd.ops.relu(x)
        fd.add_output(total)
        fd.add_output(relu)
    _shard(x, mesh, 1)
    for out in (total, relu):
        out.set_device_mesh(mesh)
    return fd, [x]


def _stream_gather(mesh: DeviceMesh, d: int, chunks: int, swizzle: bool):
    """SPEC section 3's all-gather feeding a column-parallel linear, in ``chunks`` stream
    chunks; (the fusion, its inputs)."""
    with FusionDefinition() as fd:
        inp = fd.define_tensor((8 * d, 8))
        w = fd.define_tensor((4 * d, 8))
        gathered = fd.ops.set(inp)
        fd.add_output(fd.ops.linear(gathered, w))
    _shard(inp, mesh, 0)
    _shard(w, mesh, 0)
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, chunks)
    if swizzle:
        gathered.swizzle1d(0, ParallelType.mesh_x)
    gathered.axis(0).parallelize(ParallelType.stream)
    return fd, [inp, w]


@pytest.mark.world_sizes(1)
def test_one_rank_issues_no_collective(multidevice_test) -> None:
    """A partial sum, a gather and a stream loop's gather (in 4 chunks, each a Broadcast
    of a slice; swizzled, in 1 chunk, a CollectivePermute) at world size 1: every step a
    copy, the values torch's."""
    mesh = DeviceMesh(torch.arange(1))
    generator = torch.Generator().manual_seed(34)
    x = torch.randn(4, 6, generator=generator)
    fd, _ = _partial_sum_and_gather(mesh, 1)
    (total, relu), names = _events(fd, [x])
    torch.testing.assert_close(total, x.sum(1))
    torch.testing.assert_close(relu, torch.relu(x))
    assert not [n for n in names if n.startswith(ISSUED)], sorted(set(names))
    assert names.count("hir::set") == 2, sorted(set(names))
    for chunks, swizzle in ((4, False), (1, True)):
        fd, _ = _stream_gather(mesh, 1, chunks, swizzle)
        inp, w = torch.randn(8, 8, generator=generator), torch.randn(4, 8, generator=generator)
        (out,), names = _events(fd, [inp, w])
        torch.testing.assert_close(out, inp @ w.T)
        assert f"for j0 in range(0, {chunks})" in str(fd.host_ir())  # the loop is kept
        assert not [n for n in names if n.startswith(ISSUED)], sorted(set(names))
        assert names.count("hir::set") == chunks, sorted(set(names))
