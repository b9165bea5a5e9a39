"""AllToAllV: hand-built programs run on 1, 4 and 8 ranks against torch, its text, JSON and
traffic picture, the pure piece pattern, and the errors for layouts it cannot serve.

Every rank draws the same global tensor, feeds its own block of it and checks
its output against the block of the single-device reference (bitwise: the
instruction only copies, and sums in a fixed order).
"""

from __future__ import annotations

import re

import pytest
import torch

from hostir import (
    Allocate,
    AllToAllV,
    Const,
    DType,
    EvaluationError,
    HostIrContainer,
    HostIrEvaluator,
    LocalCommunicator,
    Mesh,
    MeshAxis,
    PartialAxis,
    RaceChecker,
    ReduceOp,
    RequestValue,
    SelfChecks,
    Sharding,
    ShardPart,
    Team,
    TensorValue,
    Wait,
    parse,
    slice_global_tensor,
    to_dot,
    to_traffic_dot,
)
from hostir.analysis.boxes import Operand, block_box
from hostir.analysis.exchange_buffers import round_buffers
from hostir.analysis.member_exchanges import group_pieces, member_exchange
from hostir.check.verify import verify
from hostir.errors import HostIrError
from hostir.run.all_to_all_v import _flat_run

MESHES = {
    "1": Mesh(devices=(0,), shape=(1,)),
    "4": Mesh(devices=(0, 1, 2, 3), shape=(4,)),
    "2x2": Mesh(devices=(0, 1, 2, 3), shape=(2, 2)),
    "2x4": Mesh(devices=tuple(range(8)), shape=(2, 4)),
    "2x2x2": Mesh(devices=tuple(range(8)), shape=(2, 2, 2)),
}


def value(name: str, mesh: Mesh, shape: tuple[int, ...], dims=None, partial=None) -> TensorValue:
    """A float32 value on ``mesh``: ``dims`` maps a dim to its parts (axis names and local
    extents, ``["y", 4]``), ``partial`` an axis name to its op name; unlisted dims whole."""
    parts = []
    for d, extent in enumerate(shape):
        given = (dims or {}).get(d, [extent])
        parts.append(
            tuple(
                ShardPart(axis=MeshAxis(p), extent=Const(value=mesh.axis_size(MeshAxis(p))))
                if isinstance(p, str)
                else ShardPart(axis=None, extent=Const(value=p))
                for p in given
            )
        )
    sharding = Sharding(
        mesh=mesh,
        dims=tuple(parts),
        partial=tuple(
            PartialAxis(axis=MeshAxis(a), op=ReduceOp(op)) for a, op in (partial or {}).items()
        ),
    )
    return TensorValue(
        name=name,
        dtype=DType.FLOAT32,
        shape=tuple(Const(value=e) for e in shape),
        sharding=sharding,
    )


# name: (world size, mesh, shape, src dims, src partial, out dims, team axes, op)
CASES = {
    # (a) dim 0 over y and dim 1 over x -> dim 0 over x and dim 1 over y
    "transpose_2x2": (4, "2x2", (4, 6), {0: ["y", 2], 1: ["x", 3]}, None,
                      {0: ["x", 2], 1: ["y", 3]}, "yx", None),
    "transpose_2x4": (8, "2x4", (8, 8), {0: ["y", 4], 1: ["x", 2]}, None,
                      {0: ["x", 2], 1: ["y", 4]}, "yx", None),
    # (b) dim 0 over x -> dim 0 over y, the target replicated over x
    "x_to_y_2x2": (4, "2x2", (4, 3), {0: ["x", 2]}, None, {0: ["y", 2]}, "yx", None),
    "x_to_y_2x4": (8, "2x4", (8, 3), {0: ["x", 2]}, None, {0: ["y", 4]}, "yx", None),
    # (c) partial sums over one axis, dim 0 over another -> dim 0 over both, nested anew
    "partial_2x2": (4, "2x2", (8, 4), {0: ["x", 4]}, {"y": "sum"}, {0: ["y", "x", 2]}, "yx",
                    ReduceOp.SUM),
    "partial_2x2x2": (8, "2x2x2", (16, 16), {0: ["x", 8]}, {"z": "sum"}, {0: ["z", "x", 4]},
                      "zyx", ReduceOp.SUM),
    "partial_max_2x2": (4, "2x2", (8, 4), {0: ["x", 4]}, {"y": "max"}, {0: ["y", "x", 2]},
                        "yx", ReduceOp.MAX),
    # columns to rows on a 1-d mesh: each rank's sends are row slabs around its own piece
    "columns_to_rows_4": (4, "4", (8, 4), {1: ["x", 1]}, None, {0: ["x", 2]}, "x", None),
    # (d) nothing moves between ranks
    "alone": (1, "1", (4, 3), {0: ["x", 4]}, None, {}, "x", None),
}  # fmt: skip


def build(
    name: str, preallocated: bool = False, rounds: int | None = None
) -> tuple[HostIrContainer, AllToAllV]:
    """The program ``src -> AllToAllV -> wait`` of case ``name``."""
    _, mesh_name, shape, src_dims, partial, out_dims, axes, op = CASES[name]
    mesh = MESHES[mesh_name]
    src = value("T0", mesh, shape, src_dims, partial)
    out = value("T1", mesh, shape, out_dims)
    team = Team(mesh=mesh, axes=tuple(MeshAxis(a) for a in axes))
    request = RequestValue(name="R0")
    instruction = AllToAllV(
        out=out,
        src=src,
        team=team,
        request=request,
        op=op,
        rounds=rounds,
        preallocated=preallocated,
    )
    body = ((Allocate(out=out),) if preallocated else ()) + (instruction, Wait(request=request))
    return HostIrContainer(inputs=(src,), outputs=(out,), body=body), instruction


def inputs_and_expected(name: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's input block and the block of the reference it must end with."""
    _, mesh_name, shape, *_ = CASES[name]
    program, instruction = build(name)
    src, out = instruction.src.sharding, instruction.out.sharding
    generator = torch.Generator().manual_seed(7)
    if not src.partial:
        full = torch.randn(shape, generator=generator)
        given = slice_global_tensor(full, src, rank)
    else:
        # One tensor of partial values per coordinate of the partial axis, reduced in
        # coordinate order: the order AllToAllV combines them in.
        (axis,) = (p.axis for p in src.partial)
        parts = [torch.randn(shape, generator=generator) for _ in range(src.mesh.axis_size(axis))]
        combine = {ReduceOp.SUM: torch.add, ReduceOp.MAX: torch.maximum}[src.partial[0].op]
        full = parts[0]
        for part in parts[1:]:
            full = combine(full, part)
        given = slice_global_tensor(parts[src.mesh.coordinate(rank, axis)], src, rank)
    return given, slice_global_tensor(full, out, rank)


def check_case(name: str, rank: int, preallocated: bool = False, communicator=None) -> None:
    program, _ = build(name, preallocated)
    given, expected = inputs_and_expected(name, rank)
    evaluator = HostIrEvaluator(program, listeners=[RaceChecker()], communicator=communicator)
    (out,) = evaluator.run([given])
    assert torch.equal(out, expected), f"{name} on rank {rank}:\n{out}\nexpected\n{expected}"


def cases_of(size: int) -> list[str]:
    return [name for name, case in CASES.items() if case[0] == size]


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("name", cases_of(4))
@pytest.mark.parametrize("preallocated", [False, True])
def test_four_ranks(multidevice_test, name, preallocated):
    """(a), (b), (c) on a 2x2 mesh and columns to rows on 4 ranks, into a fresh or an
    allocated out."""
    check_case(name, multidevice_test.rank, preallocated)


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("name", cases_of(4))
def test_rounds_give_the_same_bits(multidevice_test, name):
    """``rounds=k`` makes k alltoallv calls (one per round, each moving a slab of every
    piece) and ends with exactly the bits of one call, partial sums included."""
    from tests.multidevice_simulated import communicator_class, new_communicator

    calls = []

    class Counting(communicator_class()):
        def all_to_all_v(self, *args, **kwargs):
            calls.append(args[2])
            return super().all_to_all_v(*args, **kwargs)

    rank = multidevice_test.rank
    given, expected = inputs_and_expected(name, rank)
    for rounds in (2, 3):
        calls.clear()
        program, _ = build(name, rounds=rounds)
        assert f"rounds={rounds}" in str(program)
        # One run per call (checks=SelfChecks(): no compiled check's twin making calls too)
        evaluator = HostIrEvaluator(
            program,
            listeners=[RaceChecker()],
            communicator=new_communicator(Counting),
            checks=SelfChecks(),
        )
        (out,) = evaluator.run([given])
        assert torch.equal(out, expected), f"{name}, {rounds} rounds, rank {rank}"
        assert len(calls) == rounds


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("name", cases_of(4))
def test_rounds_share_one_workspace_of_the_modelled_size(multidevice_test, name):
    """Every call of an exchange packs and receives in one workspace, allocated once:
    buffers of their own per round would briefly coexist, as gloo's worker thread drops a
    finished call's buffers after the caller's wait returns. Its size is exactly what the
    planner's memory model counts (``round_buffers``), and the bits are the reference's."""
    from tests.multidevice_simulated import communicator_class, new_communicator

    storages = []

    class Spy(communicator_class()):
        def all_to_all_v(self, out, inp, out_splits, in_splits, group):
            storages.extend([inp.untyped_storage(), out.untyped_storage()])
            return super().all_to_all_v(out, inp, out_splits, in_splits, group)

    rank = multidevice_test.rank
    given, expected = inputs_and_expected(name, rank)
    for rounds in (1, 2, 3):
        storages.clear()
        program, instruction = build(name, rounds=rounds)
        evaluator = HostIrEvaluator(  # one run per call: no twin's buffers
            program,
            listeners=[RaceChecker()],
            communicator=new_communicator(Spy),
            checks=SelfChecks(),
        )
        (out,) = evaluator.run([given])
        assert torch.equal(out, expected), f"{name}, {rounds} rounds, rank {rank}"
        own = {given.untyped_storage().data_ptr(), out.untyped_storage().data_ptr()}
        workspaces = {s.data_ptr(): s.nbytes() for s in storages if s.data_ptr() not in own}
        reduced = instruction.op is not None
        exchange = member_exchange(
            Operand("T0", instruction.src.sharding, given_shape(instruction.src)),
            Operand("T1", instruction.out.sharding, given_shape(instruction.out)),
            instruction.team,
            rank,
            reduced,
        )
        modelled = round_buffers(exchange, rounds, reduced) * given.element_size()
        assert len(workspaces) <= 1, f"{name}, {rounds} rounds: {len(workspaces)} workspaces"
        assert sum(workspaces.values()) == modelled, f"{name}, {rounds} rounds, rank {rank}"


def given_shape(value: TensorValue) -> tuple[int, ...]:
    """The global shape of a value of these programs (constant extents)."""
    return tuple(extent.value for extent in value.shape)


def test_verifier_refuses_no_rounds():
    program, _ = build("transpose_2x2", rounds=0)
    with pytest.raises(HostIrError, match=r"AllToAllV of T0 has rounds=0; expected 1 or more"):
        verify(program)


@pytest.mark.world_sizes(8)
@pytest.mark.parametrize("name", cases_of(8))
def test_eight_ranks(multidevice_test, name):
    """(a) and (b) on a 2x4 mesh, (c) on a 2x2x2 mesh."""
    check_case(name, multidevice_test.rank)


@pytest.mark.world_sizes(1)
def test_no_remote_piece_posts_nothing(multidevice_test):
    """(d) A rank that keeps all it needs copies locally; the communicator is not called."""

    class Refusing(LocalCommunicator):
        def all_to_all_v(self, *args, **kwargs):
            raise AssertionError("all_to_all_v called without a remote piece")

    check_case("alone", 0, communicator=Refusing())


@pytest.mark.world_sizes(4)
def test_row_slabs_are_sent_and_received_in_place(multidevice_test):
    """The send buffer is a view of src when the pieces are consecutive row slabs (the kept
    slab passing through the call when it lies between two sent ones); the receive buffer is
    a view of out when the received pieces are."""
    from tests.multidevice_simulated import communicator_class, new_communicator

    seen = []

    class Spy(communicator_class()):
        def all_to_all_v(self, out, inp, out_splits, in_splits, group):
            seen.append(
                (inp.untyped_storage().data_ptr(), out.untyped_storage().data_ptr(), in_splits)
            )
            return super().all_to_all_v(out, inp, out_splits, in_splits, group)

    rank = multidevice_test.rank
    # Columns to rows: src [8, 1] sends rows 2d:2d+2 to rank d, so every rank's sends are
    # one range of src; out [2, 4] receives column pieces (strided: unpacked at wait).
    given, expected = inputs_and_expected("columns_to_rows_4", rank)
    # One run per call (no self-checks): the buffers seen last are this run's.
    program = build("columns_to_rows_4")[0]
    (out,) = HostIrEvaluator(program, communicator=new_communicator(Spy), checks=SelfChecks()).run(
        [given]
    )
    assert torch.equal(out, expected)
    sent, landed, _ = seen.pop()
    assert sent == given.untyped_storage().data_ptr()
    assert landed != out.untyped_storage().data_ptr()
    # x to y on 2x2: ranks 1 and 2 receive their whole block from ranks 2 and 3 (the
    # replicas their coordinates pick), straight into out; ranks 2 and 3 send their whole
    # src; ranks 0 and 3 keep their block, and ranks 0 and 1 send nothing.
    given, expected = inputs_and_expected("x_to_y_2x2", rank)
    program = build("x_to_y_2x2")[0]
    (out,) = HostIrEvaluator(program, communicator=new_communicator(Spy), checks=SelfChecks()).run(
        [given]
    )
    assert torch.equal(out, expected)
    sent, landed, in_splits = seen.pop()
    if rank in (2, 3):
        assert sent == given.untyped_storage().data_ptr()
    if rank in (1, 2):
        assert landed == out.untyped_storage().data_ptr()
    if rank in (0, 1):
        assert sum(in_splits) == 0


# ----- text, JSON, pictures -----


TEXT = {
    ("transpose_2x4", False): (
        "  T1 : float32[8, 8] @M0 {0: [x, 2], 1: [y, 4]}, R0 = AllToAllV(T0, team=M0(y, x))\n"
    ),
    ("partial_2x2x2", False): (
        "  T1 : float32[16, 16] @M0 {0: [z, x, 4]}, R0 = AllToAllV(T0, team=M0(z, y, x), op=sum)\n"
    ),
    ("transpose_2x2", True): "  R0 = AllToAllV(T0, team=M0(y, x), out=T1)\n",
}


@pytest.mark.parametrize("name, preallocated", list(TEXT))
def test_text_and_json_round_trip(name, preallocated):
    """Printed like the other collectives (``op=`` when set, ``out=`` when preallocated);
    the text parses back and the JSON reads back to the same program."""
    program, _ = build(name, preallocated)
    text = str(program)
    assert TEXT[name, preallocated] in text
    assert parse(text) == program
    assert str(parse(text)) == text
    assert HostIrContainer.from_json(program.to_json()) == program


def test_parser_refuses_unknown_arguments():
    text = str(build("transpose_2x2")[0]).replace("team=M0(y, x))", "team=M0(y, x), axis=0)")
    with pytest.raises(Exception, match="AllToAllV has no argument axis"):
        parse(text)


def test_pictures_show_the_pieces():
    """A hexagon in the program view; in the traffic view an arrow per remote piece,
    labelled with its box of the global tensor."""
    program, _ = build("x_to_y_2x2")
    assert "shape=hexagon" in to_dot(program).source
    traffic = to_traffic_dot(program).source
    # (y, x) receives rows 2y:2y+2 from the replica (y + x mod 2, y): 2 -> 1 and 3 -> 2.
    assert "rank2:e -> rank1:s" in traffic and "T0 [0:2, 0:3]" in traffic
    assert "T0 [2:4, 0:3]" in traffic
    assert len(re.findall(r"rank\d+:\w+ -> rank", traffic)) == 2
    partial = to_traffic_dot(build("partial_2x2")[0]).source
    assert "(sum)" in partial


# ----- the pattern, pure -----


def operand(name: str, mesh: str, shape, dims=None, partial=None) -> Operand:
    tv = value(name, MESHES[mesh], shape, dims, partial)
    return Operand(name, tv.sharding, shape)


def test_block_boxes():
    """Per dim, offset = linear index over the dim's axes (outer first) * local extent."""
    sharding = value("T", MESHES["2x4"], (8, 8), {0: ["x", "y", 1]}).sharding
    # rank 6 is (y=1, x=2): index x*2 + y = 5 along dim 0; dim 1 whole.
    assert block_box(sharding, (8, 8), 6) == ((5, 1), (0, 8))
    sharding = value("T", MESHES["2x4"], (4, 8), {1: ["y", 4]}).sharding
    assert block_box(sharding, (4, 8), 6) == ((0, 4), (4, 4))


def test_pattern_picks_one_source_per_piece():
    """Each receiver gets each needed block once, from itself when it holds a replica;
    otherwise from the replica its coordinates pick (free index shifted by keyed index),
    so the replicas share the sending."""
    group = tuple(range(8))
    team = Team(mesh=MESHES["2x4"], axes=(MeshAxis.Y, MeshAxis.X))
    src = operand("T0", "2x4", (8, 3), {0: ["x", 2]})
    out = operand("T1", "2x4", (8, 3), {0: ["y", 4]})
    pieces = group_pieces(src, out, team, group, False)
    for d in group:
        y, x = divmod(d, 4)
        got = sorted((p.box[0][0], p.source) for p in pieces if p.destination == d)
        # (y, x) needs rows 4y:4y+4: the x-blocks 2y and 2y + 1 (2 rows each), held by
        # (0, b) and (1, b); it holds block x itself.
        assert [row for row, _ in got] == [4 * y, 4 * y + 2]
        for row, source in got:
            block = row // 2
            assert source % 4 == block
            if x == block:
                assert source == d
    sends = [sum(1 for p in pieces if p.source == s and p.destination != s) for s in group]
    # Row y's 4 members need blocks 2y, 2y+1: 6 remote pieces, 4 replicas of them.
    assert max(sends) == 2 and sum(sends) == 12


def test_partial_sources_are_one_per_coordinate():
    team = Team(mesh=MESHES["2x2x2"], axes=(MeshAxis.Z, MeshAxis.Y, MeshAxis.X))
    src = operand("T0", "2x2x2", (16, 16), {0: ["x", 8]}, {"z": "sum"})
    out = operand("T1", "2x2x2", (16, 16), {0: ["z", "x", 4]})
    pieces = group_pieces(src, out, team, tuple(range(8)), True)
    for d in range(8):
        sources = [p.source for p in pieces if p.destination == d]
        assert len(sources) == 2  # one per z
        assert {s // 4 for s in sources} == {0, 1}
        z, x = d // 4, d % 2
        assert all(s % 2 == z for s in sources)  # they hold 8-block z (x = z)
        if x == z:
            assert d in sources  # its own partial value is read in place
    sends = [sum(1 for p in pieces if p.source == s != p.destination) for s in range(8)]
    assert max(sends) <= 2


def test_flat_run_is_a_view_only_for_consecutive_ranges():
    base = torch.arange(24.0).reshape(6, 4)
    run = _flat_run(base, [base[0:2], base[2:5]])
    assert run is not None and run.data_ptr() == base.data_ptr() and run.numel() == 20
    assert _flat_run(base, [base[0:2], base[3:5]]) is None  # a gap
    assert _flat_run(base, [base[3:5], base[0:2]]) is None  # out of order
    assert _flat_run(base, [base[:, 0:2]]) is None  # strided
    assert _flat_run(base, []) is None


# ----- errors -----


def test_cyclic_source_is_refused():
    team = Team(mesh=MESHES["4"], axes=(MeshAxis.X,))
    src = operand("T0", "4", (8, 2), {0: [2, "x"]})
    out = operand("T1", "4", (8, 2))
    with pytest.raises(EvaluationError, match=r"T0: dim 0 is not laid out in blocks"):
        group_pieces(src, out, team, (0, 1, 2, 3), False)


def test_uncovered_out_is_refused():
    """Over M0(x) only, rank (y, x) cannot get rows held by y != x."""
    team = Team(mesh=MESHES["2x2"], axes=(MeshAxis.X,))
    src = operand("T0", "2x2", (4, 3), {0: ["y", 2]})
    out = operand("T1", "2x2", (4, 3), {0: ["x", 2]})
    message = r"the T1 block \[2:4, 0:3\] of rank 1 needs 6 elements, but the T0 blocks"
    with pytest.raises(EvaluationError, match=message):
        group_pieces(src, out, team, (0, 1), False)


def test_partial_source_needs_an_op():
    team = Team(mesh=MESHES["2x2"], axes=(MeshAxis.Y, MeshAxis.X))
    src = operand("T0", "2x2", (8, 4), {0: ["x", 4]}, {"y": "sum"})
    out = operand("T1", "2x2", (8, 4), {0: ["y", "x", 2]})
    with pytest.raises(EvaluationError, match=r"T0 is partial over y .* needs an op"):
        group_pieces(src, out, team, (0, 1, 2, 3), False)
    with pytest.raises(EvaluationError, match=r"team M0\(x\)|does not span"):
        group_pieces(src, out, Team(mesh=src.sharding.mesh, axes=(MeshAxis.X,)),
                            (0, 1), True)  # fmt: skip


@pytest.mark.world_sizes(1)
def test_evaluator_reports_a_non_block_layout(multidevice_test):
    """At run time the error names the instruction and the value."""
    mesh = MESHES["1"]
    src = value("T0", mesh, (4, 3), {0: [4, "x"]})
    out = value("T1", mesh, (4, 3))
    request = RequestValue(name="R0")
    instruction = AllToAllV(
        out=out, src=src, team=Team(mesh=mesh, axes=(MeshAxis.X,)), request=request
    )
    program = HostIrContainer(
        inputs=(src,), outputs=(out,), body=(instruction, Wait(request=request))
    )
    with pytest.raises(EvaluationError, match="T0: dim 0 is not laid out in blocks"):
        HostIrEvaluator(program).run([torch.zeros(4, 3)])
