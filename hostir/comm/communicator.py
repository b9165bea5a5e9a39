"""Communicators: the evaluator's only door to other ranks.

The evaluator talks to other ranks through a :class:`Communicator`, so tests
and simulations can substitute their own. :func:`~hostir.comm.world.default_communicator`
finds the world.

Every collective takes this rank's local buffers and a *group*: a tuple of
global ranks in team order (``(3, 1, 0, 2)``, or a column-major walk of a
mesh); positions (roots, senders, chunk indices) are indices into that tuple.
Only members of a group call a collective on it. Each collective returns a
:class:`Work` whose ``wait()`` puts the results in place.

The public methods of :class:`Communicator` check their arguments
(:mod:`hostir.comm.collective_checks`) and handle groups of one rank themselves, as
plain copies, so a one-rank group never needs ``torch.distributed``. Larger groups go
to the ``_``-prefixed hooks of its base
(:class:`~hostir.comm.backend_hooks.BackendHooks`) that a subclass
(:class:`~hostir.comm.torch_communicator.TorchCommunicator`) implements.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from hostir.comm.backend_hooks import DONE, BackendHooks, Group, Work, backend_failure
from hostir.comm.collective_checks import _check_members, _check_position, _expect
from hostir.comm.rank_text import describe_group
from hostir.comm.run_guard import WorldGuard
from hostir.comm.timeouts import collective_timeout
from hostir.errors import CommunicationError
from hostir.ir.sharding import ReduceOp


class Communicator(BackendHooks):
    """This process's place in the world (its rank, the number of ranks) and its collectives.

    The base class can talk to no other rank: it serves groups of one rank and
    raises :class:`CommunicationError` for anything larger. A stand-in for one
    rank of a larger world (a simulation, a test) also answers the agreement's
    ``_exchange_codes`` as if every rank sent the same.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = collective_timeout()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"

    # -- One thread at a time (hostir.comm.run_guard) ----------------------------------------

    def run_guard(self) -> WorldGuard:
        """The guard of this communicator's world: one per communicator here, one per
        process for TorchCommunicator (every instance talks on the default group)."""
        guard = self.__dict__.get("_run_guard")
        return guard if guard is not None else self.__dict__.setdefault("_run_guard", WorldGuard())

    def where(self) -> str:
        """``rank 0 of 2``: this rank in its world, for messages."""
        return f"rank {self.rank} of {self.world_size}"

    @contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        """Holds the world's guard for a synchronous step (nothing to hold for one rank)."""
        if self.world_size == 1:
            yield
            return
        with self.run_guard().holding(what, self.where()):
            yield

    def run_started(self, context: Any) -> None:
        """A run of a program starts on this rank (``context``: its RunContext). A
        simulated world attributes the run's traffic to it; a real backend has nothing
        to do."""

    def run_finished(self, context: Any) -> None:
        """The run of ``context`` (see :meth:`run_started`) ended without an error on this
        rank."""

    # -- Set-up -----------------------------------------------------------------

    def prepare(self, groups: Sequence[Sequence[int]]) -> None:
        """Creates the process groups of ``groups`` ahead of their first collective.

        Every rank calls this with the same list in the same order, including
        the groups it is not a member of: creating a group is itself collective.
        Groups already known create nothing.
        """
        checked = [_check_members(group, self.world_size, "prepare") for group in groups]
        with self._guarded("creating process groups"):
            self._prepare([group for group in checked if len(group) > 1])

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """How long each later collective may wait for its peers before it fails."""
        if timeout != self.timeout:
            self.timeout = timeout
            self._apply_timeout(timeout)

    # -- Agreement (hostir.comm.agreement) ----------------------------------------------

    def exchange_codes(self, codes: Sequence[int]) -> list[list[int]]:
        """Every rank's ``codes`` (int64s, the same count on every rank), in rank order.

        Called by every rank of the world before a program's first collective, on a
        process group of its own (so that a rank still in an earlier program's
        collectives cannot mix its messages with this one).
        """
        if self.world_size == 1:
            return [list(codes)]
        with self._guarded("the agreement"):
            return self._exchange_codes(list(codes))

    def exchange_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order (the agreement's detailed step)."""
        if self.world_size == 1:
            return [obj]
        with self._guarded("the agreement"):
            return self._exchange_objects(obj)

    def announce_codes(self, codes: Sequence[int]) -> None:
        """Sends ``codes`` as this rank's part of the next :meth:`exchange_codes` without
        waiting for the others' (a rank that failed before communicating, whose peers may
        not be in an agreement: hostir.comm.agreement). This rank's next communication
        waits for the exchange to complete first, where the communicator can."""
        if self.world_size == 1:
            return
        with self._guarded("the agreement"):
            self._announce_codes(list(codes))

    # -- Collectives --------------------------------------------------------------

    def allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Sequence[int]) -> Work:
        """``out[p]`` becomes ``inp`` of member ``p``; ``out`` is ``[len(group), *inp.shape]``
        (any strides: a strided ``out`` receives in place, without a staging copy of ours)."""
        team = self._team(group, "allgather")
        _expect(
            out, (len(team), *inp.shape), inp.dtype, f"allgather over {describe_group(team)}", "out"
        )
        if len(team) == 1:
            out[0].copy_(inp)
            return DONE
        return self._post("allgather", team, self._allgather, out, inp, team)

    def reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Sequence[int], op: ReduceOp
    ) -> Work:
        """Member ``p`` gets the ``op``-reduction over all members of their ``inp[p]``
        (``inp`` may be strided: the chunks are then handed over without a packing copy)."""
        team = self._team(group, "reduce_scatter")
        _expect(
            inp,
            (len(team), *out.shape),
            out.dtype,
            f"reduce_scatter over {describe_group(team)}",
            "inp",
        )
        if len(team) == 1:
            out.copy_(inp[0])
            return DONE
        return self._post("reduce_scatter", team, self._reduce_scatter, out, inp, team, op)

    def allreduce(self, tensor: torch.Tensor, group: Sequence[int], op: ReduceOp) -> Work:
        """Replaces ``tensor`` on every member by the ``op``-reduction over the members."""
        team = self._team(group, "allreduce")
        if len(team) == 1:
            return DONE
        return self._post("allreduce", team, self._allreduce, tensor, team, op)

    def broadcast(self, tensor: torch.Tensor, group: Sequence[int], root: int) -> Work:
        """Overwrites ``tensor`` on every member with that of the member at position ``root``."""
        team = self._team(group, "broadcast")
        _check_position(team, root, "root", "broadcast")
        if len(team) == 1:
            return DONE
        return self._post("broadcast", team, self._broadcast, tensor, team, root)

    def reduce(self, tensor: torch.Tensor, group: Sequence[int], root: int, op: ReduceOp) -> Work:
        """Reduces ``tensor`` in place onto position ``root``; other members get scratch."""
        team = self._team(group, "reduce")
        _check_position(team, root, "root", "reduce")
        if len(team) == 1:
            return DONE
        return self._post("reduce", team, self._reduce, tensor, team, root, op)

    def gather(
        self, out: torch.Tensor | None, inp: torch.Tensor, group: Sequence[int], root: int
    ) -> Work:
        """On ``root``, ``out[p]`` becomes ``inp`` of member ``p``; ``out`` is None elsewhere."""
        team = self._team(group, "gather")
        _check_position(team, root, "root", "gather")
        if self.rank == team[root]:
            _expect(
                out,
                (len(team), *inp.shape),
                inp.dtype,
                f"gather over {describe_group(team)}",
                "out",
            )
        if len(team) == 1:
            out[0].copy_(inp)
            return DONE
        return self._post("gather", team, self._gather, out, inp, team, root)

    def scatter(
        self, out: torch.Tensor, inp: torch.Tensor | None, group: Sequence[int], root: int
    ) -> Work:
        """Member ``p`` receives ``inp[p]`` of ``root`` into ``out``; ``inp`` is None elsewhere."""
        team = self._team(group, "scatter")
        _check_position(team, root, "root", "scatter")
        if self.rank == team[root]:
            _expect(
                inp,
                (len(team), *out.shape),
                out.dtype,
                f"scatter over {describe_group(team)}",
                "inp",
            )
        if len(team) == 1:
            out.copy_(inp[0])
            return DONE
        return self._post("scatter", team, self._scatter, out, inp, team, root)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Sequence[int]) -> Work:
        """Member ``p`` sends ``inp[q]`` to member ``q``, whose ``out[p]`` receives it."""
        team = self._team(group, "all_to_all")
        if inp.ndim == 0 or inp.shape[0] != len(team):
            raise CommunicationError(
                f"all_to_all over {describe_group(team)}: inp has shape {list(inp.shape)}, expected"
                f" {len(team)} chunks along dim 0"
            )
        _expect(out, tuple(inp.shape), inp.dtype, f"all_to_all over {describe_group(team)}", "out")
        if len(team) == 1:
            out.copy_(inp)
            return DONE
        return self._post("all_to_all", team, self._all_to_all, out, inp, team)

    def all_to_all_v(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: Sequence[int],
        in_splits: Sequence[int],
        group: Sequence[int],
    ) -> Work:
        """MPI's alltoallv on flat buffers: member ``p`` sends the ``in_splits[q]`` elements
        of ``inp`` after the first ``sum(in_splits[:q])`` to member ``q``, and receives
        ``out_splits[q]`` elements from member ``q`` at offset ``sum(out_splits[:q])`` of
        ``out``. Counts are per member in group order; a member's ``in_splits[q]`` must be
        member ``q``'s ``out_splits[p]``. ``out`` and ``inp`` are 1-d contiguous tensors."""
        team = self._team(group, "all_to_all_v")
        where = f"all_to_all_v over {describe_group(team)}"
        _expect(inp, None, None, where, "inp")
        _expect(out, None, inp.dtype, where, "out")
        for name, tensor, splits in (("inp", inp, in_splits), ("out", out, out_splits)):
            if tensor.ndim != 1 or not tensor.is_contiguous():
                raise CommunicationError(
                    f"{where}: {name} must be a flat contiguous tensor, got shape"
                    f" {list(tensor.shape)} with strides {list(tensor.stride())}"
                )
            if len(splits) != len(team) or any(int(n) < 0 for n in splits):
                raise CommunicationError(
                    f"{where}: {name} splits {list(splits)} must be {len(team)} counts >= 0"
                )
            if sum(splits) != tensor.numel():
                raise CommunicationError(
                    f"{where}: {name} splits {list(splits)} add up to {sum(splits)}, but {name}"
                    f" has {tensor.numel()} elements"
                )
        if len(team) == 1:
            if out.numel() != inp.numel():
                raise CommunicationError(
                    f"{where}: a rank alone sends itself {inp.numel()} elements, but expects"
                    f" {out.numel()}"
                )
            out.copy_(inp)
            return DONE
        out_counts, in_counts = [int(n) for n in out_splits], [int(n) for n in in_splits]
        return self._post(
            "all_to_all_v", team, self._all_to_all_v, out, inp, out_counts, in_counts, team
        )

    def send_recv(
        self,
        out: torch.Tensor | None,
        inp: torch.Tensor | None,
        group: Sequence[int],
        sender: int,
        receiver: int,
    ) -> Work:
        """The member at ``sender`` sends ``inp`` into ``out`` of the member at ``receiver``.

        ``out`` may be None on the sender and ``inp`` on the receiver; members
        that are neither do nothing. ``sender == receiver`` is a local copy.
        """
        team = self._team(group, "send_recv")
        _check_position(team, sender, "sender", "send_recv")
        _check_position(team, receiver, "receiver", "send_recv")
        where = f"send_recv over {describe_group(team)} from position {sender} to {receiver}"
        if self.rank == team[sender]:
            _expect(inp, None, None, where, "inp")
        if self.rank == team[receiver]:
            _expect(out, None if inp is None else tuple(inp.shape), None, where, "out")
        if sender == receiver:
            if self.rank == team[sender]:
                out.copy_(inp)
            return DONE
        if self.rank not in (team[sender], team[receiver]):
            return DONE
        return self._post("send_recv", team, self._send_recv, out, inp, team, sender, receiver)

    def permute(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        group: Sequence[int],
        send_to: int,
        recv_from: int,
    ) -> Work:
        """Sends ``inp`` to the member at ``send_to`` while receiving ``out`` from the
        member at ``recv_from`` (one step of a collective permute; every member calls
        it with its own peers). Both peers this rank is a local copy."""
        team = self._team(group, "permute")
        _check_position(team, send_to, "send_to", "permute")
        _check_position(team, recv_from, "recv_from", "permute")
        where = (
            f"permute over {describe_group(team)} sending to {send_to}, receiving from {recv_from}"
        )
        _expect(inp, None, None, where, "inp")
        _expect(out, tuple(inp.shape), inp.dtype, where, "out")
        me = team.index(self.rank)
        if (send_to == me) != (recv_from == me):
            raise CommunicationError(f"{where}: a rank that keeps its data must also send none")
        if send_to == me:
            out.copy_(inp)
            return DONE
        return self._post("permute", team, self._permute, out, inp, team, send_to, recv_from)

    # -- Helpers --------------------------------------------------------------------

    def _team(self, group: Sequence[int], what: str) -> Group:
        """``group`` as a checked tuple of which this rank is a member."""
        team = _check_members(group, self.world_size, what)
        if self.rank not in team:
            raise CommunicationError(
                f"{what}: rank {self.rank} is not a member of group {describe_group(team)}"
            )
        return team

    def _post(self, what: str, team: Group, hook: Callable[..., Work], *args: Any) -> Work:
        """``hook(*args)``, with a backend error raised while posting made a
        CommunicationError naming the collective, its group and this rank. Refused while
        another thread runs a program on this world (hostir.comm.run_guard)."""
        guard = self.run_guard()
        if guard.held_elsewhere():  # the message is built only when it is needed
            guard.check(f"{what} over {describe_group(team)}", self.where())
        # Backends take no uint64 (gloo: "Invalid scalar type"): its bits move as int64.
        args = tuple(_as_int64(a) if isinstance(a, torch.Tensor) else a for a in args)
        try:
            return hook(*args)
        except CommunicationError:
            raise
        except (RuntimeError, ValueError) as error:
            raise self._backend_error(f"{what} over {describe_group(team)}", error) from error

    def _backend_error(self, where: str, error: BaseException) -> CommunicationError:
        """The CommunicationError for a backend error raised by ``where`` on this rank."""
        return backend_failure(where, self.rank, error, self.timeout)


class LocalCommunicator(Communicator):
    """A world of one process (rank 0 of 1): every group is ``(0,)``, every collective a copy."""

    def __init__(self) -> None:
        super().__init__(rank=0, world_size=1)


def _as_int64(tensor: torch.Tensor) -> torch.Tensor:
    """A uint64 tensor viewed as int64 (the same bits; a sum wraps alike), others as they
    are."""
    return tensor.view(torch.int64) if tensor.dtype == torch.uint64 else tensor
