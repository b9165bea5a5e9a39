"""``lowering.redistribution.distribution``: conversions between distributions, host IR
shardings, DTensor placements and the compact notation; resharding fusions against DTensor
on 4 and 8 ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import Mesh, MeshAxis, PartialAxis, ReduceOp, Symbol, slice_global_tensor
from hostir.ir.sharding import ShardPart, normalized
from lowering import ReshardingError
from lowering.redistribution.distribution import Distribution, mesh_axis_of_dim, parse_notation
from tests.redistribution_programs import fusion_for, program_for, reference_local

X, Y, Z = MeshAxis.X, MeshAxis.Y, MeshAxis.Z
MESH_1D = Mesh(devices=(0, 1, 2, 3), shape=(4,))
MESH_2D = Mesh(devices=(0, 1, 2, 3), shape=(2, 2))
MESH_2X4 = Mesh(devices=tuple(range(8)), shape=(2, 4))
MESH_3D = Mesh(devices=tuple(range(8)), shape=(2, 2, 2))
SUM = ReduceOp.SUM


def partial(*axes: MeshAxis, op: ReduceOp = SUM) -> tuple[PartialAxis, ...]:
    return tuple(PartialAxis(axis=a, op=op) for a in axes)


# ---------------------------------------------------------------------------
# The type itself


def test_replicated_axes_are_the_unused_ones_outer_first():
    d = Distribution(mesh=MESH_3D, dims=((Y,), ()), partial=partial(X))
    assert d.replicated_axes() == (Z,)
    assert Distribution(mesh=MESH_3D, dims=((), ())).replicated_axes() == (Z, Y, X)
    assert Distribution(mesh=MESH_2D, dims=((Y, X), ())).replicated_axes() == ()


def test_nesting_orders_are_distinct():
    yx = Distribution(mesh=MESH_2D, dims=((Y, X), ()))
    xy = Distribution(mesh=MESH_2D, dims=((X, Y), ()))
    assert yx != xy
    assert yx.shard_order() == {0: (0, 1)} and xy.shard_order() == {0: (1, 0)}
    assert yx.has_default_order() and not xy.has_default_order()


def test_mesh_mapping_matches_dtensor_mesh_dims():
    """DTensor mesh dim i is our axis with axis.dim(ndim) == i: the last one is x."""
    for mesh in (MESH_1D, MESH_2D, MESH_3D):
        for dim in range(mesh.ndim):
            assert mesh_axis_of_dim(mesh, dim).dim(mesh.ndim) == dim
    assert [mesh_axis_of_dim(MESH_3D, d) for d in range(3)] == [Z, Y, X]


@pytest.mark.parametrize(
    "dims, partial_axes, match",
    [
        (((Y,), (Y,)), (), "mesh axis y is used more than once"),
        (((X,), ()), (X,), "mesh axis x is used more than once"),
        (((Z,), ()), (), "mesh axis z does not exist in the 2-d mesh"),
    ],
)
def test_invalid_distributions_are_refused(dims, partial_axes, match):
    with pytest.raises(ReshardingError, match=match):
        Distribution(mesh=MESH_2D, dims=dims, partial=partial(*partial_axes))


def test_local_shape_and_indivisible_extents():
    d = parse_notation("S0S1", MESH_2X4)
    assert d.local_shape((16, 16)) == (8, 4)
    with pytest.raises(ReshardingError, match="dim 1 of extent 6 does not divide over 4"):
        d.local_shape((16, 6))


# ---------------------------------------------------------------------------
# DTensor placements


PLACEMENT_CASES = [
    (MESH_1D, (Shard(0),), ((X,), ())),
    (MESH_1D, (Shard(-1),), ((), (X,))),
    (MESH_1D, (Partial(),), ((), ())),
    (MESH_2D, (Shard(0), Shard(0)), ((Y, X), ())),
    (MESH_2D, (Shard(1), Shard(0)), ((X,), (Y,))),
    (MESH_2D, (Replicate(), Shard(0)), ((X,), ())),
    (MESH_2D, (Partial(), Shard(1)), ((), (X,))),
    (MESH_2D, (_StridedShard(0, split_factor=2), Shard(0)), ((X, Y), ())),
    (MESH_2X4, (_StridedShard(1, split_factor=4), Shard(1)), ((), (X, Y))),
    (MESH_3D, (Shard(0), Shard(0), Shard(0)), ((Z, Y, X), ())),
    (MESH_3D, (Shard(0), Replicate(), Shard(0)), ((Z, X), ())),
    (MESH_3D, (Partial("max"), Shard(1), Partial("min")), ((), (Y,))),
    (
        MESH_3D,
        (_StridedShard(0, split_factor=2), _StridedShard(0, split_factor=2), Shard(0)),
        ((X, Z, Y), ()),
    ),
]


@pytest.mark.parametrize("mesh, placements, dims", PLACEMENT_CASES)
def test_placements_round_trip(mesh, placements, dims):
    """placements -> Distribution -> placements, and Distribution -> Sharding -> Distribution."""
    d = Distribution.from_placements(mesh, placements, ndim=2)
    assert d.dims == dims
    normalized_placements = tuple(Shard(p.dim % 2) if type(p) is Shard else p for p in placements)
    assert d.to_placements() == normalized_placements
    assert Distribution.from_sharding(d.to_sharding((16, 16))) == d
    assert parse_notation(d.notation(), mesh) == d


def test_partial_ops_map_to_dtensor_reduce_ops():
    d = Distribution.from_placements(
        MESH_3D, (Partial("sum"), Partial("max"), Partial("min")), ndim=1
    )
    assert d.partial == (
        PartialAxis(axis=Z, op=ReduceOp.SUM),
        PartialAxis(axis=Y, op=ReduceOp.MAX),
        PartialAxis(axis=X, op=ReduceOp.MIN),
    )
    assert d.to_placements() == (Partial("sum"), Partial("max"), Partial("min"))
    assert d.notation() == "PP(max)P(min)"


def test_shard_order_argument_gives_other_nesting_orders():
    """{0: (1, 0)}: dim 0 over mesh dim 1 first (outer), then mesh dim 0: [x, y]."""
    d = Distribution.from_placements(MESH_2D, (Shard(0), Shard(0)), {0: (1, 0)}, ndim=2)
    assert d.dims == ((X, Y), ())
    assert d.shard_order() == {0: (1, 0)}
    assert d.to_placements() == (_StridedShard(0, split_factor=2), Shard(0))
    assert Distribution.from_placements(MESH_2D, d.to_placements(), ndim=2) == d
    default = Distribution.from_placements(MESH_2D, (Shard(0), Shard(0)), {0: (0, 1)}, ndim=2)
    assert default.dims == ((Y, X), ())
    three = Distribution.from_placements(MESH_3D, (Shard(1),) * 3, {1: (2, 0, 1)}, ndim=2)
    assert three.dims == ((), (X, Z, Y))
    assert Distribution.from_placements(MESH_3D, three.to_placements(), ndim=2) == three


@pytest.mark.parametrize(
    "placements, kwargs, match",
    [
        ((Shard(0),), {}, "1 placements .* for the 2-d mesh"),
        ((Shard(2), Replicate()), {}, "names no dim of a 2-d tensor"),
        ((Partial("avg"), Replicate()), {}, "Partial\\(avg\\).* is not supported"),
        ((Shard(0), Replicate()), {"shard_order": {0: (0, 1)}}, "shard_order .* gives tensor"),
        (
            (_StridedShard(0, split_factor=2), Shard(0)),
            {"shard_order": {0: (1, 0)}},
            "either as _StridedShard placements or as shard_order",
        ),
        ((_StridedShard(0, split_factor=3), Shard(0)), {}, "encode no nesting order"),
        (("Shard(0)", Replicate()), {}, "placement 'Shard\\(0\\)' on mesh dim 0 is not supported"),
    ],
)
def test_unsupported_placements_are_refused(placements, kwargs, match):
    with pytest.raises(ReshardingError, match=match):
        Distribution.from_placements(MESH_2D, placements, ndim=2, **kwargs)


def test_prod_partial_has_no_dtensor_placement():
    d = Distribution(mesh=MESH_1D, dims=((),), partial=partial(X, op=ReduceOp.PROD))
    assert d.notation() == "P(prod)"
    with pytest.raises(ReshardingError, match="partial prod over x has no DTensor placement"):
        d.to_placements()


# ---------------------------------------------------------------------------
# Compact notation


@pytest.mark.parametrize(
    "text, mesh, dims, partial_axes",
    [
        ("S0", MESH_1D, ((X,), ()), ()),
        ("R", MESH_1D, ((), ()), ()),
        ("S0S0", MESH_2D, ((Y, X), ()), ()),
        ("S0S0[1,0]", MESH_2D, ((X, Y), ()), ()),
        ("PS0", MESH_2D, ((X,), ()), (Y,)),
        ("RS0", MESH_2D, ((X,), ()), ()),
        ("S1S0", MESH_2D, ((X,), (Y,)), ()),
        ("PP", MESH_2D, ((), ()), (Y, X)),
        ("S0RS0", MESH_3D, ((Z, X), ()), ()),
        ("S1S1S1[2,0,1]", MESH_3D, ((), (X, Z, Y)), ()),
        ("PRS1", MESH_3D, ((), (X,)), (Z,)),
    ],
)
def test_notation_parses_and_prints_back(text, mesh, dims, partial_axes):
    d = parse_notation(text, mesh)
    assert d.dims == dims
    assert d.partial == partial(*partial_axes)
    assert d.notation() == text


def test_notation_matches_dtensor_placements():
    """On a 2x2 mesh "S0S0" is (Shard(0), Shard(0)), "PS0" (Partial, Shard(0)), ..."""
    assert parse_notation("S0S0", MESH_2D).to_placements() == (Shard(0), Shard(0))
    assert parse_notation("PS0", MESH_2D).to_placements() == (Partial(), Shard(0))
    assert parse_notation("RS0", MESH_2D).to_placements() == (Replicate(), Shard(0))
    assert parse_notation("S0S0[1,0]", MESH_2D).to_placements() == (
        _StridedShard(0, split_factor=2),
        Shard(0),
    )


def test_notation_of_a_3d_tensor():
    d = parse_notation("S2S0", MESH_2D, ndim=3)
    assert d.dims == ((X,), (), (Y,))
    assert d.notation() == "S2S0"


@pytest.mark.parametrize(
    "text, match",
    [
        ("S0", "has 1 placements for the 2-d mesh"),
        ("S0Q", "cannot read the distribution 'S0Q' at 'Q'"),
        ("S2R", "S2 in 'S2R' names dim 2 of a 2-d tensor"),
        ("S0S1[1,0]", "must list the mesh dims of the one tensor dim sharded more than once"),
        ("S0S0[0,0]", "must list the mesh dims"),
        ("PP(avg)", "cannot read the distribution"),
    ],
)
def test_bad_notation_is_refused(text, match):
    with pytest.raises(ReshardingError, match=match):
        parse_notation(text, MESH_2D)


# ---------------------------------------------------------------------------
# Host IR shardings, from schedules built with the frontend


def test_to_sharding_writes_block_parts_like_normalized():
    d = Distribution(mesh=MESH_2X4, dims=((Y, X), (), ()), partial=())
    sharding = d.to_sharding((16, Symbol(name="i0"), 3))
    assert sharding.dims[0] == (
        ShardPart(axis=Y, extent=parse_const(2)),
        ShardPart(axis=X, extent=parse_const(4)),
        ShardPart(axis=None, extent=parse_const(2)),
    )
    assert sharding == normalized(sharding, (parse_const(16), Symbol(name="i0"), parse_const(3)))
    # Fully sharded dims have no local part of extent 1 (as the frontend writes them).
    assert d.to_sharding((8, 1, 1)).dims[0] == sharding.dims[0][:2]


def parse_const(value: int):
    from hostir import Const

    return Const(value=value)


def test_from_sharding_of_a_user_schedule():
    """The MLP example of docs/communication.md: read the distributions off fd.host_ir()."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8))
        w1 = fd.define_tensor((16, 8))
        w2 = fd.define_tensor((8, 16))
        fd.add_output(fd.ops.linear(fd.ops.relu(fd.ops.linear(x, w1)), w2))
    for tv, dim, axis in (
        (x, 0, ParallelType.mesh_y),
        (w1, 0, ParallelType.mesh_x),
        (w2, 1, ParallelType.mesh_x),
    ):
        tv.set_device_mesh(mesh)
        tv.outer_split(dim, 2)
        tv.axis(dim).parallelize(axis)
    program = fd.host_ir()
    values = {v.name: v for v in program.inputs}
    for instruction in program.body:
        out = getattr(instruction, "out", None)
        if out is not None:
            values[out.name] = out
    found = {
        name: Distribution.from_sharding(v.sharding).notation()
        for name, v in values.items()
        if v.sharding is not None
    }
    assert found["T0"] == "S0R"
    assert found["T1"] == "RS0"
    assert found["T2"] == "RS1"
    assert found["T3"] == "S0S1"
    assert found["T6"] == "S0P"  # the partial linear before its Allreduce
    assert found["T5"] == "S0R"
    for name, v in values.items():
        if v.sharding is not None:
            d = Distribution.from_sharding(v.sharding)
            assert d.to_sharding(v.shape) == v.sharding, name


@pytest.mark.parametrize(
    "src, dst",
    [("S0S0", "RR"), ("PS0", "S1R"), ("S0S0[1,0]", "S1S0"), ("PP", "PR"), ("RR", "S1S1")],
)
def test_fusion_for_schedules_what_it_is_asked(src, dst):
    """The values of the lowered fusion carry exactly ``src`` and ``dst``."""
    s, d = parse_notation(src, MESH_2D), parse_notation(dst, MESH_2D)
    fd = fusion_for(s, d, (8, 8))
    program = fd.host_ir()
    (output,) = program.outputs
    assert Distribution.from_sharding(output.sharding) == d
    assert output.sharding == d.to_sharding((8, 8))
    reshard = program_for(s, d, (8, 8))
    (source,) = reshard.inputs
    assert Distribution.from_sharding(source.sharding) == s
    assert source.sharding == s.to_sharding((8, 8))
    if s.partial:  # the fusion input: [P, *shape], dim 0 over the partial axes
        (fusion_input,) = program.inputs
        assert fusion_input.sharding.dims[0][0].axis == s.partial[0].axis
        assert "sum(" not in str(reshard)
    else:
        assert reshard == program


def test_cyclic_shardings_are_refused():
    """An inner split parallelizes the inner part: [4, x] is cyclic, not a block layout."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 4))
        fd.add_output(fd.ops.relu(x))
    x.set_device_mesh(DeviceMesh([0, 1]))
    x.inner_split(0, 2)
    x.axis(1).parallelize(ParallelType.mesh_x)
    sharding = fd.host_ir().inputs[0].sharding
    with pytest.raises(ReshardingError, match=r"dim 0 of the sharding \[4, x\] \[4\] is not"):
        Distribution.from_sharding(sharding)


def test_fusion_for_refuses_what_no_resharding_does():
    with pytest.raises(ReshardingError, match="the target holds partial values the source"):
        fusion_for(parse_notation("RR", MESH_2D), parse_notation("PR", MESH_2D), (4, 4))
    with pytest.raises(ReshardingError, match="must both describe the 3-d tensor of shape"):
        fusion_for(parse_notation("RR", MESH_2D), parse_notation("RR", MESH_2D), (4, 4, 4))
    with pytest.raises(ReshardingError, match="does not divide"):
        fusion_for(parse_notation("S0S0", MESH_2D), parse_notation("RR", MESH_2D), (6, 4))


def test_reference_local_drops_partial_axes():
    full = torch.arange(64.0).reshape(8, 8)
    d = parse_notation("PS1", MESH_2D)
    for rank in range(4):
        expected = full[:, 4 * (rank % 2) : 4 * (rank % 2) + 4]
        assert torch.equal(reference_local(full, d, rank), expected)


# ---------------------------------------------------------------------------
# Against DTensor on real ranks


def _dtensor_mesh(shape: tuple[int, ...]):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", shape)


def _check_placements_slice_like_dtensor(rank: int, mesh: Mesh, texts: list[str]) -> None:
    """distribute_tensor(full, placements) holds on each rank what our sharding slices."""
    from torch.distributed.tensor import distribute_tensor

    dmesh = _dtensor_mesh(mesh.shape)
    full = torch.arange(16 * 16, dtype=torch.float32).reshape(16, 16)
    for text in texts:
        d = parse_notation(text, mesh)
        dtensor = distribute_tensor(full, dmesh, d.to_placements(), src_data_rank=None)
        ours = slice_global_tensor(full, d.to_sharding((16, 16)), rank)
        assert torch.equal(dtensor.to_local(), ours), text
        assert Distribution.from_placements(dmesh, dtensor.placements, ndim=2) == d


@pytest.mark.real_ranks(reason="torch DTensor on a torch.distributed device mesh")
@pytest.mark.world_sizes(4)
def test_placements_slice_like_dtensor_on_2x2(multidevice_test):
    texts = ["S0S0", "S0S0[1,0]", "S1S0", "RS0", "S0R", "S1S1[1,0]", "RR"]
    _check_placements_slice_like_dtensor(multidevice_test.rank, MESH_2D, texts)


@pytest.mark.real_ranks(reason="torch DTensor on a torch.distributed device mesh")
@pytest.mark.world_sizes(8)
def test_placements_slice_like_dtensor_on_8_ranks(multidevice_test):
    texts = ["S0S0S0", "S0S0S0[2,1,0]", "S0S0S0[1,2,0]", "S1RS1[2,0]", "S0S1S0"]
    _check_placements_slice_like_dtensor(multidevice_test.rank, MESH_3D, texts)
    texts = ["S0S0", "S0S0[1,0]", "S1S0", "RS1"]
    _check_placements_slice_like_dtensor(multidevice_test.rank, MESH_2X4, texts)


def _redistribute_like_dtensor(rank: int, mesh: Mesh, src_text: str, dst_text: str) -> None:
    """fusion_for(...) executed with fd.execute, DTensor's redistribute and the single-device
    reference agree exactly (integer-valued data: any summation order is exact)."""
    from torch.distributed.tensor import DTensor

    dmesh = _dtensor_mesh(mesh.shape)
    src, dst = parse_notation(src_text, mesh), parse_notation(dst_text, mesh)
    shape = (8, 16)
    fd = fusion_for(src, dst, shape)
    parts = 1
    for p in src.partial:
        parts *= mesh.axis_size(p.axis)
    torch.manual_seed(0)
    values = torch.randint(-8, 8, (parts, *shape) if src.partial else shape).float()
    full = values.sum(0) if src.partial else values
    fusion_input = shard_tensor(values, fd.host_ir().inputs[0], rank)
    local = fusion_input.squeeze(0) if src.partial else fusion_input
    (ours,) = fd.execute([fusion_input])
    dtensor = DTensor.from_local(
        local, dmesh, src.to_placements(), run_check=False, shape=full.shape, stride=full.stride()
    )
    theirs = dtensor.redistribute(dmesh, dst.to_placements()).to_local()
    expected = reference_local(full, dst, rank)
    assert torch.equal(theirs, expected)
    assert torch.equal(ours, expected)
    program = program_for(src, dst, shape)
    from hostir import HostIrEvaluator, default_communicator

    (direct,) = HostIrEvaluator(program, communicator=default_communicator()).run([local])
    assert torch.equal(direct, expected)


@pytest.mark.real_ranks(reason="torch DTensor on a torch.distributed device mesh")
@pytest.mark.world_sizes(4)
@pytest.mark.parametrize(
    "src, dst",
    [
        ("S0S0", "RR"),
        ("PP", "RR"),
        ("PP", "S0S0"),
        ("S0S1", "S1S0"),
        ("RS0", "S0R"),
        ("PS0", "RR"),
        ("S0S0[1,0]", "RR"),
        ("S0R", "S1R"),
        ("PR", "S1R"),
    ],
)
def test_fusion_for_matches_dtensor_redistribute(multidevice_test, src, dst):
    _redistribute_like_dtensor(multidevice_test.rank, MESH_2D, src, dst)


@pytest.mark.real_ranks(reason="torch DTensor on a torch.distributed device mesh")
@pytest.mark.world_sizes(8)
@pytest.mark.parametrize("src, dst", [("S0RS0", "RRR"), ("PPS1", "S0RS1"), ("S0S1R", "S1S0R")])
def test_fusion_for_matches_dtensor_redistribute_on_a_3d_mesh(multidevice_test, src, dst):
    _redistribute_like_dtensor(multidevice_test.rank, MESH_3D, src, dst)


def test_partial_source_programs_take_the_partial_value():
    """program_for drops the fusion's local sum: its input is the partial tensor itself."""
    s, d = parse_notation("PS0", MESH_2D), parse_notation("RR", MESH_2D)
    program = program_for(s, d, (8, 8))
    (source,) = program.inputs
    assert source.sharding.partial == partial(Y)
    assert dataclasses.replace(source.sharding, partial=()) == dataclasses.replace(
        s, partial=()
    ).to_sharding((8, 8))
