"""Compiled host programs (hostir.run.compiled) and their replays (hostir.run.replay): the
same outputs as the interpreter, bitwise, on loops, pipelined stream loops, ranks outside a
mesh and scalar inputs; a failure raises what the interpreter raises, naming the
instruction's line; the switches (``compiled=``, ``HOSTIR_INTERPRET``); listeners and
profilers get the interpreter."""

from __future__ import annotations

import pathlib
from unittest import mock

import pytest
import torch

from frontend import FusionDefinition
from hostir import EvaluationError, HostIrEvaluator, Listener, SelfChecks, parse
from hostir.errors import CommunicationError, ExtentError, HostIrError, SettingError
from hostir.ir.instructions import keyword
from hostir.ir.program_info import walk_instructions
from hostir.run.compiled import LINE_NOTE
from hostir.run.compiled_runs import bitwise_equal, check_compiled_outputs
from tests.hostir.test_pipelined_loops import _row_parallel as row_parallel_streams
from tests.hostir.test_pipelined_loops import environment

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"

LOOPS = """%HostIrContainer {
  input T0 : float32[6, 4]
  input n : int64
  input s0 : float64
  input m : int64
  allocate T1 : float32[6, 4]
  for j in range(0, n) {
    for k in range(0, 2) {
      T0_c : float32[1, 4] = shard_by_stream(T0, axis=0, index=(j * 2 + k) % 6)
      T1_c : float32[1, 4] = shard_by_stream(T1, axis=0, index=j * 2 + k)
      T2 : float32[1, 4] = mul(T0_c, s0)
      add(T2, j // 2 - k, out=T1_c)
      deallocate T2
      deallocate T0_c
      deallocate T1_c
    }
  }
  T3 : float32[6, 4] = relu(T1)
  T4 : float32[6, 4] = mul(T3, 1 // m)
  output T1
  output T4
}
"""
"""Nested loops, scalar inputs (a loop bound, a float factor), index arithmetic."""


def _counting_interpreted():
    """Counts the instructions the interpreter runs (``HostIrEvaluator.run_instruction``)."""
    run = HostIrEvaluator.run_instruction
    return mock.patch.object(HostIrEvaluator, "run_instruction", autospec=True, side_effect=run)


def both_ways(program, inputs, **options) -> list:
    """Runs ``program`` compiled and interpreted (two evaluators); asserts the outputs
    are bitwise equal and that the compiled run interpreted nothing outside pipelined
    loops; returns the outputs. (The compiled evaluator makes no self-checks: the
    compiled check's interpreted twin, which the suite's settings ask for, would count.)"""
    compiled = HostIrEvaluator(program, checks=SelfChecks(), **options)
    assert compiled.runs_compiled()
    with _counting_interpreted() as interpreted:
        outputs = compiled.run(inputs)
    if not compiled.pipeline or "pipeline_stage" not in str(program):
        assert interpreted.call_count == 0
    expected = HostIrEvaluator(program, compiled=False, **options).run(inputs)
    # A second run of the signature replays (hostir.run.replay), pipelined loops too,
    # interpreting nothing; the same bits again.
    with _counting_interpreted() as interpreted:
        replayed = compiled.run(inputs)
    assert interpreted.call_count == 0
    assert len(outputs) == len(expected) == len(replayed)
    for index, (a, b, c) in enumerate(zip(outputs, expected, replayed, strict=True)):
        assert (a is None and b is None) or bitwise_equal(a, b), f"output {index}"
        assert (c is None and b is None) or bitwise_equal(c, b), f"output {index}, replayed"
    return outputs


NON_FINITE = """%HostIrContainer {
  input T0 : float32[4, 3]
  T1 : float32[4, 3] = mul(T0, inf)
  T2 : float32[4, 3] = add(T0, -inf)
  T3 : float32[4, 3] = mul(T0, nan)
  T4 : float32[4, 3] = full(-inf)
  T5 : float32[4, 3] = mul(T0, 2.0 * -inf)
  output T1
  output T2
  output T3
  output T4
  output T5
}
"""
"""Non-finite constants as operands, a fill value and inside a scalar expression."""


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
def test_non_finite_constants_run_compiled_interpreted_and_replayed(compiled):
    """``inf``, ``-inf`` and ``nan`` give torch's results in every way a program runs: the
    first run compiled (or interpreted), the next two replayed (the prepared call). Only
    the parser's round trip used to see these constants; the compiled code spells them as
    globals, since their ``repr`` reads back as names."""
    evaluator = HostIrEvaluator(parse(NON_FINITE), compiled=compiled)
    generator = torch.Generator().manual_seed(21)
    inf, nan = float("inf"), float("nan")
    for _ in range(3):
        x = torch.randn(4, 3, generator=generator)
        expected = [x * inf, x - inf, x * nan, torch.full((4, 3), -inf), x * -inf]
        for got, want in zip(evaluator.run([x]), expected, strict=True):
            torch.testing.assert_close(got, want, equal_nan=True)
    assert evaluator.runs_compiled() is compiled


@pytest.mark.parametrize("pipeline", [True, False])
def test_nested_loops_and_scalar_inputs_run_the_same_compiled(pipeline):
    program = parse(LOOPS)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    t1, t4 = both_ways(program, [x, 3, 0.5, 2], pipeline=pipeline)
    rows = torch.tensor([j // 2 - k for j in range(3) for k in range(2)], dtype=torch.float32)
    torch.testing.assert_close(t1, x * 0.5 + rows[:, None])
    assert torch.equal(t4, torch.relu(t1) * 0)  # 1 // 2 == 0


@pytest.mark.real_ranks(
    reason="patches hostir to count calls (process-wide: ranks would count each other's)"
)
@pytest.mark.world_sizes(2)
@pytest.mark.parametrize("pipeline", [True, False])
def test_every_instruction_kind_runs_the_same_compiled(multidevice_test, pipeline):
    """tests/data/every_instruction.hir: every collective, streams, a pipelined loop with
    mesh coordinates in its peers, outputs on a one-device mesh (None on the other rank)."""
    rank = multidevice_test.rank
    program = parse((DATA / "every_instruction.hir").read_text())
    generator = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 6, generator=generator), torch.randn(6, 4, generator=generator)
    outputs = both_ways(
        program, [x[2 * rank : 2 * rank + 2].contiguous(), w, 0.5], pipeline=pipeline
    )
    assert (outputs[6] is None) == (rank == 1)  # T18 lives on M1 = [0]


def _row_parallel(devices: int, rank: int) -> tuple[FusionDefinition, list, list]:
    """``x @ w.T + b`` over a mesh of ``devices`` ranks (ranks beyond it hold nothing), the
    tokens in 4 stream chunks: a pipelined stream loop with one Allreduce per chunk."""
    return row_parallel_streams(devices, 4, rank)


@pytest.mark.real_ranks(
    reason="patches hostir to count calls (process-wide: ranks would count each other's)"
)
@pytest.mark.world_sizes(1, 2, 4)
@pytest.mark.parametrize("pipeline", [True, False])
def test_a_stream_loop_runs_the_same_compiled_on_every_rank(multidevice_test, pipeline):
    """A pipelined stream loop on a mesh of half the world (at 2 and 4 ranks, the other
    half runs no instruction): compiled and interpreted agree on every rank. On a mesh of
    one device the loop issues no collective (each chunk's sum is a local copy), so there
    is nothing to pipeline."""
    d, rank = multidevice_test.size, multidevice_test.rank
    devices = max(1, d // 2)
    fd, inputs, (x, w, b) = _row_parallel(devices, rank)
    (y,) = fd.execute(inputs)  # through the frontend, which checks the same (conftest)
    program = fd.host_ir()
    text = str(program)
    assert ("pipeline_stage" in text and "Allreduce" in text) == (devices > 1), text
    (out,) = both_ways(program, inputs, pipeline=pipeline)
    if rank < devices:
        torch.testing.assert_close(out, x @ w.T + b, rtol=1e-5, atol=1e-5)
        assert torch.equal(out, y)
    else:
        assert out is None and y is None


def _failing(program, compiled: bool, word: str, error: Exception) -> HostIrEvaluator:
    """An evaluator of ``program`` whose handler of the ``word`` instruction raises
    ``error`` (the compiled code calls the handler the interpreter would)."""
    evaluator = HostIrEvaluator(program, compiled=compiled)
    (instruction,) = [i for i in walk_instructions(program.body) if keyword(i) == word]

    def fail(context, instruction, operands):
        raise error

    evaluator.step(instruction).handler = fail
    return evaluator


@pytest.mark.parametrize(
    "error", [RuntimeError("boom"), CommunicationError("lost"), ExtentError("too far")]
)
def test_a_failure_in_a_nested_loop_raises_what_the_interpreter_raises(error):
    """A handler failing inside two loops: the interpreter's error (wrapped, prefixed with
    each enclosing loop, or as it is, as the interpreter does), with a note naming the
    instruction's line in the text."""
    program = parse(LOOPS)
    inputs = [torch.randn(6, 4), 3, 0.5, 1]
    raised = []
    for compiled in (False, True):
        error.__notes__ = []  # an ExtentError is raised as it is: forget earlier notes
        with pytest.raises(HostIrError) as caught:
            _failing(program, compiled, "add", error).run(inputs)
        value = caught.value
        raised.append((type(value), str(value), list(getattr(value, "__notes__", []))))
    interpreted, compiled = raised
    assert compiled[:2] == interpreted[:2] and interpreted[2] == []
    assert compiled[2] == [f"{LINE_NOTE}12: add(T2, j // 2 - k, out=T1_c)"]
    assert compiled[1].startswith(
        {
            RuntimeError: "add into T1_c failed on rank 0: RuntimeError: boom",
            CommunicationError: "for: for: add into T1_c: lost",
            ExtentError: "too far",
        }[type(error)]
    )


def test_an_operand_that_does_not_resolve_raises_what_the_interpreter_raises():
    """``1 // m`` with m = 0: the interpreter's error, with the line of its instruction."""
    program = parse(LOOPS)
    inputs = [torch.randn(6, 4), 3, 0.5, 0]
    with pytest.raises(EvaluationError) as interpreted:
        HostIrEvaluator(program, compiled=False).run(inputs)
    with pytest.raises(EvaluationError, match=r"division by zero in 1 // m") as compiled:
        HostIrEvaluator(program).run(inputs)
    assert str(compiled.value) == str(interpreted.value)
    assert compiled.value.__notes__ == [f"{LINE_NOTE}19: T4 : float32[6, 4] = mul(T3, 1 // m)"]
    assert compiled.value.__cause__ is None and interpreted.value.__cause__ is None


def test_the_source_comments_each_instruction_with_its_line():
    """Each instruction's comment gives its line in the program's text form."""
    program = parse((DATA / "every_instruction.hir").read_text())
    lines = str(program).splitlines()
    for pipeline in (True, False):
        source = HostIrEvaluator(program, pipeline=pipeline).compiled_program(0).source
        comments = [c.strip() for c in source.splitlines() if c.strip().startswith("# [")]
        # Pipelined, the first loop's body runs interpreted: the second loop's has one.
        everything = len(list(walk_instructions(program.body)))
        assert len(comments) == (len(program.body) + 1 if pipeline else everything)
        for comment in comments:
            number, text = comment.split(" line ", 1)[1].split(": ", 1)
            text = text.split("  (")[0]
            assert lines[int(number) - 1].strip() == text, comment
    assert "(not on this rank)" in HostIrEvaluator(program).compiled_program(2).source


def test_the_switches_choose_the_interpreter():
    """``compiled=False``, ``HOSTIR_INTERPRET=1`` and ``run(compiled=False)`` interpret;
    a bad value of either is a SettingError naming it."""
    program = parse(LOOPS)
    inputs = [torch.randn(6, 4), 3, 1.5, 1]
    assert not HostIrEvaluator(program, compiled=False).runs_compiled()
    with environment(HOSTIR_INTERPRET="1"):
        assert not HostIrEvaluator(program).runs_compiled()
        assert HostIrEvaluator(program, compiled=True).runs_compiled()
    with environment(HOSTIR_INTERPRET="0"):
        assert HostIrEvaluator(program).runs_compiled()
    evaluator = HostIrEvaluator(program, checks=SelfChecks())  # no interpreted twin (counted)
    with _counting_interpreted() as interpreted:
        evaluator.run(inputs)
        assert interpreted.call_count == 0
        evaluator.run(inputs, compiled=False)
        assert interpreted.call_count > 0
    with environment(HOSTIR_INTERPRET="yes"), pytest.raises(SettingError, match="HOSTIR_INTERPRET"):
        HostIrEvaluator(program)
    with pytest.raises(SettingError, match="compiled: expected True, False or None"):
        HostIrEvaluator(program, compiled="yes")
    with pytest.raises(SettingError, match="compiled: expected True, False or None"):
        evaluator.run(inputs, compiled=1)


def test_listeners_and_profilers_get_the_interpreter():
    """With a listener the evaluator interprets (the listener sees every instruction);
    while a profiler records, each instruction still has its ``hir::<keyword>`` range."""
    program = parse(LOOPS)
    inputs = [torch.randn(6, 4), 3, 1.5, 1]
    seen = []

    class Recorder(Listener):
        def after(self, instruction, context, operands):
            seen.append(keyword(instruction))

    evaluator = HostIrEvaluator(program, listeners=[Recorder()])
    assert not evaluator.runs_compiled()
    evaluator.run(inputs)
    assert seen.count("shard_by_stream") == 12 and seen[-2:] == ["relu", "mul"]
    seen.clear()
    evaluator.run(inputs, compiled=True)  # asked for: no listener sees a compiled run
    assert seen == []
    compiled = HostIrEvaluator(program)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert not compiled.runs_compiled()
        compiled.run(inputs)
    names = [event.name for event in prof.events()]
    assert names.count("hir::shard_by_stream") == 12 and names.count("hir::relu") == 1
    assert compiled.runs_compiled()


def test_the_check_catches_a_difference():
    """check_compiled_outputs passes equal outputs (NaNs in the same places too) and names
    the first output that differs."""
    nan = torch.tensor([float("nan"), 1.0])
    check_compiled_outputs([nan, None], [nan.clone(), None], compiled=True)
    with pytest.raises(EvaluationError, match="output 1 of the compiled run differs"):
        check_compiled_outputs([nan, torch.zeros(1)], [nan, torch.ones(1)], compiled=True)
    with pytest.raises(EvaluationError, match="output 0 of the interpreted run differs"):
        check_compiled_outputs([torch.zeros(1)], [None], compiled=False)
