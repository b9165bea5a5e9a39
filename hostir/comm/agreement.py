"""Ranks agree before they communicate.

Before the first collective of a new input signature, every rank of a world of
more than one sends the others one small message: a code for the program it is
about to run, whether it failed before communicating (a bad input, say), and a
code for the extents its inputs bound to symbols and their dtypes. When every
rank sent the same, the run goes on (one all-gather of
:data:`MESSAGE_SLOTS` int64s per rank, on a process group of its own). When
they differ, the ranks exchange the details (a second, larger exchange, only
then) and every rank raises the same named error:

- :class:`~hostir.errors.PeerFailureError` on the ranks that did not fail,
  naming the rank(s) that did and their error (which those ranks raise
  themselves);
- :class:`~hostir.errors.DisagreementError` naming the ranks, and the program
  digests, or the symbol, tensor, dim and extents, or the input and dtypes
  that differ.

The comparison lives here, apart from the transport (the communicator's
``exchange_codes`` / ``exchange_objects``), so it is tested without ranks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hostir.comm.rank_text import describe_ranks
from hostir.errors import CommunicationError, DisagreementError, PeerFailureError

MAGIC = 0x686F7374697231  # "hostir1": a message from this protocol, not stray data
MESSAGE_SLOTS = 4
"""Int64s each rank sends in the common case: magic, program code, status, facts code."""
OK, FAILED = 0, 1


@dataclass(frozen=True, slots=True)
class BoundExtent:
    """A symbolic extent bound from an input: ``symbol`` = ``value``, read from dim
    ``dim`` of input ``tensor`` (the first input dim with that extent)."""

    symbol: str
    tensor: str
    dim: int
    value: int


@dataclass(frozen=True, slots=True)
class RankFacts:
    """What one rank is about to run, as the agreement compares it.

    ``digest`` is the program's digest ("" if the rank failed before it had a
    program), ``extents`` the symbols its inputs bound, ``dtypes`` the dtypes of
    the tensor inputs it holds, ``failure`` the error (``"InputError: ..."``) that
    stops this rank before it communicates, if any.
    """

    digest: str
    extents: tuple[BoundExtent, ...] = ()
    dtypes: tuple[tuple[str, str], ...] = ()
    failure: str | None = None

    @staticmethod
    def failed(error: BaseException, digest: str = "") -> RankFacts:
        """The facts of a rank that stops with ``error`` before communicating."""
        return RankFacts(digest=digest, failure=f"{type(error).__name__}: {error}")


def agree(communicator: Any, facts: RankFacts) -> None:
    """Exchanges ``facts`` with every rank; raises the same error on every rank if they
    differ (see the module docstring).

    On a rank whose ``facts`` record a failure this returns without raising (the
    caller raises its own error), also when the exchange itself fails: the
    exchange only tells the peers why this rank stops.
    """
    try:
        codes = communicator.exchange_codes(encode(facts))
        strays = [r for r, row in enumerate(codes) if row[0] != MAGIC]
        if strays:
            raise CommunicationError(
                f"the agreement before the first collective received from"
                f" {describe_ranks(strays)} data that is not an agreement message (a rank"
                f" in another collective?); this is rank {communicator.rank}"
            )
        if all(row == codes[0] for row in codes) and codes[0][2] == OK:
            return
        everyone = communicator.exchange_objects(facts)
    except CommunicationError:
        if facts.failure is not None:
            return
        raise
    error = judge(everyone, communicator.rank)
    if error is not None:
        raise error


def encode(facts: RankFacts) -> list[int]:
    """The common-case message: equal on every rank exactly when nothing differs (up to
    64-bit hash collisions, and ranks that hold different inputs, which the detailed
    exchange then compares precisely)."""
    status = OK if facts.failure is None else FAILED
    held = sorted((e.symbol, e.value) for e in facts.extents)
    return [MAGIC, _code(facts.digest), status, _code(repr((held, sorted(facts.dtypes))))]


def judge(everyone: Sequence[RankFacts], rank: int) -> CommunicationError | None:
    """The error rank ``rank`` raises given every rank's facts (None: go on)."""
    failed = [r for r, facts in enumerate(everyone) if facts.failure is not None]
    if failed:
        if rank in failed:
            return None  # this rank raises its own error
        first = everyone[failed[0]].failure
        return PeerFailureError(
            f"{describe_ranks(failed)} failed before communicating, so rank {rank} stops"
            f" too; rank {failed[0]}: {first}"
        )
    digests = _groups({r: facts.digest for r, facts in enumerate(everyone)})
    if len(digests) > 1:
        seen = "; ".join(f"{describe_ranks(rs)} run {d[:12]}" for d, rs in digests)
        return DisagreementError(
            f"the ranks run different programs (program digests differ: {seen});"
            f" this is rank {rank}"
        )
    return _extent_disagreement(everyone, rank) or _dtype_disagreement(everyone, rank)


def _extent_disagreement(everyone: Sequence[RankFacts], rank: int) -> DisagreementError | None:
    bound: dict[str, dict[int, BoundExtent]] = {}
    for r, facts in enumerate(everyone):
        for extent in facts.extents:
            bound.setdefault(extent.symbol, {})[r] = extent
    for symbol in sorted(bound):
        by_rank = bound[symbol]
        values = _groups({r: e.value for r, e in by_rank.items()})
        if len(values) == 1:
            continue
        first = by_rank[min(by_rank)]
        seen = ", ".join(f"{describe_ranks(rs)} bound {v}" for v, rs in values)
        return DisagreementError(
            f"the ranks disagree on extent {symbol} (input {first.tensor} dim {first.dim},"
            f" global): {seen}; every rank must pass a shard of the same global tensor"
            f" (this is rank {rank})"
        )
    return None


def _dtype_disagreement(everyone: Sequence[RankFacts], rank: int) -> DisagreementError | None:
    held: dict[str, dict[int, str]] = {}
    for r, facts in enumerate(everyone):
        for name, dtype in facts.dtypes:
            held.setdefault(name, {})[r] = dtype
    for name in sorted(held):
        dtypes = _groups(held[name])
        if len(dtypes) > 1:
            seen = ", ".join(f"{describe_ranks(rs)} pass {d}" for d, rs in dtypes)
            return DisagreementError(
                f"the ranks disagree on the dtype of input {name}: {seen} (this is rank {rank})"
            )
    return None


def _groups(by_rank: Mapping[int, Any]) -> list[tuple[Any, list[int]]]:
    """Ranks grouped by their value, the largest group (then the lowest rank) first."""
    groups: dict[Any, list[int]] = {}
    for r in sorted(by_rank):
        groups.setdefault(by_rank[r], []).append(r)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))


def _code(text: str) -> int:
    """A signed 64-bit number standing for ``text`` (the same on every rank)."""
    raw = hashlib.sha256(text.encode()).digest()[:8]
    return int.from_bytes(raw, "little", signed=True)
