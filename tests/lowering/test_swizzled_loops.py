"""Swizzled stream loops and the communication inside them.

``swizzle1d(a, mesh_p)`` makes iteration ``j`` handle chunk ``(j + r) % S``, ``r`` the
rank's ``mesh_p`` coordinate: ranks that differ on ``mesh_p`` hold different chunks in
the same iteration. A collective over a team spanning ``mesh_p`` (other than the loop's
own CollectivePermute) would mix chunks: the lowering refuses it by name (fuzz seed 6025
at 8 ranks computed wrong sums). Lowering is the same on every rank, so the refusals are
checked in one process.
"""

from __future__ import annotations

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from lowering import LoweringError
from tests.lowering.test_fuzz_regressions import run_against_torch

X, Y, STREAM = ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.stream


def _shard(tv, mesh: DeviceMesh, dim: int, parallel_type: ParallelType) -> None:
    tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


def _swizzle_rows(tv, mesh: DeviceMesh, parallel_type: ParallelType) -> None:
    """Dim 0 of ``tv`` in one stream chunk per device of ``parallel_type``, swizzled."""
    tv.outer_split(0, mesh.axis_size(parallel_type))
    tv.swizzle1d(0, parallel_type)
    tv.axis(0).parallelize(STREAM)


def _partial_sum(mesh: DeviceMesh, p: ParallelType, scatter: bool) -> FusionDefinition:
    """``sum(set(x), [last])`` with the summed dim sharded over ``p`` and the set's rows
    swizzled over ``p``: each chunk's partial sums need an Allreduce over ``p`` (a
    ReduceScatter with ``scatter``, the result's dim 1 sharded over ``p``)."""
    shape = (8, 8, 8) if scatter else (8, 8)
    last = len(shape) - 1
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape)
        a = fd.ops.set(x)
        r = fd.ops.sum(a, [last])
        fd.add_output(r)
    _shard(x, mesh, last, p)
    _shard(a, mesh, last, p)
    _swizzle_rows(a, mesh, p)
    if scatter:
        _shard(r, mesh, 1, p)
    return fd


def _gather(mesh: DeviceMesh, p: ParallelType) -> FusionDefinition:
    """``set(set(x))``: the second set gathers dim 1 (sharded over ``p``), chunk by chunk
    of rows swizzled over ``p``: an Allgather over ``p`` per chunk."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 8))
        a = fd.ops.set(x)
        b = fd.ops.set(a)
        fd.add_output(b)
    _shard(x, mesh, 1, p)
    _shard(a, mesh, 1, p)
    _swizzle_rows(a, mesh, p)
    b.set_device_mesh(mesh)
    return fd


MESHES = {
    "2x2-mesh_y": (DeviceMesh(torch.arange(4).reshape(2, 2)), Y),
    "2x2-mesh_x": (DeviceMesh(torch.arange(4).reshape(2, 2)), X),
    "1d-mesh_x": (DeviceMesh(torch.arange(4)), X),
}
PATTERNS = {
    "Allreduce": lambda mesh, p: _partial_sum(mesh, p, scatter=False),
    "ReduceScatter": lambda mesh, p: _partial_sum(mesh, p, scatter=True),
    "Allgather": _gather,
}


@pytest.mark.parametrize("where", MESHES)
@pytest.mark.parametrize("collective", PATTERNS)
def test_a_collective_over_the_swizzled_axis_is_refused(collective, where):
    """Inside a loop swizzled over ``p``, a collective over ``p`` would mix the chunks
    its members hold (each a different one): refused, naming the tensors, the collective,
    its team and the swizzle."""
    mesh, p = MESHES[where]
    fd = PATTERNS[collective](mesh, p)
    axis = p.value  # mesh_x or mesh_y
    with pytest.raises(
        LoweringError,
        match=rf"needs {collective} over the team of {axis} of mesh .* swizzle1d over {axis}"
        rf" on T1 rotates .* drop swizzle1d from T1",
    ):
        fd.host_ir()


def test_seed_6025_allreduce_of_partial_sums_in_a_swizzled_loop_is_refused():
    """Fuzz seed 6025 at 8 ranks (shrunk): t2 = set(t0) swizzled over mesh_y, matmul with
    t1 sharded over mesh_y, then a sum over that dim: the loop's Allreduce over M0(y)
    summed chunk (j + 0) % 2 of one rank with chunk (j + 1) % 2 of the other."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((8, 8, 8))
        t1 = fd.define_tensor((8, 8))
        t2 = fd.ops.set(t0)
        t3 = fd.ops.matmul(t2, t1)
        fd.add_output(fd.ops.sum(t3, [2], keepdim=False))
    mesh = DeviceMesh(torch.tensor([[7, 4], [3, 1]]))
    _shard(t1, mesh, 1, Y)
    _shard(t2, mesh, 0, X)
    t2.outer_split(2, 2)
    t2.swizzle1d(2, Y)
    t2.axis(2).parallelize(STREAM)
    with pytest.raises(
        LoweringError, match=r"T4 = set\(T5\) needs Allreduce over the team of mesh_y .* on T2"
    ):
        fd.host_ir()


def _broadcast_beside_a_swizzled_chunk(mesh: DeviceMesh, p: ParallelType, q: ParallelType):
    """``g = set(x)`` gathers dim 0 (over ``p``) swizzled; ``u = set(z)`` gathers dim 0
    over ``q`` without a swizzle (a Broadcast per chunk) in one loop with ``u + g``, which
    reads ``g`` by its swizzled chunks."""
    with FusionDefinition() as fd:
        x, z = fd.define_tensor((4, 4)), fd.define_tensor((4, 4))
        g = fd.ops.set(x)
        u = fd.ops.set(z)
        fd.add_output(g)
        fd.add_output(fd.ops.add(u, g))
    _shard(x, mesh, 0, p)
    _shard(z, mesh, 0, q)
    g.set_device_mesh(mesh)
    _swizzle_rows(g, mesh, p)
    u.set_device_mesh(mesh)
    u.outer_split(0, mesh.axis_size(q))
    u.axis(0).parallelize(STREAM)
    return fd, (x, z), (g, u)


@pytest.mark.world_sizes(2)
def test_a_broadcast_after_a_swizzled_loop_is_not_rotated(multidevice_test):
    """``g``'s swizzled loop writes ``g`` whole (chunk (j + r) % 2 at its place), so the
    loop of ``u`` and ``u + g`` is not rotated by it: the Broadcast's root is j and ``g``
    is read by chunk j. Before issue 34 the loop took ``g``'s swizzle from its input and
    refused the Broadcast as if it sat in the swizzled loop."""
    fd, _, _ = _broadcast_beside_a_swizzled_chunk(DeviceMesh(torch.arange(2)), X, X)
    generator = torch.Generator().manual_seed(6024)
    x, z = torch.randn(4, 4, generator=generator), torch.randn(4, 4, generator=generator)
    run_against_torch(fd, multidevice_test, [x, z], [x, z + x])
    text = str(fd.host_ir())
    assert "Broadcast(T1, team=M0(x), root=j2)" in text
    assert "shard_by_stream(T2, axis=0, index=j2)" in text


@pytest.mark.world_sizes(4)
def test_a_broadcast_in_a_loop_swizzled_over_another_axis(multidevice_test):
    """``u`` gathers over mesh_y in a loop after ``g``'s, which its swizzle over mesh_x
    rotates: ``g`` is written whole there, so ``u``'s loop reads it by chunk j and the
    Broadcast's root is j. (When ``g``'s swizzle rotated this loop too, the root had to be
    the rotated chunk: it was j, and ranks with x = 1 put block j where block j + 1
    belongs.)"""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    fd, _, _ = _broadcast_beside_a_swizzled_chunk(mesh, X, Y)
    generator = torch.Generator().manual_seed(6025)
    x, z = torch.randn(4, 4, generator=generator), torch.randn(4, 4, generator=generator)
    run_against_torch(fd, multidevice_test, [x, z], [x, z + x])
    assert "Broadcast(T1, team=M0(y), root=j2)" in str(fd.host_ir())
