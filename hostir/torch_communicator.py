"""The ``torch.distributed`` communicator: collectives of real runs (gloo on CPU, nccl on CUDA).

Our groups are in team order (a column-major team lists its devices
column-major). Each is created with ``sort_ranks=False``, so a torch group's
ranks are the team positions and collectives land straight in the caller's
buffers; the world in rank order is the default group. (``Layout`` still maps
team positions to torch group ranks, and permutes at the edges if the two ever
differ.) Rooted collectives and point-to-point calls take global ranks.

Every call is issued with ``async_op=True``; compute overlaps until ``wait()``.
torch needs contiguous buffers, so a non-contiguous output gets a contiguous
temporary that ``wait()`` copies back.

gloo (torch 2.13) handles all of these collectives for float32, bfloat16 and
float16, including reductions, on sub-groups; no dtype fallback is needed. Its
``all_gather_single`` / ``reduce_scatter_single`` (torch 2.13's preferred names)
only accept the concatenated layout (``[n * k]`` against ``[k]``), not the stacked one
(``[n, k]``), so those are called on flat views. Its ``all_to_all_single`` takes
uneven ``output_split_sizes`` / ``input_split_sizes`` (zeros included: alltoallv),
which ``all_to_all_v`` relies on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hostir.communicator import DEFAULT_TIMEOUT, Communicator, Group, Work
from hostir.errors import CommunicationError
from hostir.sharding import ReduceOp

TORCH_REDUCE_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.PROD: dist.ReduceOp.PRODUCT,
}


class GroupCache:
    """Process groups by member tuple in team order, for one default group.

    Shared by every TorchCommunicator of this process: the evaluator makes a
    communicator per run, and a per-instance cache would create (and leak) new
    groups on every run. All ranks prepare the same groups in the same order,
    so their caches stay in step. A re-initialized world starts afresh.
    """

    def __init__(self) -> None:
        self.world: Any = None
        self.groups: dict[Group, Any] = {}

    def current(self) -> dict[Group, Any]:
        """The groups of the current default group (emptied if that group changed)."""
        world = dist.group.WORLD
        if self.world is not world:
            self.groups = {}
            self.world = world  # holding it keeps its id from being reused
        return self.groups


GROUPS = GroupCache()


class PendingWork(Work):
    """torch work handles plus the post-processing that completes them in ``wait()``."""

    def __init__(
        self,
        what: str,
        handles: Sequence[Any],
        finish: Callable[[], None] | None = None,
        keep: Sequence[torch.Tensor] = (),
    ) -> None:
        self._what = what
        self._handles = list(handles)
        self._finish = finish
        # Buffers torch reads or writes asynchronously must outlive the call.
        self._keep = list(keep)
        self._done = False

    def wait(self) -> None:
        """Waits for the handles, then permutes/copies results into place (once)."""
        if self._done:
            return
        try:
            for handle in self._handles:
                handle.wait()
        except RuntimeError as exc:  # gloo reports timeouts and lost peers this way
            raise CommunicationError(f"{self._what} failed: {exc}") from exc
        if self._finish is not None:
            self._finish()
        self._done = True
        self._handles, self._finish, self._keep = [], None, []


@dataclass(frozen=True)
class Layout:
    """How a team-ordered group maps onto its torch process group.

    ``order[p]`` is the torch group rank of team position ``p``; ``inverse[s]``
    the team position of torch group rank ``s``.
    """

    process_group: Any
    order: list[int]
    inverse: list[int]

    @property
    def sorted(self) -> bool:
        """True when the team order already is torch's order."""
        return self.order == list(range(len(self.order)))


class TorchCommunicator(Communicator):
    """The ranks of the default ``torch.distributed`` process group."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise CommunicationError("torch.distributed is not initialized")
        super().__init__(rank=dist.get_rank(), world_size=dist.get_world_size())

    # -- Groups -----------------------------------------------------------------

    def _prepare(self, groups: list[Group]) -> None:
        cache = GROUPS.current()
        world = tuple(range(self.world_size))
        for group in groups:
            key = tuple(group)
            if key == world or key in cache:
                continue
            # Collective over the whole world: every rank reaches this line for
            # the same keys in the same order (non-members get a placeholder). The
            # group keeps the team's order (sort_ranks=False), so its torch ranks are
            # the team positions and no collective needs reordering copies.
            cache[key] = dist.new_group(list(key), timeout=DEFAULT_TIMEOUT, sort_ranks=False)

    def _layout(self, group: Group, what: str) -> Layout:
        key = tuple(group)
        if key == tuple(range(self.world_size)):
            process_group = None  # the default group
        elif key in GROUPS.current():
            process_group = GROUPS.current()[key]
        else:
            raise CommunicationError(
                f"{what} over group {group}: the group was not prepared; call"
                " prepare() with it on every rank before its first collective"
            )
        order = [key.index(rank) for rank in group]
        return Layout(process_group, order, [group.index(rank) for rank in key])

    def _check_same_program(self, digest: str) -> None:
        device = _scratch_device()
        mine = torch.tensor([_digest_code(digest)], dtype=torch.int64, device=device)
        codes = torch.empty(self.world_size, dtype=torch.int64, device=device)
        dist.all_gather_single(codes, mine)
        by_code: dict[int, list[int]] = {}
        for rank, code in enumerate(codes.tolist()):
            by_code.setdefault(code, []).append(rank)
        if len(by_code) == 1:
            return
        # The largest set of agreeing ranks (the one with rank 0 on a tie) is
        # taken as the reference; the others are named as differing.
        sets = sorted(by_code.values(), key=lambda ranks: (-len(ranks), ranks[0]))
        differing = sorted(rank for ranks in sets[1:] for rank in ranks)
        verb = "differs" if len(differing) == 1 else "differ"
        raise CommunicationError(
            f"the ranks run different programs: the program digest of {_ranks(differing)}"
            f" {verb} from that of {_ranks(sets[0])} (this is rank {self.rank})"
        )

    # -- Collectives --------------------------------------------------------------

    def _allgather(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        layout = self._layout(group, "allgather")
        if not out.is_contiguous():
            # Strided chunks (a gather along an inner dim): the list form lands each
            # member's chunk in its view; the backend stages the gather itself (gloo
            # always does), so no second staging buffer of ours.
            src = inp.contiguous()
            chunks = list(out.unbind(0))
            handle = dist.all_gather(
                [chunks[p] for p in layout.inverse], src, group=layout.process_group, async_op=True
            )
            return PendingWork(f"allgather over {group}", [handle], None, [out, src])
        direct = layout.sorted and out.is_contiguous()
        landing = out if direct else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        src = inp.contiguous()
        handle = dist.all_gather_single(
            landing.view(-1), src.view(-1), group=layout.process_group, async_op=True
        )

        def finish() -> None:
            if not direct:
                out.copy_(landing[layout.order])  # sorted order -> team order

        return PendingWork(f"allgather over {group}", [handle], finish, [landing, src])

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, op: ReduceOp
    ) -> Work:
        layout = self._layout(group, "reduce_scatter")
        landing = _contiguous_like(out)
        if not inp.is_contiguous():
            # Strided chunks (a reduce-scatter along an inner dim): the list form packs
            # them itself (gloo flattens its inputs anyway), so no packing copy of ours.
            chunks = list(inp.unbind(0))
            handle = dist.reduce_scatter(
                landing,
                [chunks[p] for p in layout.inverse],
                op=TORCH_REDUCE_OPS[op],
                group=layout.process_group,
                async_op=True,
            )
            return PendingWork(
                f"reduce_scatter over {group}", [handle], _copy_back(landing, out), [landing, inp]
            )
        # Chunk s of the call goes to torch group rank s: reorder team chunks.
        src = inp.contiguous() if layout.sorted else inp[layout.inverse]
        handle = dist.reduce_scatter_single(
            landing.view(-1),
            src.view(-1),
            op=TORCH_REDUCE_OPS[op],
            group=layout.process_group,
            async_op=True,
        )
        return PendingWork(
            f"reduce_scatter over {group}", [handle], _copy_back(landing, out), [landing, src]
        )

    def _allreduce(self, tensor: torch.Tensor, group: Group, op: ReduceOp) -> Work:
        layout = self._layout(group, "allreduce")
        buf = tensor.contiguous()
        handle = dist.all_reduce(
            buf, op=TORCH_REDUCE_OPS[op], group=layout.process_group, async_op=True
        )
        return PendingWork(f"allreduce over {group}", [handle], _copy_back(buf, tensor), [buf])

    def _broadcast(self, tensor: torch.Tensor, group: Group, root: int) -> Work:
        layout = self._layout(group, "broadcast")
        buf = tensor.contiguous()
        handle = dist.broadcast(buf, src=group[root], group=layout.process_group, async_op=True)
        return PendingWork(f"broadcast over {group}", [handle], _copy_back(buf, tensor), [buf])

    def _reduce(self, tensor: torch.Tensor, group: Group, root: int, op: ReduceOp) -> Work:
        layout = self._layout(group, "reduce")
        buf = tensor.contiguous()
        handle = dist.reduce(
            buf,
            dst=group[root],
            op=TORCH_REDUCE_OPS[op],
            group=layout.process_group,
            async_op=True,
        )
        return PendingWork(f"reduce over {group}", [handle], _copy_back(buf, tensor), [buf])

    def _gather(self, out: torch.Tensor | None, inp: torch.Tensor, group: Group, root: int) -> Work:
        layout = self._layout(group, "gather")
        src = inp.contiguous()
        landing, chunks = None, None
        if self.rank == group[root]:
            landing = _contiguous_like(out)
            # torch fills chunks[s] from group rank s: hand it team-ordered views.
            chunks = [landing[p] for p in layout.inverse]
        handle = dist.gather(
            src, chunks, dst=group[root], group=layout.process_group, async_op=True
        )
        finish = _copy_back(landing, out) if landing is not None else None
        return PendingWork(f"gather over {group}", [handle], finish, [src, *(chunks or [])])

    def _scatter(
        self, out: torch.Tensor, inp: torch.Tensor | None, group: Group, root: int
    ) -> Work:
        layout = self._layout(group, "scatter")
        landing = _contiguous_like(out)
        chunks = None
        if self.rank == group[root]:
            src = inp.contiguous()
            # torch sends chunks[s] to group rank s: hand it team-ordered views.
            chunks = [src[p] for p in layout.inverse]
        handle = dist.scatter(
            landing, chunks, src=group[root], group=layout.process_group, async_op=True
        )
        finish = _copy_back(landing, out)
        return PendingWork(f"scatter over {group}", [handle], finish, [landing, *(chunks or [])])

    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, group: Group) -> Work:
        layout = self._layout(group, "all_to_all")
        # Chunk s goes to, and arrives from, torch group rank s.
        src = inp.contiguous() if layout.sorted else inp[layout.inverse]
        direct = layout.sorted and out.is_contiguous()
        landing = out if direct else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        handle = dist.all_to_all_single(landing, src, group=layout.process_group, async_op=True)

        def finish() -> None:
            if not direct:
                out.copy_(landing[layout.order])  # sorted order -> team order

        return PendingWork(f"all_to_all over {group}", [handle], finish, [landing, src])

    def _all_to_all_v(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Group,
    ) -> Work:
        layout = self._layout(group, "all_to_all_v")
        what = f"all_to_all_v over {group}"
        if layout.sorted:  # torch's ranks are the team positions: the buffers go as they are
            handle = dist.all_to_all_single(
                out,
                inp,
                output_split_sizes=out_splits,
                input_split_sizes=in_splits,
                group=layout.process_group,
                async_op=True,
            )
            return PendingWork(what, [handle], None, [out, inp])
        # Torch rank s is team position inverse[s]: reorder the chunks both ways.
        torch_in = [in_splits[p] for p in layout.inverse]
        torch_out = [out_splits[p] for p in layout.inverse]
        chunks = inp.split(in_splits)
        src = torch.cat([chunks[p] for p in layout.inverse])
        landing = torch.empty_like(out)
        handle = dist.all_to_all_single(
            landing,
            src,
            output_split_sizes=torch_out,
            input_split_sizes=torch_in,
            group=layout.process_group,
            async_op=True,
        )

        def finish() -> None:
            targets = out.split(out_splits)
            for s, received in enumerate(landing.split(torch_out)):
                targets[layout.inverse[s]].copy_(received)

        return PendingWork(what, [handle], finish, [landing, src])

    def _permute(
        self, out: torch.Tensor, inp: torch.Tensor, group: Group, send_to: int, recv_from: int
    ) -> Work:
        # One batched send and receive with global ranks on the default group: posted
        # together so that every member's send meets its peer's receive (no ordering
        # deadlock around a ring).
        what = f"permute sending to rank {group[send_to]}, receiving from {group[recv_from]}"
        src = inp.contiguous()
        landing = _contiguous_like(out)
        ops = [
            dist.P2POp(dist.isend, src, group[send_to]),
            dist.P2POp(dist.irecv, landing, group[recv_from]),
        ]
        handles = dist.batch_isend_irecv(ops)
        return PendingWork(what, handles, _copy_back(landing, out), [src, landing])

    def _send_recv(
        self,
        out: torch.Tensor | None,
        inp: torch.Tensor | None,
        group: Group,
        sender: int,
        receiver: int,
    ) -> Work:
        # Point-to-point on the default group with global ranks: no sub-group
        # (and so no prepare) is needed.
        what = f"send_recv from rank {group[sender]} to rank {group[receiver]}"
        if self.rank == group[sender]:
            src = inp.contiguous()
            return PendingWork(what, [dist.isend(src, dst=group[receiver])], keep=[src])
        landing = _contiguous_like(out)
        handle = dist.irecv(landing, src=group[sender])
        return PendingWork(what, [handle], _copy_back(landing, out), [landing])


# -- Helpers -----------------------------------------------------------------------


def _contiguous_like(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself if contiguous, else an empty contiguous buffer of its shape."""
    if tensor.is_contiguous():
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)


def _copy_back(buf: torch.Tensor, target: torch.Tensor) -> Callable[[], None] | None:
    """A finisher copying ``buf`` into ``target`` when they differ (None when they are one)."""
    if buf is target:
        return None
    return lambda: target.copy_(buf)


def _digest_code(digest: str) -> int:
    """A signed 64-bit number standing for ``digest`` (any string, hex or not)."""
    raw = hashlib.sha256(digest.encode()).digest()[:8]
    return int.from_bytes(raw, "little", signed=True)


def _scratch_device() -> torch.device:
    """Where small tensors for the default group's backend live (nccl needs CUDA)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
