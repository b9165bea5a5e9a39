"""Threads: one thread at a time communicates on a world (hostir.comm.run_guard).

torch.distributed pairs collectives across ranks by their order, not by thread: two
threads of one rank running programs on the same world at once returned wrong numbers
in about half the calls, with no error. Now the second thread is refused by name, the
run it overlapped refuses to return, and no call returns a wrong result. A world of one
rank has no collectives: threads run at once there.
"""

from __future__ import annotations

import threading

import pytest
import torch

from frontend import shard_tensor
from hostir import Communicator, ConcurrentRunError, HostIrEvaluator, Listener
from hostir.comm.run_guard import WorldGuard
from hostir.errors import EvaluationError
from hostir.ir.sharding import ReduceOp
from hostir.ir.streams import SetCurrentStream
from tests.fault_catalog import full_inputs, local_inputs, row_parallel
from tests.hostir.test_race_checker import _stream_loop_program

WAIT_S = 60.0
"""How long a held run waits for the other thread's call to end (it ends at once)."""


class HoldFirstInstruction(Listener):
    """Holds the run before its first instruction until ``release`` is set, so that the
    other thread's call certainly overlaps it."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.held = False

    def before(self, instruction, context, operands) -> None:
        if not self.held:
            self.held = True
            self.release.wait(WAIT_S)


def call_in_threads(calls: list) -> list:
    """Runs each ``call()`` in a thread of its own, all at once; their outcomes, in order
    (a result, or the exception raised)."""
    outcomes: list = [None] * len(calls)

    def work(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except Exception as error:  # every outcome is checked by the caller
            outcomes[index] = error

    threads = [
        threading.Thread(target=work, args=(k,), name=f"worker-{k}") for k in range(len(calls))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def thread_inputs(d: int, rank: int, seed: int) -> tuple:
    """The program of row_parallel, and inputs of its own for one thread: the same on
    every rank for the same ``seed``, different between seeds (so that a run paired with
    the other thread's would give other numbers)."""
    fd, tvs, full = full_inputs(row_parallel, d)
    torch.manual_seed(seed)
    full = [torch.randn_like(t) for t in full]
    expected = shard_tensor(full[0] @ full[1].T, fd.host_ir().outputs[0], rank)
    return fd, local_inputs(tvs, full, rank), expected


@pytest.mark.real_ranks(
    reason="runs one rank from threads of its own (a simulated rank is one thread)"
)
@pytest.mark.world_sizes(2)
def test_two_threads_of_each_rank_are_refused_by_name(multidevice_test):
    """Both threads of each rank run a program at once (each holds its run until the other
    thread's call has ended): on every rank, one thread is refused before it communicates,
    naming the thread that runs and its program; the other, having run while a call was
    refused, raises too. No call returns a result, let alone a wrong one. Then threads
    taking turns run, and match torch."""
    d, rank = multidevice_test.size, multidevice_test.rank
    cases = [thread_inputs(d, rank, seed) for seed in (1, 2)]
    done = [threading.Event(), threading.Event()]
    evaluators = [
        HostIrEvaluator(fd.host_ir(), listeners=[HoldFirstInstruction(done[1 - k])])
        for k, (fd, _, _) in enumerate(cases)
    ]

    def call(k: int):
        def run():
            try:
                return evaluators[k].run(cases[k][1])
            finally:
                done[k].set()

        return run

    outcomes = call_in_threads([call(0), call(1)])
    for (_, _, expected), outcome in zip(cases, outcomes, strict=True):
        if not isinstance(outcome, Exception):  # a result is never a wrong one
            torch.testing.assert_close(outcome[0], expected, rtol=1e-5, atol=1e-5)
    assert all(isinstance(o, ConcurrentRunError) for o in outcomes), outcomes
    refused = [str(o) for o in outcomes if "cannot run program" in str(o)]
    overlapped = [str(o) for o in outcomes if "its result is not returned" in str(o)]
    assert len(refused) == 1 and len(overlapped) == 1, outcomes
    assert f"rank {rank} of 2: thread 'worker-" in refused[0]
    assert "is running program" in refused[0] and "same world" in refused[0]
    assert "was refused" in overlapped[0]
    # Sequential calls from different threads are fine (the guard was released).
    for fd, local, expected in cases:
        plain = HostIrEvaluator(fd.host_ir())
        (out,) = call_in_threads([lambda e=plain, given=local: e.run(given)])
        torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.real_ranks(
    reason="runs one rank from threads of its own (a simulated rank is one thread)"
)
@pytest.mark.world_sizes(2)
def test_a_failed_run_releases_the_world(multidevice_test):
    """A run that fails on every rank (a listener raising in the middle) leaves the world
    free: another thread then runs and matches torch."""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, local, expected = thread_inputs(d, rank, 3)

    class Fail(Listener):
        def before(self, instruction, context, operands) -> None:
            raise KeyError("injected")

    failing = HostIrEvaluator(fd.host_ir(), listeners=[Fail()])
    (error,) = call_in_threads([lambda: failing.run(local)])
    assert isinstance(error, EvaluationError) and "KeyError: 'injected'" in str(error), error
    (out,) = call_in_threads([lambda: HostIrEvaluator(fd.host_ir()).run(local)])
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)


def test_threads_run_at_once_in_a_world_of_one():
    """World size 1: no collectives, so no guard. Two threads run one evaluator at once
    and both match torch; with a listener (which observes one run at a time) they take
    turns instead of failing."""
    x, w = torch.randn(6, 8), torch.randn(8, 8)
    fd, _, _ = full_inputs(row_parallel, 1)
    program = fd.host_ir()
    shared = HostIrEvaluator(program)
    release = threading.Event()

    class Count(Listener):
        def __init__(self) -> None:
            self.inside = 0
            self.most = 0

        def before(self, instruction, context, operands) -> None:
            self.inside += 1
            self.most = max(self.most, self.inside)
            release.wait(0.01)  # let the other thread try to come in

        def after(self, instruction, context, operands) -> None:
            self.inside -= 1

    counted = Count()
    observed = HostIrEvaluator(program, listeners=[counted])
    for evaluator in (shared, observed):
        outcomes = call_in_threads([lambda e=evaluator: e.run([x, w])] * 2)
        for out in outcomes:
            assert not isinstance(out, Exception), out
            torch.testing.assert_close(out[0], x @ w.T)
    assert counted.most == 1  # the listener saw one run at a time


def test_the_guard_names_both_threads_and_lets_one_thread_in_again():
    guard = WorldGuard()
    guard.enter("program aaa", "rank 0 of 2")
    guard.enter("program aaa", "rank 0 of 2")  # the same thread again: a run inside a run
    outcome = call_in_threads([lambda: guard.enter("program bbb", "rank 0 of 2")])
    assert isinstance(outcome[0], ConcurrentRunError)
    assert str(outcome[0]).startswith(
        "rank 0 of 2: thread 'worker-0' cannot run program bbb: thread 'MainThread' is"
        " running program aaa on the same world"
    )
    assert guard.leave() == []  # still held once
    assert guard.leave() == ["thread 'worker-0' (program bbb)"]
    (free,) = call_in_threads([lambda: guard.enter("program ccc", "rank 0 of 2")])
    assert free is None  # released: another thread enters


def test_collectives_and_the_agreement_outside_a_run_are_refused_too():
    """A collective posted, or an agreement exchange (a rank telling its peers of a
    failure), from another thread while a run holds the world: refused by name before it
    reaches the backend (this communicator's backend would say it cannot reach the
    peers)."""
    world = Communicator(rank=0, world_size=2)
    world.run_guard().enter("program aaa", world.where())
    calls = [
        lambda: world.allreduce(torch.ones(2), (0, 1), ReduceOp.SUM),
        lambda: world.exchange_codes([1, 2]),
        lambda: world.prepare([(0, 1)]),
    ]
    for outcome in call_in_threads(calls):
        assert isinstance(outcome, ConcurrentRunError), outcome
        assert "thread 'MainThread' is running program aaa on the same world" in str(outcome)
    world.run_guard().leave()
    (after,) = call_in_threads([calls[1]])
    assert not isinstance(after, ConcurrentRunError)  # free again: the backend's own answer


class MainStreams(Listener):
    """Records, per thread, torch's current stream after each switch to ``main``."""

    def __init__(self) -> None:
        self.seen: dict[str, list] = {}

    def after(self, instruction, context, operands) -> None:
        if isinstance(instruction, SetCurrentStream) and operands["stream"] == "main":
            name = threading.current_thread().name
            self.seen.setdefault(name, []).append(torch.cuda.current_stream())


def test_each_thread_of_a_pool_keeps_the_main_stream_its_run_started_on(monkeypatch):
    """The stream pool's bookkeeping behind the CUDA test below, on any machine: torch's
    current stream is per thread, so ``main`` is recorded per thread by ``start_run``; a
    stand-in for ``torch.cuda.current_stream`` returns each thread's own marker. A pool
    that kept one ``main`` for every thread (as it did) hands a thread another's."""
    from hostir.run.stream_pool import MAIN, StreamPool

    current = threading.local()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current.stream)
    pool = StreamPool(torch.device("cuda"), 2)
    started, go = threading.Barrier(2), threading.Barrier(2)

    def run(marker: str):
        def call():
            current.stream = marker
            pool.start_run()
            started.wait()  # both threads have started a run before either reads main
            current.stream = f"{marker} (changed inside the run)"
            go.wait()
            return pool.get(MAIN)

        return call

    assert call_in_threads([run("stream of worker 0"), run("stream of worker 1")]) == [
        "stream of worker 0",
        "stream of worker 1",
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA streams")
def test_main_is_the_stream_each_run_and_thread_starts_on():
    """``main`` used to be the stream of the first run that asked, for every later run and
    thread: a run started on another stream switched back to the first one's, racing with
    its caller. Now each run's ``main`` is the stream it started on, per thread."""
    listener = MainStreams()
    evaluator = HostIrEvaluator(_stream_loop_program(True), listeners=[listener])
    x, w = torch.randn(6, 4, device="cuda"), torch.randn(3, 4, device="cuda")
    evaluator.run([x, w])  # on the default stream
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def run_on(stream):
        def run():
            with torch.cuda.stream(stream):
                (out,) = evaluator.run([x, w])
                stream.synchronize()
                return out

        return run

    outcomes = call_in_threads([run_on(stream) for stream in streams])
    for k, (out, stream) in enumerate(zip(outcomes, streams, strict=True)):
        assert not isinstance(out, Exception), out
        torch.testing.assert_close(out, x @ w.T)
        assert listener.seen[f"worker-{k}"] == [stream], (k, listener.seen)
