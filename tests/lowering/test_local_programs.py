"""Multi-rank programs that need no communication, against a single-device reference.

Each test runs at world sizes 1, 2 and 4 (plain pytest starts the ranks; under
torchrun each process is a rank), shards random data with ``shard_tensor``,
executes, and compares this rank's output shard with the same shard of the
unsharded torch result. The host IR must contain only local instructions.
"""

from __future__ import annotations

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import HostIrContainer
from hostir.ir.instructions import COMPUTE, Allocate, Deallocate

LOCAL_INSTRUCTIONS = COMPUTE | {Allocate, Deallocate}


def _assert_local_only(program: HostIrContainer) -> None:
    """Every instruction is a compute, allocation or deallocation: no communication."""
    kinds = {type(instruction) for instruction in program.body}
    assert kinds <= LOCAL_INSTRUCTIONS, f"unexpected instructions {kinds - LOCAL_INSTRUCTIONS}"


def _shard_x(tv, mesh: DeviceMesh, axis: int, d: int) -> None:
    tv.set_device_mesh(mesh)
    tv.outer_split(axis, d)
    tv.axis(axis).parallelize(ParallelType.mesh_x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_parallel_linear(multidevice_test, dtype):
    """Weight and bias sharded on the output features: each rank computes its columns."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8), dtype=DataType.from_torch(dtype))
        w = fd.define_tensor((4 * d, 8), dtype=DataType.from_torch(dtype))
        b = fd.define_tensor((4 * d,), dtype=DataType.from_torch(dtype))
        y = fd.ops.linear(x, w, b)
        fd.add_output(y)
    x.set_device_mesh(mesh)
    _shard_x(w, mesh, 0, d)
    _shard_x(b, mesh, 0, d)
    torch.manual_seed(0)
    x_full, w_full, b_full = (torch.randn(s, dtype=dtype) for s in ((6, 8), (4 * d, 8), (4 * d,)))
    dev = multidevice_test.device
    (out,) = fd.execute(
        [
            x_full.to(dev),
            multidevice_test.shard_tensor(w_full, w),
            multidevice_test.shard_tensor(b_full, b),
        ]
    )
    expected = torch.nn.functional.linear(x_full, w_full, b_full)
    torch.testing.assert_close(out.cpu(), shard_tensor(expected, fd.host_ir().outputs[0], rank))
    program = fd.host_ir()
    _assert_local_only(program)
    assert "= linear(T0, T1, bias=T2)" in str(program)
    assert "{1: [x, 4]}" in str(program), "the output is propagated as sharded on its columns"


def test_reduction_over_unsharded_axis(multidevice_test):
    """Sum over dim 1 of a tensor sharded on dim 0 stays local."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    _shard_x(x, mesh, 0, d)
    torch.manual_seed(1)
    full = torch.randn(3 * d, 5)
    (out,) = fd.execute([multidevice_test.shard_tensor(full, x)])
    torch.testing.assert_close(out.cpu(), shard_tensor(full.sum(1), fd.host_ir().outputs[0], rank))
    _assert_local_only(fd.host_ir())
    assert "= sum(T0, dims=[1], keepdim=false)" in str(fd.host_ir())


def test_pointwise_on_identically_sharded_tensors(multidevice_test):
    """add/mul/relu/neg/cast on tensors sharded the same way, cyclic split included."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        a = fd.define_tensor((-1, 2 * d))
        b = fd.define_tensor((-1, 2 * d))
        out = fd.ops.cast(fd.ops.neg(fd.ops.relu(fd.ops.mul(fd.ops.add(a, b), 2.0))), DataType.Half)
        fd.add_output(out)
    for tv in (a, b):
        tv.set_device_mesh(mesh)
        tv.inner_split(1, d)  # cyclic: the inner part is distributed
        tv.axis(2).parallelize(ParallelType.mesh_x)
    torch.manual_seed(2)
    a_full, b_full = torch.randn(3, 2 * d), torch.randn(3, 2 * d)
    (result,) = fd.execute(
        [multidevice_test.shard_tensor(a_full, a), multidevice_test.shard_tensor(b_full, b)]
    )
    expected = (-torch.relu((a_full + b_full) * 2.0)).half()
    torch.testing.assert_close(result.cpu(), shard_tensor(expected, fd.host_ir().outputs[0], rank))
    _assert_local_only(fd.host_ir())


def test_data_and_tensor_parallel_mlp_on_2d_mesh(multidevice_test):
    """A (d/2, 2) mesh: batch over mesh_y, hidden features over mesh_x, no communication."""
    d, rank = multidevice_test.size, multidevice_test.rank
    dp, tp = (d // 2, 2) if d > 1 else (1, 1)
    mesh = DeviceMesh(torch.arange(d).reshape(dp, tp))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8))
        w = fd.define_tensor((4 * tp, 8))
        h = fd.ops.relu(fd.ops.linear(x, w))
        fd.add_output(h)
    x.set_device_mesh(mesh)
    x.outer_split(0, dp)
    x.axis(0).parallelize(ParallelType.mesh_y)
    w.set_device_mesh(mesh)
    w.outer_split(0, tp)
    w.axis(0).parallelize(ParallelType.mesh_x)
    h.set_device_mesh(mesh)
    h.outer_split(0, dp)
    h.axis(0).parallelize(ParallelType.mesh_y)
    h.outer_split(2, tp)
    h.axis(2).parallelize(ParallelType.mesh_x)
    torch.manual_seed(3)
    x_full, w_full = torch.randn(2 * dp, 8), torch.randn(4 * tp, 8)
    (out,) = fd.execute(
        [multidevice_test.shard_tensor(x_full, x), multidevice_test.shard_tensor(w_full, w)]
    )
    expected = torch.relu(x_full @ w_full.T)
    torch.testing.assert_close(out.cpu(), shard_tensor(expected, h, rank))
    assert out.shape == (2, 4)
    _assert_local_only(fd.host_ir())


def test_replicated_output_on_every_rank(multidevice_test):
    """A mesh with no parallelized axis: every rank computes and gets the whole tensor."""
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 3))
        y = fd.ops.matmul(x, fd.ops.permute(x, [1, 0]))
        fd.add_output(y)
    x.set_device_mesh(mesh)
    torch.manual_seed(4)
    full = torch.randn(4, 3)
    (out,) = fd.execute([full.to(multidevice_test.device)])
    torch.testing.assert_close(out.cpu(), full @ full.T)
    assert "@M0 {" not in str(fd.host_ir()), "nothing is sharded"


@pytest.mark.world_sizes(2, 4)
def test_mesh_on_a_subset_of_ranks(multidevice_test):
    """Ranks outside the mesh pass None and get None; ranks inside compute their shard."""
    rank = multidevice_test.rank
    mesh = DeviceMesh([1, 0])  # device order is not rank order
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        y = fd.ops.neg(fd.ops.relu(x))  # the intermediate is deallocated on every rank
        fd.add_output(y)
    _shard_x(x, mesh, 1, 2)
    torch.manual_seed(5)
    full = torch.randn(4, 6)
    local = shard_tensor(full, x, rank)
    # Outside the mesh, whatever is passed is ignored.
    (out,) = fd.execute([local.to(multidevice_test.device) if local is not None else "ignored"])
    if rank in (0, 1):
        start = 3 * mesh.devices.index(rank)
        torch.testing.assert_close(out.cpu(), -torch.relu(full)[:, start : start + 3])
    else:
        assert out is None
    assert "deallocate T1" in str(fd.host_ir())
