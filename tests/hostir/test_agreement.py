"""The agreement's comparison (hostir.comm.agreement), without ranks: what every rank raises
for the facts every rank sent. (Through real ranks: tests/test_faults.py and
tests/hostir/test_communicator.py.)"""

from __future__ import annotations

import pytest

from hostir.comm.agreement import MAGIC, BoundExtent, RankFacts, agree, encode, judge
from hostir.errors import CommunicationError, DisagreementError, PeerFailureError

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
    """A communicator whose exchanges return what every rank is scripted to send."""

    def __init__(self, rank: int, world: list[RankFacts], fail: bool = False) -> None:
        self.rank = rank
        self.world = world
        self.fail = fail
        self.exchanges = 0

    def exchange_codes(self, codes):
        self.exchanges += 1
        if self.fail:
            raise CommunicationError("the exchange timed out")
        return [encode(f) for f in self.world]

    def exchange_objects(self, obj):
        self.exchanges += 1
        return list(self.world)


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
