"""Resharding lowered to collectives, run on 1, 2 and 4 ranks against torch.

Every test shards random data, executes, compares this rank's output with the
same piece of the single-device result, and checks which communications the
host IR program contains.
"""

from __future__ import annotations

import re

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import HostIrError

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def kinds(fd: FusionDefinition) -> list[str]:
    """The communication kinds of the program, in order."""
    kinds = "Allgather|ReduceScatter|Allreduce|Broadcast|Reduce|Gather|Scatter|AllToAll|SendRecv"
    return re.findall(rf"= ({kinds})\(", str(fd.host_ir()))


def communicates(fd: FusionDefinition, expected: list[str], team_size: int) -> None:
    """``fd``'s program issues the collectives ``expected`` over a team of ``team_size``
    devices, or none on a one-device team: each step is a local copy (``set``), and
    nothing is waited for (docs/communication.md)."""
    if team_size > 1:
        assert kinds(fd) == expected
        return
    text = str(fd.host_ir())
    assert kinds(fd) == [] and "wait" not in text, text
    assert re.search(r"= set\(", text), text


def shard(tv, mesh: DeviceMesh, dim: int, parallel_type=ParallelType.mesh_x) -> None:
    """Places ``tv`` on ``mesh`` (if not yet) and block-shards ``dim`` over the axis."""
    if tv.device_mesh is None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


def check(fd, multidevice_test, inputs, expected, **tolerance) -> None:
    """Executes on local shards of ``inputs`` and compares each output's shard."""
    device = multidevice_test.device
    local = [multidevice_test.shard_tensor(t, tv) if tv is not None else t for t, tv in inputs]
    local = [t.to(device) if isinstance(t, torch.Tensor) else t for t in local]
    outputs = fd.execute(local)
    program = fd.host_ir()
    for out, value, full in zip(outputs, program.outputs, expected, strict=True):
        piece = shard_tensor(full, value, multidevice_test.rank)
        if piece is None:
            assert out is None
            continue
        torch.testing.assert_close(out.cpu(), piece, **tolerance)


def _mesh(d: int) -> DeviceMesh:
    return DeviceMesh(torch.arange(d))


def _mesh_2d(d: int) -> DeviceMesh:
    rows, cols = (d // 2, 2) if d > 1 else (1, 1)
    return DeviceMesh(torch.arange(d).reshape(rows, cols))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_1d(multidevice_test, dtype):
    """A tensor sharded on dim 0 becomes replicated: one Allgather."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 6), dtype=DataType.from_torch(dtype))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 0)
    y.set_device_mesh(mesh)
    torch.manual_seed(0)
    full = torch.randn(2 * d, 6).to(dtype)
    check(fd, multidevice_test, [(full, x)], [full])
    communicates(fd, ["Allgather"], d)


@pytest.mark.parametrize("gathered", [ParallelType.mesh_x, ParallelType.mesh_y])
def test_allgather_on_2d_mesh_keeps_the_other_axis(multidevice_test, gathered):
    """Dim 0 over mesh_y, dim 1 over mesh_x; gather one axis, keep the other's sharding."""
    mesh = _mesh_2d(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 0, ParallelType.mesh_y)
    shard(x, mesh, 2, ParallelType.mesh_x)  # loop [y, 4/y, 6] -> axis 2 is dim 1
    y.set_device_mesh(mesh)
    if gathered is ParallelType.mesh_x:
        shard(y, mesh, 0, ParallelType.mesh_y)
    else:
        shard(y, mesh, 1, ParallelType.mesh_x)
    torch.manual_seed(1)
    full = torch.randn(4, 6)
    check(fd, multidevice_test, [(full, x)], [full])
    communicates(fd, ["Allgather"], mesh.axis_size(gathered))
    axis = "x" if gathered is ParallelType.mesh_x else "y"
    assert (f"team=M0({axis})" in str(fd.host_ir())) == (mesh.axis_size(gathered) > 1)


def test_sum_over_sharded_axis_is_an_allreduce(multidevice_test):
    """A local partial sum, then an Allreduce."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 5))
        s = fd.ops.sum(x, [0])
        fd.add_output(s)
    shard(x, mesh, 0)
    torch.manual_seed(2)
    full = torch.randn(3 * d, 5)
    check(fd, multidevice_test, [(full, x)], [full.sum(0)], rtol=1e-5, atol=1e-5)
    communicates(fd, ["Allreduce"], d)
    assert "partial{x: sum} = sum(T0, dims=[0]" in str(fd.host_ir())


@pytest.mark.parametrize("scattered_dim", [0, 1])
def test_sum_with_sharded_output_is_a_reduce_scatter(multidevice_test, scattered_dim):
    """Summing the sharded dim 1 of [a, b, c] into a sharded output: one ReduceScatter,
    also when the scattered dim (here dim 1 of [a, c]) is not outermost."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 3 * d, 2 * d))
        s = fd.ops.sum(x, [1])
        fd.add_output(s)
    shard(x, mesh, 1)
    s.set_device_mesh(mesh)
    shard(s, mesh, {0: 0, 1: 2}[scattered_dim])  # loop [a, r, c]: data dim 1 is loop axis 2
    torch.manual_seed(3)
    full = torch.randn(2 * d, 3 * d, 2 * d)
    check(fd, multidevice_test, [(full, x)], [full.sum(1)], rtol=1e-5, atol=1e-5)
    communicates(fd, ["ReduceScatter"], d)
    if d > 1:
        assert f"axis={scattered_dim}" in str(fd.host_ir())


@pytest.mark.parametrize("direction", ["0->1", "1->0"])
def test_all_to_all_moves_the_sharded_dim(multidevice_test, direction):
    """Sharded on dim 0 to sharded on dim 1 (and back): one AllToAll."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    source, target = (0, 1) if direction == "0->1" else (1, 0)
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 3 * d))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, source)
    y.set_device_mesh(mesh)
    shard(y, mesh, target)
    torch.manual_seed(4)
    full = torch.randn(2 * d, 3 * d)
    check(fd, multidevice_test, [(full, x)], [full])
    communicates(fd, ["AllToAll"], d)


def test_sharded_pointwise_with_replicated_output_gathers_after(multidevice_test):
    """relu runs on the shards, then its result is gathered."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 4))
        y = fd.ops.relu(x)
        fd.add_output(y)
    shard(x, mesh, 0)
    y.set_device_mesh(mesh)
    torch.manual_seed(5)
    full = torch.randn(2 * d, 4)
    check(fd, multidevice_test, [(full, x)], [torch.relu(full)])
    communicates(fd, ["Allgather"], d)
    text = str(fd.host_ir())
    assert text.index("= relu(") < text.index("= Allgather(" if d > 1 else "= set(")


def test_sharded_plus_replicated_is_a_local_slice(multidevice_test):
    """The replicated operand is sliced locally: no communication."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        a = fd.define_tensor((2 * d, 3))
        b = fd.define_tensor((2 * d, 3))
        fd.add_output(fd.ops.add(a, b))
    shard(a, mesh, 0)
    b.set_device_mesh(mesh)
    torch.manual_seed(6)
    a_full, b_full = torch.randn(2 * d, 3), torch.randn(2 * d, 3)
    check(fd, multidevice_test, [(a_full, a), (b_full, b)], [a_full + b_full])
    assert kinds(fd) == []
    assert "= local_shard(T1, axis=0, mesh_axis=x)" in str(fd.host_ir())


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_parallel_linear(multidevice_test, with_bias, dtype):
    """Contraction sharded: a partial linear, an Allreduce, then the bias."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    dt = DataType.from_torch(dtype)
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4 * d), dtype=dt)
        w = fd.define_tensor((6, 4 * d), dtype=dt)
        b = fd.define_tensor((6,), dtype=dt) if with_bias else None
        fd.add_output(fd.ops.linear(x, w, b))
    shard(x, mesh, 1)
    shard(w, mesh, 1)
    if b is not None:
        b.set_device_mesh(mesh)
    torch.manual_seed(7)
    x_full, w_full, b_full = (torch.randn(s).to(dtype) for s in ((5, 4 * d), (6, 4 * d), (6,)))
    inputs = [(x_full, x), (w_full, w)] + ([(b_full, b)] if with_bias else [])
    reference = torch.nn.functional.linear(
        x_full.double(), w_full.double(), b_full.double() if with_bias else None
    ).to(dtype)
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    check(fd, multidevice_test, inputs, [reference], **tolerance)
    communicates(fd, ["Allreduce"], d)
    text = str(fd.host_ir())
    if with_bias:
        assert text.index("= Allreduce(" if d > 1 else "= set(") < text.index("= add(")


def test_sequence_parallel_linear_gathers_the_input(multidevice_test):
    """Tokens sharded, weight column-sharded: the tokens are gathered first."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 8))
        w = fd.define_tensor((4 * d, 8))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    shard(x, mesh, 0)
    shard(w, mesh, 0)
    y.set_device_mesh(mesh)
    shard(y, mesh, 1)
    torch.manual_seed(8)
    x_full, w_full = torch.randn(2 * d, 8), torch.randn(4 * d, 8)
    check(fd, multidevice_test, [(x_full, x), (w_full, w)], [x_full @ w_full.T])
    communicates(fd, ["Allgather"], d)


def test_linear_with_sharded_tokens_gathers_the_weight(multidevice_test):
    """Tokens stay sharded (sequence-parallel output): the weight is gathered (FSDP-like)."""
    d, mesh = multidevice_test.size, _mesh(multidevice_test.size)
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 8))
        w = fd.define_tensor((4 * d, 8))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    shard(x, mesh, 0)
    shard(w, mesh, 0)
    y.set_device_mesh(mesh)
    shard(y, mesh, 0)
    torch.manual_seed(9)
    x_full, w_full = torch.randn(2 * d, 8), torch.randn(4 * d, 8)
    check(fd, multidevice_test, [(x_full, x), (w_full, w)], [x_full @ w_full.T])
    communicates(fd, ["Allgather"], d)
    assert re.search(r"= Allgather\(T1," if d > 1 else r"= set\(T1\b", str(fd.host_ir()))


def test_data_and_tensor_parallel_mlp(multidevice_test):
    """A (d/2, 2) mesh: batch over mesh_y, hidden over mesh_x; one Allreduce over rows."""
    mesh = _mesh_2d(multidevice_test.size)
    dp, tp = mesh.shape
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * dp, 8))
        w1 = fd.define_tensor((4 * tp, 8))
        w2 = fd.define_tensor((8, 4 * tp))
        h = fd.ops.relu(fd.ops.linear(x, w1))
        y = fd.ops.linear(h, w2)
        fd.add_output(y)
    shard(x, mesh, 0, ParallelType.mesh_y)
    shard(w1, mesh, 0, ParallelType.mesh_x)
    shard(w2, mesh, 1, ParallelType.mesh_x)
    torch.manual_seed(10)
    x_full, w1_full = torch.randn(2 * dp, 8), torch.randn(4 * tp, 8)
    w2_full = torch.randn(8, 4 * tp)
    expected = torch.relu(x_full @ w1_full.T) @ w2_full.T
    check(
        fd,
        multidevice_test,
        [(x_full, x), (w1_full, w1), (w2_full, w2)],
        [expected],
        rtol=1e-5,
        atol=1e-5,
    )
    communicates(fd, ["Allreduce"], tp)
    if tp > 1:
        assert "Allreduce(T6, team=M0(x), op=sum)" in str(fd.host_ir())


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("root", [0, 2])
def test_broadcast_from_one_device(multidevice_test, root):
    """A tensor on one device becomes replicated on a mesh (root inside or outside it)."""
    target = DeviceMesh([0, 1, 2, 3]) if root == 0 else DeviceMesh([0, 1, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor((3, 4))
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh([root]))
    y.set_device_mesh(target)
    torch.manual_seed(11)
    full = torch.randn(3, 4)
    check(fd, multidevice_test, [(full, x)], [full])
    assert kinds(fd) == ["Broadcast"]


@pytest.mark.world_sizes(4)
def test_scatter_from_one_device(multidevice_test):
    """A tensor on device 1 is split over the mesh: one Scatter."""
    mesh = DeviceMesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 3))
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh([1]))
    y.set_device_mesh(mesh)
    shard(y, mesh, 0)
    torch.manual_seed(12)
    full = torch.randn(8, 3)
    check(fd, multidevice_test, [(full, x)], [full])
    assert kinds(fd) == ["Scatter"]
    assert "root=1" in str(fd.host_ir())


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("direction", ["from device 0", "to device 0"])
def test_one_device_and_a_2d_mesh_split_over_both_axes(multidevice_test, direction):
    """Device 0 and a 2x2 mesh with dim 0 over y and dim 1 over x: a Scatter over the
    flattened mesh then an AllToAll (each rank receives 3/8 of the tensor, not all of it
    as a Broadcast would, and holds no copy of the whole); back, an AllToAll then a
    Gather instead of gathering everything on every rank."""
    mesh = _mesh_2d(4)
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 12))
        y = fd.ops.set(x)
        fd.add_output(y)
    one, sharded = (x, y) if direction == "from device 0" else (y, x)
    one.set_device_mesh(DeviceMesh([0]))
    shard(sharded, mesh, 1, ParallelType.mesh_x)  # dim 1 first: a split renumbers later axes
    shard(sharded, mesh, 0, ParallelType.mesh_y)
    torch.manual_seed(16)
    full = torch.randn(8, 12)
    check(fd, multidevice_test, [(full, x)], [full])
    expected = ["Scatter", "AllToAll"] if direction == "from device 0" else ["AllToAll", "Gather"]
    assert kinds(fd) == expected


@pytest.mark.world_sizes(4)
def test_gather_to_one_device(multidevice_test):
    """A tensor sharded on dim 1 over the mesh is collected on device 3: one Gather."""
    mesh = DeviceMesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor((3, 8))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 1)
    y.set_device_mesh(DeviceMesh([3]))
    torch.manual_seed(13)
    full = torch.randn(3, 8)
    check(fd, multidevice_test, [(full, x)], [full])
    assert kinds(fd) == ["Gather"]


@pytest.mark.world_sizes(4)
def test_reduce_to_one_device(multidevice_test):
    """A sum over the sharded dim lands on device 0 only: one Reduce."""
    mesh = DeviceMesh([0, 1, 2, 3])
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 3))
        s = fd.ops.sum(x, [0])
        fd.add_output(s)
    shard(x, mesh, 0)
    s.set_device_mesh(DeviceMesh([0]))
    torch.manual_seed(14)
    full = torch.randn(8, 3)
    check(fd, multidevice_test, [(full, x)], [full.sum(0)], rtol=1e-5, atol=1e-5)
    assert kinds(fd) == ["Reduce"]


@pytest.mark.world_sizes(4)
def test_send_recv_between_meshes(multidevice_test):
    """A pipeline stage boundary: shards on [0, 1] move to [2, 3] pairwise."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        y = fd.ops.set(x)
        z = fd.ops.neg(y)
        fd.add_output(z)
    shard(x, DeviceMesh([0, 1]), 0)
    shard(y, DeviceMesh([2, 3]), 0)
    torch.manual_seed(15)
    full = torch.randn(4, 6)
    check(fd, multidevice_test, [(full, x)], [-full])
    assert kinds(fd) == ["SendRecv"]
    assert "team=M1(y), sender=0, receiver=1" in str(fd.host_ir())


def test_unplannable_resharding_names_tensors_and_shardings():
    """Overlapping meshes of different sizes cannot be connected: a clear error."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 4))  # dim 1 splits over 4 devices (6 was refused first)
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, DeviceMesh([0, 1]), 0)
    shard(y, DeviceMesh([1, 2, 3, 0]), 1)
    with pytest.raises(HostIrError) as info:
        fd.host_ir()
    message = str(info.value)
    assert "cannot reshard T0 @M0 {0: [x, 2]} to T1 @M1 {1: [x]}" in message
    assert "M0 = [2] : [1]" in message and "M1 = [1, 2, 3, 0]" in message


@pytest.mark.world_sizes(4)
def test_allgather_on_a_subset_mesh_in_any_order(multidevice_test):
    """Mesh [3, 1] on 4 ranks: ranks 0 and 2 skip; the gather follows mesh order."""
    mesh = DeviceMesh([3, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 5))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 0)
    y.set_device_mesh(mesh)
    torch.manual_seed(16)
    full = torch.randn(4, 5)
    check(fd, multidevice_test, [(full, x)], [full])
    assert kinds(fd) == ["Allgather"]


@pytest.mark.world_sizes(8)
@pytest.mark.parametrize("axis", [ParallelType.mesh_z, ParallelType.mesh_y, ParallelType.mesh_x])
def test_collectives_along_each_axis_of_a_3d_mesh(multidevice_test, axis):
    """A 2x2x2 mesh: each dim of a 3-d tensor over one mesh axis; gather one of them and
    sum over another, so an Allgather and an Allreduce run along different axes."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 2, 2))
    order = [ParallelType.mesh_z, ParallelType.mesh_y, ParallelType.mesh_x]
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 4, 4))
        s = fd.ops.sum(x, [order.index(axis)])
        fd.add_output(s)
    x.set_device_mesh(mesh)
    for dim, parallel_type in enumerate(order):
        x.outer_split(2 * dim, 2)
        x.axis(2 * dim).parallelize(parallel_type)
    s.set_device_mesh(mesh)  # replicated: the other two axes are gathered
    torch.manual_seed(17)
    full = torch.randn(4, 4, 4)
    dim = order.index(axis)
    check(fd, multidevice_test, [(full, x)], [full.sum(dim)], rtol=1e-5, atol=1e-5)
    assert kinds(fd) == ["Allreduce", "Allgather", "Allgather"]
    assert f"Allreduce(T2, team=M0({axis.name[-1]}), op=sum, out=T1_0)" in str(fd.host_ir())


@pytest.mark.world_sizes(2)
def test_profiler_sees_the_collectives(multidevice_test):
    """The profiler shows the host IR range and gloo's own events for an Allgather."""
    mesh = _mesh(2)
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 3))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 0)
    y.set_device_mesh(mesh)
    torch.manual_seed(18)
    full = torch.randn(4, 3)
    check(fd, multidevice_test, [(full, x)], [full])  # warm up: groups are created once
    local = multidevice_test.shard_tensor(full, x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        (out,) = fd.execute([local])
    torch.testing.assert_close(out.cpu(), full)
    names = [event.name for event in prof.events()]
    assert names.count("hir::Allgather") == 1
    assert names.count("hir::wait") == 1
    assert sum(1 for n in names if n.startswith("gloo:all_gather")) == 1, sorted(set(names))


@pytest.mark.world_sizes(4)
def test_all_to_all_along_mesh_y_keeps_mesh_x(multidevice_test):
    """On a 2x2 mesh, dim 0 over mesh_y moves to dim 1; dim 2 stays over mesh_x."""
    mesh = _mesh_2d(4)
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6, 2))
        y = fd.ops.set(x)
        fd.add_output(y)
    shard(x, mesh, 0, ParallelType.mesh_y)
    shard(x, mesh, 3, ParallelType.mesh_x)  # loop [y, 2, 6, 2]: dim 2 is loop axis 3
    y.set_device_mesh(mesh)
    shard(y, mesh, 1, ParallelType.mesh_y)
    shard(y, mesh, 3, ParallelType.mesh_x)  # loop [4, y, 3, 2]: dim 2 is loop axis 3
    torch.manual_seed(19)
    full = torch.randn(4, 6, 2)
    check(fd, multidevice_test, [(full, x)], [full])
    assert kinds(fd) == ["AllToAll"]
    assert "team=M0(y), split_axis=1, concat_axis=0" in str(fd.host_ir())
