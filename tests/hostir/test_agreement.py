"""The agreement's comparison (hostir.comm.agreement), without ranks: what every rank raises
for the facts every rank sent. (Through real ranks: tests/test_faults.py and
tests/hostir/test_communicator.py.)"""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir.comm.agreement import (
    ANNOUNCED,
    FAILED,
    MAGIC,
    BoundExtent,
    RankFacts,
    agree,
    agreed_failure,
    encode,
    judge,
)
from hostir.comm.communicator import Communicator
from hostir.errors import CommunicationError, DisagreementError, InputError, PeerFailureError
from hostir.run.evaluator import HostIrEvaluator

DIGEST = "a" * 64


def facts(rows: int = 8, digest: str = DIGEST, dtype: str = "float32") -> RankFacts:
    return RankFacts(
        digest=digest, extents=(BoundExtent("i0", "T0", 0, rows),), dtypes=(("T0", dtype),)
    )


def test_equal_facts_encode_equal_and_pass():
    world = [facts() for _ in range(4)]
    assert len({tuple(encode(f)) for f in world}) == 1
    assert encode(world[0])[0] == MAGIC
    assert all(judge(world, rank) is None for rank in range(4))


def test_an_extent_that_differs_is_named_with_tensor_dim_and_values():
    world = [facts(), facts(12), facts(), facts()]
    assert encode(world[1]) != encode(world[0])
    for rank in range(4):
        error = judge(world, rank)
        assert isinstance(error, DisagreementError)
        assert "extent i0 (input T0 dim 0, global)" in str(error)
        assert "ranks 0, 2-3 bound 8, rank 1 bound 12" in str(error)
        assert f"this is rank {rank}" in str(error)


def test_a_different_program_is_named_by_digest():
    world = [facts(), facts(digest="b" * 64)]
    error = judge(world, 0)
    assert isinstance(error, DisagreementError)
    assert "different programs" in str(error) and "rank 1 run bbbbbbbbbbbb" in str(error)


def test_a_dtype_that_differs_is_named():
    world = [facts(), facts(dtype="float64")]
    error = judge(world, 1)
    assert isinstance(error, DisagreementError)
    assert "dtype of input T0: rank 0 pass float32, rank 1 pass float64" in str(error)


def test_a_failed_rank_stops_the_others_who_name_it():
    world = [facts(), RankFacts.failed(ValueError("bad shard")), facts()]
    assert judge(world, 1) is None  # the failed rank raises its own error
    for rank in (0, 2):
        error = judge(world, rank)
        assert isinstance(error, PeerFailureError)
        assert "rank 1 failed before communicating" in str(error)
        assert "rank 1: ValueError: bad shard" in str(error)


def test_ranks_holding_different_inputs_agree_on_what_they_share():
    """A rank outside an input's mesh binds no extent from it: codes differ, facts agree."""
    held = facts()
    outside = RankFacts(digest=DIGEST)
    assert encode(held) != encode(outside)
    assert judge([held, outside, held], 1) is None


class Scripted:
    """A communicator whose exchanges return what every rank is scripted to send; the
    ranks in ``announced`` sent their failure without waiting, and posted it (the store)."""

    def __init__(
        self, rank: int, world: list[RankFacts], fail: bool = False, announced: tuple = ()
    ) -> None:
        self.rank = rank
        self.world = world
        self.fail = fail
        self.announced = announced
        self.exchanges = 0
        self.posted = {r: f.failure for r, f in enumerate(world) if f.failure is not None}
        self.sent_without_waiting = []

    def exchange_codes(self, codes):
        self.exchanges += 1
        if self.fail:
            raise CommunicationError("the exchange timed out")
        statuses = [ANNOUNCED if r in self.announced else FAILED for r in range(len(self.world))]
        return [encode(f, status) for f, status in zip(self.world, statuses, strict=True)]

    def exchange_objects(self, obj):
        if self.announced:  # those ranks are gone: the exchange would wait for them
            raise AssertionError("exchange_objects with a rank that announced its failure")
        self.exchanges += 1
        return list(self.world)

    def announce_codes(self, codes):
        self.sent_without_waiting.append(codes)

    def post_failure(self, message):
        self.posted[self.rank] = message

    def posted_failure(self, rank):
        return self.posted.get(rank)


def test_agreeing_ranks_exchange_once():
    comm = Scripted(0, [facts(), facts()])
    agree(comm, facts())
    assert comm.exchanges == 1


def test_a_disagreement_costs_a_second_exchange_and_raises():
    comm = Scripted(0, [facts(), facts(4)])
    with pytest.raises(DisagreementError, match="rank 1 bound 4"):
        agree(comm, facts())
    assert comm.exchanges == 2


def test_stray_data_is_not_taken_for_an_agreement():
    class Stray(Scripted):
        def exchange_codes(self, codes):
            return [list(codes), [0, 0, 0, 0]]

    with pytest.raises(CommunicationError, match="rank 1 data that is not an agreement message"):
        agree(Stray(0, []), facts())


def test_a_failed_rank_raises_its_own_error_even_if_the_exchange_fails():
    failed = RankFacts.failed(ValueError("bad"))
    agree(Scripted(1, [], fail=True), failed)  # returns: the caller raises its own error
    with pytest.raises(CommunicationError, match="timed out"):
        agree(Scripted(0, [], fail=True), facts())


def test_ranks_failing_for_different_reasons_agree_on_one_account():
    """Fuzz seed 7310378 at 8 ranks: rank 0 refused a split of T6 (only it holds the input
    whose extent it needs), the others one of T7, and each raised its own. Now every
    failed rank raises the one account of all of them (the lowest rank's first), and the
    ranks that did not fail give the same account."""
    six, seven = ValueError("T6: split"), ValueError("T7: split")
    world = [RankFacts.failed(six), RankFacts.failed(seven), facts(), RankFacts.failed(seven)]
    account = "the ranks failed for different reasons: rank 0: ValueError: T6: split; ranks 1, 3:"
    assert agreed_failure(world) == account + " ValueError: T7: split"
    error = judge(world, 2)
    assert isinstance(error, PeerFailureError)
    assert str(error) == "ranks 0-1, 3 failed before communicating, so rank 2 stops too; " + (
        agreed_failure(world)
    )
    for rank in (0, 1, 3):
        assert judge(world, rank) is None  # each raises its own error, with the account
        assert agree(Scripted(rank, world), world[rank]) == agreed_failure(world)
    alike = [RankFacts.failed(six), RankFacts.failed(six)]
    assert agreed_failure(alike) is None  # the same failure: each raises its own, equal
    many = [RankFacts.failed(ValueError(f"reason {r}")) for r in range(7)]
    assert agreed_failure(many).endswith("rank 3: ValueError: reason 3; 3 more on ranks 4-6")


def test_a_rank_failing_after_an_agreed_run_announces_it_without_waiting():
    """With wait=False (the ranks agreed on an earlier signature: the peers may be running
    it) a failed rank posts its error and sends its message without waiting for any."""
    failed = RankFacts.failed(ValueError("float64"))
    comm = Scripted(1, [facts(), failed])
    assert agree(comm, failed, wait=False) is None
    assert comm.exchanges == 0 and comm.sent_without_waiting == [encode(failed, ANNOUNCED)]
    assert comm.posted[1] == "ValueError: float64"


def test_peers_name_an_announced_failure_from_its_posted_error():
    """A peer in the agreement receives the announcing rank's message, reads its error from
    the store (no detailed exchange: that rank is gone) and stops naming it; a posted error
    that is not the one announced (a later one) is not taken for it."""
    failed = RankFacts.failed(ValueError("float64"))
    comm = Scripted(0, [facts(), failed], announced=(1,))
    with pytest.raises(PeerFailureError, match=r"rank 1: ValueError: float64$"):
        agree(comm, facts())
    comm.posted[1] = "ValueError: a later failure"
    with pytest.raises(PeerFailureError, match=r"rank 1: \(its error did not reach rank 0"):
        agree(comm, facts())


NEGATE = """%HostIrContainer {
  input T0 : float32[4]
  T1 : float32[4] = neg(T0)
  output T1
}
"""


class Recording(Communicator):
    """Rank 1 of a world of two that agrees with itself, recording how each agreement
    went: waited for (``exchange_codes``) or announced without waiting."""

    def __init__(self) -> None:
        super().__init__(rank=1, world_size=2)
        self.agreements: list[str] = []

    def _exchange_codes(self, codes):
        self.agreements.append("waited")
        return [list(codes)] * self.world_size

    def _exchange_objects(self, obj):
        return [obj] * self.world_size

    def _announce_codes(self, codes):
        self.agreements.append("announced")


def test_an_evaluator_refusing_after_an_agreed_run_announces_its_failure():
    """HostIrEvaluator.run: a refusal on a first run waits for the agreement (the peers are
    entering it too); after an agreed run, or when the evaluator shares the log of an
    evaluator whose program the ranks agreed on (another program of the definition), it
    announces the refusal and raises at once."""
    world = Recording()
    evaluator = HostIrEvaluator(hostir.parse(NEGATE), communicator=world)
    x = torch.randn(4)
    with pytest.raises(InputError, match="must have dtype float32, got float64"):
        evaluator.run([x.double()])
    (out,) = evaluator.run([x])
    torch.testing.assert_close(out, -x)
    with pytest.raises(InputError, match="must have dtype float32, got float64"):
        evaluator.run([x.double()])
    assert world.agreements == ["waited", "waited", "announced"]
    log = evaluator.agreements
    other = HostIrEvaluator(hostir.parse(NEGATE), communicator=world, agreements=log)
    with pytest.raises(InputError, match="must have dtype float32, got float64"):
        other.run([x.double()])
    assert world.agreements[-1] == "announced"
