"""Schedules the lowering refuses, each with a clear error."""

from __future__ import annotations

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from lowering import LoweringError


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


def test_swizzle_without_a_stream_axis_is_refused():
    """swizzle1d reorders a stream loop; on a serial axis it is refused."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 8))
        y = fd.ops.relu(x)
        fd.add_output(y)
    y.set_device_mesh(DeviceMesh([0]))
    y.outer_split(0, 1)
    y.swizzle1d(0, ParallelType.mesh_x)
    with pytest.raises(LoweringError, match="is swizzled but not stream-parallel"):
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
