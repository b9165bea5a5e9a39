"""Faults and bad inputs on several ranks: every rank ends with a named error, in time.

One test per fault of the Reliability issue (docs/reliability.md lists them with
their outcomes): ranks that bind different extents, a rank that fails before it
communicates (in execute, or before it), a rank that stalls, a rank that fails in
the middle of a run, a program without collectives, a schedule changed after
execute. Tests whose fault times out a collective leave hostir's groups unusable
on purpose; the harness then starts a fresh pool for the next test.
"""

from __future__ import annotations

import os
import pathlib
import re
import time
import zlib

import pytest
import torch

import hostir
from frontend import FusionDefinition, ParallelType, shard_tensor
from frontend.errors import DefinitionError
from hostir import HostIrEvaluator, Listener, cli
from hostir.comm import launcher
from hostir.comm.timeouts import DEFAULT_TIMEOUT_S, collective_timeout
from hostir.errors import (
    CommunicationError,
    DisagreementError,
    EvaluationError,
    InputError,
    PeerFailureError,
    SettingError,
)
from tests.child_runs import Python, Run
from tests.fault_catalog import (
    CATALOG,
    PROGRAMS,
    catalog_table,
    full_inputs,
    gather_rows,
    local_inputs,
    local_only,
    row_parallel,
)
from tests.multidevice import launched_by_torchrun
from tests.multidevice_simulated import every_ranks

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

# Tests that start processes of their own run once, not once per torchrun rank.
once = pytest.mark.skipif(
    launched_by_torchrun() and os.environ.get("RANK") != "0",
    reason="starts its own processes: runs on rank 0 only",
)

SHORT_TIMEOUT_S = 2.0
"""The collective timeout of the tests whose fault is a rank that never answers."""


# -- Ranks that bind different extents ----------------------------------------------------


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("program", list(PROGRAMS))
@pytest.mark.parametrize("rows", [12, 4], ids=["more-rows", "fewer-rows"])
def test_ranks_binding_different_extents_all_raise(multidevice_test, program, rows):
    """Rank 1's token shard has another size than the others' (a symbolic extent): gloo
    used to abort (more rows) or rank 1 returned wrong numbers while the others hung
    (fewer rows). Now every rank raises DisagreementError naming i0, T0, dim 0 and the
    extents seen, before any collective."""
    define, reference = PROGRAMS[program]
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(define, multidevice_test.size)
    local = local_inputs(tvs, full, rank)
    if rank == 1:
        rows_here = local[0].shape[0] * rows // 8
        local[0] = torch.randn(rows_here, local[0].shape[1])
    with pytest.raises(DisagreementError, match=r"extent i0 \(input T0 dim 0, global\)") as info:
        fd.execute(local)
    assert f"ranks 0, 2-3 bound 8, rank 1 bound {rows}" in str(info.value)
    assert f"this is rank {rank}" in str(info.value)
    # The same definition then runs on consistent inputs and matches torch.
    (out,) = fd.execute(local_inputs(tvs, full, rank))
    torch.testing.assert_close(out, shard_tensor(reference(*full), fd.host_ir().outputs[0], rank))


@pytest.mark.world_sizes(4)
def test_every_bad_input_of_the_catalog_ends_by_name_on_every_rank(multidevice_test):
    """Each entry of tests/fault_catalog.py at 4 ranks: the faulty ranks raise what the
    catalog says, the others too, nobody waits for a timeout, valid inputs match torch, and
    the ranks still run the program correctly afterwards."""
    rank, d = multidevice_test.rank, multidevice_test.size
    problems = []
    for fault in CATALOG:
        define, reference = PROGRAMS[fault.program]
        fd, tvs, full = full_inputs(define, d)
        good = local_inputs(tvs, full, rank)
        given = fault.mutate(good) if fault.applies_to(rank) else good
        expected = fault.faulty if fault.applies_to(rank) else fault.others
        outcome = run_outcome(fd, given, fault.full(full), reference, rank)
        if outcome[0] != expected[0] or expected[1] not in outcome[1]:
            problems.append(f"{fault.name} ({fault.program}, {fault.where}): {outcome}")
        if run_outcome(fd, good, full, reference, rank)[0] != "ok":
            problems.append(f"after {fault.name} ({fault.program}): the good run failed")
    assert not problems, "\n".join(problems)


def run_outcome(fd, given, full, reference, rank) -> tuple[str, str]:
    """("ok", "") if the run matches torch, else (error class name, message)."""
    try:
        (out,) = fd.execute(given)
    except Exception as error:  # every outcome is recorded, and compared by the caller
        return (type(error).__name__, str(error))
    expected = shard_tensor(reference(*full), fd.host_ir().outputs[0], rank)
    if out.shape != expected.shape or not torch.allclose(out, expected, atol=1e-5, rtol=1e-4):
        return ("wrong", f"shape {tuple(out.shape)}, expected {tuple(expected.shape)}")
    return ("ok", "")


@pytest.mark.world_sizes(2, 4)
def test_ranks_running_different_programs_all_raise(multidevice_test):
    """Rank 1 gathers its rows while the others stay local: different programs (one with an
    Allgather, one without) are refused on every rank before anything communicates."""
    rank = multidevice_test.rank
    define = gather_rows if rank == 1 else local_only
    fd, tvs, full = full_inputs(define, multidevice_test.size)
    with pytest.raises(DisagreementError, match=r"different programs .*rank 1 run [0-9a-f]{12}"):
        fd.execute(local_inputs(tvs, full, rank))


# -- Schedules and definitions after execute -------------------------------------------------


@pytest.mark.world_sizes(2, 4)
def test_a_schedule_changed_after_execute_is_lowered_again(multidevice_test):
    """A first execute lowers the gather program; sharding the output afterwards must run the
    new program (no Allgather: a local slice), not the cached one."""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, tvs, full = full_inputs(gather_rows, d)
    (before,) = fd.execute(local_inputs(tvs, full, rank))
    torch.testing.assert_close(before, torch.relu(full[0]))
    assert "Allgather" in str(fd.host_ir())
    whole = fd.fusion.outputs()[0].definition.inputs()[0]
    whole.outer_split(0, d)
    whole.axis(0).parallelize(ParallelType.mesh_x)
    (after,) = fd.execute(local_inputs(tvs, full, rank))
    program = fd.host_ir()
    assert "Allgather" not in str(program)
    torch.testing.assert_close(after, shard_tensor(torch.relu(full[0]), program.outputs[0], rank))
    assert fd.lowering_count == 2


# -- A rank that fails, before or while communicating ---------------------------------------


@pytest.mark.world_sizes(2, 4)
def test_a_rank_refusing_its_input_stops_the_others_by_name(multidevice_test):
    """Rank 1 passes float64 where float32 is declared: rank 1 raises InputError naming the
    input and dtypes; every other rank raises PeerFailureError naming rank 1 and that
    error, before any collective (no bare gloo error, no waiting for a timeout)."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    local = local_inputs(tvs, full, rank)
    if rank == 1:
        local[1] = local[1].double()
    started = time.monotonic()
    if rank == 1:
        with pytest.raises(InputError, match="input T1 must have dtype float32, got float64"):
            fd.execute(local)
    else:
        with pytest.raises(PeerFailureError, match=r"rank 1: InputError: input T1 must have"):
            fd.execute(local)
    assert time.monotonic() - started < DEFAULT_TIMEOUT_S / 2  # not the default timeout


def warm_up(multidevice_test) -> None:
    """One agreed run, so that the agreement's process group exists before the fault."""
    fd, tvs, full = full_inputs(local_only, multidevice_test.size)
    fd.execute(local_inputs(tvs, full, multidevice_test.rank))


@pytest.mark.world_sizes(4)
def test_a_rank_that_never_executes_is_named_by_the_others(multidevice_test):
    """Rank 1 fails before its execute (as if its script raised) and stays silent: the
    others' agreement times out and names rank 1 as the rank that did not reach it."""
    warm_up(multidevice_test)
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    if rank == 1:
        return
    started = time.monotonic()
    with pytest.raises(CommunicationError, match="rank 1 did not reach the agreement"):
        fd.execute(local_inputs(tvs, full, rank), timeout=SHORT_TIMEOUT_S)
    assert time.monotonic() - started < DEFAULT_TIMEOUT_S / 2  # the short timeout, not a hang


@pytest.mark.real_ranks(reason="ranks wait for each other through the c10d store")
@pytest.mark.world_sizes(2)
def test_a_stalled_rank_is_named_and_fails_too(multidevice_test):
    """Rank 1 stalls before its execute until the others have given up on it: they fail
    after one timeout naming rank 1; rank 1, when it arrives, fails at once (its peers
    closed their connections) instead of waiting."""
    warm_up(multidevice_test)
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    local = local_inputs(tvs, full, rank)
    store = torch.distributed.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["faults/stall/gave-up"])  # stalled until the others gave up
        started = time.monotonic()
        with pytest.raises(CommunicationError, match="agreement .* failed on rank 1"):
            fd.execute(local, timeout=SHORT_TIMEOUT_S)
        assert time.monotonic() - started < DEFAULT_TIMEOUT_S / 2
        return
    with pytest.raises(CommunicationError, match="rank 1 did not reach the agreement"):
        fd.execute(local, timeout=SHORT_TIMEOUT_S)
    store.set("faults/stall/gave-up", "1")


@pytest.mark.world_sizes(2)
def test_a_rank_changing_its_shapes_alone_later_fails_by_name_in_time(multidevice_test):
    """After a good first run, rank 1 alone passes more rows: its new signature sends it to
    an agreement while rank 0 runs the agreed program. Their messages never mix (the
    agreement has a group of its own): rank 1 names rank 0 as missing from the agreement,
    rank 0's Allreduce times out naming the collective."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    local = local_inputs(tvs, full, rank)
    fd.execute(local)
    if rank == 1:
        local[0] = torch.cat([local[0], local[0]])
        with pytest.raises(CommunicationError, match="rank 0 did not reach the agreement"):
            fd.execute(local, timeout=SHORT_TIMEOUT_S)
    else:
        with pytest.raises(
            CommunicationError, match=r"Allreduce defining T\d+ .* failed on rank 0"
        ):
            fd.execute(local, timeout=SHORT_TIMEOUT_S)


LONG_TIMEOUT_S = 60.0
"""The collective timeout of a rank that must not wait for it (a wait would be a hang)."""


@pytest.mark.real_ranks(reason="ranks wait for each other through the c10d store")
@pytest.mark.world_sizes(2)
def test_a_rank_refusing_a_later_signature_alone_fails_at_once_and_is_named(multidevice_test):
    """After an agreed run, rank 1 alone passes a float64 weight (a signature it refuses
    before communicating) while rank 0 runs the agreed one: rank 1 used to wait for the
    whole timeout in an agreement rank 0 never joined, and rank 0's Allreduce timed out
    saying only that a peer stalled. Now rank 1 announces its refusal and raises at once,
    and rank 0 names it. First, both ranks pass more rows and rank 1 float64: rank 0, in
    the agreement, receives the announcement and stops at once naming rank 1's error;
    then both run the new rows, still in step."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    (out,) = fd.execute(local_inputs(tvs, full, rank))
    torch.testing.assert_close(out, full[0] @ full[1].T)
    torch.manual_seed(1)
    more = [torch.randn(16, full[0].shape[1]), full[1]]
    local = local_inputs(tvs, more, rank)
    refused = [local[0], local[1].double()]
    refusal = "InputError: input T1 must have dtype float32, got float64"
    started = time.monotonic()
    if rank == 1:
        with pytest.raises(InputError, match=refusal.partition(": ")[2]):
            fd.execute(refused, timeout=LONG_TIMEOUT_S)
    else:
        with pytest.raises(PeerFailureError, match=f"rank 1: {refusal}"):
            fd.execute(local, timeout=LONG_TIMEOUT_S)
    assert time.monotonic() - started < LONG_TIMEOUT_S / 2
    (out,) = fd.execute(local)
    torch.testing.assert_close(out, more[0] @ more[1].T)
    store = torch.distributed.distributed_c10d._get_default_store()
    if rank == 1:
        for _ in range(2):  # the second with the first announcement still unanswered
            started = time.monotonic()
            with pytest.raises(InputError, match=refusal.partition(": ")[2]):
                fd.execute(refused, timeout=LONG_TIMEOUT_S)
            assert time.monotonic() - started < LONG_TIMEOUT_S / 2
        store.set("faults/later-refusal/raised", "1")
        return
    store.wait(["faults/later-refusal/raised"])  # rank 0 is not in an agreement meanwhile
    with pytest.raises(CommunicationError) as info:
        fd.execute(local, timeout=SHORT_TIMEOUT_S)
    assert re.search(r"Allreduce defining T\d+ .* failed on rank 0", str(info.value))
    assert f"rank 1 failed first: {refusal}" in str(info.value)


@pytest.mark.world_sizes(2)
def test_ranks_refusing_for_different_reasons_all_raise_one_account(multidevice_test):
    """Rank 0 passes a float64 x, rank 1 a float64 w: each refuses its own input before
    communicating, and each used to raise only its own error (fuzz seed 7310378 at 8
    ranks: rank 0 named T6's split, the others T7's). Now every rank raises the one
    account of both refusals; then both run good inputs."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    good = local_inputs(tvs, full, rank)
    bad = [t.double() if i == rank else t for i, t in enumerate(good)]
    with pytest.raises(InputError) as info:
        fd.execute(bad)
    message = str(info.value)
    assert message.startswith("the ranks failed for different reasons: rank 0: InputError:")
    assert "input T0 must have dtype float32" in message
    assert "; rank 1: InputError: input T1 must have dtype float32" in message
    # The same account on every rank: its checksum and length, gathered.
    mine = torch.tensor([zlib.crc32(message.encode()), len(message)])
    assert all(torch.equal(mine, theirs) for theirs in every_ranks(mine))
    (out,) = fd.execute(good)
    torch.testing.assert_close(out, full[0] @ full[1].T)


class FailOnRank(Listener):
    """Injects a fault: raises before the first compute instruction on ``rank``."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def before(self, instruction, context, operands) -> None:
        if context.rank == self.rank and type(instruction).__name__ == "Linear":
            raise RuntimeError("injected fault")


@pytest.mark.world_sizes(2)
def test_a_rank_failing_mid_run_is_named_by_its_peers(multidevice_test):
    """After the agreement, rank 1 fails before its partial matmul (a listener raises): it
    raises EvaluationError naming the instruction, its rank and the error; the others'
    Allreduce fails within the timeout, naming the collective, its group and rank 1's
    error."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    local = local_inputs(tvs, full, rank)
    evaluator = HostIrEvaluator(fd.host_ir(), listeners=[FailOnRank(1)])
    named = r"linear defining T\d+ failed on rank 1: RuntimeError: injected fault"
    if rank == 1:
        with pytest.raises(EvaluationError, match=named):
            evaluator.run(local, timeout=SHORT_TIMEOUT_S)
        return
    with pytest.raises(CommunicationError) as info:
        evaluator.run(local, timeout=SHORT_TIMEOUT_S)
    message = str(info.value)
    assert "wait R0 (Allreduce defining T" in message and "failed on rank" in message
    assert "rank 1 failed first: EvaluationError: linear defining T" in message
    assert "RuntimeError: injected fault" in message


class Overflowing:
    """An operand whose every torch op raises OverflowError (torch hands any call on an
    object with ``__torch_function__`` to it): a rank-local fault inside an op's handler."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise OverflowError("injected overflow")


class OverflowInLinear(Listener):
    """Hands rank ``rank``'s linear an Overflowing input, so that its handler raises."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def before(self, instruction, context, operands) -> None:
        if context.rank == self.rank and type(instruction).__name__ == "Linear":
            operands["input"] = Overflowing()


@pytest.mark.world_sizes(2)
def test_an_exception_of_any_type_inside_an_op_is_named_on_every_rank(multidevice_test):
    """Rank 1's linear raises OverflowError inside torch (it used to escape bare: only
    HostIrError, RuntimeError, ValueError, TypeError and IndexError were named): rank 1
    raises EvaluationError naming the linear, its rank and the OverflowError; rank 0's
    Allreduce names rank 1's error."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    evaluator = HostIrEvaluator(fd.host_ir(), listeners=[OverflowInLinear(1)])
    named = r"linear defining T\d+ failed on rank 1: OverflowError: injected overflow"
    if rank == 1:
        with pytest.raises(EvaluationError, match=named):
            evaluator.run(local_inputs(tvs, full, rank), timeout=SHORT_TIMEOUT_S)
        return
    with pytest.raises(CommunicationError, match="rank 1 failed first: EvaluationError: " + named):
        evaluator.run(local_inputs(tvs, full, rank), timeout=SHORT_TIMEOUT_S)


# -- hostir run: the root cause, the end of every rank, and a clean exit ---------------------

LAUNCHED = """
import atexit, os, sys
import torch, torch.distributed as dist

def released():  # registered first, so it runs after hostir's own exit handlers
    print(f"rank {os.environ['RANK']}: groups released {not dist.is_initialized()}", flush=True)

atexit.register(released)
sys.path.insert(0, sys.argv[1])
from tests.fault_catalog import full_inputs, local_inputs, row_parallel
from hostir import default_communicator

world = default_communicator()
fd, tvs, full = full_inputs(row_parallel, world.world_size)
local = local_inputs(tvs, full, world.rank)
if world.rank == int(sys.argv[2]):
    local[1] = local[1].double()
(out,) = fd.execute(local)
torch.testing.assert_close(out, full[0] @ full[1].T)
print(f"rank {world.rank}: OK", flush=True)
"""


def launch(child_runs, nproc: int, bad_rank: int, *options: str):
    """``hostir run`` of LAUNCHED on ``nproc`` ranks, rank ``bad_rank`` passing a bad input
    (-1: none), through the suite's throttled child runs."""
    args = ("run", "{dir}/launched.py", "--nproc", str(nproc), *options)
    args += ("--", str(REPO_ROOT), str(bad_rank))
    name = f"faults launch {nproc} {bad_rank} {' '.join(options)}"
    run = Run(name, Python("module", "hostir.cli", args), nproc, files=(("launched.py", LAUNCHED),))
    return child_runs.result(run)


@once
def test_hostir_run_names_the_rank_that_failed_first(child_runs):
    """Rank 1 of 2 refuses its input: every rank ends, and ``hostir run`` exits 1 with rank
    1's InputError (not rank 0's PeerFailureError naming it, though rank 0 is the lower
    rank). Two ranks, not four: two fewer interpreters importing torch (about 5 s of CPU)."""
    done = launch(child_runs, 2, 1)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hostir: rank 1 exited with code 1: hostir.errors.InputError:"), last
    assert "input T1 must have dtype float32, got float64" in last
    assert done.stderr.count("PeerFailureError") >= 1  # the others said why they stopped


@once
def test_hostir_run_backend_gloo_and_groups_released_at_exit(child_runs):
    """A good run with an explicit ``--backend gloo``: both ranks match torch, and hostir's
    process groups are destroyed before the interpreter ends (left to its teardown, gloo
    aborted 6 of 30 torchrun runs of examples/row_parallel_streams.py)."""
    done = launch(child_runs, 2, -1, "--backend", "gloo")
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"rank {rank}: OK" in done.stdout
        assert f"rank {rank}: groups released True" in done.stdout
    assert "terminate called" not in done.stderr


def test_hostir_run_backend_nccl_without_cuda_is_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nccl is a valid choice here")
    assert cli.main(["run", __file__, "--nproc", "2", "--backend", "nccl"]) == 2
    err = capsys.readouterr().err
    assert err == "hostir: error: --backend nccl needs CUDA, and this machine has no CUDA device\n"


@pytest.mark.parametrize(
    "variable, option, expected",
    [
        (None, None, "gloo"),
        ("gloo", "gloo", "gloo"),
        ("nccl", None, "nccl" if torch.cuda.is_available() else "HOSTIR_BACKEND=nccl needs CUDA"),
        ("nccl", "gloo", "--backend gloo conflicts with HOSTIR_BACKEND=nccl in the environment"),
        ("banana", None, "HOSTIR_BACKEND='banana': expected gloo or nccl"),
    ],
    ids=["default", "both-agree", "variable-nccl", "conflict", "bad-variable"],
)
def test_hostir_run_keeps_a_users_backend_or_refuses_a_conflict(
    monkeypatch, capsys, variable, option, expected
):
    """``hostir run`` set every rank's HOSTIR_BACKEND to ``--backend``'s default, gloo, so a
    user's ``HOSTIR_BACKEND=nccl`` (or a typo) was silently replaced. Now the variable is
    the default of ``--backend``; the two given differently, nccl without CUDA or a bad
    value is one line, exit 2, before any rank starts (the launch is recorded, not run)."""
    launched = []
    monkeypatch.setattr(launcher, "launch", lambda *args, backend: launched.append(backend) or 0)
    if variable is None:
        monkeypatch.delenv("HOSTIR_BACKEND", raising=False)
    else:
        monkeypatch.setenv("HOSTIR_BACKEND", variable)
    options = [] if option is None else ["--backend", option]
    code = cli.main(["run", __file__, "--nproc", "2", *options])
    if expected in ("gloo", "nccl"):
        assert (code, launched) == (0, [expected])
        return
    assert (code, launched) == (2, [])
    err = capsys.readouterr().err
    assert err.startswith(f"hostir: error: {expected}") and err.count("\n") == 1, err


# -- Settings -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["abc", "0", "-3", "inf"])
def test_a_bad_timeout_setting_is_named(monkeypatch, text):
    monkeypatch.setenv("HOSTIR_TIMEOUT", text)
    with pytest.raises(SettingError, match=f"HOSTIR_TIMEOUT.*{text}"):
        collective_timeout()
    with pytest.raises(SettingError, match="timeout: expected a positive number of seconds"):
        collective_timeout(-1)


def test_the_timeout_setting_and_its_default(monkeypatch):
    monkeypatch.delenv("HOSTIR_TIMEOUT", raising=False)
    assert collective_timeout().total_seconds() == DEFAULT_TIMEOUT_S
    monkeypatch.setenv("HOSTIR_TIMEOUT", "2.5")
    assert collective_timeout().total_seconds() == 2.5
    assert collective_timeout(7).total_seconds() == 7


def test_ops_after_the_definition_raise():
    """An op added after the ``with`` block used to be silently left out of the program."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4,))
        fd.add_output(fd.ops.relu(x))
    with pytest.raises(DefinitionError, match=r"fd.ops.neg: the fusion definition is finished"):
        fd.ops.neg(x)
    assert len(fd.fusion.exprs()) == 1
    data = torch.randn(4)
    (out,) = fd.execute([data])
    torch.testing.assert_close(out, torch.relu(data))


def test_the_docs_show_the_catalog():
    """docs/reliability.md's table of bad inputs is the catalog the sweep above runs."""
    text = (REPO_ROOT / "docs" / "reliability.md").read_text()
    start = text.index("<!-- catalog: generated")
    shown = text[text.index("\n", start) + 1 : text.index("<!-- end of catalog -->")]
    assert shown == catalog_table()


LOOP_OVER_A_SCALAR = """%HostIrContainer {
  mesh M0 = [2] : [1]
  input n : int64
  input T0 : float32[4, 4] @M0
  allocate T1 : float32[4, 4] @M0
  for j0 in range(0, n) {
    T0_c : float32[2, 4] @M0 = shard_by_stream(T0, axis=0, index=j0)
    T1_c : float32[2, 4] @M0 = shard_by_stream(T1, axis=0, index=j0)
    relu(T0_c, out=T1_c)
  }
  T2 : float32[4, 4] @M0 partial{x: sum} = set(T1)
  T3 : float32[4, 4] @M0, R0 = Allreduce(T2, team=M0(x), op=sum)
  wait R0
  output T3
}
"""


@pytest.mark.world_sizes(2)
def test_a_binding_refused_after_the_agreement_is_named_by_the_peers(multidevice_test):
    """A scalar input is not part of the input signature, so a second run with the same
    shapes starts without the agreement. Rank 1's loop bound n = 1 leaves half of T1
    unwritten: it raises ExtentError before running, and its peer, already in the
    Allreduce, names rank 1 and its error instead of only timing out."""
    rank = multidevice_test.rank
    evaluator = HostIrEvaluator(hostir.parse(LOOP_OVER_A_SCALAR))
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rank))
    xs = [torch.randn(4, 4, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    (out,) = evaluator.run([2, x], timeout=SHORT_TIMEOUT_S)
    torch.testing.assert_close(out, sum(t.relu() for t in xs))
    if rank == 1:
        with pytest.raises(hostir.ExtentError, match=r"output|buffer T1 .* never written"):
            evaluator.run([1, x], timeout=SHORT_TIMEOUT_S)
        return
    with pytest.raises(CommunicationError, match=r"rank 1 failed first: ExtentError: buffer T1"):
        evaluator.run([2, x], timeout=SHORT_TIMEOUT_S)
