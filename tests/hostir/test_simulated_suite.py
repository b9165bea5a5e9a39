"""What the suite needs of a simulated world to run its multi-rank tests there
(``HOSTIR_TEST_SIMULATE=1``, tests/multidevice_simulated.py; docs/simulated_world.md,
"The suite in a simulated world"): ranks drawing random numbers as separate processes
do, faults named in a real run's words, each program run's traffic compared with its
static count even after a rank refused its inputs, and the helpers that let a test talk
to its peers the same way on real and simulated ranks.
"""

from __future__ import annotations

import pytest
import torch

from hostir import default_communicator
from hostir.comm.simulate import simulate
from hostir.comm.simulated_communicator import SimulatedCommunicator
from hostir.comm.simulated_traffic import compare_traffic
from hostir.errors import CommunicationError, HostIrError
from hostir.ir.sharding import ReduceOp
from tests import test_faults
from tests.fault_catalog import full_inputs, local_inputs, row_parallel
from tests.multidevice_pool import MultiDeviceTest
from tests.multidevice_simulated import (
    _left_waiting,
    communicator_class,
    every_ranks,
    new_communicator,
)


def as_rank(size: int, rank: int) -> MultiDeviceTest:
    return MultiDeviceTest(size, rank, size, rank, torch.device("cpu"))


def test_each_rank_draws_from_its_own_generator_across_waits():
    """Every rank draws from torch's default generator, waits in a barrier (the other
    ranks run and draw meanwhile), and draws again: each gets what one process draws
    from the state the world started in, as separate processes would."""
    start = torch.get_rng_state()

    def rank_main(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = torch.rand(5)
        default_communicator().barrier()
        return first, torch.rand(5)

    run = simulate(rank_main, 3)
    assert not run.errors, run.first_error()
    torch.set_rng_state(start)
    first, second = torch.rand(5), torch.rand(5)
    assert not torch.equal(first, second)
    for rank, (a, b) in enumerate(run.results):
        assert torch.equal(a, first) and torch.equal(b, second), f"rank {rank}"


def test_a_rank_missing_from_the_agreement_is_named_in_a_real_runs_words():
    """Rank 1 never executes: the others' error says "rank 1 did not reach the
    agreement", as TorchCommunicator's does (the test checks it on every other rank)."""
    case = test_faults.test_a_rank_that_never_executes_is_named_by_the_others
    run = simulate(lambda rank: case(as_rank(4, rank)), 4)
    assert not run.errors, run.first_error()


def test_runs_after_a_rank_refused_its_inputs_still_match_the_static_count():
    """Rank 1 passes a float64 weight, which it refuses before its run starts, while its
    peers' run starts and fails in the agreement; then every rank runs good inputs twice.
    The runs still pair up rank by rank: each whole run's traffic (an Allreduce) equals
    the static count, the result torch's."""

    def rank_main(rank: int) -> None:
        fd, tvs, full = full_inputs(row_parallel, 2)
        good = local_inputs(tvs, full, rank)
        bad = [good[0], good[1].double()] if rank == 1 else good
        with pytest.raises(HostIrError):
            fd.execute(bad)
        for _ in range(2):
            (out,) = fd.execute(good)
            torch.testing.assert_close(out, full[0] @ full[1].T, rtol=1e-5, atol=1e-5)

    run = simulate(rank_main, 2, by_run=True)
    assert not run.errors, run.first_error()
    compared = compare_traffic(run.world)
    assert compared.mismatched == [], compared.mismatched[0]
    assert len(compared.matched) >= 2, compared


def test_a_test_talks_to_its_peers_alike_on_real_and_simulated_ranks():
    """every_ranks gathers each rank's tensor in rank order; a spy subclassing
    communicator_class(), made by new_communicator, talks for the rank that made it."""
    calls = []

    def rank_main(rank: int) -> torch.Tensor:
        class Spy(communicator_class()):
            def allgather(self, out, inp, group):
                calls.append(self.rank)
                return super().allgather(out, inp, group)

        spy = new_communicator(Spy)
        assert isinstance(spy, SimulatedCommunicator) and spy.rank == rank
        out = torch.empty(3, 2)
        spy.allgather(out, torch.full((2,), float(rank)), [0, 1, 2]).wait()
        assert torch.equal(out, torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))
        return every_ranks(torch.tensor([10 * rank + 1]))

    run = simulate(rank_main, 3)
    assert not run.errors, run.first_error()
    assert sorted(calls) == [0, 1, 2]
    for gathered in run.results:
        assert torch.equal(gathered, torch.tensor([[1], [11], [21]]))


def test_a_skip_hides_only_the_peers_it_left_waiting():
    """A test where one rank skips is a skip when the others only waited for it (their
    hang report); a peer failing for a reason of its own still fails the test."""

    def skips_while_a_peer_waits(rank: int) -> None:
        if rank == 0:
            pytest.skip("rank 0 skips")
        default_communicator().allreduce(torch.ones(2), (0, 1), ReduceOp.SUM).wait()

    run = simulate(skips_while_a_peer_waits, 2)
    assert isinstance(run.errors[0], pytest.skip.Exception)
    assert _left_waiting(run.errors[1]), run.errors[1]
    assert not _left_waiting(CommunicationError("allreduce over (0, 1): shapes differ"))
    assert not _left_waiting(ValueError("no answer from its peers"))
