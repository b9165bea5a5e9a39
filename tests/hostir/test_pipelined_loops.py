"""Pipelined loops (``pipeline_stage``): the stages of a loop body run interleaved across
iterations, each iteration keeping its own values; the lowering splits every stream loop
with a communication so that a chunk's communication is in flight while the next chunk
is computed; the same program runs unpipelined with one switch and gives bitwise-equal
results (the suite checks that on every pipelined program it executes, see conftest)."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import ForLoop, HostIrEvaluator, Listener, RaceChecker, SelfChecks, parse
from hostir.analysis.traffic import count_traffic, traffic_report
from hostir.errors import EvaluationError, SettingError, VerifyError
from hostir.ir.instructions import keyword
from hostir.run.pipelined_loops import check_same_outputs

CHUNKED = """%HostIrContainer {
  input T0 : float32[6, 4]
  allocate T1 : float32[6, 4]
  for j in range(0, 3) {
    T0_c : float32[2, 4] = shard_by_stream(T0, axis=0, index=j)
    T2 : float32[2, 4] = relu(T0_c)
    deallocate T0_c
    pipeline_stage(depth=DEPTH)
    T1_c : float32[2, 4] = shard_by_stream(T1, axis=0, index=j)
    neg(T2, out=T1_c)
    deallocate T2
    deallocate T1_c
  }
  output T1
}
"""


class Order(Listener):
    """Records ``(keyword, loop index)`` of the instructions it is asked about."""

    def __init__(self, keywords: set[str], index: str) -> None:
        self.keywords, self.index, self.seen, self.streams = keywords, index, [], []

    def before(self, instruction, context, operands) -> None:
        if keyword(instruction) in self.keywords:
            self.seen.append((keyword(instruction), context.scalars.get(self.index)))
            self.streams.append(context.current_stream)


@contextmanager
def environment(**values: str):
    """Sets environment variables for the block (in this rank's process)."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize(
    ("depth", "pipeline", "expected"),
    [
        (1, True, "relu0 relu1 neg0 relu2 neg1 neg2"),
        (2, True, "relu0 relu1 relu2 neg0 neg1 neg2"),
        (1, False, "relu0 neg0 relu1 neg1 relu2 neg2"),
    ],
)
def test_stages_run_interleaved_and_each_iteration_keeps_its_values(depth, pipeline, expected):
    """Step t runs stage 0 of iteration t, then stage 1 of iteration t - depth; stage 1
    reads the T2 its own iteration defined though later iterations defined T2 since (the
    result would be another chunk's otherwise); unpipelined, iterations run whole."""
    program = parse(CHUNKED.replace("DEPTH", str(depth)))
    order = Order({"relu", "neg"}, "j")
    x = torch.randn(6, 4)
    evaluator = HostIrEvaluator(program, listeners=[order, RaceChecker()], pipeline=pipeline)
    (out,) = evaluator.run([x])
    assert torch.equal(out, -torch.relu(x))
    assert " ".join(f"{k}{j}" for k, j in order.seen) == expected


def test_the_switch_runs_the_same_program_unpipelined_and_the_check_can_fail():
    """HOSTIR_PIPELINE=0 runs a pipelined program iteration by iteration. A program whose
    first stage overwrites a buffer the previous iteration's second stage still reads
    gives different results pipelined: check_same_outputs names it, and so does the
    pipeline check, which the suite makes on every pipelined program it runs."""
    program = parse(
        CHUNKED.replace("DEPTH", "1")
        .replace("  allocate T1", "  allocate T9 : float32[2, 4]\n  allocate T1")
        .replace("T2 : float32[2, 4] = relu(T0_c)", "relu(T0_c, out=T9)")
        .replace("neg(T2, out=T1_c)", "neg(T9, out=T1_c)")
        .replace("    deallocate T2\n", "")
    )
    x = torch.randn(6, 4)
    with environment(HOSTIR_PIPELINE="0"):
        (serial,) = HostIrEvaluator(program).run([x])
    assert torch.equal(serial, -torch.relu(x))
    (pipelined,) = HostIrEvaluator(program, checks=SelfChecks()).run([x])  # as a user runs
    assert not torch.equal(pipelined, serial)
    with pytest.raises(EvaluationError, match="output 0 of the pipelined run differs"):
        check_same_outputs([pipelined], [serial])
    check_same_outputs([serial], [serial.clone()])
    # The pipeline check (HOSTIR_CHECK_PIPELINE, the suite's) makes that comparison itself:
    with pytest.raises(EvaluationError, match="output 0 of the pipelined run differs"):
        HostIrEvaluator(program, checks=SelfChecks(pipeline=True)).run([x])


def test_bad_settings_and_misplaced_stages_are_named():
    """A bad HOSTIR_PIPELINE or HOSTIR_PIPELINE_DEPTH is a SettingError naming it; a
    pipeline_stage outside a loop, or of depth 0, is a VerifyError naming its place."""
    program = parse(CHUNKED.replace("DEPTH", "1"))
    with environment(HOSTIR_PIPELINE="yes"), pytest.raises(SettingError, match="HOSTIR_PIPELINE"):
        HostIrEvaluator(program)
    with pytest.raises(VerifyError, match=r"^8:5: pipeline_stage: .*depth >= 1 \(got depth=0\)"):
        parse(CHUNKED.replace("DEPTH", "0"))
    outside = CHUNKED.replace("DEPTH", "1").replace(
        "  for j", "  pipeline_stage(depth=1)\n  for j", 1
    )
    with pytest.raises(VerifyError, match=r"^4:3: pipeline_stage: .*outside every loop"):
        parse(outside)
    fd, inputs, _ = _row_parallel(1, 4)
    with environment(HOSTIR_PIPELINE_DEPTH="x"), pytest.raises(SettingError, match="DEPTH='x'"):
        fd.execute(inputs)


def _row_parallel(d: int, streams: int, rank: int = 0) -> tuple[FusionDefinition, list, list]:
    """``x @ w.T + b`` with the contraction over mesh_x and the tokens in stream chunks;
    inputs are this rank's shards of seeded random tensors."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8))
        w = fd.define_tensor((6, 8))
        b = fd.define_tensor((6,))
        fd.add_output(fd.ops.linear(x, w, b))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    b.set_device_mesh(mesh)
    x.outer_split(0, streams)
    x.axis(0).parallelize(ParallelType.stream)
    torch.manual_seed(3)
    full = [torch.randn(4 * streams, 8), torch.randn(6, 8), torch.randn(6)]
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, (x, w, b), strict=True)]
    return fd, local, full


@pytest.mark.world_sizes(1, 2, 4)
@pytest.mark.parametrize("depth", ["0", "1", "2"])
def test_stream_loops_post_the_next_chunk_before_waiting(multidevice_test, depth):
    """A row-parallel stream loop: at depth 1, chunk j + 1's Allreduce is posted before
    chunk j's wait (its matmul runs while chunk j's Allreduce is in flight), at depth 2
    two chunks ahead, at 0 not at all, each on its iteration's stream; the text shows the
    stage; results equal torch's (and, through the suite's check, the unpipelined run's,
    bitwise). On one rank the loop issues no collective, so nothing is pipelined."""
    d, rank = multidevice_test.size, multidevice_test.rank
    with environment(HOSTIR_PIPELINE_DEPTH=depth):
        fd, inputs, (x, w, b) = _row_parallel(d, 4, rank)
        (y,) = fd.execute([t.to(multidevice_test.device) for t in inputs])
    torch.testing.assert_close(y.cpu(), x @ w.T + b, rtol=1e-5, atol=1e-5)
    text = str(fd.host_ir())
    if d == 1:  # each chunk's sum over one device is a local copy: nothing to overlap
        assert "Allreduce" not in text and "wait" not in text and "pipeline_stage" not in text
        return
    if depth == "0":
        assert "pipeline_stage" not in text
    else:
        assert f"op=sum)\n    pipeline_stage(depth={depth})\n    wait R0\n" in text, text
    loop = next(i for i in fd.host_ir().body if isinstance(i, ForLoop))
    order = Order({"Allreduce", "wait"}, loop.index.name)
    HostIrEvaluator(fd.host_ir(), listeners=[order]).run(
        [t.to(multidevice_test.device) for t in inputs]
    )
    lag = int(depth)
    expected = []
    for step in range(4 + lag):
        if step < 4:
            expected.append(("Allreduce", step))
        if 0 <= step - lag < 4:
            expected.append(("wait", step - lag))
    assert order.seen == expected
    # Each stage runs on its own iteration's stream (pool stream j mod 4), the second
    # too, though a later iteration switched streams in between.
    assert order.streams == [j % 4 for _, j in expected]


@pytest.mark.parametrize("depth", [1, 2])
def test_the_static_report_counts_the_buffers_in_flight(depth):
    """hostir traffic's report counts what a pipelined loop keeps alive: the tensors one
    iteration allocates (T2, 2 x 4 float32; the shard_by_stream views allocate nothing)
    times the iterations in flight (depth + 1)."""
    program = parse(CHUNKED.replace("DEPTH", str(depth)))
    report = traffic_report(count_traffic(program, 1))
    assert f"  body[1] for j: {depth + 1} iterations x 32 B = {32 * (depth + 1)} B" in report
