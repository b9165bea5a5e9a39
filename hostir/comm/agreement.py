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
  digests, or the symbol, tensor, dim and extents, or the scalar input (one that
  extents read) and its values, or the input and dtypes that differ.

When several ranks fail, for different reasons (rank 0 refuses a split of T6 that
only it can check, the others one of T7), they agree on one account of all the
failures, the lowest rank's first, and every failed rank raises its own error with
that message.

A rank that fails after the ranks agreed on earlier signatures *announces* its
failure instead of waiting (``agree(..., wait=False)``): its peers may be running a
signature they agreed on, in collectives this rank will not join, and would leave it
waiting for the whole timeout. It posts its error where the peers read it (the
process group's store: ``post_failure``), sends its message without waiting
(``announce_codes``) and raises at once. Peers that are in the agreement receive the
message (status :data:`ANNOUNCED`), read the error, and stop naming it; peers in a
collective time out naming it (its posted failure). Until the announcement is
received, the rank's next communication waits for it, so that no later message of its
pairs with a peer's earlier one, and a further failure is not announced again (the
communicator's business: hostir.comm.torch_communicator).

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
"""Int64s each rank sends in the common case: magic, program code, status, facts code (a
failed rank's: the code of its error)."""
OK, FAILED, ANNOUNCED = 0, 1, 2
"""Statuses: the rank runs; it failed and waits for the agreement (it takes part in the
detailed exchange); it failed and did not wait (its error is in its posted failure)."""
MAX_FAILURES_SHOWN = 4
"""How many different failures an account of the ranks' failures spells out."""


@dataclass(frozen=True, slots=True)
class BoundExtent:
    """A symbolic extent bound from an input: ``symbol`` = ``value``, read from dim
    ``dim`` of input ``tensor`` (the first input dim with that extent); ``dim`` None for
    a scalar input an extent reads (``tensor`` is then its name, ``symbol``)."""

    symbol: str
    tensor: str
    dim: int | None
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


def agree(communicator: Any, facts: RankFacts, *, wait: bool = True) -> str | None:
    """Exchanges ``facts`` with every rank; raises the same error on every rank if they
    differ (see the module docstring).

    On a rank whose ``facts`` record a failure this does not raise: the caller raises its
    own error, with the message returned here if the ranks failed for different reasons
    (:func:`restate`; None: its own message stands, also when the exchange itself
    fails, which only tells the peers why this rank stops). Such a rank first posts its
    failure for the peers; with ``wait=False`` it announces it without waiting (see the
    module docstring) and returns None at once.
    """
    failed = facts.failure is not None
    if failed:
        communicator.post_failure(facts.failure)
        if not wait:
            _announce(communicator, facts)
            return None
    try:
        codes = communicator.exchange_codes(encode(facts, FAILED))
        _check_messages(codes, communicator.rank)
        if all(row == codes[0] for row in codes) and codes[0][2] == OK:
            return None
        everyone = _details(communicator, facts, codes)
    except CommunicationError:
        if failed:
            return None
        raise
    if failed:
        return agreed_failure(everyone)
    error = judge(everyone, communicator.rank)
    if error is not None:
        raise error
    return None


def restate(error: BaseException, message: str | None) -> BaseException:
    """``error`` carrying ``message`` (what :func:`agree` returned) as its message, its class
    and traceback kept; ``error`` as it was for None."""
    if message is not None:
        error.args = (message,)
    return error


def _announce(communicator: Any, facts: RankFacts) -> None:
    """Sends a failed rank's message without waiting for the peers (best effort: the rank
    raises its own error whatever happens here)."""
    try:
        communicator.announce_codes(encode(facts, ANNOUNCED))
    except CommunicationError:
        pass  # the world is unusable already, or the group could not be made: nobody waits


def _check_messages(codes: Sequence[Sequence[int]], rank: int) -> None:
    """Refuses codes that are not agreement messages (a rank in another collective)."""
    strays = [r for r, row in enumerate(codes) if row[0] != MAGIC]
    if strays:
        raise CommunicationError(
            f"the agreement before the first collective received from"
            f" {describe_ranks(strays)} data that is not an agreement message (a rank"
            f" in another collective?); this is rank {rank}"
        )


def _details(communicator: Any, facts: RankFacts, codes: list[list[int]]) -> list[RankFacts]:
    """Every rank's facts, once the codes differ: exchanged, unless a rank announced its
    failure (it takes no part in the exchange). Then a failure decides what every rank
    raises, and the failed ranks' errors are read from their posted failures."""
    if all(row[2] != ANNOUNCED for row in codes):
        return communicator.exchange_objects(facts)
    everyone = []
    for rank, row in enumerate(codes):
        if rank == communicator.rank or row[2] == OK:
            everyone.append(facts if rank == communicator.rank else RankFacts(digest=""))
            continue
        posted = communicator.posted_failure(rank)
        if posted is None or _code(posted) != row[3]:  # gone with the store, or a later one
            posted = f"(its error did not reach rank {communicator.rank}: see rank {rank}'s own)"
        everyone.append(RankFacts(digest="", failure=posted))
    return everyone


def encode(facts: RankFacts, failed: int = FAILED) -> list[int]:
    """The common-case message: equal on every rank exactly when nothing differs (up to
    64-bit hash collisions, and ranks that hold different inputs, which the detailed
    exchange then compares precisely). A failed rank sends status ``failed`` (FAILED or
    ANNOUNCED) and the code of its error."""
    if facts.failure is not None:
        return [MAGIC, _code(facts.digest), failed, _code(facts.failure)]
    held = sorted((e.symbol, e.value) for e in facts.extents)
    return [MAGIC, _code(facts.digest), OK, _code(repr((held, sorted(facts.dtypes))))]


def judge(everyone: Sequence[RankFacts], rank: int) -> CommunicationError | None:
    """The error rank ``rank`` raises given every rank's facts (None: go on; on a failed
    rank, None too: it raises its own error, see :func:`agreed_failure`)."""
    failures = {r: facts.failure for r, facts in enumerate(everyone) if facts.failure is not None}
    if failures:
        if rank in failures:
            return None  # this rank raises its own error
        return PeerFailureError(
            f"{describe_ranks(failures)} failed before communicating, so rank {rank} stops"
            f" too; {_account(failures)}"
        )
    digests = _groups({r: facts.digest for r, facts in enumerate(everyone)})
    if len(digests) > 1:
        seen = "; ".join(f"{describe_ranks(rs)} run {d[:12]}" for d, rs in digests)
        return DisagreementError(
            f"the ranks run different programs (program digests differ: {seen});"
            f" this is rank {rank}"
        )
    return _extent_disagreement(everyone, rank) or _dtype_disagreement(everyone, rank)


def agreed_failure(everyone: Sequence[RankFacts]) -> str | None:
    """The message every failed rank raises when the ranks failed for different reasons:
    the account of all of them (:func:`judge` gives the others the same). None when they
    failed alike (each raises its own, equal, error) or none failed."""
    failures = {r: facts.failure for r, facts in enumerate(everyone) if facts.failure is not None}
    return _account(failures) if len(set(failures.values())) > 1 else None


def _account(failures: Mapping[int, str]) -> str:
    """``rank 1: InputError: ...``, or for different failures ``the ranks failed for
    different reasons: rank 0: ...; ranks 1-7: ...``: in the order of their lowest rank,
    at most MAX_FAILURES_SHOWN of them."""
    by_failure: dict[str, list[int]] = {}
    for r in sorted(failures):
        by_failure.setdefault(failures[r], []).append(r)
    if len(by_failure) == 1:
        return f"rank {min(failures)}: {failures[min(failures)]}"
    shown = list(by_failure.items())
    parts = [f"{describe_ranks(rs)}: {failure}" for failure, rs in shown[:MAX_FAILURES_SHOWN]]
    rest = [r for _, rs in shown[MAX_FAILURES_SHOWN:] for r in rs]
    if rest:
        parts.append(f"{len(shown) - MAX_FAILURES_SHOWN} more on {describe_ranks(rest)}")
    return "the ranks failed for different reasons: " + "; ".join(parts)


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
        if first.dim is None:  # a scalar input, passed as it is
            seen = ", ".join(f"{describe_ranks(rs)} passed {v}" for v, rs in values)
            return DisagreementError(
                f"the ranks disagree on scalar input {symbol}, which extents read: {seen};"
                f" every rank must pass the same value (this is rank {rank})"
            )
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
