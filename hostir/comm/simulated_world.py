"""A simulated world: every rank of an SPMD program in one process, each in a thread.

The ranks run the unchanged run path; their communicators
(:class:`~hostir.comm.simulated_communicator.SimulatedCommunicator`) post each
collective here. The world pairs posts as torch.distributed does, by their order on
each group (the k-th post of every member of group G is one collective), checks that
the members posted the same collective (:func:`hostir.comm.simulated_collectives.mismatch`:
a real run would hang or deliver garbage; here every member raises a
CommunicationError naming the ranks), and completes it when its last member posts:
that member's thread moves the data into every member's buffers
(:func:`~hostir.comm.simulated_collectives.complete`) and wakes the members waiting
for it. Point-to-point calls (SendRecv, a CollectivePermute's step) pair by sender and
receiver, first in first out.

**One rank runs at a time**, from one wait to its next (a turn): a rank's thread takes
the world's turn when it starts and gives it up only while it waits for a
communication, and when it ends; the turn goes to the rank that has been ready longest
(its collective completed), each rank's thread sleeping on an event of its own. A rank
that computes forever therefore stops the world (there is no timeout to end it, as
there is none to end a real rank's endless loop). So the code a rank runs between communications is
never interleaved with another rank's. And each rank has **its own state of torch's
(process-wide) CPU generator**, swapped in when it takes the turn and saved when it
gives it up: every rank starts from the state the world was made in and draws as a
process of its own would, even across waits (a program's random op after its agreement,
a script seeding then drawing around a collective), so the ranks draw the same numbers
where separate processes would.

**Hangs are found, not waited for.** The world knows which ranks are running, which
wait, and for what. When every rank still running waits for a communication that
cannot complete (a member finished or failed without posting it), it is a hang: each
waiting rank raises a CommunicationError naming the collective, the members that
posted it and, for each missing member, what it is doing instead (finished, failed
with its error, or waiting elsewhere). The rank that failed is named as a real run
names it ("rank r failed first: ..."), through the failure notices kept here.

**Traffic is measured** as it moves: ``links[s, d]``, the bytes rank ``s`` sent rank
``d`` in the program's collectives (the agreement apart), counted with ``hostir
traffic``'s logical model (see hostir.comm.simulated_collectives), so a run's
measure can be compared with the static count.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hostir.comm.backend_hooks import Work
from hostir.comm.rank_text import describe_group, describe_ranks
from hostir.comm.simulated_collectives import (
    Post,
    complete,
    describe_tensor,
    mismatch,
    sent_elements,
)
from hostir.comm.simulated_memory import MemoryMeter
from hostir.errors import CommunicationError
from hostir.ir.scalars import RANK

Group = tuple[int, ...]

AGREEMENT = "agreement"
"""The channel of the agreement's exchanges (a process group of its own in a real run)."""


class SimulatedWork(Work):
    """One rank's part of a communication in a simulated world: done when every piece
    of it (a collective: one; a permute: its send and its receive) completed."""

    def __init__(self, world: SimulatedWorld, rank: int, what: str, pieces: int = 1) -> None:
        self.world, self.rank, self.what = world, rank, what
        self.left = pieces
        self.error: str | None = None
        self.result: Any = None

    @property
    def done(self) -> bool:
        """Whether every piece completed (or failed)."""
        return self.left == 0 or self.error is not None

    def wait(self) -> None:
        """Blocks until done; CommunicationError if it failed or can never complete."""
        self.world.wait_for(self)
        if self.error is not None:
            raise CommunicationError(self.error)


@dataclass
class _Collective:
    """Posts of one collective (the ``index``-th on ``group``) so far, by position."""

    channel: str
    group: Group
    index: int
    posts: dict[int, Post] = field(default_factory=dict)
    works: dict[int, SimulatedWork] = field(default_factory=dict)


@dataclass
class RunRecord:
    """One rank's run of a program, where the world counts traffic by run: the run's
    context (its program and bound scalars) and its key, (program digest, how many
    agreements this rank joined before, how many runs of it this rank started since),
    the same on every rank's matching run. The agreements realign the ranks: a rank
    refusing its inputs before it starts a run joins the agreement its peers' run fails
    in, so counting runs alone would pair its next run with their run after."""

    context: Any
    key: tuple[str, int, int]


@dataclass
class _Transfer:
    """One side of a point-to-point transfer waiting for its other side (a send: with
    the run it belongs to, where counted)."""

    tensor: torch.Tensor
    work: SimulatedWork
    run: RunRecord | None = None


class SimulatedWorld:
    """The shared state of ``world_size`` simulated ranks (see the module docstring)."""

    def __init__(self, world_size: int, by_run: bool = False) -> None:
        self.world_size = world_size
        self.by_run = by_run  # count each program run's traffic apart (run_links)
        self.run_links: dict[tuple[str, int, int], torch.Tensor] = {}
        self.run_contexts: dict[tuple[str, int, int], Any] = {}
        self.run_bindings: dict[tuple[str, int, int], dict[str, int]] = {}
        self._started: dict[tuple[int, str, int], int] = {}
        self.run_ranks: dict[tuple[str, int, int], list[int]] = {}  # key -> [started, finished]
        self._lock = threading.Lock()
        self._open: dict[tuple, _Collective] = {}  # (channel, group, index) -> posts
        self._counts: dict[tuple, int] = {}  # (rank, channel, group) -> posts so far
        self._sends: dict[tuple[int, int], deque[_Transfer]] = {}  # (from, to)
        self._receives: dict[tuple[int, int], deque[_Transfer]] = {}
        self._running = set(range(world_size))
        self._ended: dict[int, str] = {}  # rank -> "finished" / "failed with ..."
        self._waiting: dict[int, SimulatedWork] = {}
        # A rank's thread sleeps on its own event until it is given the turn: one wakes
        # at a time, in the order the ranks became ready (no herd on one lock).
        self._turns = [threading.Event() for _ in range(world_size)]
        self._ready: deque[int] = deque()
        self._failures: dict[int, tuple[float, str]] = {}
        self.hang: str | None = None
        self.links = torch.zeros(world_size, world_size, dtype=torch.float64)
        self.memory = MemoryMeter(world_size)
        self._generator_start = torch.get_rng_state()  # every rank starts from it
        self._generators: dict[int, torch.Tensor] = {}  # a waiting rank's saved state

    # -- Collectives -------------------------------------------------------------------

    def post(
        self, channel: str, group: Group, post: Post, what: str, wait: bool = True
    ) -> SimulatedWork:
        """Posts ``post`` as the next collective of ``post.rank`` on ``group``; completes it
        if this is its last member. Returns the rank's work (waited for when ``wait``)."""
        work = SimulatedWork(self, post.rank, what)
        with self._lock:
            self._check_alive(work)
            key = (post.rank, channel, group)
            index = self._counts.get(key, 0)
            self._counts[key] = index + 1
            slot = (channel, group, index)
            collective = self._open.get(slot)
            if collective is None:
                collective = self._open[slot] = _Collective(channel, group, index)
            position = group.index(post.rank)
            collective.posts[position] = post
            collective.works[position] = work
            if len(collective.posts) == len(group):
                del self._open[slot]
                self._complete(collective)
        if wait:
            work.wait()
        return work

    def _complete(self, collective: _Collective) -> None:
        posts = [collective.posts[p] for p in range(len(collective.group))]
        problem = mismatch(posts, collective.group, collective.index)
        if problem is None:
            try:
                complete(posts)
            except (RuntimeError, ValueError) as error:  # shapes a backend would refuse
                problem = f"{posts[0].kind} over {describe_group(collective.group)}: {error}"
        if problem is None and collective.channel != AGREEMENT:
            self._count(collective.group, sent_elements(posts), posts)
        for position, work in collective.works.items():
            work.result = posts[position].args.get("result")
            self._finish_piece(work, problem)

    def _count(self, group: Group, elements: torch.Tensor | None, posts: list[Post]) -> None:
        if elements is None:
            return
        sent = elements * _itemsize(posts[0])
        members = torch.tensor(group)
        self.links[members.unsqueeze(1), members] += sent
        if self.by_run:
            for position, post in enumerate(posts):  # each sender's row to its own run
                if post.run is not None:
                    self._run_links(post.run)[group[position], members] += sent[position]

    def _run_links(self, run: RunRecord) -> torch.Tensor:
        links = self.run_links.get(run.key)
        if links is None:
            links = torch.zeros(self.world_size, self.world_size, dtype=torch.float64)
            self.run_links[run.key] = links
        return links

    def run_started(self, rank: int, context: Any) -> RunRecord:
        """The record of a run ``rank`` starts (``context``: its RunContext), whose traffic
        counts apart in :attr:`run_links` under the same key on every rank."""
        digest = context.runner.digest()
        with self._lock:
            agreements = self._counts.get((rank, AGREEMENT, tuple(range(self.world_size))), 0)
            ordinal = self._started.get((rank, digest, agreements), 0)
            self._started[(rank, digest, agreements)] = ordinal + 1
            record = RunRecord(context, (digest, agreements, ordinal))
            self.run_contexts.setdefault(record.key, context)
            self.run_ranks.setdefault(record.key, [0, 0])[0] += 1
        return record

    def run_finished(self, run: RunRecord) -> None:
        """A rank's run of ``run.key`` ended without an error: the extents it bound join
        the run's (a rank outside a tensor's mesh binds none of that tensor's)."""
        bound = {
            name: value
            for name, value in run.context.scalars.items()
            if type(value) is int and name != RANK
        }
        with self._lock:
            self.run_ranks[run.key][1] += 1
            known = self.run_bindings.setdefault(run.key, {})
            for name, value in bound.items():
                known.setdefault(name, value)

    # -- Point to point --------------------------------------------------------------------

    def transfer(
        self,
        rank: int,
        what: str,
        send: tuple[int, torch.Tensor] | None,
        receive: tuple[int, torch.Tensor] | None,
        run: RunRecord | None = None,
    ) -> SimulatedWork:
        """Posts this rank's send of a tensor to a peer and/or receive of one from a peer
        (global ranks); each pairs with the peer's matching side, first in first out."""
        work = SimulatedWork(self, rank, what, pieces=(send is not None) + (receive is not None))
        with self._lock:
            self._check_alive(work)
            if send is not None:
                peer, tensor = send
                self._pair(rank, peer, _Transfer(tensor, work, run), sending=True)
            if receive is not None:
                peer, tensor = receive
                self._pair(peer, rank, _Transfer(tensor, work), sending=False)
        return work

    def _pair(self, source: int, destination: int, side: _Transfer, sending: bool) -> None:
        mine, theirs = (self._sends, self._receives) if sending else (self._receives, self._sends)
        waiting = theirs.get((source, destination))
        if not waiting:
            mine.setdefault((source, destination), deque()).append(side)
            return
        other = waiting.popleft()
        sent, received = (side, other) if sending else (other, side)
        problem = None
        if sent.tensor.shape != received.tensor.shape or sent.tensor.dtype != received.tensor.dtype:
            problem = (
                f"rank {source} sends {describe_tensor(sent.tensor)} to rank {destination}, which"
                f" receives {describe_tensor(received.tensor)} ({sent.work.what} /"
                f" {received.work.what})"
            )
        else:
            received.tensor.copy_(sent.tensor)
            size = sent.tensor.numel() * sent.tensor.element_size()
            self.links[source, destination] += size
            if sent.run is not None:
                self._run_links(sent.run)[source, destination] += size
        self._finish_piece(sent.work, problem)
        self._finish_piece(received.work, problem)

    # -- Waiting and hangs -------------------------------------------------------------

    def _finish_piece(self, work: SimulatedWork, problem: str | None) -> None:
        """One piece of ``work`` completed (or failed with ``problem``); wakes its rank if
        it waits for it and nothing is left. The world's lock is held."""
        if problem is not None and work.error is None:
            work.error = f"{work.what} failed on rank {work.rank}: {problem}"
        work.left = max(work.left - 1, 0)
        if work.done and self._waiting.get(work.rank) is work:
            del self._waiting[work.rank]
            self._ready.append(work.rank)  # it runs again when the turn comes to it

    def wait_for(self, work: SimulatedWork) -> None:
        """Blocks the calling rank until ``work`` is done, another rank running meanwhile;
        marks it failed if every rank still running waits for something that cannot
        come (a hang, named)."""
        rank = work.rank
        with self._lock:
            if work.done:
                return
            self._check_alive(work)
            if work.error is not None:
                return
            self._waiting[rank] = work
            self._generators[rank] = torch.get_rng_state()  # the next rank draws its own
            self._pass_turn()
        self._take_turn(rank)
        torch.set_rng_state(self._generators.pop(rank))
        if not work.done:  # woken by a hang: every rank waits
            with self._lock:
                work.error = work.error or self._hang_message(work)

    def _pass_turn(self) -> None:
        """With the lock held, the running rank gives up the turn: to the rank ready
        longest; if none is ready and every running rank waits, it is a hang (each waiting
        rank is woken to raise it)."""
        if not self._ready and self._running and len(self._waiting) >= len(self._running):
            self._declare_hang()
        if self._ready:
            self._turns[self._ready.popleft()].set()

    def _take_turn(self, rank: int) -> None:
        """Sleeps until ``rank`` is given the turn."""
        self._turns[rank].wait()
        self._turns[rank].clear()

    def _check_alive(self, work: SimulatedWork) -> None:
        if self.hang is not None and work.error is None:
            work.error = self._hang_message(work)

    def _hang_message(self, work: SimulatedWork) -> str:
        return (
            f"{work.what} failed on rank {work.rank}: no answer from its peers, ever (the"
            f" simulated world found every running rank waiting: {self.hang})"
        )

    def _declare_hang(self) -> None:
        """With the lock held: every running rank waits; names the hang and readies them
        all (each raises it)."""
        self.hang = self._describe_hang()
        for rank, work in list(self._waiting.items()):
            if work.error is None:
                work.error = self._hang_message(work)
            self._ready.append(rank)
        self._waiting.clear()

    def _describe_hang(self) -> str:
        parts = []
        for collective in list(self._open.values())[:3]:
            missing = [r for p, r in enumerate(collective.group) if p not in collective.posts]
            kind = next(iter(collective.posts.values())).kind
            where = (
                "the agreement"
                if collective.channel == AGREEMENT
                else f"{kind} number {collective.index + 1} over {describe_group(collective.group)}"
            )
            posted = [collective.group[p] for p in sorted(collective.posts)]
            # The agreement's in a real run's words (TorchCommunicator: "... did not reach
            # the agreement"), which the suite's fault tests look for.
            never = (
                f"; {describe_ranks(missing)} did not reach the agreement"
                if collective.channel == AGREEMENT
                else f" and never by {describe_ranks(missing)}"
            )
            parts.append(
                f"{where} was posted by {describe_ranks(posted)}{never} ({self._doing(missing)})"
            )
        for (source, destination), sides in list(self._sends.items())[:2]:
            if sides:
                parts.append(f"rank {source} sends to rank {destination}, which never receives")
        for (source, destination), sides in list(self._receives.items())[:2]:
            if sides:
                parts.append(f"rank {destination} receives from rank {source}, which never sends")
        return "; ".join(parts) if parts else "no communication is pending"

    def _doing(self, ranks: list[int]) -> str:
        """What each of ``ranks`` does instead (the first few)."""
        said = []
        for rank in ranks[:4]:
            if rank in self._ended:
                said.append(f"rank {rank} {self._ended[rank]}")
            elif rank in self._waiting:
                said.append(f"rank {rank} waits in {self._waiting[rank].what}")
        more = len(ranks) - 4
        return ", ".join(said) + (f", and {more} more" if more > 0 else "")

    # -- Ranks starting and ending ---------------------------------------------------------

    def start(self) -> None:
        """Makes every rank ready, in rank order, and gives rank 0 the turn (the ranks'
        threads are started and wait in :meth:`start_turn`)."""
        with self._lock:
            self._ready.extend(range(self.world_size))
            self._pass_turn()

    def start_turn(self, rank: int) -> None:
        """Blocks rank ``rank``'s thread until it has the turn (see the module docstring:
        one rank runs at a time, from one wait to the next); it starts from the generator
        state the world was made in."""
        self._take_turn(rank)
        torch.set_rng_state(self._generator_start)

    def ended(self, rank: int, how: str) -> None:
        """Rank ``rank`` stopped running (``how``: ``finished``, ``failed with ...``); the
        turn passes on."""
        with self._lock:
            self._running.discard(rank)
            self._ended[rank] = how
            self._pass_turn()

    # -- Failure notices (the c10d store's part in a real run) --------------------------

    def post_failure(self, rank: int, message: str) -> None:
        """Records that ``rank`` failed with ``message`` (peers name it)."""
        with self._lock:
            self._failures[rank] = (time.time(), message)

    def failures_since(self, rank: int, moment: float) -> list[tuple[int, str]]:
        """Failures of ranks other than ``rank`` posted at or after ``moment``, rank order."""
        with self._lock:
            found = sorted(self._failures.items())
        return [(r, msg) for r, (at, msg) in found if r != rank and at >= moment]

    def posted_failure(self, rank: int) -> str | None:
        """The last failure ``rank`` posted, if any."""
        with self._lock:
            notice = self._failures.get(rank)
        return None if notice is None else notice[1]


def _itemsize(post: Post) -> int:
    for name in ("inp", "tensor", "out"):
        tensor = post.args.get(name)
        if isinstance(tensor, torch.Tensor):
            return tensor.element_size()
    return 1
