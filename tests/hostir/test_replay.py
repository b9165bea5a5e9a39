"""Replays (hostir.run.replay) and prepared calls (``hostir.run.executable``, kept by
``HostIrEvaluator.run`` and ``FusionDefinition.execute``): a signature's later runs make
the torch calls directly, with new data every call giving the new result; an Allreduce
over one rank returns its source only where nobody can tell; a failure inside a replay
raises what the interpreter raises; a repeated ``execute`` runs nothing but the replay;
a profiler still sees the interpreter's ranges. (tests/hostir/test_compiled.py runs
every program of its sweep a second time, replayed, and compares bitwise.)"""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch

import hostir.run.replay as replay_module
from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import EvaluationError, HostIrEvaluator, parse
from hostir.ir.instructions import keyword
from hostir.ir.program_info import walk_instructions
from hostir.run.compiled import LINE_NOTE
from hostir.run.compiled_runs import bitwise_equal
from hostir.run.executable import Executable


def _mlp(d: int) -> tuple[FusionDefinition, list]:
    """The README's MLP: column-parallel linear, relu, row-parallel linear (one
    Allreduce over ``d`` ranks), bias."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 8))
        w1, b1 = fd.define_tensor((4 * d, 8)), fd.define_tensor((4 * d,))
        w2, b2 = fd.define_tensor((8, 4 * d)), fd.define_tensor((8,))
        h = fd.ops.relu(fd.ops.linear(x, w1, b1))
        fd.add_output(fd.ops.add(fd.ops.linear(h, w2), b2))
    for tv in (x, w1, b1, w2, b2):
        tv.set_device_mesh(mesh)
    for tv, dim in ((w1, 0), (b1, 0), (w2, 1)):
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)
    return fd, [x, w1, b1, w2, b2]


def _mlp_data(generator: torch.Generator, d: int, tokens: int = 5) -> list[torch.Tensor]:
    shapes = [(tokens, 8), (4 * d, 8), (4 * d,), (8, 4 * d), (8,)]
    return [torch.randn(s, generator=generator) for s in shapes]


def _reference(x, w1, b1, w2, b2) -> torch.Tensor:
    return torch.relu(x @ w1.T + b1) @ w2.T + b2


@pytest.mark.real_ranks(
    reason="patches hostir to count calls (process-wide: ranks would count each other's)"
)
@pytest.mark.world_sizes(1, 2, 4)
def test_repeated_executes_replay_with_new_data(multidevice_test, monkeypatch) -> None:
    """Every call after a signature's first runs its prepared call alone (no call of
    the evaluator: the compiled-against-interpreted check is off here), and each call's
    new data gives the new result; a new signature is prepared once more."""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")  # no interpreted twin run
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")  # the race checker listens: interpreted
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, tvs = _mlp(d)
    generator = torch.Generator().manual_seed(11)
    run = HostIrEvaluator.executable  # what execute calls for a signature it has not run
    with mock.patch.object(HostIrEvaluator, "executable", autospec=True, side_effect=run) as runs:
        for tokens in (5, 3):
            for _ in range(4):
                full = _mlp_data(generator, d, tokens)
                local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
                (out,) = fd.execute(local)
                torch.testing.assert_close(out, _reference(*full), rtol=1e-5, atol=1e-5)
    assert runs.call_count == 2  # the first call of each signature


@pytest.mark.world_sizes(1, 2)
def test_the_replay_calls_torch_and_lets_a_lone_allreduce_pass_its_source(multidevice_test):
    """The replay's compute is the torch calls themselves; on two ranks the Allreduce of
    the partial sums is posted. The lowering issues none on one rank (a local copy), so
    there a written program's Allreduce over one device, of a fresh intermediate, is the
    one that passes its source on uncopied."""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, tvs = _mlp(d)
    full = _mlp_data(torch.Generator().manual_seed(12), d)
    local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
    fd.execute(local)
    (evaluator,) = fd._evaluators.values()
    source = evaluator.replay_program(rank).source
    assert re.search(r"v_T\d+ = F0\(v_T0, v_T1, v_T2\)", source)  # linear(x, w1, bias=b1)
    handlers = re.findall(r"= (H\d+)\(ctx, I\d+, \{'src': v_T\d+\}\)", source)
    assert len(handlers) == (d > 1) and ("Allreduce" in str(fd.host_ir())) == (d > 1)
    assert source.count("(ctx, I") == len(handlers)  # no other handler is called
    assert not re.search(_LONE, source)
    (out,) = fd.execute(local)
    torch.testing.assert_close(out, _reference(*full), rtol=1e-5, atol=1e-5)
    if d == 1:
        evaluator = HostIrEvaluator(parse(LONE_ALLREDUCE_OF_AN_INTERMEDIATE))
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(16))
        (got,) = evaluator.run([x])
        assert len(re.findall(_LONE, evaluator.replay_program(0).source)) == 1
        torch.testing.assert_close(got, x)


_LONE = r"v_(T\d+) = v_(T\d+) if v_T\d+\.is_contiguous\(\)"

LONE_ALLREDUCE_OF_AN_INTERMEDIATE = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[4, 3] @M0 partial{x: sum}
  T1 : float32[4, 3] @M0 partial{x: sum} = neg(T0)
  T2 : float32[4, 3] @M0, R0 = Allreduce(T1, team=M0(x), op=sum)
  wait R0
  T3 : float32[4, 3] @M0 = neg(T2)
  output T3
}
"""


LONE_ALLREDUCE_OF_AN_INPUT = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[4, 3] @M0 partial{x: sum}
  T1 : float32[4, 3] @M0, R0 = Allreduce(T0, team=M0(x), op=sum)
  wait R0
  T2 : float32[4, 3] @M0 = neg(T1)
  output T1
  output T2
}
"""


def test_a_lone_allreduce_of_an_input_copies_it():
    """The source is the caller's tensor and the result an output: sharing memory would
    let a write to one change the other, so the replay copies, as the handler does."""
    evaluator = HostIrEvaluator(parse(LONE_ALLREDUCE_OF_AN_INPUT))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(13))
    first = evaluator.run([x])
    again = evaluator.run([x])
    assert "is_contiguous()" not in evaluator.replay_program(0).source
    for a, b in zip(first, again, strict=True):
        assert bitwise_equal(a, b)
    assert again[0].data_ptr() != x.data_ptr()
    again[0].add_(1)
    torch.testing.assert_close(again[1], -x)


LONE_ALLREDUCE_OF_A_CHUNKED_SOURCE = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[4, 3] @M0 partial{x: sum}
  T1 : float32[4, 3] @M0 partial{x: sum} = neg(T0)
  T2 : float32[4, 3] @M0, R0 = Allreduce(T1, team=M0(x), op=sum)
  wait R0
  for j in range(0, 2) {
    T1_c : float32[2, 3] @M0 partial{x: sum} = shard_by_stream(T1, axis=0, index=j)
    mul(T1_c, 2.0, out=T1_c)
    deallocate T1_c
  }
  T3 : float32[4, 3] @M0 partial{x: sum} = add(T1, T2)
  output T3
}
"""


def test_a_lone_allreduce_of_a_source_a_stream_chunk_writes_copies_it():
    """The Allreduce's source is fresh, neither input nor output, but a stream chunk of it
    is written in place after the Allreduce: sharing memory would let that write change
    the Allreduce's result too, so the replay copies. Without "a shard_by_stream source
    counts as touched" in the replay's aliasing rule, the second and third runs (replays)
    gave ``4 * -x`` instead of ``3 * -x``."""
    evaluator = HostIrEvaluator(parse(LONE_ALLREDUCE_OF_A_CHUNKED_SOURCE))
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(14))
    (first,) = evaluator.run([x])
    torch.testing.assert_close(first, 2 * -x + -x)
    for _ in range(2):
        (again,) = evaluator.run([x])
        assert bitwise_equal(again, first)
    assert "is_contiguous()" not in evaluator.replay_program(0).source


def _loops_program():
    from tests.hostir.test_compiled import LOOPS

    return parse(LOOPS)


def _fail(*args):
    raise RuntimeError("boom")


def _failing_write(failing, written=replay_module.declared_write):
    """The replay's ``declared_write``, with ``failing``'s write raising."""

    def write_of(instruction):
        return (_fail, instruction.INS) if instruction is failing else written(instruction)

    return write_of


def test_a_failing_handler_in_a_replay_raises_what_the_interpreter_raises(monkeypatch):
    """The handler of the preallocated ``add`` inside two loops fails on the second run,
    and so does its write, which a replay calls directly: the interpreter's error, with
    the note naming its line. (The suite's checks are off, as a user runs: the compiled
    check's twin of the first run replays, so the replay would be made before the handler
    is replaced.)"""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")  # the race checker listens: interpreted
    program = _loops_program()
    inputs = [torch.randn(6, 4), 3, 0.5, 1]
    raised = []
    for compiled in (False, True):
        evaluator = HostIrEvaluator(program, compiled=compiled)
        evaluator.run(inputs)  # the signature's first run: fine
        (add,) = [i for i in walk_instructions(program.body) if keyword(i) == "add"]

        evaluator.step(add).handler = _fail
        monkeypatch.setattr(replay_module, "declared_write", _failing_write(add))
        with pytest.raises(EvaluationError) as caught:
            evaluator.run(inputs)
        raised.append((str(caught.value), list(getattr(caught.value, "__notes__", []))))
    (interpreted, no_notes), (replayed, notes) = raised
    assert replayed == interpreted == "add into T1_c failed on rank 0: RuntimeError: boom"
    assert no_notes == [] and notes == [f"{LINE_NOTE}12: add(T2, j // 2 - k, out=T1_c)"]


def test_a_torch_error_in_a_replay_names_the_instruction_and_its_line():
    """A direct torch call that fails (inputs of another shape than the signature the
    replay was made for: the prepared call's key never lets that happen) raises the
    interpreter's error for that instruction."""
    fd, tvs = _mlp(1)
    full = _mlp_data(torch.Generator().manual_seed(14), 1)
    fd.execute(full)
    (evaluator,) = fd._evaluators.values()
    replay = evaluator.replay_program(0)
    wrong = [full[0][:, :5], *full[1:]]
    with pytest.raises(EvaluationError, match=r"^linear defining T5 failed on rank 0: Runtime"):
        replay.run(_context(evaluator), wrong)
    # The MLP's replay reads no context (torch calls only): a prepared call passes the
    # function making one, called only to report a failure, with the same error.
    assert replay.uses_context is False
    made = []

    def make_context():
        made.append(True)
        return _context(evaluator)

    assert len(replay.run(make_context, full)) == 1 and made == []
    with pytest.raises(EvaluationError, match=r"^linear defining T5 failed on rank 0: Runtime"):
        replay.run(make_context, wrong)
    assert made == [True]


def _context(evaluator: HostIrEvaluator):
    from hostir import default_communicator
    from hostir.run.context import RunContext

    return RunContext(evaluator, evaluator.program, default_communicator(), torch.device("cpu"))


def test_a_profiler_sees_the_interpreter_in_a_prepared_call(monkeypatch):
    """Under a torch profiler the prepared call runs interpreted: one ``hir::`` range per
    instruction, as on a first call."""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")  # one run per call
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")
    fd, tvs = _mlp(1)
    full = _mlp_data(torch.Generator().manual_seed(15), 1)
    fd.execute(full)
    fd.execute(full)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        (out,) = fd.execute(full)
    names = [event.name for event in profile.events()]
    # one rank: the partial sums reduced by a local copy (hir::set), no hir::Allreduce
    assert names.count("hir::linear") == 2 and names.count("hir::Allreduce") == 0
    assert names.count("hir::set") == 1, sorted(set(names))
    torch.testing.assert_close(out, _reference(*full), rtol=1e-5, atol=1e-5)


def test_a_replay_on_the_cpu_leaves_the_stream_instructions_out():
    """The row-parallel stream loop: its replay for the CPU calls no stream handler (no
    `H<k>(ctx, I<k>, ...)` for get/set_current_stream or synchronize), the general one
    does; both give the interpreter's result bitwise, and a prepared call on the CPU runs
    the CPU replay."""
    from tests.hostir.test_compiled import _row_parallel

    fd, inputs, (x, w, b) = _row_parallel(1, 0)
    program = fd.host_ir()
    stream_lines = [
        line for line in str(program).splitlines() if "stream(" in line or "synchronize" in line
    ]
    assert stream_lines, str(program)
    evaluator = HostIrEvaluator(program, compiled=True)
    (interpreted,) = HostIrEvaluator(program, compiled=False).run(inputs)
    evaluator.run(inputs)  # the signature's first run: bound, checked
    cpu, general = evaluator.replay_program(0, on_cpu=True), evaluator.replay_program(0)
    calls = {
        "cpu": _stream_handler_calls(cpu.source),
        "general": _stream_handler_calls(general.source),
    }
    assert calls["cpu"] == 0 and calls["general"] >= 3, calls
    (executable,) = evaluator._executables.values()  # the signature's, prepared
    for replay in (cpu, general):
        context = _context(evaluator)  # bound as the prepared call binds it
        context.scalars.update(executable.binding.scalars)
        context.shape_cache = executable.binding.shapes
        assert torch.equal(replay.run(context, inputs)[0], interpreted)
    assert torch.equal(executable.call(inputs)[0], interpreted)  # the prepared call
    assert (0, evaluator.pipeline, True) in evaluator._replays
    torch.testing.assert_close(interpreted, x @ w.T + b, rtol=1e-5, atol=1e-5)


def _stream_handler_calls(source: str) -> int:
    """How many handler calls of a replay's source run a stream instruction (each block
    starts with a comment naming its instruction)."""
    keywords = ("main = get_current_stream", "set_current_stream", "synchronize")
    count, instruction = 0, ""
    for line in source.splitlines():
        comment = re.match(r"\s*# \[\d+\] line \d+: (.*)", line)
        if comment:
            instruction = comment.group(1)
        elif re.search(r"\bH\d+\(ctx, I\d+", line) and instruction.startswith(keywords):
            count += 1
    return count


def _counting_binds(evaluator: HostIrEvaluator, monkeypatch) -> list:
    """The bindings of ``evaluator``'s inputs from now on, one entry each."""
    binds = []
    original = evaluator.input_checks.bind
    monkeypatch.setattr(evaluator.input_checks, "bind", lambda *a: binds.append(1) or original(*a))
    return binds


def test_repeated_runs_of_one_signature_take_the_prepared_call(monkeypatch):
    """HostIrEvaluator.run, like execute: the first run of a signature binds and checks;
    later runs of it bind nothing (the prepared call); another shape, or another value of
    a scalar input, is another signature; an explicit ``compiled`` runs the signature that
    way, its binding applied; the results are the interpreter's throughout."""
    from tests.hostir.test_compiled import LOOPS, _row_parallel

    fd, inputs, _ = _row_parallel(1, 0)
    program = fd.host_ir()
    evaluator = HostIrEvaluator(program)
    binds = _counting_binds(evaluator, monkeypatch)
    (expected,) = HostIrEvaluator(program, compiled=False).run(inputs)
    for _ in range(3):
        assert torch.equal(evaluator.run(inputs)[0], expected)
    assert len(binds) == 1 and len(evaluator._executables) == 1
    again = [2 * t for t in inputs]
    (doubled,) = HostIrEvaluator(program, compiled=False).run(again)
    assert torch.equal(evaluator.run(again)[0], doubled) and len(binds) == 1  # same shapes
    (executable,) = evaluator._executables.values()
    with mock.patch.object(executable, "run", wraps=executable.run) as runs:
        assert torch.equal(evaluator.run(inputs, compiled=True)[0], expected)
    assert runs.call_count >= 1 and len(binds) == 1  # asked for compiled: bound before
    scalars = HostIrEvaluator(parse(LOOPS))
    scalar_binds = _counting_binds(scalars, monkeypatch)
    loop_inputs = [torch.randn(6, 4), 3, 0.5, 1]
    first = scalars.run(loop_inputs)[0]
    assert torch.equal(scalars.run(loop_inputs)[0], first) and len(scalar_binds) == 1
    scalars.run([loop_inputs[0], 3, 1.5, 1])  # another value: another signature
    assert len(scalar_binds) == 2 and len(scalars._executables) == 2


def test_loops_nested_deeper_than_python_compiles_run_without_a_replay():
    """Twelve nested loops inline to more than Python's 20 nested blocks: no replay (the
    compiled program runs them through the loop handler), and repeated runs still give
    the interpreter's result."""
    lines, indent = [], "  "
    for k in range(12):
        lines.append(f"{indent}for i{k} in range(0, 1) {{")
        indent += "  "
    lines.append(f"{indent}neg(x, out=y)")
    for _ in range(12):
        indent = indent[:-2]
        lines.append(f"{indent}}}")
    text = "%HostIrContainer {\n  input x : float32[4]\n  allocate y : float32[4]\n"
    program = parse(text + "\n".join(lines) + "\n  output y\n}\n")
    evaluator = HostIrEvaluator(program)
    value = torch.randn(4)
    for _ in range(3):
        assert torch.equal(evaluator.run([value])[0], -value)
    assert evaluator.replay_program(0, on_cpu=True) is None
    (executable,) = evaluator._executables.values()  # no prepared call: whole runs
    assert executable.call.__func__ in (Executable._run_again, Executable._checked_run_again)


@pytest.mark.world_sizes(2, 4)
def test_repeated_runs_between_ranks_bind_once_and_give_new_results(multidevice_test):
    """HostIrEvaluator.run of the tensor-parallel MLP on every rank, again and again with
    new data of one signature: one binding (and one agreement) per rank, then the
    prepared call, each run's result the reference's."""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, tvs = _mlp(d)
    generator = torch.Generator().manual_seed(12)
    evaluator = HostIrEvaluator(fd.host_ir())
    binds = []
    original = evaluator.input_checks.bind
    evaluator.input_checks.bind = lambda *a: binds.append(1) or original(*a)
    for _ in range(4):
        full = _mlp_data(generator, d, 5)
        local = [shard_tensor(t, tv, rank) for t, tv in zip(full, tvs, strict=True)]
        (out,) = evaluator.run(local)
        torch.testing.assert_close(out, _reference(*full), rtol=1e-5, atol=1e-5)
    assert len(binds) == 1 and len(evaluator._executables) == 1
