"""CUDA graphs (hostir.run.cuda_graph_checks, hostir.run.cuda_graphs): what cannot be
captured is refused by name (no CUDA, inputs off CUDA, listeners, foreign handlers, a
backend other than NCCL, a blocking wait), the ``cuda_graph`` option and
``HOSTIR_CUDA_GRAPH``; on a GPU, a replay gives bitwise what the uncaptured run gives,
new inputs give new results, earlier results stay as they were, and a changed scalar
input is refused.

The GPU tests skip on a machine without CUDA; the rest runs everywhere."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir import (
    CudaGraphError,
    HostIrEvaluator,
    Listener,
    LocalCommunicator,
    RaceChecker,
    SelfChecks,
    TorchCommunicator,
    parse,
)
from hostir.comm.communicator import Communicator
from hostir.errors import SettingError
from hostir.ir.instructions import keyword
from hostir.ir.program_info import walk_instructions
from hostir.run.compiled_runs import bitwise_equal
from hostir.run.cuda_graph_checks import (
    NEEDS_CUDA,
    _blocking_wait_problems,
    capture_problems,
    check_capturable,
    cuda_backend,
    graphing,
)
from hostir.run.cuda_graphs import GraphedProgram
from tests.hostir.test_compiled import LOOPS, _row_parallel
from tests.hostir.test_pipelined_loops import environment

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="captures and replays CUDA graphs: needs a CUDA GPU"
)

HIDDEN, FFN = 16, 64


@pytest.fixture(autouse=True)
def _no_race_checker(monkeypatch):
    """Runs as a user's do: the suite's race checker (``HOSTIR_CHECK_RACES``), which every
    evaluator now attaches, would be named among the problems of every capture (as it is
    in test_listeners_and_the_race_checker_are_named)."""
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")


WRITES_ITS_INPUT = """%HostIrContainer {
  input T0 : float32[4, 4]
  input T1 : float32[1, 4]
  T0_c : float32[1, 4] = shard_by_stream(T0, axis=0, index=0)
  neg(T1, out=T0_c)
  T2 : float32[4, 4] = relu(T0)
  output T2
}
"""
"""A program that writes into its input T0 (its first row), as a hand-written one may."""


def _mlp() -> FusionDefinition:
    """The README's tensor-parallel MLP at world size 1: ``relu(x @ w1.T + b1) @ w2.T + b2``,
    w1/b1 column-parallel and w2 row-parallel (one Allreduce, a local copy at one rank)."""
    mesh = DeviceMesh(torch.arange(1))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        w1 = fd.define_tensor((FFN, HIDDEN))
        b1 = fd.define_tensor((FFN,))
        w2 = fd.define_tensor((HIDDEN, FFN))
        b2 = fd.define_tensor((HIDDEN,))
        h = fd.ops.relu(fd.ops.linear(x, w1, b1))
        fd.add_output(fd.ops.linear(h, w2, b2))
    for tv in (x, b2):
        tv.set_device_mesh(mesh)
    for tv, dim in ((w1, 0), (b1, 0), (w2, 1)):
        tv.set_device_mesh(mesh)
        tv.outer_split(dim, 1)
        tv.axis(dim).parallelize(ParallelType.mesh_x)
    return fd


def _mlp_inputs(seed: int, device: str = "cpu") -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(8, HIDDEN), (FFN, HIDDEN), (FFN,), (HIDDEN, FFN), (HIDDEN,)]
    return [torch.randn(shape, generator=generator).to(device) for shape in shapes]


def _mlp_reference(x, w1, b1, w2, b2) -> torch.Tensor:
    return torch.relu(x @ w1.T + b1) @ w2.T + b2


def _besides_the_device(evaluator, communicator) -> list[str]:
    """What capture_problems finds besides the device (no input given: CPU here)."""
    problems = capture_problems(evaluator, [], communicator)
    return [problem for problem in problems if "CUDA device" not in problem]


NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the refusal where CUDA is absent; with CUDA the same call captures and replays,"
    " which the needs_cuda tests below check",
)
"""A test of what a machine without CUDA says; on a CUDA machine its counterpart runs."""


# -- Refusals and options: every machine ---------------------------------------------------


@NO_CUDA
def test_without_cuda_a_capture_is_refused_because_graphs_need_cuda():
    evaluator = HostIrEvaluator(_mlp().host_ir(), communicator=LocalCommunicator())
    inputs = _mlp_inputs(0)
    with pytest.raises(CudaGraphError, match=NEEDS_CUDA):
        check_capturable(evaluator, inputs, LocalCommunicator())
    with pytest.raises(CudaGraphError, match=NEEDS_CUDA):
        GraphedProgram(evaluator.run, inputs, "cuda")


def test_a_device_that_is_not_cuda_is_refused():
    evaluator = HostIrEvaluator(_mlp().host_ir())
    with pytest.raises(CudaGraphError, match=f"{NEEDS_CUDA}: "):
        GraphedProgram(evaluator.run, _mlp_inputs(0), "cpu")


def test_inputs_off_cuda_are_named():
    """Each tensor input not on CUDA is named; an evaluator pinned to the CPU is refused."""
    program = _mlp().host_ir()
    names = [value.name for value in program.inputs]
    inputs = _mlp_inputs(0)
    problems = capture_problems(HostIrEvaluator(program), inputs, LocalCommunicator())
    assert problems == [f"input {name} is on cpu, not on a CUDA device" for name in names]
    pinned = HostIrEvaluator(program, device="cpu")
    assert capture_problems(pinned, inputs, LocalCommunicator()) == [
        "the evaluator runs on cpu, not on a CUDA device"
    ]
    scalars_only = parse("%HostIrContainer {\n  input n : int64\n}\n")
    (problem,) = capture_problems(HostIrEvaluator(scalars_only), [3], LocalCommunicator())
    assert "no tensor input is on a CUDA device" in problem


def test_listeners_and_the_race_checker_are_named():
    class Recorder(Listener):
        pass

    evaluator = HostIrEvaluator(_mlp().host_ir(), listeners=[RaceChecker(), Recorder()])
    problems = _besides_the_device(evaluator, LocalCommunicator())
    assert len(problems) == 2
    assert problems[0].startswith("the race checker (RaceChecker, HOSTIR_CHECK_RACES) is attached")
    assert problems[1].startswith("listener Recorder is attached")


def test_a_handler_from_outside_hostir_is_named():
    """hostir cannot vouch for a handler it did not write (docs/extending.md): it may read
    tensor values on the host."""
    evaluator = HostIrEvaluator(_mlp().host_ir())
    assert _besides_the_device(evaluator, LocalCommunicator()) == []  # hostir's own

    def foreign(context, instruction, operands):
        return [operands["src"]]

    (relu,) = [i for i in walk_instructions(evaluator.program.body) if keyword(i) == "relu"]
    evaluator.step(relu).handler = foreign
    (problem,) = _besides_the_device(evaluator, LocalCommunicator())
    assert problem.startswith(f"instruction Unary runs a handler from {__name__}")


def test_communication_between_ranks_needs_a_torch_communicator():
    """At one rank every collective is a local copy: no backend is asked for. A program
    that communicates between ranks through a communicator that is not torch's (a
    simulation) is refused, naming it."""
    fd, _, _ = _row_parallel(2, 0)
    evaluator = HostIrEvaluator(fd.host_ir())
    simulated = Communicator(rank=0, world_size=2)
    (problem,) = _besides_the_device(evaluator, simulated)
    assert problem.startswith(
        "the program communicates between ranks through Communicator(rank=0, world_size=2)"
    )
    local = HostIrEvaluator(_row_parallel(1, 0)[0].host_ir())
    assert _besides_the_device(local, LocalCommunicator()) == []


@pytest.mark.real_ranks(reason="checks the backend of the torch.distributed world")
@pytest.mark.world_sizes(2)
def test_the_backend_of_the_world_must_be_nccl(multidevice_test):
    """On gloo (the CPU suite) a program with an Allreduce between the ranks is refused,
    naming gloo; over NCCL (under torchrun on GPUs) the backend is not the problem."""
    fd, _, _ = _row_parallel(2, multidevice_test.rank)
    # No race checker (the ranks' environment asks for one; see _no_race_checker)
    evaluator = HostIrEvaluator(fd.host_ir(), checks=SelfChecks())
    problems = _besides_the_device(evaluator, TorchCommunicator())
    if cuda_backend() == "gloo":
        (problem,) = problems
        assert problem.startswith("the program communicates between ranks over gloo")
    else:
        assert not any("communicates between ranks" in problem for problem in problems)


def test_the_cuda_backend_is_read_from_a_device_list():
    assert cuda_backend("nccl") == "nccl"
    assert cuda_backend("gloo") == "gloo"
    assert cuda_backend("cpu:gloo,cuda:nccl") == "nccl"


def test_a_blocking_nccl_wait_is_refused():
    """torch's rules, not hostir's: ``True`` is on, ``no`` off, and nothing is an error."""
    with environment(TORCH_NCCL_BLOCKING_WAIT="1", NCCL_BLOCKING_WAIT="0"):
        (problem,) = _blocking_wait_problems()
        assert problem.startswith("TORCH_NCCL_BLOCKING_WAIT is on: every wait would block")
    with environment(TORCH_NCCL_BLOCKING_WAIT="no", NCCL_BLOCKING_WAIT="True"):
        (problem,) = _blocking_wait_problems()
        assert problem.startswith("NCCL_BLOCKING_WAIT is on")
    with environment(TORCH_NCCL_BLOCKING_WAIT="0", NCCL_BLOCKING_WAIT=""):
        assert _blocking_wait_problems() == []


def test_the_cuda_graph_option_and_its_variable():
    with environment(HOSTIR_CUDA_GRAPH=""):
        assert graphing() is False
        assert graphing(True) is True
    with environment(HOSTIR_CUDA_GRAPH="1"):
        assert graphing() is True
        assert graphing(False) is False
    with environment(HOSTIR_CUDA_GRAPH="yes"), pytest.raises(SettingError, match="HOSTIR_CUDA"):
        graphing()
    with pytest.raises(SettingError, match="cuda_graph: expected True, False or None"):
        graphing(1)


# -- Capture and replay: a CUDA GPU ----------------------------------------------------------


def _replays_like_uncaptured_runs(program, runs: list[list], **options) -> list[list]:
    """Captures ``program`` on ``runs[0]`` and replays it on each run's inputs in turn:
    each replay's outputs are bitwise those of an uncaptured run, and the outputs of
    earlier replays are unchanged by later ones. Returns the replays' outputs."""
    evaluator = HostIrEvaluator(program, communicator=LocalCommunicator(), **options)
    check_capturable(evaluator, runs[0], evaluator.communicator)
    names = [value.name for value in program.inputs]
    graphed = GraphedProgram(evaluator.run, runs[0], "cuda", names=names)
    replays, expected = [], []
    for inputs in runs:
        replays.append(graphed.replay(inputs))
        expected.append(evaluator.run(inputs))
        for outputs, wanted in zip(replays, expected, strict=True):
            for a, b in zip(outputs, wanted, strict=True):
                assert (a is None and b is None) or bitwise_equal(a, b)
    return replays


@needs_cuda
def test_the_mlp_replays_bitwise_and_new_inputs_give_new_results():
    runs = [_mlp_inputs(seed, "cuda") for seed in range(3)]
    replays = _replays_like_uncaptured_runs(_mlp().host_ir(), runs)
    for (out,), inputs in zip(replays, runs, strict=True):
        torch.testing.assert_close(out, _mlp_reference(*inputs), rtol=1e-4, atol=1e-4)
    assert not torch.equal(replays[0][0], replays[1][0])


@needs_cuda
@pytest.mark.parametrize("pipeline", [True, False])
def test_a_stream_loop_on_pool_streams_replays_bitwise(pipeline):
    """Four chunks on the pool's streams, forked from and joined to the capture stream
    by the program's own synchronizes."""
    fd, inputs, _ = _row_parallel(1, 0)
    program = fd.host_ir()
    assert "stream" in str(program)
    runs = [[t.cuda() for t in inputs], [(2 * t - 1).cuda() for t in inputs]]
    replays = _replays_like_uncaptured_runs(program, runs, pipeline=pipeline)
    for (out,), (x, w, b) in zip(replays, runs, strict=True):
        torch.testing.assert_close(out, x @ w.T + b, rtol=1e-4, atol=1e-4)


@needs_cuda
def test_scalar_inputs_are_part_of_the_graph():
    """Loop bounds and factors from scalar inputs are captured as they were: the same
    scalars replay bitwise, another value is refused by name."""
    program = parse(LOOPS)
    runs = [[torch.randn(6, 4, device="cuda"), 3, 1.5, 1] for _ in range(2)]
    _replays_like_uncaptured_runs(program, runs)
    evaluator = HostIrEvaluator(program, communicator=LocalCommunicator())
    graphed = GraphedProgram(evaluator.run, runs[0], "cuda", names=["T0", "n", "s0", "m"])
    with pytest.raises(CudaGraphError, match="input n was 3 when the graph was captured, got 2"):
        graphed.replay([runs[1][0], 2, 1.5, 1])
    with pytest.raises(CudaGraphError, match=r"input T0: .* shape \[6, 4\]"):
        graphed.replay([torch.randn(4, 6, device="cuda"), 3, 1.5, 1])


@needs_cuda
def test_an_input_on_the_cpu_is_refused_by_name():
    program = _mlp().host_ir()
    inputs = _mlp_inputs(0, "cuda")
    inputs[3] = inputs[3].cpu()
    evaluator = HostIrEvaluator(program, communicator=LocalCommunicator())
    name = program.inputs[3].name
    with pytest.raises(CudaGraphError, match=f"input {name} is on cpu, not on a CUDA device"):
        check_capturable(evaluator, inputs, evaluator.communicator)


@needs_cuda
def test_replays_on_another_stream_wait_for_the_last_one():
    evaluator = HostIrEvaluator(_mlp().host_ir(), communicator=LocalCommunicator())
    runs = [_mlp_inputs(seed, "cuda") for seed in range(2)]
    graphed = GraphedProgram(evaluator.run, runs[0], "cuda")
    first = graphed.replay(runs[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        second = graphed.replay(runs[1])
    torch.cuda.current_stream().wait_stream(side)
    third = graphed.replay(runs[0])
    assert bitwise_equal(first[0], third[0])
    assert bitwise_equal(second[0], evaluator.run(runs[1])[0])
    # replay_known (execute's prepared call) orders its streams the same way
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.current_stream())
        fourth = graphed.replay_known(runs[1])
    torch.cuda.current_stream().wait_stream(side)
    fifth = graphed.replay_known(runs[0])
    assert bitwise_equal(fourth[0], second[0]) and bitwise_equal(fifth[0], first[0])


def test_the_program_the_gpu_test_refuses_writes_into_its_input():
    """Uncaptured, WRITES_ITS_INPUT changes the caller's T0: what a replay could not do."""
    x, y = torch.ones(4, 4), torch.full((1, 4), 2.0)
    HostIrEvaluator(parse(WRITES_ITS_INPUT), communicator=LocalCommunicator()).run([x, y])
    assert torch.equal(x[0], -y[0]) and torch.equal(x[1:], torch.ones(3, 4))


@needs_cuda
def test_a_program_that_writes_into_an_input_is_refused_by_name():
    evaluator = HostIrEvaluator(parse(WRITES_ITS_INPUT), communicator=LocalCommunicator())
    inputs = [torch.ones(4, 4, device="cuda"), torch.full((1, 4), 2.0, device="cuda")]
    with pytest.raises(CudaGraphError, match="the program writes into input T0: a replay"):
        GraphedProgram(evaluator.run, inputs, "cuda", names=["T0", "T1"])
    assert torch.equal(inputs[0], torch.ones(4, 4, device="cuda"))  # only its copy written


def test_the_mlp_the_gpu_tests_capture_computes_the_reference():
    """The program the GPU tests capture, run uncaptured on CPU: the torch reference."""
    inputs = _mlp_inputs(0)
    (out,) = HostIrEvaluator(_mlp().host_ir(), communicator=LocalCommunicator()).run(inputs)
    torch.testing.assert_close(out, _mlp_reference(*inputs), rtol=1e-5, atol=1e-5)


# -- through FusionDefinition.execute ----------------------------------------------------


def _small_mlp() -> tuple[FusionDefinition, list[torch.Tensor]]:
    """A one-rank linear, relu, linear with biases, and random inputs for it."""
    with FusionDefinition() as fd:
        x, w1, b1 = fd.define_tensor((-1, 8)), fd.define_tensor((16, 8)), fd.define_tensor((16,))
        w2 = fd.define_tensor((8, 16))
        fd.add_output(fd.ops.linear(fd.ops.relu(fd.ops.linear(x, w1, b1)), w2))
    generator = torch.Generator().manual_seed(21)
    shapes = [(4, 8), (16, 8), (16,), (8, 16)]
    return fd, [torch.randn(s, generator=generator) for s in shapes]


@NO_CUDA
def test_execute_refuses_a_cuda_graph_without_cuda(monkeypatch):
    """``execute(cuda_graph=True)`` and ``HOSTIR_CUDA_GRAPH=1`` on a machine without CUDA:
    CudaGraphError saying why, before anything runs; a bad value is a SettingError."""
    fd, inputs = _small_mlp()
    with pytest.raises(CudaGraphError, match="CUDA graphs need CUDA"):
        fd.execute(inputs, cuda_graph=True)
    monkeypatch.setenv("HOSTIR_CUDA_GRAPH", "1")
    with pytest.raises(CudaGraphError, match="CUDA graphs need CUDA"):
        fd.execute(inputs)
    with pytest.raises(SettingError, match="cuda_graph: expected True, False or None"):
        fd.execute(inputs, cuda_graph="yes")
    (out,) = fd.execute(inputs, cuda_graph=False)  # asked not to: runs eagerly
    x, w1, b1, w2 = inputs
    torch.testing.assert_close(out, torch.relu(x @ w1.T + b1) @ w2.T)


@NO_CUDA
def test_an_evaluator_refuses_a_cuda_graph_without_cuda(monkeypatch):
    """``HostIrEvaluator.run(cuda_graph=True)`` (the one run path, as ``execute``) and
    ``HOSTIR_CUDA_GRAPH=1`` on a machine without CUDA, a program parsed from text: the
    same CudaGraphError, before anything runs; a bad value is a SettingError; the same
    evaluator then runs eagerly."""
    program = parse(str(_small_mlp()[0].host_ir()))
    evaluator = HostIrEvaluator(program)
    inputs = _small_mlp()[1]
    with pytest.raises(CudaGraphError, match="CUDA graphs need CUDA"):
        evaluator.run(inputs, cuda_graph=True)
    monkeypatch.setenv("HOSTIR_CUDA_GRAPH", "1")
    with pytest.raises(CudaGraphError, match="CUDA graphs need CUDA"):
        evaluator.run(inputs)
    with pytest.raises(SettingError, match="cuda_graph: expected True, False or None"):
        evaluator.run(inputs, cuda_graph="yes")
    (out,) = evaluator.run(inputs, cuda_graph=False)
    x, w1, b1, w2 = inputs
    torch.testing.assert_close(out, torch.relu(x @ w1.T + b1) @ w2.T)


class StandInGraph:
    """``GraphedProgram``'s contract without CUDA, for the run path around it: the warm-up
    runs and the capture call ``run_once``; a replay runs it again."""

    made: list[StandInGraph] = []

    def __init__(self, run_once, inputs, device, *, names=None) -> None:
        self.run_once, self.names = run_once, names
        self.first = [run_once(list(inputs)) for _ in range(4)][0]  # 3 warm-ups, a capture
        StandInGraph.made.append(self)

    def replay(self, inputs):
        return self.run_once(list(inputs))

    def replay_known(self, inputs):
        return self.run_once(list(inputs))


def test_the_cuda_graph_path_of_execute_and_run_is_one_path(monkeypatch):
    """``execute(cuda_graph=True)`` and ``HostIrEvaluator.run(cuda_graph=True)`` take the
    same path (hostir.run.executable): the signature's first call captures once (here a
    stand-in for the graph, so that the path runs without CUDA), its first warm-up run is
    the compiled program that checks every result (the others and the capture replay), the
    later calls are the graph's replay, and each call's new data gives its result."""
    from hostir.run import executable as executable_module

    monkeypatch.setattr(executable_module, "GraphedProgram", StandInGraph)
    monkeypatch.setattr(executable_module, "check_capturable", lambda *args: None)
    StandInGraph.made.clear()
    fd, inputs = _small_mlp()
    program = parse(str(fd.host_ir()))
    run_body = HostIrEvaluator.run_body
    for call in (fd.execute, HostIrEvaluator(program).run):
        with mock.patch.object(
            HostIrEvaluator, "run_body", autospec=True, side_effect=run_body
        ) as bodies:
            for scale in (1.0, 2.0, 3.0):
                given = [scale * t for t in inputs]
                (out,) = call(given, cuda_graph=True)
                reference = torch.relu(given[0] @ given[1].T + given[2]) @ given[3].T
                torch.testing.assert_close(out, reference)
        assert bodies.call_count == 1  # the first warm-up run; everything else replays
    assert len(StandInGraph.made) == 2 and StandInGraph.made[0].names == ["T0", "T1", "T2", "T3"]


@needs_cuda
def test_an_evaluator_replays_a_cuda_graph_as_execute_does():
    """On CUDA, a program parsed from text: ``run(cuda_graph=True)`` captures the first
    call of a signature and replays it for the later ones, bitwise what an eager run gives,
    new data giving its new result, earlier outputs unchanged (the executable keeps the
    graph, as for ``execute``)."""
    program = parse(str(_small_mlp()[0].host_ir()))
    inputs = [t.cuda() for t in _small_mlp()[1]]
    evaluator = HostIrEvaluator(program)
    (eager,) = HostIrEvaluator(program).run(inputs)
    (first,) = evaluator.run(inputs, cuda_graph=True)
    assert bitwise_equal(first, eager)
    kept = first.clone()
    again = [t + 1 for t in inputs]
    (second,) = evaluator.run(again, cuda_graph=True)
    (expected,) = HostIrEvaluator(program).run(again)
    assert bitwise_equal(second, expected) and bitwise_equal(first, kept)
    (executable,) = [e for e in evaluator._executables.values() if e.graph is not None]
    assert executable.call == executable.graph.replay_known


@needs_cuda
def test_execute_with_a_cuda_graph_replays_new_inputs(monkeypatch):
    """On CUDA: the graphed execute gives the eager result bitwise, then new data gives
    its new result (the prepared call replays the graph), earlier outputs unchanged. (The
    suite checks races on every run, which a capture refuses: off here.)"""
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")
    fd, inputs = _small_mlp()
    inputs = [t.cuda() for t in inputs]
    eager = fd.execute(inputs, cuda_graph=False)
    first = fd.execute(inputs, cuda_graph=True)
    assert bitwise_equal(first[0], eager[0])
    kept = first[0].clone()
    again = [t + 1 for t in inputs]
    (second,) = fd.execute(again, cuda_graph=True)
    (expected,) = fd.execute(again, cuda_graph=False)
    assert bitwise_equal(second, expected) and bitwise_equal(first[0], kept)


def test_a_replay_checks_its_inputs_against_the_capture():
    """What a replay checks before it copies anything (on every machine: the check reads
    only the static inputs kept at capture): the count, each tensor's shape, dtype and
    device, each scalar's value; the tensors pass on in order."""
    graphed = object.__new__(GraphedProgram)  # the capture itself needs CUDA
    statics = [torch.zeros(2, 3), 4, torch.zeros(5)]
    graphed._static, graphed._names = statics, ["T0", "n", "T1"]
    given = [torch.ones(2, 3), 4, torch.ones(5)]
    tensors = graphed._checked_tensors(given)
    assert len(tensors) == 2 and tensors[0] is given[0] and tensors[1] is given[2]
    with pytest.raises(CudaGraphError, match="captured with 3 inputs, got 2"):
        graphed._checked_tensors(given[:2])
    with pytest.raises(CudaGraphError, match=r"input T1: .* shape \[5\] and dtype torch.float32"):
        graphed._checked_tensors([given[0], 4, torch.ones(5, dtype=torch.float64)])
    with pytest.raises(CudaGraphError, match="input n was 4 when the graph was captured, got 5"):
        graphed._checked_tensors([given[0], 5, given[2]])
