"""The race checker on hand-written programs: streams, aliases, communications, loops.

Each program runs in one process with ``RaceChecker`` as a listener; racy programs
must raise ``RaceError`` naming the buffer, both streams and both instructions,
and the others must run through with the right numbers.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from hostir import (
    Allocate,
    Allreduce,
    Deallocate,
    ForLoop,
    GetCurrentStream,
    HostIrContainer,
    HostIrError,
    HostIrEvaluator,
    Linear,
    LocalCommunicator,
    Mesh,
    MeshAxis,
    Permute,
    RequestValue,
    Set,
    SetCurrentStream,
    ShardByStream,
    StreamValue,
    Symbol,
    Synchronize,
    Team,
    Unary,
    UnaryOpKind,
    Wait,
    parse,
)
from hostir.errors import EvaluationError, RaceError
from hostir.ir.scalars import mod
from hostir.run.race_checker import RaceChecker, race_checking_enabled
from tests.hostir.programs import c, tensor

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MAIN = StreamValue(name="main")
TEAM = Team(mesh=Mesh(devices=(0,), shape=(1,)), axes=(MeshAxis.X,))


def stream(index) -> StreamValue:
    """Stream ``index`` of the pool (an int or a scalar expression)."""
    return StreamValue(index=c(index) if isinstance(index, int) else index)


def checked_run(program: HostIrContainer, inputs, checker: RaceChecker | None = None):
    """Runs ``program`` in a world of one with a race checker."""
    evaluator = HostIrEvaluator(
        program, communicator=LocalCommunicator(), listeners=[checker or RaceChecker()]
    )
    return evaluator.run(inputs)


def neg_into_chunk(index: int, rows: int, x, buf) -> tuple:
    """``buf_<index> = chunk of buf``, ``neg(x_<index>, out=buf_<index>)``."""
    x_i, buf_i = tensor(f"x_{index}", rows, 3), tensor(f"buf_{index}", rows, 3)
    return (
        ShardByStream(out=x_i, src=x, axis=0, index=c(index)),
        ShardByStream(out=buf_i, src=buf, axis=0, index=c(index)),
        Unary(op=UnaryOpKind.NEG, out=buf_i, src=x_i, preallocated=True),
    )


# -- (1), (2): a pool stream writing into main's buffer --------------------------


def _one_stream_program(synchronize: bool) -> HostIrContainer:
    x, buf = tensor("x", 4, 3), tensor("buf", 4, 3)
    body = (
        GetCurrentStream(out=MAIN),
        Allocate(out=buf),
        SetCurrentStream(stream=stream(0)),
        *((Synchronize(stream=MAIN),) if synchronize else ()),
        *neg_into_chunk(0, 2, x, buf),
        *neg_into_chunk(1, 2, x, buf),
        SetCurrentStream(stream=MAIN),
        Synchronize(stream=stream(0)),
    )
    return HostIrContainer(inputs=(x,), outputs=(buf,), body=body)


@pytest.mark.parametrize("device", DEVICES)
def test_stream_writing_main_buffer_without_synchronize_races(device):
    """stream(0) writes into a buffer main allocated, without synchronize(main)."""
    program = _one_stream_program(synchronize=False)
    with pytest.raises(RaceError) as caught:
        checked_run(program, [torch.randn(4, 3, device=device)])
    assert str(caught.value) == (
        "race on buf and buf_0 (overlapping views of one buffer): written by allocate"
        " defining buf on main and written by neg into buf_0 on stream(0) with no"
        " synchronize or wait between them (rank 0)"
    )
    assert isinstance(caught.value, EvaluationError) and isinstance(caught.value, HostIrError)


@pytest.mark.parametrize("device", DEVICES)
def test_stream_writing_main_buffer_after_synchronize_is_fine(device):
    """The same program with synchronize(main) on stream(0) runs and computes -x."""
    program = _one_stream_program(synchronize=True)
    x = torch.randn(4, 3, device=device)
    (result,) = checked_run(program, [x])
    if device == "cuda":
        torch.cuda.synchronize()
    torch.testing.assert_close(result, -x)


def test_reading_an_input_on_a_fresh_stream_races():
    """Inputs count as written by main: a fresh stream must synchronize before reading."""
    x, y = tensor("x", 4), tensor("y", 4)
    program = HostIrContainer(
        inputs=(x,),
        outputs=(y,),
        body=(
            GetCurrentStream(out=MAIN),
            SetCurrentStream(stream=stream(3)),
            Unary(op=UnaryOpKind.RELU, out=y, src=x),
            SetCurrentStream(stream=MAIN),
            Synchronize(stream=stream(3)),
        ),
    )
    with pytest.raises(
        RaceError,
        match=r"race on x: written by input x on main and read by relu defining y on stream\(3\)",
    ):
        checked_run(program, [torch.randn(4)])


# -- (3), (4): two streams, disjoint and overlapping slices ------------------------


def _two_streams_program(
    final_syncs: tuple[int, ...], widths=(2, 2), indices=(0, 1), axis=0
) -> HostIrContainer:
    """Stream ``k`` (0 and 1) writes chunk ``indices[k]`` (``widths[k]`` wide along
    ``axis``) of ``buf`` after synchronizing with main; main then synchronizes with
    ``final_syncs`` and copies ``buf`` into ``y``."""
    x, buf, y = tensor("x", 4, 4), tensor("buf", 4, 4), tensor("y", 4, 4)
    body = [GetCurrentStream(out=MAIN), Allocate(out=buf)]
    for k in (0, 1):
        shape = [4, 4]
        shape[axis] = widths[k]
        x_k, buf_k = tensor(f"x_{k}", *shape), tensor(f"buf_{k}", *shape)
        body += [
            SetCurrentStream(stream=stream(k)),
            Synchronize(stream=MAIN),
            ShardByStream(out=x_k, src=x, axis=axis, index=c(indices[k])),
            ShardByStream(out=buf_k, src=buf, axis=axis, index=c(indices[k])),
            Unary(op=UnaryOpKind.NEG, out=buf_k, src=x_k, preallocated=True),
        ]
    body.append(SetCurrentStream(stream=MAIN))
    body += [Synchronize(stream=stream(k)) for k in final_syncs]
    body.append(Set(out=y, src=buf))
    return HostIrContainer(inputs=(x,), outputs=(y,), body=tuple(body))


@pytest.mark.parametrize("axis", [0, 1])
def test_two_streams_writing_disjoint_slices_then_main_reads(axis):
    """Disjoint row (or interleaved column) chunks on two streams; main synchronizes both."""
    x = torch.randn(4, 4)
    (y,) = checked_run(_two_streams_program((0, 1), axis=axis), [x])
    torch.testing.assert_close(y, -x)


def test_main_reading_without_synchronizing_the_writers_races():
    """Main reads the whole buffer while stream(0) (then stream(1)) may still write."""
    with pytest.raises(
        RaceError,
        match=r"race on buf_0 and buf \(overlapping views of one buffer\): written by neg into"
        r" buf_0 on stream\(0\) and read by set defining y on main with no synchronize or wait",
    ):
        checked_run(_two_streams_program(()), [torch.randn(4, 4)])
    with pytest.raises(RaceError, match=r"neg into buf_1 on stream\(1\) and read by set"):
        checked_run(_two_streams_program((0,)), [torch.randn(4, 4)])


@pytest.mark.parametrize("axis", [0, 1])
def test_overlapping_slices_on_two_streams_race(axis):
    """stream(0) writes chunk 0 of width 2, stream(1) chunk 0 of width 4 (all of it): they
    overlap."""
    program = _two_streams_program((0, 1), widths=(2, 4), indices=(0, 0), axis=axis)
    with pytest.raises(
        RaceError,
        match=r"race on buf_0 and buf_1 \(overlapping views of one buffer\): written by neg"
        r" into buf_0 on stream\(0\) and written by neg into buf_1 on stream\(1\)",
    ):
        checked_run(program, [torch.randn(4, 4)])


# -- (5), (6), (7): communications ------------------------------------------------


def _allreduce_program(*body, outputs=("y",)) -> HostIrContainer:
    x = tensor("x", 2, 3)
    values = {"y": tensor("y", 2, 3), "s": tensor("s", 2, 3), "z": tensor("z", 2, 3)}
    return HostIrContainer(inputs=(x,), outputs=tuple(values[n] for n in outputs), body=body)


def _allreduce(src: str = "x"):
    return Allreduce(
        out=tensor("y", 2, 3), src=tensor(src, 2, 3), team=TEAM, request=RequestValue(name="R0")
    )


WAIT = Wait(request=RequestValue(name="R0"))


def test_reading_a_collective_output_before_its_wait_races():
    """relu(y) before wait(R0): y is not filled yet."""
    relu = Unary(op=UnaryOpKind.RELU, out=tensor("z", 2, 3), src=tensor("y", 2, 3))
    with pytest.raises(
        RaceError,
        match=r"race on y: written by Allreduce defining y, R0 on request R0 and read by relu"
        r" defining z on main with no synchronize or wait between them \(rank 0\)",
    ):
        checked_run(_allreduce_program(_allreduce(), relu, WAIT), [torch.randn(2, 3)])
    x = torch.randn(2, 3)
    z, y = checked_run(_allreduce_program(_allreduce(), WAIT, relu, outputs=("z", "y")), [x])
    torch.testing.assert_close(y, x)
    torch.testing.assert_close(z, torch.relu(x))


def test_writing_a_collective_source_before_its_wait_races():
    """neg(x, out=s) while the allreduce may still read s."""
    copy = Set(out=tensor("s", 2, 3), src=tensor("x", 2, 3))
    overwrite = Unary(
        op=UnaryOpKind.NEG, out=tensor("s", 2, 3), src=tensor("x", 2, 3), preallocated=True
    )
    with pytest.raises(
        RaceError,
        match=r"race on s: read by Allreduce defining y, R0 on request R0 and written by neg"
        r" into s on main",
    ):
        checked_run(_allreduce_program(copy, _allreduce("s"), overwrite, WAIT), [torch.randn(2, 3)])
    x = torch.randn(2, 3)
    y, s = checked_run(
        _allreduce_program(copy, _allreduce("s"), WAIT, overwrite, outputs=("y", "s")), [x]
    )
    torch.testing.assert_close(y, x)
    torch.testing.assert_close(s, -x)


def test_deallocating_a_collective_source_before_its_wait_races():
    """Freeing s while the allreduce reads it races; freeing a view of s does not free s."""
    s = tensor("s", 2, 3)
    copy = Set(out=s, src=tensor("x", 2, 3))
    with pytest.raises(
        RaceError,
        match=r"race on s: read by Allreduce defining y, R0 on request R0 and freed by"
        r" deallocate s on main",
    ):
        checked_run(
            _allreduce_program(copy, _allreduce("s"), Deallocate(tensor=s), WAIT),
            [torch.randn(2, 3)],
        )
    s_t = tensor("s_t", 3, 2)
    x = torch.randn(2, 3)
    (y,) = checked_run(
        _allreduce_program(
            copy,
            Permute(out=s_t, src=s, dims=(1, 0)),
            _allreduce("s"),
            Deallocate(tensor=s_t),  # a view: s still holds the memory
            WAIT,
            Deallocate(tensor=s),
        ),
        [x],
    )
    torch.testing.assert_close(y, x)


# -- (8): a stream-parallel loop -----------------------------------------------------


def _stream_loop_program(synchronize_back: bool, streams: int = 3, chunks: int = 3):
    """``out = x @ w.T`` in ``chunks`` row chunks, chunk i on stream(i % streams)."""
    x, w, out = tensor("x", 2 * chunks, 4), tensor("w", 3, 4), tensor("out", 2 * chunks, 3)
    y = tensor("y", 2 * chunks, 3)
    i, j = Symbol(name="i"), Symbol(name="j")
    x_i, out_i = tensor("x_i", 2, 4), tensor("out_i", 2, 3)
    body = (
        SetCurrentStream(stream=stream(mod(i, streams))),
        Synchronize(stream=MAIN),
        ShardByStream(out=x_i, src=x, axis=0, index=i),
        ShardByStream(out=out_i, src=out, axis=0, index=i),
        Linear(out=out_i, input=x_i, weight=w, preallocated=True),
        Deallocate(tensor=x_i),
        Deallocate(tensor=out_i),
    )
    back = (SetCurrentStream(stream=MAIN),)
    if synchronize_back:
        back += (
            ForLoop(index=j, start=c(0), stop=c(streams), body=(Synchronize(stream=stream(j)),)),
        )
    program_body = (
        GetCurrentStream(out=MAIN),
        Allocate(out=out),
        ForLoop(index=i, start=c(0), stop=c(chunks), body=body),
        *back,
        Set(out=y, src=out),
    )
    return HostIrContainer(inputs=(x, w), outputs=(y,), body=program_body)


@pytest.mark.parametrize("device", DEVICES)
def test_stream_parallel_loop_passes_and_checker_is_reusable(device):
    """Each iteration synchronizes with main; main synchronizes with every stream after.
    The same evaluator and checker run twice (the checker resets per run)."""
    torch.manual_seed(0)
    x, w = torch.randn(6, 4, device=device), torch.randn(3, 4, device=device)
    evaluator = HostIrEvaluator(
        _stream_loop_program(True), communicator=LocalCommunicator(), listeners=[RaceChecker()]
    )
    for _ in range(2):
        (y,) = evaluator.run([x, w])
        if device == "cuda":
            torch.cuda.synchronize()
        torch.testing.assert_close(y, x @ w.T)


def test_stream_parallel_loop_without_synchronizing_back_races():
    """Main reads the output while the loop's streams may still write; the message
    gives the loop index of the write."""
    with pytest.raises(
        RaceError,
        match=r"race on out_i and out \(overlapping views of one buffer\): written by linear"
        r" into out_i \(i=0\) on stream\(0\) and read by set defining y on main",
    ):
        checked_run(_stream_loop_program(False), [torch.randn(6, 4), torch.randn(3, 4)])


def test_finish_checks_that_main_is_ordered_after_the_outputs_writers():
    """The caller reads outputs on main: ``finish`` (called by the evaluator after the
    body, where supported; by hand here) reports outputs still being written by a stream."""

    class Finishing(RaceChecker):
        def after(self, instruction, context, operands):
            super().after(instruction, context, operands)
            self.context = context

    x, w = torch.randn(6, 4), torch.randn(3, 4)

    def run_and_finish(synchronize_back: bool) -> torch.Tensor:
        program = _stream_loop_program(synchronize_back)
        # Return ``out`` itself instead of main's copy of it.
        program = dataclasses.replace(
            program, outputs=(tensor("out", 6, 3),), body=program.body[:-1]
        )
        checker = Finishing()
        (out,) = checked_run(program, [x, w], checker)
        checker.finish(checker.context)
        return out

    torch.testing.assert_close(run_and_finish(True), x @ w.T)
    with pytest.raises(
        RaceError,
        match=r"race on out_i and out \(overlapping views of one buffer\): written by linear"
        r" into out_i \(i=0\) on stream\(0\) and read by the caller \(output out\) on main",
    ):
        run_and_finish(False)


def test_long_loop_keeps_few_records_and_stays_fast():
    """400 chunks over 4 streams: the checker's records stay bounded by the live regions,
    and checking costs about as much per instruction as in a short loop."""
    chunks = 400
    checker = RaceChecker()
    x, w = torch.randn(2 * chunks, 4), torch.randn(3, 4)
    start = time.perf_counter()
    (y,) = checked_run(_stream_loop_program(True, streams=4, chunks=chunks), [x, w], checker)
    elapsed = time.perf_counter() - start
    torch.testing.assert_close(y, x @ w.T)
    records = sum(len(buffer.accesses) for buffer in checker._buffers.values())
    assert records <= 2 * chunks + 8, records
    assert elapsed < 20, elapsed


def test_a_loop_of_waited_communications_keeps_no_posted_records():
    """200 Allreduces, each waited in its iteration: the checker forgets a request at its
    wait, so its records do not grow with the trip count (they kept one per iteration)."""
    program = parse(
        "%HostIrContainer {\n  mesh M0 = [1] : [1]\n  input x : float32[2, 3] @M0\n"
        "  allocate y : float32[2, 3] @M0\n  for j0 in range(0, 200) {\n"
        "    R0 = Allreduce(x, team=M0(x), op=sum, out=y)\n    wait R0\n  }\n  output y\n}\n"
    )
    checker = RaceChecker()
    x = torch.randn(2, 3)
    (y,) = checked_run(program, [x], checker)
    torch.testing.assert_close(y, x)  # the sum over a team of one
    assert checker._posted == {}


def test_race_checking_enabled_reads_the_environment(monkeypatch):
    """HOSTIR_CHECK_RACES=1 turns it on; anything else leaves it off."""
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "1")
    assert race_checking_enabled()
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")
    assert not race_checking_enabled()
    monkeypatch.delenv("HOSTIR_CHECK_RACES")
    assert not race_checking_enabled()


def _bytes_of(view: torch.Tensor) -> set[int]:
    """Every storage byte ``view`` covers, by brute force."""
    itemsize = view.element_size()
    index = torch.arange(view.untyped_storage().nbytes() // itemsize)
    offsets = index.as_strided(view.shape, view.stride(), view.storage_offset())
    return {int(o) * itemsize + b for o in offsets.flatten().tolist() for b in range(itemsize)}


def test_regions_overlap_and_contain_exactly_or_conservatively():
    """Random views of one buffer (slices, steps, transposes): overlap is never missed,
    and exact for views without steps (slices of one layout, like stream chunks along
    any axis, and views reshaped from them); containment is never claimed wrongly."""
    from hostir.run.race_checker import _contains, _overlap, _region

    generator = torch.Generator().manual_seed(0)
    base = torch.zeros(6, 8, 4)

    def draw(high: int) -> int:
        return int(torch.randint(0, high, (1,), generator=generator))

    def random_view(steps: bool) -> torch.Tensor:
        view = base
        for dim in range(3):
            start = draw(view.shape[dim])
            view = view.narrow(dim, start, 1 + draw(view.shape[dim] - start))
            if steps and draw(2):
                view = view[(slice(None),) * dim + (slice(None, None, 2),)]
        return view.transpose(0, 2) if draw(2) else view

    for steps in (False, True):
        for _ in range(300):
            a, b = random_view(steps), random_view(steps)
            bytes_a, bytes_b = _bytes_of(a), _bytes_of(b)
            overlap = _overlap(_region(a), _region(b))
            assert overlap or not bytes_a & bytes_b
            if not steps:
                assert overlap == bool(bytes_a & bytes_b)
            if _contains(_region(a), _region(b)):
                assert bytes_b <= bytes_a
    # Chunks and the reshaped views of chunks (a stream loop's reshape of its chunk; fuzz
    # seed 800879 took two chunks of one buffer for a race): exact, every pair.
    chunks = [base.narrow(dim, start, 2) for dim in range(3) for start in range(0, 4, 2)]
    views = chunks + [c.view(*c.shape[:-1], 2, c.shape[-1] // 2) for c in chunks]
    views += [
        c.flatten(0, 1)
        for c in chunks
        if c.is_contiguous() or c.stride(0) == c.shape[1] * c.stride(1)
    ]
    for a in views:
        for b in views:
            assert _overlap(_region(a), _region(b)) == bool(_bytes_of(a) & _bytes_of(b)), (
                a.stride(),
                b.stride(),
            )
    # Another dtype over the same bytes: int16 halves of disjoint float columns.
    low = base.view(torch.int16)[1:3, :, 0::2]  # the first half of every float
    high = base.view(torch.int16)[1:3, :, 1::2]  # the second half
    assert not _overlap(_region(low), _region(high))
    assert _overlap(_region(low), _region(base[1:3, :, 2:3]))
