"""The simulated world (hostir.comm.simulate): N ranks of one program in this process.

What it must share with a real run: every collective's result (the communicator
conformance cases of tests/hostir/test_communicator.py, run in it), the named errors
of the fault catalog (tests/fault_catalog.py: the same class and words on every rank as
on real ranks), and the program's numbers against torch. What it adds: hangs and
mismatched collectives named at once with the ranks, and the traffic measured, equal to
the static count of ``hostir traffic``.
"""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from examples.tensor_parallel_mlp import define as define_mlp
from examples.tensor_parallel_mlp import ffn
from hostir import cli, default_communicator
from hostir.analysis.traffic import count_traffic
from hostir.comm.simulate import simulate
from hostir.comm.simulated_traffic import compare_traffic
from hostir.errors import CommunicationError, HostIrError
from hostir.ir.sharding import ReduceOp
from tests import test_faults
from tests.fault_catalog import CATALOG, PROGRAMS, full_inputs, local_inputs
from tests.hostir import test_communicator as conformance
from tests.multidevice_pool import MultiDeviceTest


def as_rank(size: int, rank: int) -> MultiDeviceTest:
    return MultiDeviceTest(size, rank, size, rank, torch.device("cpu"))


def conformance_cases(size: int) -> list[str]:
    """The multi-rank tests of test_communicator that run at ``size`` on real ranks, but
    those of torch.distributed's own groups."""
    found = []
    for name, fn in inspect.getmembers(conformance, inspect.isfunction):
        marks = {m.name: m.args for m in getattr(fn, "pytestmark", [])}
        if (
            name.startswith("test_")
            and "multidevice_test" in inspect.signature(fn).parameters
            and "real_ranks" not in marks
            and size in marks.get("world_sizes", (1, 2, 4))
        ):
            found.append(name)
    return found


@pytest.mark.parametrize("size", [2, 4])
def test_every_collective_gives_what_gloo_gives(size):
    """The conformance cases real ranks pass (every collective, permuted and swizzled
    teams, roots, SendRecv, permute, alltoallv) pass in a simulated world too."""
    names = conformance_cases(size)
    assert len(names) >= 12, names
    for name in names:
        case = getattr(conformance, name)
        run = simulate(lambda rank, case=case: case(as_rank(size, rank)), size)
        assert not run.errors, f"{name}: {run.first_error()}"


def test_the_fault_catalog_ends_by_name_as_on_real_ranks():
    """Every bad input of the catalog: the faulty ranks and their peers raise the same
    errors, in the same words, as real ranks do (tests/test_faults.py checks both)."""
    case = test_faults.test_every_bad_input_of_the_catalog_ends_by_name_on_every_rank
    run = simulate(lambda rank: case(as_rank(4, rank)), 4)
    assert not run.errors, run.first_error()
    assert len(CATALOG) >= 10


def test_a_rank_failing_mid_run_is_named_by_its_peers_as_on_real_ranks():
    case = test_faults.test_a_rank_failing_mid_run_is_named_by_its_peers
    run = simulate(lambda rank: case(as_rank(4, rank)), 4)
    assert not run.errors, run.first_error()


def test_a_missing_member_is_named_at_once():
    """Rank 3 never posts the Allreduce: the others fail at once (no timeout), naming
    the collective, who posted it, and what rank 3 does instead."""

    def body(rank: int) -> None:
        if rank == 3:
            return
        t = torch.ones(4)
        default_communicator().allreduce(t, (0, 1, 2, 3), ReduceOp.SUM).wait()

    run = simulate(body, 4)
    assert sorted(run.errors) == [0, 1, 2]
    for error in run.errors.values():
        assert isinstance(error, CommunicationError)
        text = str(error)
        assert "no answer from its peers" in text
        assert "allreduce number 1 over (0, 1, 2, 3) was posted by ranks 0-2" in text
        assert "never by rank 3 (rank 3 finished)" in text


def test_members_posting_different_collectives_are_named():
    def body(rank: int) -> None:
        comm, group = default_communicator(), (0, 1)
        t = torch.full((2,), float(rank))
        if rank == 0:
            comm.allgather(torch.empty(2, 2), t, group).wait()
        else:
            comm.allreduce(t, group, ReduceOp.SUM).wait()

    run = simulate(body, 2)
    assert sorted(run.errors) == [0, 1]
    for error in run.errors.values():
        assert "rank 0 posted allgather and rank 1 posted allreduce (op sum) as their" in str(error)


def test_alltoallv_splits_that_do_not_pair_are_named():
    def body(rank: int) -> None:
        sent = [1, 2] if rank == 0 else [2, 2]  # rank 0 sends 2 to rank 1, which expects 2
        expected = [1, 3] if rank == 0 else [2, 2]  # rank 0 expects 3 from rank 1: sent 2
        out = torch.empty(sum(expected))
        inp = torch.arange(sum(sent), dtype=torch.float32)
        default_communicator().all_to_all_v(out, inp, expected, sent, (0, 1)).wait()

    run = simulate(body, 2)
    assert sorted(run.errors) == [0, 1]
    assert "rank 1 sends 2 elements to rank 0, which expects 3" in str(run.errors[0])


def mlp_inputs(tokens: int, features: int) -> list[torch.Tensor]:
    """Random whole inputs of the README's MLP (examples/tensor_parallel_mlp.py)."""
    torch.manual_seed(0)
    shapes = ((tokens, 16), (features, 16), (features,), (16, features), (16,))
    return [torch.randn(shape) for shape in shapes]


def test_execute_simulated_gives_every_rank_the_reference_and_counts_its_traffic():
    d, tokens = 64, 64
    full = mlp_inputs(tokens, ffn(d))
    fd, _ = define_mlp(d)
    run = fd.execute_simulated(full, world_size=d)
    assert not run.errors
    x, w1, b1, w2, b2 = full
    expected = torch.relu(x @ w1.T + b1) @ w2.T + b2
    for outputs in run.results:
        torch.testing.assert_close(outputs[0], expected, rtol=1e-4, atol=1e-4)
    program = fd.host_ir()
    assert str(program).count("Allreduce(") == 1
    static = count_traffic(program, d, {"i0": tokens}).links
    assert static.sum() == d * (d - 1) * 2 * (tokens * 16 // d) * 4  # ring parts
    runs = run.links.sum() / static.sum()  # the suite's self-checks run a program twice
    assert runs in (1, 2) and torch.equal(run.links, static * runs)


def test_each_rank_holds_its_shards_and_the_process_holds_replicas_once():
    """The MLP at 8 ranks: a rank's peak is its input shards plus the intermediates it
    holds at once (counted by hand below); replicated inputs (x, b2) and shards that are
    views of the whole tensors are stored once for all ranks."""
    d, tokens = 8, 8
    features = ffn(d)
    full = mlp_inputs(tokens, features)
    fd, _ = define_mlp(d)
    run = fd.execute_simulated(full, world_size=d)
    assert not run.errors
    f, part = 4, features // d  # float32; each rank's share of the hidden features
    inputs = (tokens * 16 + part * 16 + part + 16 * part + 16) * f
    # the peak: the inputs, the partial sums T8 and the Allreduce's result T9 (T6 freed)
    assert run.peak_bytes == [inputs + 2 * tokens * 16 * f] * d
    assert run.process_peak_bytes < sum(run.peak_bytes)


def test_traffic_of_every_fault_program_equals_the_static_count():
    """Each program of the fault catalog (an Allreduce, an Allgather, a stream loop of
    CollectivePermutes, none, a scalar) at 4 ranks: measured = counted, and right."""
    for name, (define, reference) in PROGRAMS.items():
        fd, tvs, full = full_inputs(define, 4)

        def body(rank: int, fd=fd, tvs=tvs, full=full) -> list:
            return fd.execute(local_inputs(tvs, full, rank))

        run = simulate(body, 4, by_run=True)
        assert not run.errors, (name, run.first_error())
        compared = compare_traffic(run.world)
        assert compared.matched and not compared.mismatched, (name, compared)
        expected = reference(*full)
        for outputs in run.results:
            if outputs[0] is not None and outputs[0].shape == expected.shape:
                torch.testing.assert_close(outputs[0], expected)


def test_a_traffic_mismatch_is_found():
    """The comparison can fail: a run whose measure is changed by hand differs."""
    fd, tvs, full = full_inputs(PROGRAMS["Allreduce"][0], 2)
    run = simulate(lambda rank: fd.execute(local_inputs(tvs, full, rank)), 2, by_run=True)
    key = next(iter(run.world.run_links))
    run.world.run_links[key][0, 1] += 4
    compared = compare_traffic(run.world)
    assert len(compared.mismatched) == 1
    assert "rank 0 -> rank 1 moved" in compared.mismatched[0]


def test_hostir_run_simulate_runs_the_readme_mlp(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    code = cli.main(["run", "examples/tensor_parallel_mlp.py", "--simulate", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.count(", OK") == 4
    assert "hostir: simulated 4 ranks" in captured.err
    line = next(s for s in captured.err.splitlines() if "received per rank" in s)
    numbers = [int(w) for w in line.replace(",", " ").split() if w.isdigit()]
    assert numbers[0] == numbers[1] == numbers[2] and numbers[0] % 768 == 0, line


def test_hostir_run_simulate_names_the_failed_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys\nfrom hostir import default_communicator\n"
        "if default_communicator().rank == 2:\n    sys.exit(3)\n"
    )
    code = cli.main(["run", str(script), "--simulate", "4"])
    assert code == 3
    assert "hostir: rank 2 exited with code 3 (simulated)" in capsys.readouterr().err


def test_a_world_size_out_of_range_is_refused():
    with pytest.raises(HostIrError, match="a simulated world has 1 to 4096 ranks, not 0"):
        simulate(lambda rank: None, 0)
