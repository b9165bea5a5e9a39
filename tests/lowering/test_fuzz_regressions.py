"""Programs the differential fuzzer (tests/fuzz) found lowered wrongly, each reduced to a
few lines and run against the single-device reference (the seed and world size of the
fuzz case are in each docstring)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hostir
from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir.ir.catalog import COMMUNICATING, Kind, declaration_of
from hostir.ir.instructions import keyword
from hostir.ir.program_info import walk_instructions
from lowering import LoweringError
from lowering.insert_deallocations import insert_deallocations
from tests.child_runs import child_environment
from tests.fuzz.run import never_freed

X, Y = ParallelType.mesh_x, ParallelType.mesh_y
MOVES_DATA = COMMUNICATING | {Kind.LOCAL_RESHARD}


def assert_valid_shardings(program: hostir.HostIrContainer) -> None:
    """Every value an instruction defines uses each mesh axis of its mesh at most once."""
    for instruction in program.body:
        value = getattr(instruction, "out", None)
        if getattr(value, "sharding", None) is None:
            continue
        sharding = value.sharding
        used = [p.axis for dim in sharding.dims for p in dim if p.axis is not None]
        used += [p.axis for p in sharding.partial]
        assert len(used) == len(set(used)), f"{value.name} uses a mesh axis twice: {instruction}"
        assert set(used) <= set(sharding.mesh.axes()), f"{value.name}: {instruction}"


def run_against_torch(fd, multidevice_test, full: list[torch.Tensor], expected: list) -> None:
    """Shards ``full`` as the program's inputs, executes, and compares every output shard
    with the same shard of ``expected``; the program must also round-trip as text."""
    rank = multidevice_test.rank
    program = fd.host_ir()
    assert hostir.parse(str(program)) == program
    assert_valid_shardings(program)
    local = [shard_tensor(t, value, rank) for t, value in zip(full, program.inputs, strict=True)]
    outputs = fd.execute(local)
    for out, value, ref in zip(outputs, fd.host_ir().outputs, expected, strict=True):
        piece = shard_tensor(ref, value, rank)
        if piece is None:
            assert out is None
        else:
            torch.testing.assert_close(out, piece)


def _shard(tv, mesh: DeviceMesh, dim: int, parallel_type: ParallelType) -> None:
    if tv.device_mesh is None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.axis_size(parallel_type))
    tv.axis(dim).parallelize(parallel_type)


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("source", ["one device", "same mesh"])
def test_broadcast_in_dim_to_a_dim_sharded_elsewhere(multidevice_test, source):
    """broadcast_in_dim computes where its input is; the new dim kept the output's mesh
    axis (y, absent from a one-device mesh; or x, which the mapped dim already used) and
    gave an invalid sharding (seed 343 at 4 ranks)."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        t = fd.define_tensor((8,))
        b = fd.ops.broadcast_in_dim(t, [4, -1], [1])
        fd.add_output(b)
    if source == "one device":
        t.set_device_mesh(DeviceMesh([3]))
        _shard(b, mesh, 0, Y)
    else:
        _shard(t, mesh, 0, X)
        _shard(b, mesh, 0, X)
    full = torch.randn(8, generator=torch.Generator().manual_seed(0))
    run_against_torch(fd, multidevice_test, [full], [full.expand(4, 8)])


@pytest.mark.world_sizes(2, 4)
def test_a_producer_placed_by_one_consumer_places_its_other_consumers(multidevice_test):
    """x has no mesh; z = x + w places x (from its consumer z), and x must then place
    y = relu(x). Propagation ran the producer pass once, before x had a mesh, and refused
    y as meshless (about 1 in 6 fuzz cases at 4 ranks, e.g. seed 1)."""
    d = multidevice_test.size
    with FusionDefinition() as fd:
        x = fd.define_tensor((2 * d, 3))
        w = fd.define_tensor((2 * d, 3))
        y = fd.ops.relu(x)
        z = fd.ops.add(x, w)
        fd.add_output(y)
        fd.add_output(z)
    _shard(w, DeviceMesh(list(range(d))), 0, X)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(2 * d, 3, generator=generator) for _ in range(2)]
    expected = [full[0].relu(), full[0] + full[1]]
    run_against_torch(fd, multidevice_test, full, expected)
    assert fd.host_ir().outputs[0].sharding == fd.host_ir().inputs[1].sharding


@pytest.mark.world_sizes(1, 2)
def test_two_stream_loops_share_the_main_stream(multidevice_test):
    """Two stream loops (2 and 4 chunks) in one program: each emitted its own
    ``main = get_current_stream()``, which the verifier refuses as a second definition
    (seed 37 at 4 ranks)."""
    d = multidevice_test.size
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 2 * d))
        y = fd.define_tensor((8, 2 * d))
        fd.add_output(fd.ops.relu(x))
        fd.add_output(fd.ops.neg(y))
    for tv, chunks in ((x, 2), (y, 4)):
        _shard(tv, mesh, 1, X)
        tv.outer_split(0, chunks)
        tv.axis(0).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(8, 2 * d, generator=generator) for _ in range(2)]
    run_against_torch(fd, multidevice_test, full, [full[0].relu(), -full[1]])
    assert str(fd.host_ir()).count("get_current_stream()") == 1


@pytest.mark.world_sizes(2, 4)
@pytest.mark.parametrize("swizzle", [False, True])
def test_stream_gather_of_a_dim_with_one_row_per_rank(multidevice_test, swizzle):
    """src's dim 0 is split over all of mesh_x, one row per rank ({0: [x]}, no local
    part): the stream all-gather must still fetch one chunk per iteration. It planned an
    Allgather of the whole of src into each chunk instead (seed 37 at 4 ranks)."""
    d = multidevice_test.size
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x = fd.define_tensor((d, 4))
        gathered = fd.ops.set(x)
        fd.add_output(fd.ops.relu(gathered))
    _shard(x, mesh, 0, X)
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, d)
    if swizzle:
        gathered.swizzle1d(0, X)
    gathered.axis(0).parallelize(ParallelType.stream)
    full = torch.randn(d, 4, generator=torch.Generator().manual_seed(0))
    run_against_torch(fd, multidevice_test, [full], [full.relu()])
    kind = "CollectivePermute" if swizzle else "Broadcast"
    assert str(fd.host_ir()).count(kind) == 1 and "Allgather" not in str(fd.host_ir())


@pytest.mark.world_sizes(2, 4)
def test_stream_split_set_that_keeps_the_sharding_is_a_copy(multidevice_test):
    """A set whose output keeps the input's sharding of the stream-split dim ({0: [x, 4]},
    the local part in 2 chunks) copies each chunk; it is no all-gather."""
    d = multidevice_test.size
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x = fd.define_tensor((4 * d, 3))
        y = fd.ops.set(x)
        fd.add_output(y)
    _shard(x, mesh, 0, X)
    _shard(y, mesh, 0, X)
    y.outer_split(1, 2)
    y.axis(1).parallelize(ParallelType.stream)
    full = torch.randn(4 * d, 3, generator=torch.Generator().manual_seed(0))
    run_against_torch(fd, multidevice_test, [full], [full])
    # The numbers alone pass with a gather that is sliced again: check that nothing moves.
    instructions = list(walk_instructions(fd.host_ir().body))
    moving = [keyword(i) for i in instructions if declaration_of(type(i)).kind in MOVES_DATA]
    assert not moving, f"a set that keeps its sharding communicates: {moving}"
    chunks = {i.out.name for i in instructions if isinstance(i, hostir.ShardByStream)}
    copies = [(i.src.name, i.out.name) for i in instructions if isinstance(i, hostir.Set)]
    assert len(copies) == 1 and set(copies[0]) <= chunks, str(fd.host_ir())


def test_stream_gather_over_two_mesh_axes_takes_the_planners_allgather_apart():
    """A stream loop reading a set's input whole over (y, x) once planned an Allgather of the
    whole input into each chunk (a wrong result), then was refused; now the planner's one
    Allgather over the flattened team M0(y, x) becomes one Broadcast per chunk, and nothing
    else communicates in the loop (the numbers: test_stream_allgather_over_a_flattened_team)."""
    mesh = DeviceMesh(torch.arange(4).reshape(2, 2))
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 4))
        gathered = fd.ops.set(x)
        fd.add_output(gathered)
    _shard(x, mesh, 0, Y)
    x.outer_split(1, 2)
    x.axis(1).parallelize(X)  # dim 0: [y, x, 2]
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, 4)
    gathered.axis(0).parallelize(ParallelType.stream)
    text = str(fd.host_ir())
    assert "Broadcast(T0, team=M0(y, x), root=j0" in text
    assert text.count("team=") == 1


@pytest.mark.world_sizes(1, 2)
def test_a_tensor_read_in_a_stream_loop_lives_until_the_streams_join(multidevice_test):
    """a = neg(x) is defined before the loop and read by every iteration; it was freed
    right after the loop, on the last iteration's stream, before main waited for the
    others: the race checker's error on every fuzz case with such a loop (seed 0 at 4)."""
    d = multidevice_test.size
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 2 * d))
        y = fd.define_tensor((8, 2 * d))
        a = fd.ops.neg(x)
        fd.add_output(fd.ops.add(y, a))
    _shard(x, mesh, 1, X)
    _shard(y, mesh, 1, X)
    y.outer_split(0, 2)
    y.axis(0).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(8, 2 * d, generator=generator) for _ in range(2)]
    run_against_torch(fd, multidevice_test, full, [full[1] - full[0]])
    program = fd.host_ir()
    text = str(program)
    assert text.index("deallocate T2\n") > text.index("synchronize(stream(j1))")
    # ... while the chunks the body defines are freed in the body, on its stream (the
    # first version of this rule kept them alive past the join, where nothing freed them)
    assert not never_freed(program), text
    body = text[
        text.index("set_current_stream(stream(j0))") : text.index("set_current_stream(main)")
    ]
    assert "deallocate T1_c" in body, text


@pytest.mark.world_sizes(2)
def test_the_result_of_an_unused_communication_is_freed_after_its_wait(multidevice_test):
    """A communication's result nothing reads was freed between the Allreduce and its
    wait, while the Allreduce still wrote it (seed 2 at 4, a sum nothing read). The
    lowering now drops ops no output needs (the dead sum is not computed at all), so the
    rule is checked on such a program written out."""
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 3))
        fd.ops.sum(x, [0])  # dead: no output reads it
        fd.add_output(fd.ops.relu(x))
    _shard(x, mesh, 0, X)
    full = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    run_against_torch(fd, multidevice_test, [full], [full.relu()])
    assert "Allreduce" not in str(fd.host_ir()), str(fd.host_ir())
    written = hostir.parse(
        """%HostIrContainer {
  mesh M0 = [2] : [1]
  input T0 : float32[4, 3] @M0 {0: [x, 2]}
  T2 : float32[3] @M0 partial{x: sum} = sum(T0, dims=[0], keepdim=false)
  T1 : float32[3] @M0, R0 = Allreduce(T2, team=M0(x), op=sum)
  T3 : float32[4, 3] @M0 {0: [x, 2]} = relu(T0)
  wait R0
  output T3
}
"""
    )
    text = str(insert_deallocations(written))
    assert text.index("deallocate T1\n") > text.index("wait R0"), text


@pytest.mark.world_sizes(2)
def test_a_cyclic_contraction_dim_is_copied_across_extents_written_differently(multidevice_test):
    """x's contraction dim (symbolic, i0) and w's (8) are split cyclically over x; the
    partial sums take x's layout [i0 // 2, x] and w must be read as [4, x]. Only block
    layouts were copied across differently written extents, so w was wanted replicated
    and the lowering failed its own check (seed 57 at 4 ranks)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, -1))
        w = fd.define_tensor((6, 8))
        fd.add_output(fd.ops.linear(x, w))
    for tv in (x, w):
        tv.set_device_mesh(DeviceMesh([0, 1]))
        tv.inner_split(1, 2)
        tv.axis(2).parallelize(X)  # [i0 // 2, x] and [4, x]
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(4, 8, generator=generator), torch.randn(6, 8, generator=generator)]
    run_against_torch(fd, multidevice_test, full, [full[0] @ full[1].T])


@pytest.mark.world_sizes(2)
def test_one_index_per_device_is_a_block_layout_across_extents(multidevice_test):
    """y's dim 0 (2) is split over x with nothing local ([x]); the unscheduled x (dim 0
    symbolic) inherits it. [x] was taken for a layout that is not in blocks, x stayed
    replicated, and the lowering failed its own check (seed 49 at 4 ranks)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 3))
        y = fd.define_tensor((2, 3))
        fd.add_output(fd.ops.add(x, y))
    _shard(y, DeviceMesh([0, 1]), 0, X)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(2, 3, generator=generator) for _ in range(2)]
    run_against_torch(fd, multidevice_test, full, [full[0] + full[1]])
    assert str(fd.host_ir()).startswith(
        "%HostIrContainer {\n  mesh M0 = [2] : [1]\n  input T0 : float32[i0, 3] @M0 {0: [x]}"
    )


@pytest.mark.world_sizes(1, 2)
def test_two_stream_loops_read_chunks_of_one_tensor(multidevice_test):
    """a = relu(x) and c = a + neg(y) ran in two loops of 2 chunks (neg(y) between them is
    not split); both read chunks of a, and both named them T2_c: a second definition
    the verifier refuses (seed 346 at 4 ranks). Since issue 34 neg(y), which reads
    nothing of the loop, runs before it, and both ops share one loop."""
    d = multidevice_test.size
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 2 * d))
        y = fd.define_tensor((8, 2 * d))
        a = fd.ops.relu(x)
        b = fd.ops.neg(y)
        fd.add_output(fd.ops.add(a, b))
    _shard(x, mesh, 1, X)
    _shard(y, mesh, 1, X)
    x.outer_split(0, 2)
    x.axis(0).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(8, 2 * d, generator=generator) for _ in range(2)]
    run_against_torch(fd, multidevice_test, full, [full[0].relu() - full[1]])
    text = str(fd.host_ir())
    assert text.count("for j") == 2  # one loop and its join
    assert text.index("= neg(T1)") < text.index("for j0")


LOWER_A_LOOP_WITH_THREE_BUFFERS = """
from frontend import DeviceMesh, FusionDefinition, ParallelType
with FusionDefinition() as fd:
    x = fd.define_tensor((8, 4))
    y = fd.ops.relu(x)
    z = fd.ops.neg(y)
    fd.add_output(z)
    fd.add_output(fd.ops.add(y, z))
    fd.add_output(fd.ops.sum(y, [0]))
x.set_device_mesh(DeviceMesh([0]))
x.outer_split(0, 2)
x.axis(0).parallelize(ParallelType.stream)
print(fd.host_ir())
"""


def test_the_program_does_not_depend_on_string_hashes():
    """A stream loop allocated its buffers in the order of a set of names, which depends
    on each process's string hashes: ranks lowered different programs and refused to run
    (the program digest check; seed 100 at 8 ranks). Two interpreters, not four (each
    imports torch): with the set's order back, hash seeds 0 and 1 allocate T2, T1, T3 and
    T3, T1, T2 (0 to 5 give four orders; checked on Python 3.11)."""
    env = child_environment()
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", LOWER_A_LOOP_WITH_THREE_BUFFERS],
            env={**env, "PYTHONHASHSEED": str(seed)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(2)
    ]
    texts = [run.communicate(timeout=120)[0] for run in runs]
    assert texts[0].count("  allocate ") == 3
    assert all(text == texts[0] for text in texts)


def test_an_extent_only_some_ranks_know_is_refused():
    """x (symbolic i0) is on rank 1 only and is broadcast to [0, 1]; rank 0 learns no i0
    and could not size its buffer: it failed while rank 1 waited in the Broadcast until
    the collective timed out (seed 17 at 4 ranks). Now a LoweringError names it."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4))
        y = fd.ops.set(x)
        fd.add_output(y)
    x.set_device_mesh(DeviceMesh([1]))
    y.set_device_mesh(DeviceMesh([0, 1]))
    expected = r"T1 has the symbolic extent i0, which only ranks \[1\] learn \(from input T0\)"
    with pytest.raises(LoweringError, match=expected + r", but ranks \[0\] of its mesh need it"):
        fd.host_ir()


@pytest.mark.world_sizes(4)
def test_linear_bias_on_a_partial_output_is_refused_not_dropped(multidevice_test):
    """A linear with a bias whose output keeps partial sums (its contraction sharded, the
    output laid out with them) dropped the bias: wrong sums on every rank (seed 72 at 4
    ranks). The bias cannot be added once per sum, so the schedule is refused by name;
    sharded without partial sums the same linear reduces first and adds the bias once."""
    mesh = DeviceMesh(list(range(4)))

    def define(partial_output: bool):
        with FusionDefinition() as fd:
            a = fd.define_tensor((4, 2, 4))
            w = fd.define_tensor((-1, 4))
            b = fd.define_tensor((8,))
            out = fd.ops.linear(fd.ops.sum(a, [0, 1], keepdim=False), w, b)
            fd.add_output(out)
        out.set_device_mesh(mesh)
        if partial_output:  # the output's loop domain [i0, r4]: shard its reduction axis
            out.inner_split(1, 1)
            out.axis(1).parallelize(X)
        return fd

    fd = define(partial_output=True)
    with pytest.raises(LoweringError, match=r"holds partial sums over mesh axes \['x'\].*bias"):
        fd.host_ir()
    gen = torch.Generator().manual_seed(72)
    full = [torch.randn(4, 2, 4, generator=gen), torch.randn(8, 4, generator=gen)]
    full.append(torch.randn(8, generator=gen))
    fd = define(partial_output=False)
    expected = torch.nn.functional.linear(full[0].sum([0, 1]), full[1], full[2])
    run_against_torch(fd, multidevice_test, full, [expected])


@pytest.mark.world_sizes(4)
def test_one_sharded_tensor_as_two_operands_is_refused(multidevice_test):
    """linear(t, t) on a sharded output needs t laid out two ways at once; inputs were
    resharded by name, so both operands got one layout and the linear produced the wrong
    local shape (seed 87 at 4 ranks). Refused by name; with a copy for one operand it runs."""
    mesh = DeviceMesh(list(range(4)))

    def define(copy: bool):
        with FusionDefinition() as fd:
            t = fd.define_tensor((8, 8))
            out = fd.ops.relu(fd.ops.linear(t, fd.ops.set(t) if copy else t))
            fd.add_output(out)
        _shard(out, mesh, 1, X)
        return fd

    with pytest.raises(LoweringError, match=r"read as 2 operands .* pass a copy"):
        define(copy=False).host_ir()
    full = torch.randn(8, 8, generator=torch.Generator().manual_seed(87))
    expected = torch.relu(torch.nn.functional.linear(full, full))
    run_against_torch(define(copy=True), multidevice_test, [full], [expected])


@pytest.mark.world_sizes(4)
def test_stream_chunks_of_differently_laid_out_dims_are_refused(multidevice_test):
    """A stream split inside a sharded dim ([x, stream, 1]: chunk j holds rows {2d + j})
    read by a loop that chunks an unsharded dim (chunk j: a block of rows) mixed the two
    and computed wrong numbers (seed 53 at 4 ranks); a dim with one index per device cut
    into 4 chunks failed verification (seed 49). Both are refused by name (since issue 34
    the first because the split stops before the sub, which needs other chunks, and nothing
    else reads b chunk by chunk); with the same layouts the loop runs and matches torch."""
    mesh = DeviceMesh(list(range(4)))

    def define(mixed: bool):
        with FusionDefinition() as fd:
            a = fd.define_tensor((8, 8, 8))
            b = fd.define_tensor((8, 8))
            out = fd.ops.sub(fd.ops.add(a, a), b)
            fd.add_output(out)
        _shard(a, mesh, 2, X)
        b.set_device_mesh(mesh)
        if mixed:
            b.outer_split(0, 4)
            b.axis(0).parallelize(X)
            b.outer_split(1, 2)
            b.axis(1).parallelize(ParallelType.stream)
        else:
            _shard(b, mesh, 1, X)
            b.outer_split(0, 2)
            b.axis(0).parallelize(ParallelType.stream)
        return fd

    # The split does not follow into the sub (its chunks would hold other rows), and no
    # other op reads b by its chunks: refused by b's name.
    with pytest.raises(LoweringError, match="T1 is split into 2 stream chunks on dim 0, but no"):
        define(mixed=True).host_ir()
    gen = torch.Generator().manual_seed(53)
    full = [torch.randn(8, 8, 8, generator=gen), torch.randn(8, 8, generator=gen)]
    fd = define(mixed=False)
    assert "shard_by_stream" in str(fd.host_ir())
    run_against_torch(fd, multidevice_test, full, [full[0] + full[0] - full[1]])

    # Seed 49: rows laid out [x] alone (one row per device) cut into 4 stream chunks.
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((4, 8))
        t1 = fd.define_tensor((-1, 8))
        t3 = fd.ops.div(t0, t1)
        fd.add_output(t3)
    t0.set_device_mesh(DeviceMesh(torch.tensor([[3, 1, 0, 2]])))
    t0.outer_split(1, 1)
    t0.axis(1).parallelize(ParallelType.mesh_y)
    t0.outer_split(0, 1)
    t0.axis(1).parallelize(X)
    t3.outer_split(0, 4)
    t3.axis(0).parallelize(ParallelType.stream)
    with pytest.raises(LoweringError, match="do not split into 4 stream chunks"):
        fd.host_ir()


@pytest.mark.world_sizes(2, 4)
def test_unswizzled_ops_do_not_share_a_swizzled_loop(multidevice_test):
    """Seed 67 at 4 ranks, once stream splits spread to tensors with a user-set mesh: a
    set whose output is swizzled over mesh_x, then add/sub split on another dim, fell
    into one loop, so the sub's Allgather joined rows of different chunks. The two now
    run in separate loops."""
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        t1, t2 = fd.define_tensor((8, 2 * d)), fd.define_tensor((8, 1))
        t4 = fd.ops.set(t1)
        t7 = fd.ops.sub(fd.ops.add(t1, t2), 2.0)
        fd.add_output(t4)
        fd.add_output(t7)
    for tv in (t1, t2, t4, t7):
        tv.set_device_mesh(mesh)
    t1.outer_split(1, d)
    t1.axis(1).parallelize(X)
    t4.inner_split(1, 2)
    t4.swizzle1d(1, X)
    t4.axis(1).parallelize(ParallelType.stream)
    t2.outer_split(0, 2)
    t2.axis(0).parallelize(ParallelType.stream)
    torch.manual_seed(67)
    a, b = torch.randn(8, 2 * d), torch.randn(8, 1)
    run_against_torch(fd, multidevice_test, [a, b], [a, a + b - 2.0])
    loops = str(fd.host_ir()).split("for j")[1:]
    assert any("CollectivePermute" in body for body in loops)
    assert not any("CollectivePermute" in body and "sub(" in body for body in loops)


@pytest.mark.world_sizes(1)
def test_a_stream_schedule_without_a_mesh_gives_the_same_loop(multidevice_test):
    """A single-device fusion with no set_device_mesh, stream-split on its input only,
    runs its linear and relu chunk by chunk, as with a one-device mesh (the split used
    to be dropped for every tensor after the input)."""
    programs = []
    for mesh in (None, DeviceMesh(torch.arange(1))):
        with FusionDefinition() as fd:
            x, w = fd.define_tensor((-1, 8)), fd.define_tensor((4, 8))
            fd.add_output(fd.ops.relu(fd.ops.linear(x, w)))
        if mesh is not None:
            x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.axis(0).parallelize(ParallelType.stream)
        torch.manual_seed(0)
        x_full, w_full = torch.randn(6, 8), torch.randn(4, 8)
        (y,) = fd.execute([x_full, w_full])
        torch.testing.assert_close(y, torch.relu(x_full @ w_full.T))
        programs.append(str(fd.host_ir()).replace(" @M0", ""))
    for text in programs:
        body = text[text.index("for j0 in range(0, 2) {") : text.index("set_current_stream(main)")]
        assert "= linear(T0_c, T1)" in body and "relu(T2_c, out=T3_c)" in body, text
    strip = [t[t.index("main = get_current_stream()") :] for t in programs]
    assert strip[0] == strip[1]


@pytest.mark.world_sizes(1, 2, 4)
def test_a_linear_into_a_strided_stream_chunk_of_a_3d_output(multidevice_test):
    """Seed 3081 at 4 ranks: a 3-d input stream-split on its middle dim, so the linear
    writes chunk j of a 3-d output, a strided view; torch's matmul(out=) folds the batch
    into one 2-d product and cannot reshape such an out (a crash on every rank). The
    handler writes a copy there."""
    d = multidevice_test.size
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        t1, t2 = fd.define_tensor((4, 16, 4 * d)), fd.define_tensor((16, 4 * d))
        fd.add_output(fd.ops.linear(t1, t2))
    t1.set_device_mesh(mesh)
    t1.outer_split(1, 2)
    t1.axis(1).parallelize(ParallelType.stream)
    _shard(t2, mesh, 1, X)
    torch.manual_seed(3081)
    a, b = torch.randn(4, 16, 4 * d), torch.randn(16, 4 * d)
    run_against_torch(fd, multidevice_test, [a, b], [torch.nn.functional.linear(a, b)])
    text = str(fd.host_ir())
    loop = text[text.index("for j0 in range(0, 2) {") :]
    assert any(
        line.strip().startswith("linear(") and ", out=" in line for line in loop.splitlines()
    )


@pytest.mark.parametrize("split_dim", [0, 1])
def test_one_tensor_as_two_operands_of_a_linear_in_a_stream_loop_is_refused(split_dim):
    """linear(t0, t0) with the output split into stream chunks: the loop chunked t0 for
    one role (or for none) and read it so in the other; the lowering's verifier refused
    its own program (seeds 430076 and 300376 at 8 ranks)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((4, 4))
        out = fd.ops.linear(t0, t0)
        fd.add_output(out)
    out.outer_split(split_dim, 2)
    out.axis(split_dim).parallelize(ParallelType.stream)
    with pytest.raises(
        LoweringError,
        match=r"T0 is read as 2 operands of the op defining T1 in a stream loop: each operand"
        r" needs its own chunks of T0; pass a copy for one of them \(fd.ops.set\(T0\)\)",
    ):
        fd.host_ir()


@pytest.mark.world_sizes(1)
def test_a_chunk_one_op_of_a_loop_takes_is_read_whole_where_another_op_needs_it(
    multidevice_test,
):
    """sub(t0, t1) reads t1's rows by the chunks of t0's split dim 1; linear(t0, t1) in the
    same loop reads t1's rows as the weight's and needs it whole. It got the chunk: the
    lowering's verifier refused its own program (seed 301456 at 8 ranks)."""
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor((-1, -1, -1)), fd.define_tensor((4, 8))
        fd.add_output(fd.ops.sub(t0, t1))
        fd.add_output(fd.ops.linear(t0, t1))
    t0.outer_split(1, 2)
    t0.axis(1).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(301456)
    a, b = torch.randn(2, 4, 8, generator=generator), torch.randn(4, 8, generator=generator)
    expected = [a - b, torch.nn.functional.linear(a, b)]
    run_against_torch(fd, multidevice_test, [a, b], expected)


@pytest.mark.world_sizes(1)
def test_a_tensor_read_by_the_chunks_of_two_dims_in_one_loop(multidevice_test):
    """sub(permute(t2), t2) with the permute split into stream chunks: the loop chunked t2's
    rows for the permute and the sub read those rows where it needs t2's columns (fuzz seed
    500091 at 8 ranks: the lowering's verifier refused its own program). The sub now gets
    its own chunk of t2's columns."""
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor((4, 16)), fd.define_tensor((16, 4))
        t2 = fd.ops.matmul(t0, t1)
        t3 = fd.ops.permute(t2, [1, 0])
        fd.add_output(fd.ops.sub(t3, t2))
    t3.outer_split(1, 4)
    t3.axis(1).parallelize(ParallelType.stream)
    generator = torch.Generator().manual_seed(500091)
    a, b = torch.randn(4, 16, generator=generator), torch.randn(16, 4, generator=generator)
    product = a @ b
    run_against_torch(fd, multidevice_test, [a, b], [product.T - product])


@pytest.mark.world_sizes(4)
def test_a_set_reading_a_chunked_input_whole_runs_after_the_loop(multidevice_test):
    """t0 is chunked on its unsharded dim 1 by the loop's mul, and the set that reshards it
    for a linear (dim 1 over [x, y]) read it whole: the planner planned the whole t0 into
    one chunk, and the lowering's own verifier failed ("local_shard: T10_c_0 and T0 must
    have the same global extents"; fuzz seed 701842 at 4 ranks); it was then refused by
    name. Since issue 34 the copy a set makes for an op is chunked as that op reads it: the
    linear is not in a loop, so the set runs whole outside the mul's loop (local_shard
    twice, no chunk; before the loop, as it reads nothing the loop computes) and the
    program matches torch."""
    mesh = DeviceMesh(torch.tensor([[[1], [2]], [[0], [3]]]))
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor((3, -1)), fd.define_tensor((2, -1))
        squares = fd.ops.mul(t0, t0)  # first: the loop chunks t0 for it
        fd.add_output(fd.ops.linear(t0, t1))
        fd.add_output(squares)
    t0.outer_split(1, 2)
    t0.axis(1).parallelize(ParallelType.stream)
    t1.set_device_mesh(mesh)
    t1.outer_split(1, 1)
    t1.axis(1).parallelize(ParallelType.mesh_x)
    t1.outer_split(2, 2)
    t1.axis(2).parallelize(ParallelType.mesh_y)
    text = str(fd.host_ir())
    (whole,) = [
        line for line in text.splitlines() if "= local_shard(T0, axis=1, mesh_axis=x)" in line
    ]
    assert whole.startswith("  T"), text  # at the top level: outside the mul's loop
    generator = torch.Generator().manual_seed(701842)
    a, b = torch.randn(3, 8, generator=generator), torch.randn(2, 8, generator=generator)
    run_against_torch(fd, multidevice_test, [a, b], [a @ b.T, a * a])


@pytest.mark.world_sizes(8)
def test_one_chunk_layout_over_meshes_of_other_sizes_runs_after_the_loop(multidevice_test):
    """t5 = linear(...) on 8 devices is chunked [x, stream]: chunk j of rank r is row 2r + j.
    The linear reading it on a 1-device mesh gathered it in a stream loop whose chunk j is
    rows 8j..8j+7 of the layout [x, 16] there: the same layout text over an x of size 1,
    so the check let it through and rows landed in the wrong places (a wrong result, fuzz
    seed 830156 at 8 ranks); then it was refused. Since issue 34 the copy for the second
    linear is made as that linear reads it, whole (it is in no loop): one Gather of t5
    after its loop, and the program matches torch."""
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor((8,)), fd.define_tensor((16, 8))
        t2, t3 = fd.define_tensor((16,)), fd.define_tensor((2, 16))
        fd.add_output(fd.ops.linear(fd.ops.linear(fd.ops.mul(t0, t0), t1, t2), t3))
    t1.set_device_mesh(DeviceMesh(list(range(8))))
    t1.inner_split(0, 2)
    t1.axis(0).parallelize(ParallelType.mesh_x)
    t1.outer_split(1, 2)
    t1.axis(1).parallelize(ParallelType.stream)
    t3.set_device_mesh(DeviceMesh([1]))
    t3.outer_split(1, 1)
    t3.axis(1).parallelize(ParallelType.mesh_x)
    text = str(fd.host_ir())
    loop_end = text.index("synchronize(stream(j1))")
    assert text.index("= Gather(T5, team=M0(x), axis=0, root=1)") > loop_end
    generator = torch.Generator().manual_seed(830156)
    a, w1, b1, w2 = (
        torch.randn(shape, generator=generator) for shape in ((8,), (16, 8), (16,), (2, 16))
    )
    expected = F.linear(F.linear(a * a, w1, b1), w2)
    run_against_torch(fd, multidevice_test, [a, w1, b1, w2], [expected])


def test_shard_tensor_of_a_dim_whose_extent_is_an_expression_of_unbound_symbols():
    """The output of ``cat([t10, t5], 1)`` with ``t5: [2, i0]`` has the extent ``8 + i0``,
    split by a mesh axis of one device: sharding the reference by the program's output
    (``shard_tensor(ref, fd.host_ir().outputs[0])``) could not evaluate ``8 + i0``
    (nothing binds ``i0`` there) and raised a bare EvaluationError (fuzz seed 961202 at 4
    ranks, a crash of the fuzzer's comparison). The one local part whose extent is not
    known takes what the dim's size leaves."""
    with FusionDefinition() as fd:
        t0, t1 = fd.define_tensor((2, 8)), fd.define_tensor((2, -1))
        out = fd.ops.cat([t0, t1], 1)
        fd.add_output(out)
    out.set_device_mesh(DeviceMesh([0]))
    out.outer_split(1, 1)
    out.axis(1).parallelize(ParallelType.mesh_x)
    full = [torch.randn(2, 8), torch.randn(2, 3)]
    expected = torch.cat(full, 1)
    value = fd.host_ir().outputs[0]
    assert f"{value.name} : float32[2, 8 + i" in str(fd.host_ir())
    assert torch.equal(shard_tensor(expected, value, 0), expected)
    assert torch.equal(fd.execute(full)[0], expected)


@pytest.mark.world_sizes(1, 2)
def test_take_along_axis_of_extents_written_differently_is_split_alike(multidevice_test):
    """take_along_axis(t0: [4, 8], t3: [i1, 3], 1): off the taken dim the extents are equal
    (4 and i1 bound to 4), but only the index's dim was mapped to the output's, so a split
    of the output's rows (stream chunks, or a mesh axis at 2 ranks) left t0 whole: torch
    broadcast a [1, 3] chunk of the index against all 4 rows (fuzz seed 970059 at 8 ranks:
    "output with shape [1, 3] doesn't match the broadcast shape [4, 3]"). The two dims are
    mapped to the output's alike now."""
    size = multidevice_test.size
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((4, 8))
        t3 = fd.define_tensor((-1, 3), dtype=DataType.Int)
        t7 = fd.ops.take_along_axis(t0, t3, 1)
        fd.add_output(t7)
    if size == 1:
        t7.outer_split(0, 4)
        t7.axis(0).parallelize(ParallelType.stream)
    else:
        _shard(t7, DeviceMesh(list(range(size))), 0, X)
    generator = torch.Generator().manual_seed(970059)
    arg = torch.randn(4, 8, generator=generator)
    index = torch.randint(0, 8, (4, 3), generator=generator)
    run_against_torch(fd, multidevice_test, [arg, index], [torch.take_along_dim(arg, index, 1)])


def test_chunks_in_blocks_of_a_symbolic_extent_are_refused():
    """gelu(t0) split into 4 stream chunks and cast into a tensor sharded over mesh_z on
    that dim: the split is back-propagated onto the gelu's output, whose op computes the
    dim unsharded, so its chunk j would be chunk j of 2 blocks of ``i0`` rows; the
    reshape viewing ``[6, i0]`` as ``[6, 2, i0 // 2]`` failed the lowering's own
    verifier (fuzz seed 8001352 at 4 ranks, a crash). Refused by name."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((6, -1))
        t1 = fd.ops.gelu(t0, approximate="tanh")
        t2 = fd.ops.cast(t1, DataType.Double)
        fd.add_output(t2)
    m0 = DeviceMesh(torch.tensor([[[0], [1]], [[2], [3]]]))
    t0.set_device_mesh(m0)
    t1.outer_split(1, 4)
    t1.axis(1).parallelize(ParallelType.stream)
    t2.set_device_mesh(m0)
    t2.outer_split(1, 2)
    t2.axis(1).parallelize(ParallelType.mesh_z)
    with pytest.raises(LoweringError, match="whose extent i0 is symbolic"):
        fd.host_ir()
