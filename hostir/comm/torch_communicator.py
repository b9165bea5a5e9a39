"""The ``torch.distributed`` communicator: collectives of real runs (gloo on CPU, nccl on CUDA).

hostir's collectives run on process groups of its own
(:mod:`hostir.comm.torch_groups`). Our groups are in team order (a column-major team
lists its devices column-major). Each is created with ``sort_ranks=False``, so a
torch group's ranks are the team positions and collectives land straight in the
caller's buffers. Rooted collectives and point-to-point calls take global ranks.
torch before 2.13 has no ``sort_ranks`` and always sorts: there, teams already in
ascending order work and any other is refused by name (KEEPS_TEAM_ORDER).

Every call is issued with ``async_op=True``; compute overlaps until ``wait()``
(:mod:`hostir.comm.torch_work`). A backend error, raised when posting or when
waiting, becomes a CommunicationError naming the collective, its group and this rank
(see :func:`hostir.comm.backend_hooks.backend_failure`).

gloo (torch 2.13) handles all of these collectives for float32, bfloat16 and
float16, including reductions, on sub-groups; no dtype fallback is needed. Its
``all_gather_single`` / ``reduce_scatter_single`` (torch 2.13's names; before,
``all_gather_into_tensor`` / ``reduce_scatter_tensor``) only accept the
concatenated layout (``[n * k]`` against ``[k]``), not the stacked one
(``[n, k]``), so those are called on flat views. Its ``all_to_all_single`` takes
uneven ``output_split_sizes`` / ``input_split_sizes`` (zeros included: alltoallv),
which ``all_to_all_v`` relies on.
"""

from __future__ import annotations

import datetime
import inspect
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hostir.comm.backend_hooks import Group, Work, backend_failure
from hostir.comm.communicator import Communicator
from hostir.comm.rank_text import describe_group, describe_ranks
from hostir.comm.run_guard import WorldGuard
from hostir.comm.torch_groups import (
    AGREEMENT,
    GROUPS,
    NOTICES,
    WORLD_GUARD,
    _arrive,
    _missing,
    _notice,
)
from hostir.comm.torch_work import PendingWork, _contiguous_like, _copy_back
from hostir.errors import CommunicationError
from hostir.ir.sharding import ReduceOp

TORCH_REDUCE_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.PROD: dist.ReduceOp.PRODUCT,
}

KEEPS_TEAM_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters
"""Whether this torch's new_group can keep the ranks in the order given (torch >= 2.13)."""

# torch 2.13's names; earlier versions have the same calls as all_gather_into_tensor and
# reduce_scatter_tensor (deprecated in 2.13, so the new names are preferred where present).
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class TorchCommunicator(Communicator):
    """The ranks of the default ``torch.distributed`` process group."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise CommunicationError("torch.distributed is not initialized")
        super().__init__(rank=dist.get_rank(), world_size=dist.get_world_size())

    def run_guard(self) -> WorldGuard:
        """The process's guard: every TorchCommunicator talks on the default group."""
        return WORLD_GUARD

    # -- Groups -----------------------------------------------------------------

    def _prepare(self, groups: list[Group]) -> None:
        cache = GROUPS.current()
        self._sync_timeout()
        # Our world group first (collectives over every rank and point-to-point calls run
        # on it), so that it exists whatever the program: every rank creates it in step.
        world = [tuple(range(self.world_size))] if self.world_size > 1 else []
        for group in [*world, *groups]:
            key = tuple(group)
            if key in cache:
                continue
            # Collective over the whole world: every rank reaches this line for
            # the same keys in the same order (non-members get a placeholder). The
            # group keeps the team's order (sort_ranks=False), so its torch ranks are
            # the team positions and no collective needs reordering copies.
            cache[key] = self._new_group(f"group {describe_group(key)}", list(key))

    def _new_group(self, what: str, ranks: list[int], **options: Any) -> Any:
        if KEEPS_TEAM_ORDER:
            options["sort_ranks"] = False
        elif ranks != sorted(ranks):
            # Every rank prepares the same groups in the same order, so all of them
            # stop here together: no rank is left waiting in new_group.
            raise CommunicationError(
                f"creating {what} on rank {self.rank}: its ranks are not in ascending order,"
                f" and torch {torch.__version__}'s new_group sorts a group's ranks, so its"
                " collectives would land in the wrong places; install torch >= 2.13"
                " (new_group(sort_ranks=False)), or list the mesh's devices in ascending"
                " order along every axis"
            )
        try:
            return dist.new_group(ranks, timeout=self.timeout, **options)
        except RuntimeError as error:
            raise self._backend_error(f"creating {what}", error) from error

    def _group(self, group: Group, what: str) -> Any:
        """The torch process group of ``group`` (prepared earlier on every rank)."""
        self._check_usable(what)
        found = GROUPS.current().get(tuple(group))
        if found is None:
            raise CommunicationError(
                f"{what} over group {describe_group(group)}: the group was not prepared; call"
                " prepare() with it on every rank before its first collective"
            )
        return found

    def _check_usable(self, what: str) -> None:
        """Refuses to communicate after a backend failure: a timed-out or broken gloo group
        has closed its connections, and late messages could land in a later collective.
        An agreement message this rank announced without waiting (``announce_codes``) is
        waited for first: a later message of this rank must not pair with a peer's earlier
        one. Its peers receive it at their agreement; if they never come to one (they ran
        a signature agreed on before), it times out and the world is unusable."""
        GROUPS.current()
        announced, GROUPS.announced = GROUPS.announced, None
        if announced is not None:
            try:
                announced.wait()
            except CommunicationError:
                pass  # recorded as GROUPS.failure (PendingWork's on_error): refused below
        if GROUPS.failure is not None:
            raise CommunicationError(
                f"{what} on rank {self.rank}: hostir's process groups are unusable after an"
                f" earlier failure ({GROUPS.failure}); restart the ranks"
            )

    def _backend_error(self, where: str, error: BaseException) -> CommunicationError:
        failure = backend_failure(where, self.rank, error, self.timeout)
        if GROUPS.failure is None:
            GROUPS.failure = failure
        return failure

    def post_failure(self, message: str) -> None:
        try:
            store = dist.distributed_c10d._get_default_store()
            store.set(f"{NOTICES}{self.rank}", f"{time.time()}|{message}")
        except Exception:  # noqa: BLE001 - a notice is a courtesy: the store may be gone
            pass

    def failures_since(self, moment: float) -> list[tuple[int, str]]:
        found = []
        try:
            store = dist.distributed_c10d._get_default_store()
            for rank in range(self.world_size):
                notice = _notice(store, rank) if rank != self.rank else None
                if notice is not None and notice[0] >= moment:
                    found.append((rank, notice[1]))
        except Exception:  # noqa: BLE001 - the store may be gone with a failed rank 0
            return found
        return found

    def posted_failure(self, rank: int) -> str | None:
        try:
            notice = _notice(dist.distributed_c10d._get_default_store(), rank)
        except Exception:  # noqa: BLE001 - the store may be gone with a failed rank 0
            return None
        return None if notice is None else notice[1]

    def _sync_timeout(self) -> None:
        """Gives our existing groups this communicator's timeout if they have another."""
        if GROUPS.timeout != self.timeout:
            self._apply_timeout(self.timeout)

    def _apply_timeout(self, timeout: datetime.timedelta) -> None:
        for key, group in GROUPS.current().items():
            members = range(self.world_size) if key == AGREEMENT else key
            if self.rank in members:
                dist.distributed_c10d._set_pg_timeout(timeout, group)
        GROUPS.timeout = timeout

    # -- Agreement ------------------------------------------------------------------

    def _agreement_group(self) -> Any:
        self._check_usable("the agreement")
        cache = GROUPS.current()
        if AGREEMENT not in cache:
            # gloo whatever the default backend: the messages are small CPU tensors.
            ranks = list(range(self.world_size))
            cache[AGREEMENT] = self._new_group("the agreement group", ranks, backend="gloo")
        self._sync_timeout()
        return cache[AGREEMENT]

    def _exchange_codes(self, codes: list[int]) -> list[list[int]]:
        arrivals = _arrive(self.rank)
        try:
            group = self._agreement_group()
            mine = torch.tensor(codes, dtype=torch.int64)
            everyone = torch.empty(self.world_size * len(codes), dtype=torch.int64)
            ALL_GATHER_SINGLE(everyone, mine, group=group, async_op=True).wait()
        except (RuntimeError, CommunicationError) as error:
            raise self._agreement_failure(error, arrivals) from error
        return everyone.view(self.world_size, len(codes)).tolist()

    def _announce_codes(self, codes: list[int]) -> None:
        GROUPS.current()
        if GROUPS.announced is not None and not GROUPS.announced.ready():
            # The peers have not received this rank's earlier announcement (they are
            # running a signature agreed on before): this one would only queue behind it,
            # and waiting for that one is waiting for the timeout. Its posted failure
            # names this rank to them.
            return
        _arrive(self.rank)
        group = self._agreement_group()
        mine = torch.tensor(codes, dtype=torch.int64)
        everyone = torch.empty(self.world_size * len(codes), dtype=torch.int64)
        try:
            handle = ALL_GATHER_SINGLE(everyone, mine, group=group, async_op=True)
        except RuntimeError as error:
            raise self._agreement_failure(error, None) from error
        where = "the agreement announcing this rank's failure before communicating"
        GROUPS.announced = self._work(where, [handle], None, [mine, everyone])

    def _exchange_objects(self, obj: Any) -> list[Any]:
        everyone: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(everyone, obj, group=self._agreement_group())
        except RuntimeError as error:
            raise self._agreement_failure(error, None) from error
        return everyone

    def _agreement_failure(self, error: BaseException, arrivals: int | None) -> CommunicationError:
        where = "the agreement before the first collective (over every rank)"
        if isinstance(error, CommunicationError):
            failure = error  # recorded where it was raised
        else:
            failure = self._backend_error(where, error)
        missing = _missing(self.world_size, arrivals)
        if missing:
            return CommunicationError(
                f"{failure}; {describe_ranks(missing)} did not reach the agreement (stopped"
                " or failed before its execute, still busy, or running inputs the ranks agreed"
                " on before)"
            )
        return failure

    # -- Collectives --------------------------------------------------------------

    def _work(self, what: str, handles: Sequence[Any], finish=None, keep=()) -> PendingWork:
        return PendingWork(what, handles, finish, keep, on_error=self._backend_error)

    def _allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        process_group = self._group(group, "allgather")
        what = f"allgather over {describe_group(group)}"
        src = inp.contiguous()
        if not out.is_contiguous():
            # Strided chunks (a gather along an inner dim): the list form lands each
            # member's chunk in its view; the backend stages the gather itself (gloo
            # always does), so no second staging buffer of ours.
            handle = dist.all_gather(list(out.unbind(0)), src, group=process_group, async_op=True)
            return self._work(what, [handle], None, [out, src])
        handle = ALL_GATHER_SINGLE(out.view(-1), src.view(-1), group=process_group, async_op=True)
        return self._work(what, [handle], None, [out, src])

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, op: ReduceOp
    ) -> Work:
        process_group = self._group(group, "reduce_scatter")
        what = f"reduce_scatter over {describe_group(group)}"
        landing = _contiguous_like(out)
        # The packed form: gloo runs the list form as one all-reduce per chunk.
        handle = REDUCE_SCATTER_SINGLE(
            landing.view(-1),
            inp.contiguous().view(-1),
            op=TORCH_REDUCE_OPS[op],
            group=process_group,
            async_op=True,
        )
        return self._work(what, [handle], _copy_back(landing, out), [landing, inp])

    def _allreduce(self, tensor: torch.Tensor, group: Group, op: ReduceOp) -> Work:
        process_group = self._group(group, "allreduce")
        buf = tensor.contiguous()
        handle = dist.all_reduce(buf, op=TORCH_REDUCE_OPS[op], group=process_group, async_op=True)
        what = f"allreduce over {describe_group(group)}"
        return self._work(what, [handle], _copy_back(buf, tensor), [buf])

    def _broadcast(self, tensor: torch.Tensor, group: Group, root: int) -> Work:
        process_group = self._group(group, "broadcast")
        buf = tensor.contiguous()
        handle = dist.broadcast(buf, src=group[root], group=process_group, async_op=True)
        what = f"broadcast over {describe_group(group)}"
        return self._work(what, [handle], _copy_back(buf, tensor), [buf])

    def _reduce(self, tensor: torch.Tensor, group: Group, root: int, op: ReduceOp) -> Work:
        process_group = self._group(group, "reduce")
        buf = tensor.contiguous()
        handle = dist.reduce(
            buf, dst=group[root], op=TORCH_REDUCE_OPS[op], group=process_group, async_op=True
        )
        what = f"reduce over {describe_group(group)}"
        return self._work(what, [handle], _copy_back(buf, tensor), [buf])

    def _gather(self, out: torch.Tensor | None, inp: torch.Tensor, group: Group, root: int) -> Work:
        process_group = self._group(group, "gather")
        src = inp.contiguous()
        landing, chunks = None, None
        if self.rank == group[root]:
            landing = _contiguous_like(out)
            chunks = list(landing.unbind(0))  # torch fills chunks[p] from group rank p
        handle = dist.gather(src, chunks, dst=group[root], group=process_group, async_op=True)
        finish = _copy_back(landing, out) if landing is not None else None
        what = f"gather over {describe_group(group)}"
        return self._work(what, [handle], finish, [src, *(chunks or [])])

    def _scatter(
        self, out: torch.Tensor, inp: torch.Tensor | None, group: Group, root: int
    ) -> Work:
        process_group = self._group(group, "scatter")
        landing = _contiguous_like(out)
        chunks = None
        if self.rank == group[root]:
            chunks = list(inp.contiguous().unbind(0))  # torch sends chunks[p] to group rank p
        handle = dist.scatter(landing, chunks, src=group[root], group=process_group, async_op=True)
        what = f"scatter over {describe_group(group)}"
        return self._work(what, [handle], _copy_back(landing, out), [landing, *(chunks or [])])

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        process_group = self._group(group, "all_to_all")
        # Chunk p goes to, and arrives from, torch group rank p.
        src = inp.contiguous()
        landing = _contiguous_like(out)
        handle = dist.all_to_all_single(landing, src, group=process_group, async_op=True)
        what = f"all_to_all over {describe_group(group)}"
        return self._work(what, [handle], _copy_back(landing, out), [landing, src])

    def _all_to_all_v(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Group,
    ) -> Work:
        handle = dist.all_to_all_single(
            out,
            inp,
            output_split_sizes=out_splits,
            input_split_sizes=in_splits,
            group=self._group(group, "all_to_all_v"),
            async_op=True,
        )
        return self._work(f"all_to_all_v over {describe_group(group)}", [handle], None, [out, inp])

    def _permute(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, send_to: int, recv_from: int
    ) -> Work:
        # One batched send and receive with global ranks on our world group: posted
        # together so that every member's send meets its peer's receive (no ordering
        # deadlock around a ring).
        process_group = self._world()
        what = f"permute sending to rank {group[send_to]}, receiving from {group[recv_from]}"
        src = inp.contiguous()
        landing = _contiguous_like(out)
        ops = [
            dist.P2POp(dist.isend, src, group[send_to], group=process_group),
            dist.P2POp(dist.irecv, landing, group[recv_from], group=process_group),
        ]
        handles = dist.batch_isend_irecv(ops)
        return self._work(what, handles, _copy_back(landing, out), [src, landing])

    def _send_recv(
        self,
        out: torch.Tensor | None,
        inp: torch.Tensor | None,
        group: Group,
        sender: int,
        receiver: int,
    ) -> Work:
        # Point-to-point on our world group with global ranks.
        process_group = self._world()
        what = f"send_recv from rank {group[sender]} to rank {group[receiver]}"
        if self.rank == group[sender]:
            src = inp.contiguous()
            handle = dist.isend(src, dst=group[receiver], group=process_group)
            return self._work(what, [handle], keep=[src])
        landing = _contiguous_like(out)
        handle = dist.irecv(landing, src=group[sender], group=process_group)
        return self._work(what, [handle], _copy_back(landing, out), [landing])

    def _world(self) -> Any:
        """Our group of every rank (point-to-point calls run on it; ``prepare`` creates it)."""
        return self._group(tuple(range(self.world_size)), "point-to-point")
