"""The JSON form: program -> JSON -> program on lowered and hand-built programs, constants
keep their type, the text is deterministic, and malformed documents are refused clearly."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import re
from collections.abc import Callable

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType
from hostir import (
    INSTRUCTIONS,
    Allgather,
    Allocate,
    Allreduce,
    AllToAll,
    AllToAllV,
    Binary,
    BinaryExpr,
    BinaryOpKind,
    Broadcast,
    BroadcastInDim,
    Cast,
    CollectivePermute,
    Const,
    Deallocate,
    DType,
    ForLoop,
    Gather,
    GetCurrentStream,
    HostIrContainer,
    HostIrError,
    HostIrEvaluator,
    HostValue,
    Linear,
    LocalShard,
    Matmul,
    Mesh,
    MeshAxis,
    MeshCoordinate,
    PartialAxis,
    Permute,
    PipelineStage,
    RaggedAllToAll,
    Reduce,
    ReduceOp,
    ReduceScatter,
    Reduction,
    ReductionOpKind,
    RequestValue,
    ScalarInput,
    ScalarOp,
    Scatter,
    SendRecv,
    Set,
    SetCurrentStream,
    ShardByStream,
    Sharding,
    ShardPart,
    StreamValue,
    Symbol,
    Synchronize,
    Team,
    Ternary,
    TernaryOpKind,
    ToHost,
    Unary,
    UnaryOpKind,
    VerifyError,
    Wait,
    parse,
)
from hostir.errors import JsonFormatError
from hostir.ir.attention import EmbeddingFwd, GroupedMm, PhiloxResult, SdpaBwd, SdpaFwd, SdpaPhilox
from hostir.ir.creation import Distribution, Full, Iota, Random
from hostir.ir.host_reads import RaggedExchange
from hostir.ir.indexing import Argsort, Cumsum, GatherAlong, GatherKind, IndexSelect, TopK
from hostir.ir.scatter_ops import Bincount, IndexAdd, ScatterAlong, ScatterKind
from hostir.ir.shape_ops import Cat, Pad, Reshape, Slice
from hostir.text import json_format
from hostir.text.round_trip import check_round_trip
from tests.hostir.programs import c, tensor

# ----- programs -----


def walk(body: tuple) -> list:
    """Every instruction of ``body``, loop bodies included."""
    found = []
    for instruction in body:
        found.append(instruction)
        if isinstance(instruction, ForLoop):
            found.extend(walk(instruction.body))
    return found


def every_instruction() -> tuple:
    """One instance (or more) of every catalog class, with varied field values."""
    mesh = Mesh(devices=(3, 1, 0, 2), shape=(2, 2))
    sharding = Sharding(
        mesh=mesh,
        dims=(
            (
                ShardPart(axis=MeshAxis.Y, extent=c(2)),
                ShardPart(axis=None, extent=Symbol(name="n")),
            ),
            (ShardPart(axis=None, extent=c(4)),),
        ),
        partial=(PartialAxis(axis=MeshAxis.X, op=ReduceOp.MAX),),
    )
    x = tensor("x", "n", 4, sharding=sharding)
    y = tensor("y", "n", 4, dtype=DType.BFLOAT16)
    w = tensor("w", 3, 4, dtype=DType.INT32)
    team = Team(mesh=mesh, axes=(MeshAxis.Y, MeshAxis.X))
    request = RequestValue(name="R0")
    i = Symbol(name="i")
    coord = MeshCoordinate(mesh=mesh, axis=MeshAxis.X)
    peer = BinaryExpr(op=ScalarOp.MOD, lhs=BinaryExpr(op=ScalarOp.ADD, lhs=coord, rhs=i), rhs=c(2))
    back = BinaryExpr(op=ScalarOp.SUB, lhs=coord, rhs=BinaryExpr(op=ScalarOp.MUL, lhs=i, rhs=c(3)))
    main = StreamValue(name="main")
    comm = {"out": y, "src": x, "team": team, "request": request}
    loop_body = (
        SetCurrentStream(stream=StreamValue(index=i)),
        Synchronize(stream=main),
        ShardByStream(out=y, src=x, axis=0, index=peer),
        PipelineStage(depth=2),
        ForLoop(index=Symbol(name="k"), start=i, stop=c(2), body=(Deallocate(tensor=y),)),
    )
    return (
        GetCurrentStream(out=main),
        Allocate(out=y),
        Set(out=y, src=x, preallocated=True),
        Allgather(**comm, axis=1, inner=Symbol(name="n")),
        Unary(op=UnaryOpKind.RELU, out=y, src=x),
        Unary(op=UnaryOpKind.NEG, out=y, src=x, preallocated=True),
        Binary(op=BinaryOpKind.DIV, out=y, lhs=Const(value=0.5), rhs=x),
        Binary(op=BinaryOpKind.SUB, out=y, lhs=x, rhs=Const(value=True)),
        Binary(op=BinaryOpKind.ADD, out=y, lhs=x, rhs=y),
        Binary(op=BinaryOpKind.MUL, out=y, lhs=Symbol(name="n"), rhs=x),
        Cast(out=y, src=x),
        Reduction(op=ReductionOpKind.SUM, out=y, src=x, dims=(0, 1), keepdim=True),
        Reduction(op=ReductionOpKind.MIN, out=y, src=x, dims=(1,)),
        Reduction(op=ReductionOpKind.SUM, out=y, src=x, dims=(1,), dtype=DType.FLOAT64),
        Linear(out=y, input=x, weight=w),
        Linear(out=y, input=x, weight=w, bias=y, preallocated=True),
        Matmul(out=y, lhs=x, rhs=w),
        BroadcastInDim(out=y, src=x, broadcast_dims=(1,)),
        Permute(out=y, src=x, dims=(1, 0)),
        ShardByStream(out=y, src=x, axis=1, index=c(0)),
        ForLoop(
            index=i,
            start=c(0),
            stop=BinaryExpr(op=ScalarOp.FLOORDIV, lhs=Symbol(name="n"), rhs=c(2)),
            body=loop_body,
        ),
        SetCurrentStream(stream=main),
        LocalShard(out=y, src=x, axis=0, mesh_axis=MeshAxis.Z, inner=c(2)),
        LocalShard(out=y, src=x, axis=1, mesh_axis=MeshAxis.Y),
        ReduceScatter(**comm, axis=0, op=ReduceOp.MIN),
        Allreduce(**comm, op=ReduceOp.PROD),
        Broadcast(**comm, root=c(1)),
        Reduce(**comm, root=coord),
        Gather(**comm, root=c(0), axis=0),
        Scatter(**comm, root=c(3), axis=1, preallocated=True),
        AllToAll(**comm, split_axis=0, concat_axis=1),
        AllToAllV(**comm),
        AllToAllV(**comm, op=ReduceOp.MAX, preallocated=True),
        SendRecv(**comm, sender=c(0), receiver=c(1)),
        CollectivePermute(**comm, send_peer=peer, recv_peer=back),
        Wait(request=request),
        Synchronize(stream=StreamValue(index=c(2))),
        Ternary(op=TernaryOpKind.WHERE, out=y, a=x, b=Const(value=1.5), c=y),
        Full(out=y, fill_value=Const(value=-2.5)),
        Iota(out=w, start=Symbol(name="n"), step=c(3), preallocated=True),
        Random(distribution=Distribution.UNIFORM, out=y, a=c(0), b=Const(value=2.0)),
        Random(distribution=Distribution.NORMAL, out=y, a=c(1), b=c(2), seed=i, offset=c(7)),
        IndexSelect(out=y, src=x, index=w, dim=1),
        GatherAlong(kind=GatherKind.GATHER, out=y, src=x, index=w, dim=0),
        GatherAlong(kind=GatherKind.TAKE_ALONG_AXIS, out=y, src=x, index=w, dim=1),
        Cumsum(out=y, src=x, dim=1, preallocated=True),
        TopK(values=y, indices=w, src=x, k=c(2), dim=0, largest=False, sorted=True),
        *attention_instructions(x, y, w),
        Reshape(out=y, src=x),
        Slice(out=y, src=x, dim=1, start=c(1), stop=Symbol(name="n")),
        Pad(out=y, src=x, dim=0, left=c(0), right=i, value=Const(value=-0.5), preallocated=True),
        Cat(out=y, lhs=x, rhs=w, dim=1),
        Argsort(out=w, src=x, dim=0, descending=True, stable=True),  # a class declare_op made
        ScatterAlong(kind=ScatterKind.SCATTER, out=y, arg=x, index=w, src=c(1.5), dim=1),
        ScatterAlong(kind=ScatterKind.SCATTER_ADD, out=y, arg=x, index=w, src=y, dim=0),
        IndexAdd(out=y, arg=x, index=w, src=y, dim=1, preallocated=True),
        Bincount(out=w, src=w, length=i),
        ToHost(out=HostValue(name="H0"), src=w),
        RaggedExchange(out=y, src=x, counts=w, extent=Symbol(name="n"), transpose=True),
        RaggedAllToAll(
            received=Symbol(name="m"), **comm, counts=HostValue(name="H0"), transpose=True
        ),
    )


def attention_instructions(x, y, w) -> tuple:
    """The attention and MoE instructions (hostir.ir.attention), their fields varied."""
    return (
        SdpaFwd(output=x, logsumexp=y, query=x, key=x, value=y),
        SdpaFwd(
            output=y, logsumexp=w, query=x, key=x, value=x, is_causal=True,
            scale=Const(value=0.25), preallocated=True,
        ),
        SdpaPhilox(out=y, result=PhiloxResult.OFFSET),
        SdpaBwd(
            grad_query=y, grad_key=x, grad_value=w, grad_output=x, query=x, key=y, value=x,
            output=x, logsumexp=w, is_causal=True,
        ),
        GroupedMm(out=y, mat1=x, mat2=y, offsets=w),
        EmbeddingFwd(out=y, input=w, weight=x, preallocated=True),
    )  # fmt: skip


def hand_built() -> HostIrContainer:
    """A program holding every catalog class (not meant to run, nor to verify: the codec
    reads it with ``read_document``)."""
    body = every_instruction()
    x = body[2].src
    inputs = (x, tensor("w", 3, 4, dtype=DType.INT32), ScalarInput(name="n", dtype=DType.INT64))
    return HostIrContainer(inputs=inputs, outputs=(body[1].out,), body=body)


def _shard(tv, mesh: DeviceMesh, dim: int, parallel_type=ParallelType.mesh_x) -> None:
    if tv.device_mesh is None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


def local_compute() -> FusionDefinition:
    """Every compute kind on one device, with int, float, bool and input scalars."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4))
        w = fd.define_tensor((3, 4))
        b = fd.define_tensor((3,))
        s = fd.define_scalar(dtype=DataType.Int)
        y = fd.ops.mul(fd.ops.linear(x, w, b), 0.5)
        y = fd.ops.div(fd.ops.sub(2, fd.ops.add(y, s)), True)
        y = fd.ops.where(fd.ops.gt(y, s), y, 1.5)
        y = fd.ops.cast(fd.ops.neg(fd.ops.relu(y)), DataType.Double)
        m = fd.ops.permute(fd.ops.matmul(y, fd.ops.cast(w, DataType.Double)), [1, 0])
        fd.add_output(fd.ops.sum(m, [1], keepdim=True))
        fd.add_output(fd.ops.set(x))
    return fd


def creation_indexing() -> FusionDefinition:
    """The creation, random, indexing and scan ops (frontend.creation_ops, indexing_ops)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        index = fd.define_tensor((4, 2), dtype=DataType.Int)
        seed = fd.define_scalar(dtype=DataType.Int)
        picks = fd.ops.iota(3, 1, 2)
        noise = fd.ops.uniform(0.0, 1.0, [4, 6], rng_seed=seed, rng_offset=seed)
        y = fd.ops.add(fd.ops.index_select(x, picks, 1), fd.ops.full([4, 3], 2.0, DataType.Float))
        fd.add_output(y)
        fd.add_output(fd.ops.gather(fd.ops.cumsum(x, 0), index, 1))
        fd.add_output(fd.ops.take_along_axis(fd.ops.normal(0.0, 1.0, [4, 6]), index, 1))
        fd.add_output(fd.ops.topk(noise, 2)[1])
    return fd


def walkthrough_ops() -> FusionDefinition:
    """The ops docs/extending.md's "Adding an op" adds: erf and argsort."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        fd.add_output(fd.ops.argsort(fd.ops.erf(x), 1, descending=True))
    return fd


def scatter_ops() -> FusionDefinition:
    """The MoE ops (hostir.ir.scatter_ops): scatter, scatter_add, index_add, bincount."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6))
        index = fd.define_tensor((2, 6), dtype=DataType.Int)
        rows = fd.define_tensor((2,), dtype=DataType.Int32)
        y = fd.ops.scatter_add(
            fd.ops.scatter(x, index, 0.5, 0), index, fd.ops.slice(x, [0, 0], [2, 6]), 0
        )
        fd.add_output(fd.ops.index_add(y, rows, fd.ops.slice(x, [0, 0], [4, 2]), 1))
        fd.add_output(fd.ops.bincount(rows, 6))
    return fd


def shape_ops() -> FusionDefinition:
    """The shape ops' instructions: reshape, slice, pad and cat."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((2, 6))
        y = fd.ops.reshape(fd.ops.slice(x, [0, 1], [2, 5]), [4, 2])
        fd.add_output(fd.ops.cat([fd.ops.pad(y, [1, 0]), fd.ops.neg(fd.ops.pad(y, [0, 1]))], 0))
    return fd


def resharding(source: tuple, target: tuple, shape=(8, 4)) -> Callable[[], FusionDefinition]:
    """``set`` from ``(devices, sharded dim or None)`` to another such placement."""

    def build() -> FusionDefinition:
        with FusionDefinition() as fd:
            x = fd.define_tensor(shape)
            y = fd.ops.set(x)
            fd.add_output(y)
        for tv, (devices, dim) in ((x, source), (y, target)):
            mesh = DeviceMesh(devices)
            if dim is None:
                tv.set_device_mesh(mesh)
            else:
                _shard(tv, mesh, dim)
        return fd

    return build


def reduction(target: str) -> Callable[[], FusionDefinition]:
    """A sum over the sharded dim: replicated (Allreduce), on one device (Reduce), or
    sharded (ReduceScatter)."""

    def build() -> FusionDefinition:
        mesh = DeviceMesh([0, 1, 2, 3])
        with FusionDefinition() as fd:
            x = fd.define_tensor((8, 12, 8))
            s = fd.ops.sum(x, [1])
            fd.add_output(s)
        _shard(x, mesh, 1)
        if target == "one":
            s.set_device_mesh(DeviceMesh([0]))
        else:
            s.set_device_mesh(mesh)
        if target == "sharded":
            _shard(s, mesh, 0)
        return fd

    return build


def stream_allgather(swizzle: bool) -> Callable[[], FusionDefinition]:
    """SPEC section 3: a stream-chunked all-gather feeding a column-parallel linear."""

    def build() -> FusionDefinition:
        mesh = DeviceMesh(torch.arange(4))
        with FusionDefinition() as fd:
            inp = fd.define_tensor((-1, 8))
            w = fd.define_tensor((16, 8))
            ag = fd.ops.set(inp)
            fd.add_output(fd.ops.linear(ag, w))
        for tv in (inp, w):
            _shard(tv, mesh, 0)
        ag.set_device_mesh(mesh)
        ag.outer_split(0, 4)
        if swizzle:
            ag.swizzle1d(0, ParallelType.mesh_x)
        ag.axis(0).parallelize(ParallelType.stream)
        return fd

    return build


def mesh_2d_all_to_all() -> FusionDefinition:
    """On a 2x2 mesh, dim 0 over mesh_y moves to dim 1; dim 2 stays over mesh_x."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6, 2))
        y = fd.ops.set(x)
        fd.add_output(y)
    _shard(x, mesh, 0, ParallelType.mesh_y)
    _shard(x, mesh, 3, ParallelType.mesh_x)
    y.set_device_mesh(mesh)
    _shard(y, mesh, 1, ParallelType.mesh_y)
    _shard(y, mesh, 3, ParallelType.mesh_x)
    return fd


def mesh_2x4_all_to_all_v() -> FusionDefinition:
    """On a 2x4 mesh, dim 0 over mesh_y and dim 1 over mesh_x trade places: the axes
    differ in size, so one AllToAllV (not a permutation)."""
    mesh = DeviceMesh(torch.arange(8).reshape(2, 4))
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 8))
        y = fd.ops.set(x)
        fd.add_output(y)
    _shard(x, mesh, 0, ParallelType.mesh_y)
    _shard(x, mesh, 2, ParallelType.mesh_x)
    y.set_device_mesh(mesh)
    _shard(y, mesh, 0, ParallelType.mesh_x)
    _shard(y, mesh, 2, ParallelType.mesh_y)
    return fd


def attention_ops() -> FusionDefinition:
    """sdpfa_fwd with every result used, sdpfa_bwd, grouped_mm and embedding_fwd."""
    with FusionDefinition() as fd:
        q = fd.define_tensor((1, 2, 4, 8), dtype=DataType.BFloat16)
        attention, logsumexp, seed, offset = fd.ops.sdpfa_fwd(q, q, q, is_causal=True)
        grads = fd.ops.sdpfa_bwd(q, q, q, q, attention, logsumexp, 0.0, True, seed, offset, 0.5)
        for out in (attention, logsumexp, seed, offset, *grads):
            fd.add_output(out)
        offsets = fd.define_tensor((2,), dtype=DataType.Int32)
        fd.add_output(
            fd.ops.grouped_mm(fd.define_tensor((6, 8)), fd.define_tensor((2, 8, 3)), offsets)
        )
        indices = fd.define_tensor((5,), dtype=DataType.Int)
        fd.add_output(fd.ops.embedding_fwd(indices, fd.define_tensor((7, 3))))
    return fd


FOUR = [0, 1, 2, 3]


def ragged_exchange() -> FusionDefinition:
    """Rows by run-time counts over 4 devices and back (to_host, RaggedAllToAll)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 3, 2))
        counts = fd.define_tensor((4, 4), dtype=DataType.Int)
        back = fd.ops.ragged_all_to_all(fd.ops.ragged_all_to_all(x, counts), counts, True, 3)
        fd.add_output(back)
    _shard(x, DeviceMesh(torch.arange(4)), 0)
    counts.set_device_mesh(DeviceMesh(torch.arange(4)))
    return fd


FUSIONS: dict[str, Callable[[], FusionDefinition]] = {
    "local_compute": local_compute,
    "attention_ops": attention_ops,
    "shape_ops": shape_ops,
    "allgather": resharding((FOUR, 0), (FOUR, None)),
    "all_to_all": resharding((FOUR, 0), (FOUR, 1)),
    "broadcast": resharding(([2], None), (FOUR, None)),
    "scatter": resharding(([1], None), (FOUR, 0)),
    "gather": resharding((FOUR, 1), ([3], None)),
    "send_recv": resharding(([0, 1], 0), ([2, 3], 0)),
    "local_shard": resharding((FOUR, None), (FOUR, 0)),
    "allreduce": reduction("replicated"),
    "reduce": reduction("one"),
    "reduce_scatter": reduction("sharded"),
    "stream_permute": stream_allgather(swizzle=True),
    "stream_broadcast": stream_allgather(swizzle=False),
    "mesh_2d_all_to_all": mesh_2d_all_to_all,
    "mesh_2x4_all_to_all_v": mesh_2x4_all_to_all_v,
    "creation_indexing": creation_indexing,
    "walkthrough_ops": walkthrough_ops,
    "scatter_ops": scatter_ops,
    "ragged_exchange": ragged_exchange,
}


def round_trip(program: HostIrContainer) -> HostIrContainer:
    """program -> JSON -> program through the codec alone (these programs need not be well
    formed: they exercise every field; ``from_json`` would verify them too)."""
    return json_format.read_document(program.to_json())


# ----- round trips -----


@pytest.mark.parametrize("name", FUSIONS)
def test_lowered_program_round_trips(name):
    """program -> JSON -> program gives an equal program, which writes the same JSON."""
    program = FUSIONS[name]().host_ir()  # also runs check_round_trip (conftest)
    document = program.to_json()
    again = HostIrContainer.from_json(document)
    assert again == program
    assert again.to_json() == document
    assert str(again) == str(program)
    assert check_round_trip(program) == program


def test_lowered_programs_cover_every_instruction():
    """The fusions above make lowering emit every catalog class."""
    seen = {type(i) for build in FUSIONS.values() for i in walk(build().host_ir().body)}
    seen.add(RaggedExchange)  # the frontend's form, which lowering replaces by what it runs
    missing = set(INSTRUCTIONS) - seen
    assert not missing, {c.__name__ for c in missing}


def test_every_catalog_class_has_a_json_tag_and_round_trips():
    """Catalog completeness: each instruction class is tagged by its name and comes back."""
    instructions = every_instruction()
    assert {type(i) for i in walk(instructions)} == set(INSTRUCTIONS)
    for cls in INSTRUCTIONS:
        assert json_format.NODES[cls.__name__] is cls
    for instruction in walk(instructions):
        program = HostIrContainer(inputs=(), outputs=(), body=(instruction,))
        document = json.loads(program.to_json())
        assert document["program"]["body"][0]["node"] == type(instruction).__name__
        assert round_trip(program) == program, type(instruction).__name__


def test_hand_built_program_round_trips():
    """Every node, enum and scalar kind at once: meshes, teams, partial axes, loops."""
    program = hand_built()
    assert round_trip(program) == program
    text = program.to_json()
    for enum_class in json_format.ENUM_CLASSES:
        assert f'"enum": "{enum_class.__name__}"' in text, enum_class


def test_node_tags_do_not_collide_with_field_names():
    """No IR class has a field named like the tags, so a tag is never mistaken for data."""
    for cls in json_format.NODE_CLASSES:
        assert not {f.name for f in dataclasses.fields(cls)} & {"node", "enum", "float"}, cls


@pytest.mark.parametrize("value", [0, 1, -7, 2**40, 1.0, 0.0, 0.5, -2.5e-3, 1e300, True, False])
def test_constants_keep_their_type(value):
    """``1``, ``1.0`` and ``True`` compare equal in Python; JSON keeps them apart."""
    program = HostIrContainer(
        inputs=(),
        outputs=(),
        body=(Binary(op=BinaryOpKind.MUL, out=tensor("o", 2), lhs=tensor("a", 2), rhs=c(value)),),
    )
    decoded = round_trip(program).body[0].rhs.value
    assert type(decoded) is type(value) and decoded == value


def test_lowered_constants_keep_their_type():
    """``mul(T, 0.5)``, ``sub(2, T)`` and ``div(T, true)`` read back as float, int and bool."""
    program = round_trip(local_compute().host_ir())
    constants = [
        operand.value
        for i in program.body
        if isinstance(i, Binary)
        for operand in (i.lhs, i.rhs)
        if isinstance(operand, Const)
    ]
    assert [type(v) for v in constants] == [float, int, bool]
    assert constants == [0.5, 2, True]


def test_to_json_is_deterministic():
    """Same program, same text; two lowerings of one fusion write identical documents;
    keys are the envelope's and then each node's fields in declaration order."""
    program = hand_built()
    assert program.to_json() == program.to_json()
    build = FUSIONS["stream_permute"]
    assert build().host_ir().to_json() == build().host_ir().to_json()
    text = program.to_json()
    assert text.startswith('{\n "format": "hostir",\n "version": 2,\n "program": {\n  "node"')
    document = json.loads(text)
    assert list(document) == ["format", "version", "program"]
    allgather = document["program"]["body"][3]
    assert list(allgather) == ["node"] + [f.name for f in dataclasses.fields(Allgather)]
    assert allgather["team"]["axes"] == [
        {"enum": "MeshAxis", "value": "y"},
        {"enum": "MeshAxis", "value": "x"},
    ]


# ----- refusals -----


def _document() -> dict:
    return json.loads(hand_built().to_json())


def _refusal(mutate: Callable[[dict], object]) -> str:
    document = _document()
    mutate(document)
    with pytest.raises(JsonFormatError) as info:
        json_format.read_document(json.dumps(document))
    return str(info.value)


def test_text_that_is_not_json_is_refused():
    with pytest.raises(JsonFormatError, match=r"the text is not JSON: Expecting .* line 1"):
        HostIrContainer.from_json('{"format": "hostir", ')
    with pytest.raises(JsonFormatError, match="expected an object with format, version and"):
        HostIrContainer.from_json("[1, 2]")


def test_refusals_are_verify_errors():
    """Callers that catch VerifyError (or HostIrError) catch malformed JSON too."""
    assert issubclass(JsonFormatError, VerifyError)
    with pytest.raises(VerifyError):
        HostIrContainer.from_json("not json")


def test_another_format_is_refused():
    message = _refusal(lambda d: d.update(format="onnx"))
    assert message == 'format: expected "hostir", got "onnx"'
    assert _refusal(lambda d: d.pop("format")) == 'format: expected "hostir", got no format'


@pytest.mark.parametrize("version", [3, 0, "1", 1.0, True, None])
def test_unknown_version_is_refused_naming_found_and_supported(version):
    message = _refusal(lambda d: d.update(version=version))
    assert message == (
        f"version: unsupported host IR JSON version {json.dumps(version)};"
        " this hostir reads version 1, 2"
    )


def test_missing_version_or_program_and_extra_keys_are_refused():
    assert _refusal(lambda d: d.pop("version")).startswith("version: missing; this hostir reads")
    assert _refusal(lambda d: d.pop("program")) == "program: missing"
    message = _refusal(lambda d: d.update(comment="hi"))
    assert (
        message == "unexpected top-level key(s) 'comment'; a document has format, version, program"
    )


def test_unknown_node_and_enum_tags_are_refused():
    message = _refusal(lambda d: d["program"]["body"][3].update(node="Allgather2"))
    assert message.startswith('program.body[3]: unknown node tag "Allgather2"; known tags: ')
    assert "CollectivePermute" in message
    message = _refusal(lambda d: d["program"]["body"][3]["team"]["axes"][0].update(enum="Axis"))
    assert message.startswith('program.body[3].team.axes[0]: unknown enum tag "Axis"')
    message = _refusal(lambda d: d["program"]["body"][3]["team"]["axes"][0].update(value="w"))
    assert message == (
        'program.body[3].team.axes[0]: "w" is not a MeshAxis; expected one of "x", "y", "z"'
    )


def test_untagged_objects_are_refused():
    message = _refusal(lambda d: d["program"]["body"][0]["out"].pop("node"))
    assert message == (
        'program.body[0].out: an object needs a "node", an "enum" or a "float" tag, got keys'
        " 'name', 'index'"
    )


def test_missing_and_extra_fields_are_refused():
    body = "program.body[3]"
    assert _refusal(lambda d: d["program"]["body"][3].pop("team")) == (
        f"{body}: Allgather lacks field(s) team"
    )
    # Defaults are written too, and a document must carry them.
    assert _refusal(lambda d: d["program"]["body"][3].pop("preallocated")) == (
        f"{body}: Allgather lacks field(s) preallocated"
    )
    assert _refusal(lambda d: d["program"]["body"][3].update(root=0, tag=1)) == (
        f"{body}: Allgather has no field(s) root, tag; its fields are out, src, team, axis,"
        " inner, request, preallocated"
    )


def test_values_of_the_wrong_type_are_refused_with_their_path():
    symbol = {"node": "Symbol", "name": "M0"}
    message = _refusal(lambda d: d["program"]["body"][3]["team"].update(mesh=symbol))
    assert message == "program.body[3].team.mesh: expected Mesh, got Symbol"
    message = _refusal(lambda d: d["program"]["body"][6]["lhs"].update(value="0.5"))
    assert message == 'program.body[6].lhs.value: expected int | float | bool, got str "0.5"'
    message = _refusal(lambda d: d["program"]["body"][3]["team"]["mesh"].update(table=[3, 1.0]))
    assert message == "program.body[3].team.mesh.table[1]: expected int, got float 1.0"
    message = _refusal(lambda d: d["program"]["body"][3].update(axis=True))
    assert message == "program.body[3].axis: expected int, got bool true"
    message = _refusal(lambda d: d["program"]["body"][3].update(inner=[]))
    assert message == "program.body[3].inner: expected Scalar | null, got a list of 0"
    message = _refusal(lambda d: d["program"]["body"][4].update(src=copy.deepcopy(symbol)))
    assert message == "program.body[4].src: expected TensorValue, got Symbol"
    message = _refusal(
        lambda d: d["program"]["body"][6].update(rhs={"node": "RequestValue", "name": "R"})
    )
    assert message == "program.body[6].rhs: expected TensorValue | Scalar, got RequestValue"
    loop = 20
    message = _refusal(lambda d: d["program"]["body"][loop]["body"].append(symbol))
    assert message == f"program.body[{loop}].body[5]: expected Instruction, got Symbol"
    message = _refusal(lambda d: d.update(program=symbol))
    assert message == "program: expected HostIrContainer, got Symbol"


def test_a_version_1_document_reads_its_meshes_as_device_lists():
    """Version 1 wrote meshes as ``devices`` and ``shape``; they read back as the same
    meshes (a layout where the devices follow one)."""
    program = HostIrContainer(
        inputs=(),
        outputs=(),
        body=tuple(i for i in every_instruction() if getattr(i, "team", None) is not None)[:2],
    )
    document = json.loads(program.to_json())
    document["version"] = 1

    def old_meshes(node):
        if isinstance(node, list):
            return [old_meshes(item) for item in node]
        if not isinstance(node, dict):
            return node
        if node.get("node") == "Mesh":
            if node["table"]:
                devices = node["table"]
            else:
                layout = Mesh(shape=node["shape"], strides=node["strides"], offset=node["offset"])
                devices = list(layout.devices)
            return {"node": "Mesh", "devices": devices, "shape": node["shape"]}
        return {key: old_meshes(value) for key, value in node.items()}

    assert json_format.read_document(json.dumps(old_meshes(document))) == program


def test_nodes_their_constructors_reject_are_refused_with_their_path():
    message = _refusal(lambda d: d["program"]["body"][3]["team"]["mesh"].update(table=[0, 0, 1, 2]))
    assert message == "program.body[3].team.mesh: mesh devices must be distinct, got [0, 0, 1, 2]"
    axis_z = {"enum": "MeshAxis", "value": "z"}
    message = _refusal(lambda d: d["program"]["body"][3]["team"]["axes"].append(axis_z))
    assert message == "program.body[3].team: mesh axis z does not exist in a 2-d mesh"


def test_to_json_refuses_what_is_not_a_host_ir_node():
    program = dataclasses.replace(hand_built(), outputs=[tensor("y", 2)])
    with pytest.raises(
        JsonFormatError, match=r"^program.outputs: list \[.*\] is not a host IR node"
    ):
        program.to_json()


def test_check_round_trip_checks_the_json_form(monkeypatch):
    """A JSON reader that loses something fails check_round_trip with a diff."""
    program = FUSIONS["allgather"]().host_ir()
    original = json_format.from_json

    def lossy(text: str) -> HostIrContainer:
        decoded = original(text)
        return dataclasses.replace(decoded, body=decoded.body[:-1])

    monkeypatch.setattr(json_format, "from_json", lossy)
    with pytest.raises(
        VerifyError, match="the program read back from its JSON form differs"
    ) as info:
        check_round_trip(program)
    removed = [line[1:].strip() for line in str(info.value).splitlines() if line[:1] == "-"]
    assert '"node": "Wait",' in removed


# ----- constants JSON has no number for, and documents that do not fit ----------------


def _strict_json(text: str):
    """``text`` read as standard JSON: bare NaN and Infinity refused."""

    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "value",
    [math.inf, -math.inf, math.nan, 0.1, 1e300, -0.0, 2**63 - 1, -(2**63), 2**64, 2**100],
    ids=repr,
)
def test_every_constant_round_trips_as_standard_json(value):
    """Non-finite floats used to be written as bare NaN/Infinity (not JSON); they are
    ``{"float": ...}`` objects now, and every constant reads back as itself."""
    program = HostIrContainer(
        inputs=(),
        outputs=(),
        body=(Binary(op=BinaryOpKind.MUL, out=tensor("o", 2), lhs=tensor("a", 2), rhs=c(value)),),
    )
    document = program.to_json()
    rhs = _strict_json(document)["program"]["body"][0]["rhs"]["value"]
    if isinstance(value, float) and not math.isfinite(value):
        assert rhs == {"float": repr(value)}
    decoded = round_trip(program)
    assert decoded == program
    assert type(decoded.body[0].rhs.value) is type(value)
    assert repr(decoded.body[0].rhs.value) == repr(value)  # -0.0 keeps its sign


def test_a_program_with_non_finite_constants_runs_the_same_after_json():
    """Read back from JSON (verified), ``x * inf + nan`` computes what torch does."""
    text = (
        "%HostIrContainer {\n  input T0 : float32[4]\n  T1 : float32[4] = mul(T0, -inf)\n"
        "  T2 : float32[4] = add(T1, nan)\n  T3 : float32[4] = add(T0, 1e+300)\n"
        "  output T2\n  output T3\n}\n"
    )
    program = HostIrContainer.from_json(parse(text).to_json())
    x = torch.randn(4)
    got = HostIrEvaluator(program).run([x])
    torch.testing.assert_close(got[0], x * -math.inf + math.nan, equal_nan=True)
    torch.testing.assert_close(got[1], x + 1e300)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "hostir", "version": NaN}', "the text is not standard JSON: NaN;"),
        ('{"format": "hostir", "version": -Infinity}', "not standard JSON: -Infinity"),
        ('{"format": "hostir", "version": 1e400}', "the number 1e400 does not fit a float64"),
        ('{"format": "hostir", "version": ' + "9" * 4301 + "}", "at most 4300 digits, got 4301"),
        ("[" * 100_000 + "]" * 100_000, "the JSON nests deeper than 196 levels"),
        ('{"a": ' * 197 + "1" + "}" * 197, "the JSON nests deeper than 196 levels"),
    ],
    ids=["NaN", "-Infinity", "1e400", "huge int", "deep lists", "deep objects"],
)
def test_documents_json_cannot_carry_are_refused(text, message):
    """Each used to be read (NaN, 1e400 as infinity) or to raise a bare ValueError or
    RecursionError."""
    with pytest.raises(JsonFormatError, match=re.escape(message)):
        HostIrContainer.from_json(text)


@pytest.mark.parametrize("document", [{}, None, 3, ["{}"]], ids=repr)
def test_anything_but_text_or_bytes_is_refused(document):
    """``HostIrContainer.from_json({})`` used to raise a TypeError from ``json.loads``."""
    with pytest.raises(JsonFormatError, match=r"^expected the text of a JSON document \(str"):
        HostIrContainer.from_json(document)


def test_a_non_finite_float_object_must_be_one_of_three():
    message = _refusal(
        lambda d: d["program"]["body"][6].update(rhs={"node": "Const", "value": {"float": "+inf"}})
    )
    assert message.startswith('program.body[6].rhs.value: a non-finite float is {"float": "inf"}')


_EXTENT_TEXT = (
    "%HostIrContainer {\n  mesh M0 = [2] : [1]\n"
    "  input T0 : float32[8, 3] @M0 {0: [x, 4]}\n  output T0\n}\n"
)


@pytest.mark.parametrize(
    ("bad", "shown"),
    [(8.5, "8.5"), ({"float": "nan"}, "nan"), ({"float": "inf"}, "inf"), (-8, "-8")]
    + [(True, "true")],
    ids=repr,
)
@pytest.mark.parametrize("where", ["shape", "sharding"])
def test_extents_that_are_not_whole_numbers_are_refused(bad, shown, where):
    """An extent of 8.5, NaN or infinity used to be read and truncated when run."""
    document = json.loads(parse(_EXTENT_TEXT).to_json())
    value = document["program"]["inputs"][0]
    if where == "shape":
        value["shape"][1]["value"] = bad
        path, dim = "program.inputs[0].shape[1]", "T0 dim 1"
    else:
        value["sharding"]["dims"][0][1]["extent"]["value"] = bad
        path, dim = "program.inputs[0].sharding.dims[0][1].extent", "T0 dim 0's sharding"
    with pytest.raises(JsonFormatError) as info:
        HostIrContainer.from_json(json.dumps(document))
    assert str(info.value) == f"{path}: {dim}: an extent must be a whole number >= 0, got {shown}"


def test_an_axis_part_must_have_its_axis_size():
    """Text writes a mesh axis part by its name; a JSON one with another extent would
    read back as a different program."""
    document = json.loads(parse(_EXTENT_TEXT).to_json())
    document["program"]["inputs"][0]["sharding"]["dims"][0][0]["extent"]["value"] = 3
    with pytest.raises(JsonFormatError, match=r"T0 dim 0: its part on mesh axis x has extent 3"):
        HostIrContainer.from_json(json.dumps(document))


def test_deeply_nested_programs_are_refused_by_name():
    """33 nested loops, or an expression 150 operators deep, are refused (by the verifier,
    at their JSON path, or as too deeply nested), never with a RecursionError."""
    body: tuple = ()
    for k in reversed(range(33)):
        body = (ForLoop(index=Symbol(name=f"i{k}"), start=c(0), stop=c(1), body=body),)
    loops = HostIrContainer(inputs=(), outputs=(), body=body)
    with pytest.raises(JsonFormatError, match=r"^program(\.body\[0\]){33}: loops nest deeper"):
        HostIrContainer.from_json(loops.to_json())
    stop = c(1)
    for _ in range(150):
        stop = BinaryExpr(op=ScalarOp.ADD, lhs=stop, rhs=c(1))
    deep = HostIrContainer(
        inputs=(),
        outputs=(),
        body=(ForLoop(index=Symbol(name="i"), start=c(0), stop=stop, body=()),),
    )
    with pytest.raises(JsonFormatError, match="nests deeper than"):
        HostIrContainer.from_json(deep.to_json())


_JUNK = [None, True, 0, -1, 2**70, 1.5, "x", [], {}, [[1]], {"node": "Const"}, {"float": "nan"}]
_JUNK += [{"enum": "DType", "value": [1]}, {"node": ["x"]}, {"node": "Symbol", "name": "inf"}]
_JUNK += [{"node": "Mesh", "shape": [2], "strides": [10**30], "offset": -5, "table": []}]
_JUNK += [{"node": "Mesh", "devices": [0, 1]}, [[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]] * 10]


def _paths(data, path=()):
    yield path
    if isinstance(data, dict | list):
        for key, value in data.items() if isinstance(data, dict) else enumerate(data):
            yield from _paths(value, (*path, key))


def test_mangled_documents_raise_only_host_ir_errors():
    """A field of the hand-built program's document (any depth) replaced by junk or
    deleted, read as version 2 and 1: a program or a HostIrError, never a bare exception
    (a version-1 mesh without its shape used to raise KeyError)."""
    base = _document()
    paths = [p for p in _paths(base) if p]
    rng = random.Random(0)
    for _ in range(100):
        document, path = copy.deepcopy(base), rng.choice(paths)
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if rng.random() < 0.2:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(_JUNK))
        for version in (2, 1):
            if isinstance(document, dict) and "version" in document:
                document["version"] = version
            try:
                HostIrContainer.from_json(json.dumps(document))
            except HostIrError:
                pass


def test_documents_of_one_instruction_per_result_are_refused_by_name():
    """``topk``, ``sdpfa_fwd`` and ``sdpfa_bwd`` were one instruction per result (an ``out``
    and a ``result`` naming it, of the enums ``TopKResult``, ``SdpaFwdResult`` and
    ``SdpaBwdResult``); they are one instruction defining every result now. A document
    written before is refused, naming the fields and the enum (docs/design.md)."""
    program = parse(
        "%HostIrContainer {\n  input T0 : float32[4, 9]\n"
        "  T1 : float32[4, 3], T2 : int64[4, 3] = topk(T0, k=3, dim=1, largest=true,"
        " sorted=false)\n  output T1\n}\n"
    )
    document = json.loads(program.to_json())
    node = document["program"]["body"][0]
    old = {key: value for key, value in node.items() if key not in ("values", "indices")}
    old = {"node": "TopK", "out": node["values"], **old}
    old["result"] = {"enum": "TopKResult", "value": "values"}
    document["program"]["body"][0] = old
    with pytest.raises(JsonFormatError) as info:
        json_format.read_document(json.dumps(document))
    assert str(info.value) == ("program.body[0]: TopK lacks field(s) values, indices"), info.value
    del old["out"]
    old.update(values=node["values"], indices=node["indices"])
    with pytest.raises(JsonFormatError, match=r"TopK has no field\(s\) result; its fields are"):
        json_format.read_document(json.dumps(document))
    old.pop("result")
    old["largest"] = {"enum": "SdpaFwdResult", "value": "output"}
    with pytest.raises(JsonFormatError, match='unknown enum tag "SdpaFwdResult"'):
        json_format.read_document(json.dumps(document))
