"""Stream loops: chunked compute overlapped with per-chunk communication.

Checked at 1, 2 and 4 ranks against torch, with the torch profiler counting the
ops and gloo events each rank runs.
"""

from __future__ import annotations

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir.errors import SettingError
from hostir.run.context import Listener
from hostir.run.evaluator import HostIrEvaluator
from hostir.run.race_checker import RaceChecker
from hostir.run.stream_pool import DEFAULT_STREAMS, stream_count
from lowering import LoweringError

STREAMS = 3
HIDDEN = 4


def profile(fd: FusionDefinition, inputs: list) -> tuple[list, list]:
    """Runs ``fd`` once to warm up, then once under the profiler; (outputs, events)."""
    fd.execute(inputs)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        outputs = fd.execute(inputs)
    return outputs, list(prof.events())


def count(events: list, prefix: str) -> int:
    """Number of events whose name starts with ``prefix``."""
    return sum(1 for event in events if event.name.startswith(prefix))


def row_parallel(d: int, streams: int) -> tuple[FusionDefinition, list]:
    """``x @ w.T`` with the contraction over mesh_x and the tokens in stream chunks."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4 * HIDDEN * d))
        w = fd.define_tensor((HIDDEN, 4 * HIDDEN * d))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    for tv in (x, y):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, streams)
        tv.axis(0).parallelize(ParallelType.stream)
    return fd, [x, w, y]


def test_row_parallel_linear_in_stream_chunks(multidevice_test):
    """s chunks: s matmuls of [t/s, 4h/d] x [4h/d, h] and s Allreduces per rank."""
    d = multidevice_test.size
    fd, (x, w, _) = row_parallel(d, STREAMS)
    tokens = 2 * STREAMS
    torch.manual_seed(0)
    x_full, w_full = torch.randn(tokens, 4 * HIDDEN * d), torch.randn(HIDDEN, 4 * HIDDEN * d)
    inputs = [multidevice_test.shard_tensor(x_full, x), multidevice_test.shard_tensor(w_full, w)]
    (out,), events = profile(fd, inputs)
    torch.testing.assert_close(out.cpu(), x_full @ w_full.T, rtol=1e-5, atol=1e-5)
    mms = [event for event in events if event.name == "aten::mm"]
    assert len(mms) == STREAMS
    for event in mms:
        assert [list(s) for s in event.input_shapes[:2]] == [
            [tokens // STREAMS, 4 * HIDDEN],
            [4 * HIDDEN, HIDDEN],
        ]
    # on one device each chunk's sum is a local copy (hir::set), not an Allreduce
    assert count(events, "hir::Allreduce") == (STREAMS if d > 1 else 0)
    assert count(events, "gloo:all_reduce") == (STREAMS if d > 1 else 0)
    text = str(fd.host_ir())
    assert f"for j0 in range(0, {STREAMS}) {{" in text
    assert "    set_current_stream(stream(j0))\n    synchronize(main)" in text
    if d > 1:
        assert "R0 = Allreduce(T3_c, team=M0(x), op=sum, out=T2_c)" in text
    else:
        assert "set(T3_c, out=T2_c)" in text and "wait" not in text, text
    assert fd.lowering_count == 1, "the second execute reused the program"


def column_parallel(d: int, swizzle: bool) -> tuple[FusionDefinition, list]:
    """SPEC section 3's example: an all-gather feeding a column-parallel linear."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((-1, 8))
        w = fd.define_tensor((4 * d, 8))
        ag = fd.ops.set(inp)
        out = fd.ops.linear(ag, w)
        fd.add_output(out)
    for tv in (inp, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, d)
    if swizzle:
        ag.swizzle1d(0, ParallelType.mesh_x)
    ag.axis(0).parallelize(ParallelType.stream)
    return fd, [inp, w]


@pytest.mark.parametrize("swizzle", [True, False], ids=["permute", "broadcast"])
def test_column_parallel_linear_fed_by_a_stream_allgather(multidevice_test, swizzle):
    """With swizzle1d: d-1 sends per rank; without: d broadcasts; never an all-gather."""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, (inp, w) = column_parallel(d, swizzle)
    torch.manual_seed(1)
    inp_full, w_full = torch.randn(2 * d, 8), torch.randn(4 * d, 8)
    inputs = [
        multidevice_test.shard_tensor(inp_full, inp),
        multidevice_test.shard_tensor(w_full, w),
    ]
    (out,), events = profile(fd, inputs)
    expected = shard_tensor(inp_full @ w_full.T, fd.host_ir().outputs[0], rank)
    torch.testing.assert_close(out.cpu(), expected)
    assert count(events, "gloo:all_gather") == 0
    assert count(events, "hir::Allgather") == 0
    text = str(fd.host_ir())
    if d == 1:  # one device holds every chunk: a copy each, no collective
        assert not [e for e in events if e.name.startswith(("gloo:", "hir::Broadcast"))]
        assert count(events, "hir::CollectivePermute") == 0 and count(events, "hir::set") >= 1
        assert "Broadcast" not in text and "CollectivePermute" not in text, text
    elif swizzle:
        assert count(events, "hir::CollectivePermute") == d
        assert count(events, "gloo:send") == d - 1
        if d > 1:  # at d = 1 the peers fold to 0
            assert f"send_peer=(coord(M0, x) - j0) % {d}" in text
            assert f"recv_peer=(coord(M0, x) + j0) % {d}" in text
    else:
        assert count(events, "hir::Broadcast") == d
        assert count(events, "gloo:broadcast") == (d if d > 1 else 0)
        assert "Broadcast(T0, team=M0(x), root=j0)" in text


def _gather_in_chunks(d: int, rows: int, chunks: int, swizzle: bool = False):
    """``set(x)`` of ``x`` (``rows`` x 4, sharded over ``d`` devices) into ``chunks`` stream
    chunks, and ``relu`` of it in the same loop."""
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((rows, 4))
        ag = fd.ops.set(inp)
        fd.add_output(fd.ops.relu(ag))
    inp.set_device_mesh(mesh)
    inp.outer_split(0, d)
    inp.axis(0).parallelize(ParallelType.mesh_x)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, chunks)
    if swizzle:
        ag.swizzle1d(0, ParallelType.mesh_x)
    ag.axis(0).parallelize(ParallelType.stream)
    return fd, inp


def test_stream_count_must_divide_or_be_divided_by_the_team():
    """Gathering a tensor sharded 2 ways into 3 stream chunks is refused (a chunk would
    hold part of a device's block and part of another's), as is a swizzled loop of 4."""
    with pytest.raises(LoweringError, match="T1 gathers T0 over 3 stream chunks, but T0 is"):
        _gather_in_chunks(2, 12, 3)[0].host_ir()
    with pytest.raises(LoweringError, match="over 4 stream chunks swizzled over mesh_x, but"):
        _gather_in_chunks(2, 8, 4, swizzle=True)[0].host_ir()


@pytest.mark.world_sizes(2, 4)
@pytest.mark.parametrize("per_device", [2, 0.5], ids=["2-per-block", "2-blocks-per-chunk"])
def test_a_gather_in_more_or_fewer_chunks_than_devices(multidevice_test, per_device):
    """Into twice as many chunks as devices: iteration j broadcasts slice j % 2 of block
    j // 2 (one Broadcast each); into half as many (4 ranks; 2 ranks: one chunk): two
    Broadcasts of whole blocks per iteration, into the two halves of its chunk. Both
    match torch, every rank taking part in as many Broadcasts as the loop issues."""
    d, rank = multidevice_test.size, multidevice_test.rank
    chunks = int(d * per_device)
    fd, inp = _gather_in_chunks(d, 8 * d, chunks)
    x = torch.randn(8 * d, 4, generator=torch.Generator().manual_seed(34))
    (out,), events = profile(fd, [multidevice_test.shard_tensor(x, inp)])
    torch.testing.assert_close(out.cpu(), shard_tensor(x.relu(), fd.host_ir().outputs[0], rank))
    assert count(events, "hir::Broadcast") == max(chunks, d)
    assert count(events, "hir::Allgather") == 0
    text = str(fd.host_ir())
    if per_device > 1:
        assert "Broadcast(T0_2, team=M0(x), root=j0 // 2)" in text
        assert "shard_by_stream(T0, axis=0, index=j0 % 2)" in text
    else:
        assert f"root=j0 * {d // chunks} + 1" in text


def test_swizzle_must_name_the_producers_mesh_axis():
    """A swizzle over mesh_y of a tensor sharded over mesh_x is refused."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((8, 4))
        ag = fd.ops.set(inp)
        fd.add_output(ag)
    inp.set_device_mesh(mesh)
    inp.outer_split(0, 2)
    inp.axis(0).parallelize(ParallelType.mesh_x)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, 2)
    ag.swizzle1d(0, ParallelType.mesh_y)
    ag.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(LoweringError, match="swizzled over mesh_y, but T0 is sharded over mesh_x"):
        fd.host_ir()


def test_row_parallel_with_sharded_output_reduce_scatters_each_chunk(multidevice_test):
    """Output sharded over mesh_x on its features: one ReduceScatter per chunk."""
    d, rank = multidevice_test.size, multidevice_test.rank
    torch.manual_seed(2)
    tokens, features = 2 * STREAMS, HIDDEN * d
    x_full = torch.randn(tokens, 4 * HIDDEN * d)
    w_full = torch.randn(features, 4 * HIDDEN * d)
    fd, (x, w, _) = _row_parallel_sharded_output(d)
    inputs = [multidevice_test.shard_tensor(x_full, x), multidevice_test.shard_tensor(w_full, w)]
    (out,), events = profile(fd, inputs)
    expected = shard_tensor(x_full @ w_full.T, fd.host_ir().outputs[0], rank)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert count(events, "hir::ReduceScatter") == (STREAMS if d > 1 else 0)  # 1: a copy
    assert count(events, "hir::Allreduce") == 0


def _row_parallel_sharded_output(d: int) -> tuple[FusionDefinition, list]:
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4 * HIDDEN * d))
        w = fd.define_tensor((HIDDEN * d, 4 * HIDDEN * d))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    x.outer_split(0, STREAMS)
    x.axis(0).parallelize(ParallelType.stream)
    y.set_device_mesh(mesh)
    y.outer_split(0, STREAMS)
    y.axis(0).parallelize(ParallelType.stream)
    y.outer_split(2, d)
    y.axis(2).parallelize(ParallelType.mesh_x)
    return fd, [x, w, y]


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("swizzle", [True, False], ids=["permute", "broadcast"])
def test_stream_allgather_along_mesh_y_of_a_2d_mesh(multidevice_test, swizzle):
    """The gathered tensor is sharded over mesh_y of a 2x2 mesh; peers are column positions."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((4, 8))
        ag = fd.ops.set(inp)
        fd.add_output(fd.ops.relu(ag))
    inp.set_device_mesh(mesh)
    inp.outer_split(0, 2)
    inp.axis(0).parallelize(ParallelType.mesh_y)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, 2)
    if swizzle:
        ag.swizzle1d(0, ParallelType.mesh_y)
    ag.axis(0).parallelize(ParallelType.stream)
    torch.manual_seed(3)
    full = torch.randn(4, 8)
    (out,), events = profile(fd, [multidevice_test.shard_tensor(full, inp)])
    torch.testing.assert_close(out.cpu(), torch.relu(full))
    if swizzle:
        assert count(events, "gloo:send") == 1
        assert "team=M0(y), send_peer=(coord(M0, y) - j0) % 2" in str(fd.host_ir())
    else:
        assert count(events, "gloo:broadcast") == 2


def gather_over_2x2(nesting: tuple, rows: int, stream_chunks: int, swizzle=None):
    """``relu(set(inp))``: inp [rows, 4] on a 2x2 mesh, dim 0 split over the mesh axes
    ``nesting`` (outermost first; a ``(ParallelType, dim)`` pair shards another dim), the
    set's output split into ``stream_chunks`` on dim 0 (swizzled over ``swizzle``)."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        inp = fd.define_tensor((rows, 4))
        ag = fd.ops.set(inp)
        fd.add_output(fd.ops.relu(ag))
    inp.set_device_mesh(mesh)
    for position, (axis, dim) in enumerate(nesting):
        split_at = position if dim == 0 else dim + position
        inp.outer_split(split_at, 2)
        inp.axis(split_at).parallelize(axis)
    ag.set_device_mesh(mesh)
    ag.outer_split(0, stream_chunks)
    if swizzle is not None:
        ag.swizzle1d(0, swizzle)
    ag.axis(0).parallelize(ParallelType.stream)
    return fd, inp


X, Y = ParallelType.mesh_x, ParallelType.mesh_y


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("nesting", [(X, Y), (Y, X)], ids=["xy", "yx"])
def test_stream_allgather_over_a_flattened_team(multidevice_test, nesting):
    """Dim 0 split over both axes of a 2x2 mesh, gathered in 4 stream chunks: the planner's
    plan is one Allgather over the flattened team in the nesting's order, and the loop
    takes it apart into one Broadcast per chunk from that team's position j."""
    fd, inp = gather_over_2x2(tuple((axis, 0) for axis in nesting), 8, 4)
    torch.manual_seed(5)
    full = torch.randn(8, 4)
    (out,), events = profile(fd, [multidevice_test.shard_tensor(full, inp)])
    torch.testing.assert_close(out.cpu(), torch.relu(full))
    team = ", ".join(axis.name.removeprefix("mesh_") for axis in nesting)
    assert f"Broadcast(T0, team=M0({team}), root=j0)" in str(fd.host_ir())
    assert count(events, "gloo:broadcast") == 4


def test_a_stream_gather_that_is_not_one_allgather_is_refused():
    """Dim 1 sharded too: the planner's plan gathers two dims (two Allgathers), which a
    stream loop cannot take apart by chunk of dim 0; a swizzle over one axis of a flattened
    team is refused as well."""
    fd, _ = gather_over_2x2(((X, 0), (Y, 1)), 8, 2)
    with pytest.raises(
        LoweringError,
        match=r"planner reshards T0 into T1 \(dim 0: \[x, 4\]"
        r" to \[8\]\) with Allgather, Allgather; reshard it with a set",
    ):
        fd.host_ir()
    fd, _ = gather_over_2x2(((X, 0), (Y, 0)), 8, 4, swizzle=X)
    with pytest.raises(
        LoweringError, match="swizzled over mesh_x, but T0 is sharded over mesh_x and mesh_y"
    ):
        fd.host_ir()


def test_split_only_on_the_output_slices_the_input_per_chunk():
    """An unsplit input that maps to the output's stream dim is read chunk by chunk."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 4))
        y = fd.ops.relu(x)
        fd.add_output(y)
    for tv in (x, y):
        tv.set_device_mesh(DeviceMesh([0]))
    y.outer_split(0, 2)
    y.axis(0).parallelize(ParallelType.stream)
    torch.manual_seed(4)
    full = torch.randn(8, 4)
    (out,) = fd.execute([full])
    torch.testing.assert_close(out, torch.relu(full))
    assert "T0_c : float32[4, 4] @M0 = shard_by_stream(T0, axis=0, index=j0)" in str(fd.host_ir())


class StreamIds(Listener):
    """Records the stream every instruction of a run runs on."""

    def __init__(self) -> None:
        self.seen: set = set()

    def before(self, instruction, context, operands) -> None:
        self.seen.add(context.current_stream)


@pytest.mark.parametrize("streams", [None, 2])
def test_a_64_chunk_loop_uses_at_most_the_pools_streams(multidevice_test, streams, monkeypatch):
    """stream(j) runs on pool stream j mod N (default 4, or HOSTIR_STREAMS): 64 chunks use
    N streams, the race checker (which sees the same ids) passes, and the result is exact."""
    if streams is not None:
        monkeypatch.setenv("HOSTIR_STREAMS", str(streams))
    d, chunks = multidevice_test.size, 64
    fd, (x, w, _) = row_parallel(d, chunks)
    torch.manual_seed(1)
    x_full, w_full = torch.randn(2 * chunks, 4 * HIDDEN * d), torch.randn(HIDDEN, 4 * HIDDEN * d)
    inputs = [multidevice_test.shard_tensor(x_full, x), multidevice_test.shard_tensor(w_full, w)]
    ids = StreamIds()
    evaluator = HostIrEvaluator(fd.host_ir(), listeners=[ids, RaceChecker()])
    (out,) = evaluator.run([t.to(multidevice_test.device) for t in inputs])
    torch.testing.assert_close(out.cpu(), x_full @ w_full.T, rtol=1e-5, atol=1e-5)
    assert f"for j0 in range(0, {chunks}) {{" in str(fd.host_ir())
    assert ids.seen == {"main", *range(streams or DEFAULT_STREAMS)}


def test_the_pool_size_is_checked(monkeypatch):
    monkeypatch.setenv("HOSTIR_STREAMS", "0x")
    with pytest.raises(SettingError, match="HOSTIR_STREAMS='0x': expected a positive integer"):
        stream_count()
    with pytest.raises(SettingError, match="streams: expected a positive integer, got 0"):
        stream_count(0)


@pytest.mark.parametrize("op", ["linear", "sum"])
@pytest.mark.parametrize("with_mesh", [False, True])
def test_a_stream_split_on_a_reduced_dim_is_refused(op, with_mesh):
    """A stream split that no loop can use is a named error, not a program without a loop:
    here on the dim a linear contracts or a sum reduces."""
    with FusionDefinition() as fd:
        x, w = fd.define_tensor((6, 8)), fd.define_tensor((4, 8))
        fd.add_output(fd.ops.linear(x, w) if op == "linear" else fd.ops.sum(x, [1]))
    if with_mesh:
        for tv in (x, w):
            tv.set_device_mesh(DeviceMesh(torch.arange(1)))
    x.outer_split(1, 2)
    x.axis(1).parallelize(ParallelType.stream)
    with pytest.raises(LoweringError, match=f"T0 is split into 2 stream chunks on dim 1.*{op}"):
        fd.host_ir()


@pytest.mark.parametrize("with_mesh", [False, True])
def test_ops_split_on_different_dims_get_loops_of_their_own(with_mesh):
    """relu follows x's split of dim 0; neg is split on dim 1 by the user: two loops, the
    first writing relu's output whole, the second reading it by columns (the race
    checker runs on both, tests/conftest.py)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 8))
        z = fd.ops.neg(fd.ops.relu(x))
        fd.add_output(z)
    if with_mesh:
        for tv in (x, z):
            tv.set_device_mesh(DeviceMesh(torch.arange(1)))
    x.outer_split(0, 2)
    x.axis(0).parallelize(ParallelType.stream)
    z.outer_split(1, 2)
    z.axis(1).parallelize(ParallelType.stream)
    torch.manual_seed(2)
    a = torch.randn(8, 8)
    (out,), events = profile(fd, [a])
    torch.testing.assert_close(out, -a.relu())
    # relu writes its chunks in place with clamp_min(out=), torch's relu (hostir.run.pointwise)
    ops = ("aten::clamp_min", "aten::neg")
    shapes = [list(e.input_shapes[0]) for e in events if e.name in ops]
    assert sorted(shapes) == [[4, 8], [4, 8], [8, 4], [8, 4]]
    text = str(fd.host_ir())
    assert "shard_by_stream(T1, axis=1" in text and text.count("synchronize(main)") == 2
