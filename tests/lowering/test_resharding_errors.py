"""Fusions whose schedule needs communication are refused with a clear error."""

from __future__ import annotations

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir import HostIrError
from lowering import LoweringError, ReshardingError


def _gather_fusion(mesh: DeviceMesh) -> FusionDefinition:
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 8))
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(mesh)
    x.outer_split(0, 2)
    x.axis(0).parallelize(ParallelType.mesh_x)
    y.set_device_mesh(mesh)  # replicated: would need an all-gather
    return fd


def test_gather_needs_communication_and_names_both_shardings():
    """Sharded -> replicated is a resharding: the error names both tensors and shardings."""
    fd = _gather_fusion(DeviceMesh([0, 1]))
    with pytest.raises(ReshardingError) as info:
        fd.host_ir()
    message = str(info.value)
    assert isinstance(info.value, HostIrError)
    assert "T1 = set(T0)" in message
    assert "T0 @M0 {0: [x, 2]}" in message and "T1 @M0 on [0, 1]" in message


def test_row_parallel_linear_needs_a_reduction():
    """A contraction over a sharded axis makes partial sums, which need an Allreduce."""
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor((3, 8))
        w = fd.define_tensor((5, 8))
        fd.add_output(fd.ops.linear(x, w))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, 2)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    with pytest.raises(ReshardingError, match="T2 would hold partial sums"):
        fd.host_ir()


def test_different_meshes_need_communication():
    """Producer and consumer on different meshes (a pipeline stage boundary)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4,))
        y = fd.ops.neg(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh([0]))
    y.set_device_mesh(DeviceMesh([1]))
    with pytest.raises(ReshardingError, match="T0 and T1 live on different meshes"):
        fd.host_ir()


def test_mesh_on_some_tensors_only_cannot_propagate():
    """Two disconnected tensors, one with a mesh: propagation cannot reach the other."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((4,))
        b = fd.define_tensor((4,))
        fd.add_output(fd.ops.neg(a))
        fd.add_output(fd.ops.relu(b))
    a.set_device_mesh(DeviceMesh([0]))
    with pytest.raises(LoweringError, match="T1, T3 have no device mesh"):
        fd.host_ir()


def test_sharded_and_replicated_operands_are_refused_for_now():
    """add(sharded, replicated) needs a local slice of the replicated operand (not yet)."""
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        a = fd.define_tensor((4,))
        b = fd.define_tensor((4,))
        fd.add_output(fd.ops.add(a, b))
    a.set_device_mesh(mesh)
    a.outer_split(0, 2)
    a.axis(0).parallelize(ParallelType.mesh_x)
    b.set_device_mesh(mesh)
    with pytest.raises(ReshardingError, match="axis 0 of T1 and axis 0 of T2"):
        fd.execute([torch.randn(2), torch.randn(4)])


def test_stream_axes_are_refused_until_stream_lowering_exists():
    """A stream-parallel axis is not silently run serially: lowering says so."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 8))
        y = fd.ops.relu(x)
        fd.add_output(y)
    y.outer_split(0, 2)
    y.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(LoweringError, match="T1 axis .* is parallelized over streams"):
        fd.execute([torch.randn(4, 8)])


def test_symbolic_extents_that_disagree_at_run_time():
    """add(a[i0, 6], b[i1, 6]) assumes i0 == i1; other sizes fail instead of broadcasting."""
    from hostir import EvaluationError

    with FusionDefinition() as fd:
        a = fd.define_tensor((-1, 6))
        b = fd.define_tensor((-1, 6))
        fd.add_output(fd.ops.add(a, b))
    with pytest.raises(EvaluationError, match=r"T2 is declared with local shape \[1, 6\]"):
        fd.execute([torch.ones(1, 6), torch.ones(4, 6)])


def test_swizzle_over_a_missing_mesh_axis():
    """swizzle1d over mesh_y of a 1-d mesh is a mesh error naming the mesh."""
    from frontend import MeshError

    with FusionDefinition() as fd:
        x = fd.define_tensor((2, 8))
        fd.add_output(fd.ops.set(x))
    x.set_device_mesh(DeviceMesh([0]))
    x.swizzle1d(0, ParallelType.mesh_y)
    with pytest.raises(MeshError, match=r"DeviceMesh\(\[0\]\) is 1-d and has no axis mesh_y"):
        fd.execute([torch.randn(2, 8)])
