"""What a communicator's backend implements, and what a collective returns.

:class:`~hostir.comm.communicator.Communicator` checks a collective's arguments and serves
groups of one rank itself; a group of more than one rank goes to the ``_``-prefixed hooks
of :class:`BackendHooks`, its base, which a backend overrides
(:class:`~hostir.comm.torch_communicator.TorchCommunicator`). Here they reach no other
rank and raise. The failure notices are the backend's too (best effort). Each collective
returns a :class:`Work`; :func:`backend_failure` is the error a backend's own error
becomes.
"""

from __future__ import annotations

import abc
import datetime
from typing import Any

import torch

from hostir.comm.rank_text import describe_group
from hostir.errors import CommunicationError
from hostir.ir.sharding import ReduceOp

Group = tuple[int, ...]
"""Global ranks in team order."""


class Work(abc.ABC):
    """A communication in flight: ``wait()`` returns once this rank's results are in place."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Blocks until the communication is done and its outputs are written."""


class CompletedWork(Work):
    """Work that was finished when issued (local copies, ranks with nothing to do)."""

    def wait(self) -> None:
        """Nothing to wait for."""


DONE = CompletedWork()


class BackendHooks:
    """The hooks a backend implements for groups of more than one rank (their arguments
    already checked by :class:`~hostir.comm.communicator.Communicator`, which derives from
    this class and holds the ``rank`` and ``world_size`` read here), and its failure
    notices. This base reaches no other rank: each collective hook raises."""

    # -- Hooks: groups of more than one rank, arguments already checked -------------

    def _permute(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, send_to: int, recv_from: int
    ) -> Work:
        raise self._cannot_reach("permute", group)

    def _prepare(self, groups: list[Group]) -> None:
        if groups:
            raise self._cannot_reach("prepare", groups[0])

    def _exchange_codes(self, codes: list[int]) -> list[list[int]]:
        raise self._cannot_reach("exchange_codes", tuple(range(self.world_size)))

    def _exchange_objects(self, obj: Any) -> list[Any]:
        raise self._cannot_reach("exchange_objects", tuple(range(self.world_size)))

    def _announce_codes(self, codes: list[int]) -> None:
        self._exchange_codes(codes)  # a stand-in answers at once

    def _apply_timeout(self, timeout: datetime.timedelta) -> None:
        """Hands a new timeout to the backend's groups (nothing to do without a backend)."""

    def _allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        raise self._cannot_reach("allgather", group)

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, op: ReduceOp
    ) -> Work:
        raise self._cannot_reach("reduce_scatter", group)

    def _allreduce(self, tensor: torch.Tensor, group: Group, op: ReduceOp) -> Work:
        raise self._cannot_reach("allreduce", group)

    def _broadcast(self, tensor: torch.Tensor, group: Group, root: int) -> Work:
        raise self._cannot_reach("broadcast", group)

    def _reduce(self, tensor: torch.Tensor, group: Group, root: int, op: ReduceOp) -> Work:
        raise self._cannot_reach("reduce", group)

    def _gather(self, out: torch.Tensor | None, inp: torch.Tensor, group: Group, root: int) -> Work:
        raise self._cannot_reach("gather", group)

    def _scatter(
        self, out: torch.Tensor, inp: torch.Tensor | None, group: Group, root: int
    ) -> Work:
        raise self._cannot_reach("scatter", group)

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        raise self._cannot_reach("all_to_all", group)

    def _all_to_all_v(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Group,
    ) -> Work:
        raise self._cannot_reach("all_to_all_v", group)

    def _send_recv(
        self,
        out: torch.Tensor | None,
        inp: torch.Tensor | None,
        group: Group,
        sender: int,
        receiver: int,
    ) -> Work:
        raise self._cannot_reach("send_recv", group)

    # -- Failure notices (best effort: they name the rank behind a peer's error) ---------

    def post_failure(self, message: str) -> None:
        """Tells the other ranks, where this communicator can, that this rank failed with
        ``message`` (they name it in their own communication errors)."""

    def failures_since(self, moment: float) -> list[tuple[int, str]]:
        """(rank, message) of the failures other ranks posted at or after ``moment``
        (``time.time()``), where this communicator can know them."""
        return []

    def posted_failure(self, rank: int) -> str | None:
        """The message of the last failure ``rank`` posted (:meth:`post_failure`), where
        this communicator can know it; else None."""
        return None

    def _cannot_reach(self, what: str, group: Group) -> CommunicationError:
        return CommunicationError(
            f"{what} over group {describe_group(group)}: {self!r} cannot reach other ranks"
            " (use TorchCommunicator, or a communicator that simulates them)"
        )


def backend_failure(
    where: str, rank: int, error: BaseException, timeout: datetime.timedelta
) -> CommunicationError:
    """The CommunicationError for a backend (gloo/NCCL) error raised by ``where`` on
    ``rank``: what most likely happened, then the backend's own first line."""
    text = str(error)
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered:
        reason = (
            f"no answer from its peers within {timeout.total_seconds():g} s (the collective"
            " timeout: HOSTIR_TIMEOUT or execute(timeout=)); a peer is stalled, far slower,"
            " or waiting in another collective"
        )
    elif any(word in lowered for word in ("closed", "reset by peer", "broken pipe", "abort")):
        reason = "a peer closed its connection: it failed or exited (see that rank's error)"
    else:
        reason = "the backend reported an error"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if len(first) > 240:
        first = first[:240] + "..."
    return CommunicationError(f"{where} failed on rank {rank}: {reason} [{first}]")
