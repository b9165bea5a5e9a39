"""One rank of a simulated world (hostir.comm.simulated_world): the backend hooks of
:class:`~hostir.comm.communicator.Communicator` posting to the world.

The public methods of Communicator stay the argument checks and the one-rank copies,
as in a real run; only groups of several ranks reach the hooks here. Every hook posts
and returns at once (as an ``async_op=True`` call does); ``wait()`` on the work blocks
until the collective's last member posted it.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from hostir.comm.backend_hooks import Group, Work
from hostir.comm.communicator import Communicator
from hostir.comm.rank_text import describe_group
from hostir.comm.simulated_collectives import Post
from hostir.comm.simulated_memory import HeldTensors
from hostir.comm.simulated_world import AGREEMENT, RunRecord, SimulatedWorld
from hostir.ir.sharding import ReduceOp


class SimulatedCommunicator(Communicator):
    """Rank ``rank`` of the simulated ``world`` (its own thread runs this rank)."""

    def __init__(self, world: SimulatedWorld, rank: int) -> None:
        super().__init__(rank=rank, world_size=world.world_size)
        self.world = world
        self.run: RunRecord | None = None  # the program run this rank is in, if counted

    def run_started(self, context: Any) -> None:
        """Counts what the run holds (hostir.comm.simulated_memory) and, where the world
        counts traffic by run, attributes this rank's next posts to it."""
        self._end_held()
        self._held = context.tensors = HeldTensors(self.world.memory, self.rank)
        if self.world.by_run:
            self.run = self.world.run_started(self.rank, context)

    def _end_held(self) -> None:
        held = self.__dict__.pop("_held", None)
        if held is not None:
            held.release_all()

    def run_finished(self, context: Any) -> None:
        """The run this rank is in ended well: its traffic may be compared whole."""
        self._end_held()
        if self.run is not None and self.run.context is context:
            self.world.run_finished(self.run)
            self.run = None

    def _collective(self, kind: str, group: Group, **args: Any) -> Work:
        where = f"{kind} over group {describe_group(group)}"
        post = Post(self.rank, kind, args, self.run)
        return self.world.post("collectives", group, post, where, False)

    # -- Set-up and agreement -------------------------------------------------------------

    def _prepare(self, groups: list[Group]) -> None:
        """Nothing to create: the world pairs collectives by group as they come."""

    def _apply_timeout(self, timeout: datetime.timedelta) -> None:
        """Nothing to hand on: the world finds hangs instead of timing out."""

    def _exchange_codes(self, codes: list[int]) -> list[list[int]]:
        return self._agree("exchange_codes", codes, wait=True)

    def _exchange_objects(self, obj: Any) -> list[Any]:
        return self._agree("exchange_objects", obj, wait=True)

    def _announce_codes(self, codes: list[int]) -> None:
        self._agree("exchange_codes", codes, wait=False)

    def _agree(self, kind: str, value: Any, wait: bool) -> Any:
        world = tuple(range(self.world_size))
        where = "the agreement before the first collective (over every rank)"
        work = self.world.post(
            AGREEMENT, world, Post(self.rank, kind, {"value": value}), where, wait
        )
        return work.result

    def barrier(self) -> None:
        """Waits until every rank of the world reached a barrier (its own channel)."""
        world = tuple(range(self.world_size))
        self.world.post("barrier", world, Post(self.rank, "barrier"), "a barrier over every rank")

    # -- Collectives ---------------------------------------------------------------------

    def _allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        return self._collective("allgather", group, out=out, inp=inp)

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, op: ReduceOp
    ) -> Work:
        return self._collective("reduce_scatter", group, out=out, inp=inp, op=op)

    def _allreduce(self, tensor: torch.Tensor, group: Group, op: ReduceOp) -> Work:
        return self._collective("allreduce", group, tensor=tensor, op=op)

    def _broadcast(self, tensor: torch.Tensor, group: Group, root: int) -> Work:
        return self._collective("broadcast", group, tensor=tensor, root=root)

    def _reduce(self, tensor: torch.Tensor, group: Group, root: int, op: ReduceOp) -> Work:
        return self._collective("reduce", group, tensor=tensor, root=root, op=op)

    def _gather(self, out: torch.Tensor | None, inp: torch.Tensor, group: Group, root: int) -> Work:
        return self._collective("gather", group, out=out, inp=inp, root=root)

    def _scatter(
        self, out: torch.Tensor, inp: torch.Tensor | None, group: Group, root: int
    ) -> Work:
        return self._collective("scatter", group, out=out, inp=inp, root=root)

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        return self._collective("all_to_all", group, out=out, inp=inp)

    def _all_to_all_v(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Group,
    ) -> Work:
        return self._collective(
            "all_to_all_v", group, out=out, inp=inp, out_splits=out_splits, in_splits=in_splits
        )

    # -- Point to point -------------------------------------------------------------------

    def _send_recv(
        self,
        out: torch.Tensor | None,
        inp: torch.Tensor | None,
        group: Group,
        sender: int,
        receiver: int,
    ) -> Work:
        where = (
            f"send_recv over group {describe_group(group)} from {group[sender]} to"
            f" {group[receiver]}"
        )
        if self.rank == group[sender]:
            return self.world.transfer(self.rank, where, (group[receiver], inp), None, self.run)
        return self.world.transfer(self.rank, where, None, (group[sender], out))

    def _permute(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, send_to: int, recv_from: int
    ) -> Work:
        where = f"permute over group {describe_group(group)}"
        send, receive = (group[send_to], inp), (group[recv_from], out)
        return self.world.transfer(self.rank, where, send, receive, self.run)

    # -- Failure notices ------------------------------------------------------------------

    def post_failure(self, message: str) -> None:
        self.world.post_failure(self.rank, message)

    def failures_since(self, moment: float) -> list[tuple[int, str]]:
        return self.world.failures_since(self.rank, moment)

    def posted_failure(self, rank: int) -> str | None:
        return self.world.posted_failure(rank)
