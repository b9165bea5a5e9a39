"""Stream loops over a sweep of op chains (issue "Streams", acceptance): pointwise ops,
``linear``, ``matmul`` and a reduction over another axis, with the stream split placed on
the input, on an intermediate or on the output, with and without a device mesh, at 1, 2
and 4 ranks. Every case: results equal the single-device torch reference, and the
profiler sees each op of a chunked tensor run once per chunk on chunk-sized inputs
(``aten::mm``/``aten::relu``/... counts and input shapes, as nvFuser's stream tests
check: the unsplit fusion's operand shapes with the rows divided by the chunks), the ops
before the split once on the whole. With a mesh, the feature dim is
sharded over ``mesh_x``: a linear or a sum over it reduces per chunk (an Allreduce in the
loop, pipelined: the suite also checks every such program against its unpipelined run,
bitwise, and runs the race checker, tests/conftest.py)."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import ForLoop, Wait
from hostir.analysis.pipeline_stages import is_pipelined
from hostir.ir.program_info import walk_instructions

TOKENS, FEATURES, OUT = 8, 8, 6
STREAMS = 4

# A chain: its steps, each (torch op name the profiler reports, the frontend call on
# (fd, previous tensor, weights), the torch reference on (previous value, weights)).
CHAINS = {
    "pointwise": [
        ("aten::relu", lambda fd, t, w: fd.ops.relu(t), lambda a, w: a.relu()),
        ("aten::neg", lambda fd, t, w: fd.ops.neg(t), lambda a, w: -a),
    ],
    "linear": [
        ("aten::relu", lambda fd, t, w: fd.ops.relu(t), lambda a, w: a.relu()),
        ("aten::mm", lambda fd, t, w: fd.ops.linear(t, w[0]), lambda a, w: a @ w[0].T),
        ("aten::neg", lambda fd, t, w: fd.ops.neg(t), lambda a, w: -a),
    ],
    "matmul": [
        ("aten::neg", lambda fd, t, w: fd.ops.neg(t), lambda a, w: -a),
        ("aten::mm", lambda fd, t, w: fd.ops.matmul(t, w[1]), lambda a, w: a @ w[1]),
        ("aten::relu", lambda fd, t, w: fd.ops.relu(t), lambda a, w: a.relu()),
    ],
    "reduction": [
        ("aten::relu", lambda fd, t, w: fd.ops.relu(t), lambda a, w: a.relu()),
        ("aten::sum", lambda fd, t, w: fd.ops.sum(t, [1]), lambda a, w: a.sum(1)),
    ],
}
PLACEMENTS = ("input", "intermediate", "output")


def _build(chain: str, placement: str | None, d: int | None):
    """(fusion, its input views, the tensor of each step); ``d``: a 1-d mesh of d devices
    sharding the feature dim of the input (and the contracted dim of the weights), or
    None for a fusion without a mesh."""
    steps = CHAINS[chain]
    with FusionDefinition() as fd:
        x = fd.define_tensor((TOKENS, FEATURES))
        weights = [fd.define_tensor((OUT, FEATURES)), fd.define_tensor((FEATURES, OUT))]
        tensors = [x]
        for _, call, _ in steps:
            tensors.append(call(fd, tensors[-1], weights))
        fd.add_output(tensors[-1])
    if d is not None:
        mesh = DeviceMesh(torch.arange(d))
        for tv in (x, *weights):
            tv.set_device_mesh(mesh)
        # The feature dim over mesh_x: linear contracts it (partial sums), matmul's
        # weight is contracted on its dim 0, the sum reduces it.
        for tv, dim in ((x, 1), (weights[0], 1), (weights[1], 0)):
            tv.outer_split(dim, d)
            tv.axis(dim).parallelize(ParallelType.mesh_x)
    if placement is None:  # the same fusion without a stream split: the reference shapes
        return fd, [x, *weights], None
    split = {"input": 0, "intermediate": 1, "output": len(steps)}[placement]
    target = tensors[split]
    target.outer_split(0, STREAMS)
    target.axis(0).parallelize(ParallelType.stream)
    return fd, [x, *weights], split


def _run(fd: FusionDefinition, local: list) -> tuple[torch.Tensor, list]:
    """(the output, the profiler's events with shapes) of a second run of ``fd``."""
    fd.execute(local)  # lowers and warms up
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        (out,) = fd.execute(local)
    return out, list(prof.events())


def _shapes(events: list, name: str) -> list:
    """The shapes of the tensor operands of every ``name`` event, in order (two for mm,
    one for the others; an ``out=`` buffer, when the op writes into one, comes after)."""
    operands = 2 if name == "aten::mm" else 1
    return [[list(s) for s in e.input_shapes[:operands]] for e in events if _is(e, name)]


def _is(event, name: str) -> bool:
    """Whether ``event`` is a run of torch op ``name``: a relu written into a stream chunk
    in place is torch's ``clamp_min(x, 0, out=)`` (hostir.run.pointwise; torch's relu
    calls that clamp_min, which is then not another run)."""
    if event.name == name:
        return True
    parent = event.cpu_parent.name if event.cpu_parent is not None else None
    return name == "aten::relu" and event.name == "aten::clamp_min" and parent != name


def _check(chain: str, placement: str, d: int | None, rank: int, device) -> None:
    fd, inputs, split = _build(chain, placement, d)
    generator = torch.Generator().manual_seed(zlib.crc32(f"{chain} {placement} {d}".encode()))
    shapes = [(TOKENS, FEATURES), (OUT, FEATURES), (FEATURES, OUT)]
    full = [torch.randn(shape, generator=generator) for shape in shapes]
    local = [shard_tensor(t, tv, rank).to(device) for t, tv in zip(full, inputs, strict=True)]
    out, events = _run(fd, local)
    _, whole = _run(_build(chain, None, d)[0], local)
    expected = full[0]
    for _, _, reference in CHAINS[chain]:
        expected = reference(expected, full[1:])
    where = f"{chain}, split on the {placement}, {'no mesh' if d is None else f'{d} ranks'}"
    # Every stream loop that waits for a communication is pipelined (docs/streams.md).
    for loop in (i for i in walk_instructions(fd.host_ir().body) if isinstance(i, ForLoop)):
        waits = any(isinstance(i, Wait) for i in loop.body)
        assert is_pipelined(loop) == waits, f"{where}:\n{fd.host_ir()}"
    expected = shard_tensor(expected, fd.host_ir().outputs[0], rank)  # this rank's block
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5, msg=where)
    # Step k (defining tensor k + 1) runs per chunk when its output is stream-split: the
    # split tensor and everything after it (splits spread to consumers); the first
    # step also when the split is on the input, which it reads chunk by chunk. Per chunk,
    # its inputs are those of the unsplit fusion's op with the first one's rows / chunks.
    for k, (name, _, _) in enumerate(CHAINS[chain]):
        (reference,) = _shapes(whole, name)
        want = [reference]
        if k + 1 >= split:
            first = [reference[0][0] // STREAMS, *reference[0][1:]]
            want = [[first, *reference[1:]]] * STREAMS
        got = _shapes(events, name)
        assert got == want, f"{where}: {name} ran on {got}, expected {want}"


@pytest.mark.world_sizes(1, 2, 4)
def test_every_chain_placement_and_mesh(multidevice_test):
    """All chains x placements, without a mesh and on a mesh of every rank."""
    d = multidevice_test.size
    for chain, placement, mesh in itertools.product(CHAINS, PLACEMENTS, (None, d)):
        _check(chain, placement, mesh, multidevice_test.rank, multidevice_test.device)


@pytest.mark.parametrize("with_mesh", [False, True])
def test_schedules_set_inside_the_with_block_behave_like_those_set_after_it(with_mesh):
    """nvFuser users schedule inside ``with FusionDefinition()`` as often as after it:
    both give the same program and the same results (a linear chain, split on its input,
    sharded over a 1-device mesh or without one)."""

    def build(inside: bool) -> FusionDefinition:
        with FusionDefinition() as fd:
            x, w = fd.define_tensor((TOKENS, FEATURES)), fd.define_tensor((OUT, FEATURES))
            fd.add_output(fd.ops.neg(fd.ops.linear(x, w)))
            if inside:
                schedule(x, w)
        if not inside:
            schedule(x, w)
        return fd

    def schedule(x, w) -> None:
        if with_mesh:
            for tv in (x, w):
                tv.set_device_mesh(DeviceMesh(torch.arange(1)))
        x.outer_split(0, STREAMS)
        x.axis(0).parallelize(ParallelType.stream)

    inside, after = build(True), build(False)
    assert str(inside.host_ir()) == str(after.host_ir())
    assert "for j0 in range(0, 4)" in str(inside.host_ir())
    torch.manual_seed(5)
    a, w = torch.randn(TOKENS, FEATURES), torch.randn(OUT, FEATURES)
    (got,), (again,) = inside.execute([a, w]), after.execute([a, w])
    torch.testing.assert_close(got, -(a @ w.T))
    assert torch.equal(got, again)
