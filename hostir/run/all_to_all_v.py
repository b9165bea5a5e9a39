"""The evaluator handler of ``AllToAllV``: one alltoallv moving boxes between block layouts.

This rank's part of the pattern (which box it sends to whom, and receives from
whom) comes from :func:`hostir.analysis.member_exchanges.member_exchange`; this module
moves the data. The
point of the instruction is a redistribution whose temporaries stay below the
larger of the local input and output, so:

- the piece a rank keeps (source and destination itself) is never sent to
  another rank: it is copied locally, or, where that turns a packed buffer
  into a plain view (a kept row slab between two sent ones), passed through
  the alltoallv as the rank's chunk to itself, which the backend copies;
- the send buffer is a flat view of ``src`` when the pieces it sends, in
  destination order, are consecutive contiguous ranges of ``src``'s memory (row
  slabs, say); otherwise they are packed into the workspace, each copied once;
- the receive buffer is a flat view of ``out`` when there is no ``op`` and the
  pieces it receives, in source order, are consecutive contiguous ranges of
  ``out``; otherwise a flat part of the workspace, unpacked at ``wait``.

With ``rounds=k`` the exchange is k alltoallv calls
(``hostir.analysis.exchange_buffers.exchange_rounds``), each moving a slab of every
piece and waited for before the next. The calls share one workspace, allocated once and
sized for the round that needs the most (its send and receive buffers side by side:
``hostir.analysis.exchange_buffers.round_buffers`` counts exactly that). Buffers of
their own per round would briefly coexist: gloo's worker thread drops its reference to a
finished call after the caller's ``wait`` returns, so a round's buffers can outlive it
while the next round's are allocated (and the profiler records no free for them).

With an ``op``, each region of ``out`` is combined from its pieces in member
order of their sources (the first copied, the others combined), so every
replica of the result is bitwise identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hostir.analysis.boxes import Box, Operand, relative, volume
from hostir.analysis.exchange_buffers import exchange_rounds, keeps_through
from hostir.analysis.member_exchanges import Exchange, Piece, member_exchange
from hostir.errors import EvaluationError
from hostir.ir.communications import AllToAllV
from hostir.ir.scalars import evaluate_scalar
from hostir.ir.sharding import ReduceOp
from hostir.ir.values import TensorValue
from hostir.run.handler_common import Request, need, out_buffer

if TYPE_CHECKING:
    from hostir.run.context import RunContext


def run_all_to_all_v(context: RunContext, instruction: AllToAllV, operands: dict) -> list:
    """AllToAllV on this rank: the piece it keeps copied locally (or passed through the
    call), the others through one alltoallv of the group per round, every round's buffers
    in one workspace; ``out`` and its request."""
    src = need(operands["src"], instruction, "src", context)
    out = need(out_buffer(context, instruction, operands), instruction, "out", context)
    exchange = member_exchange(
        operand(context, instruction.src),
        operand(context, instruction.out),
        instruction.team,
        context.rank,
        instruction.op is not None,
    )
    _check_local(src, exchange.src_box, instruction.src, context)
    _check_local(out, exchange.out_box, instruction.out, context)
    op = instruction.op
    if not exchange.communicates:
        # No member of the group sends anything (every member knows it alike).
        kept = [
            (exchange.member, src[relative(p.box, exchange.src_box)], p.box) for p in exchange.sends
        ]
        _combine(out, exchange.out_box, kept, op)
        return [out, Request(None)]
    group = instruction.team.group_of(context.rank)
    calls = [
        _layout(exchange, (src, out), pieces, op)
        for pieces in exchange_rounds(exchange, instruction.rounds or 1)
    ]
    # One workspace for all rounds (see the module docstring): rounds run one after the
    # other, each waited for before the next packs into it.
    size = max(call.packing + call.receiving for call in calls)
    workspace = torch.empty(size, dtype=out.dtype, device=out.device)
    written: set[Box] = set()  # regions of out written so far, for combining partial sums
    request = Request(None)
    for call in calls:
        request.wait()
        request = _post(context, group, exchange, out, call, workspace, op, written)
    return [out, request]


@dataclass(frozen=True)
class _Call:
    """One alltoallv call of this rank (the whole exchange or one round), as views: what
    it sends and receives, where, and what it keeps without sending."""

    sends: list[Piece]
    receives: list[Piece]
    kept: list[tuple[int, torch.Tensor, Box]]
    """(member, view of src, box): the piece this rank keeps beside the call."""
    send_views: list[torch.Tensor]
    sent: torch.Tensor | None
    """A flat view of src holding the sends in order, or None: packed into the workspace."""
    receive_views: list[torch.Tensor]
    landing: torch.Tensor | None
    """A flat view of out the receives land in, or None: received into the workspace."""

    @property
    def packing(self) -> int:
        """Workspace elements the sends are packed into (0: sent from a view of src)."""
        return 0 if self.sent is not None else sum(v.numel() for v in self.send_views)

    @property
    def receiving(self) -> int:
        """Workspace elements the receives land in (0: straight into out)."""
        return 0 if self.landing is not None else sum(volume(p.box) for p in self.receives)


def _layout(
    exchange: Exchange,
    tensors: tuple[torch.Tensor, torch.Tensor],
    pieces: tuple[Sequence[Piece], Sequence[Piece]],
    op: ReduceOp | None,
) -> _Call:
    """The views of one call sending and receiving ``pieces``; nothing is copied yet.

    The piece this rank keeps goes through the call where that makes a buffer a plain
    view (``hostir.analysis.exchange_buffers.keeps_through``); otherwise it is kept beside
    the call."""
    (src_tensor, out_tensor), (all_sends, all_receives) = tensors, pieces
    src_box, out_box, me = exchange.src_box, exchange.out_box, exchange.member
    through = keeps_through(exchange, all_sends, all_receives, op is not None)
    kept = [
        (me, src_tensor[relative(p.box, src_box)], p.box)
        for p in all_receives
        if p.source == me and not through
    ]
    sends = [p for p in all_sends if through or p.destination != me]
    receives = [p for p in all_receives if through or p.source != me]
    send_views = [src_tensor[relative(p.box, src_box)] for p in sends]
    receive_views = [out_tensor[relative(p.box, out_box)] for p in receives]
    landing = _flat_run(out_tensor, receive_views) if op is None else None
    sent = _flat_run(src_tensor, send_views)
    return _Call(sends, receives, kept, send_views, sent, receive_views, landing)


def _post(
    context: RunContext,
    group: tuple[int, ...],
    exchange: Exchange,
    out_tensor: torch.Tensor,
    call: _Call,
    workspace: torch.Tensor,
    op: ReduceOp | None,
    written: set[Box],
) -> Request:
    """Posts one alltoallv (``call``), its packing and receive buffers in ``workspace``.

    Without an op the kept piece is copied now (out's regions are disjoint); with one it
    is combined at ``wait`` with the received ones, in source order (sends come in
    destination order and receives in source order)."""
    if op is None:
        _combine(out_tensor, exchange.out_box, call.kept, None)
    sent = call.sent
    if sent is None:
        sent = _pack(call.send_views, workspace[: call.packing])
    landing = call.landing
    if landing is None:
        landing = workspace[call.packing : call.packing + call.receiving]
    out_splits = _splits(exchange.group_size, call.receives, lambda p: p.source)
    in_splits = _splits(exchange.group_size, call.sends, lambda p: p.destination)
    work = context.communicator.all_to_all_v(landing, sent, out_splits, in_splits, group)

    def finish() -> None:
        received = _unflattened(landing, call.receives)
        if op is None:
            if call.landing is None:
                for view, data in zip(call.receive_views, received, strict=True):
                    view.copy_(data)
            return
        parts = [(p.source, data, p.box) for p, data in zip(call.receives, received, strict=True)]
        _combine(out_tensor, exchange.out_box, parts + call.kept, op, written)

    return Request(work, finish)


def operand(context: RunContext, value: TensorValue) -> Operand:
    """``value``'s name, sharding and global shape evaluated as the evaluator does."""
    if value.sharding is None:
        raise EvaluationError(
            f"AllToAllV: {value.name} has no sharding; AllToAllV moves blocks of values on a mesh"
        )
    shape = tuple(int(evaluate_scalar(e, context.scalars)) for e in value.shape)
    return Operand(value.name, value.sharding, shape)


def _check_local(tensor: torch.Tensor, box: Box, value: TensorValue, context: RunContext) -> None:
    """The block layout, the declared local shape and the bound tensor agree."""
    expected = [extent for _, extent in box]
    declared = context.local_shape(value)
    for what, shape in (("declared", list(declared)), ("bound", list(tensor.shape))):
        if shape != expected:
            raise EvaluationError(
                f"AllToAllV: the {what} local shape of {value.name} on rank {context.rank} is"
                f" {shape}, but its block of the global tensor has shape {expected}"
            )


def _splits(group_size: int, pieces: Sequence, member) -> list[int]:
    """Element counts per member in group order (0 for members without a piece)."""
    splits = [0] * group_size
    for piece in pieces:
        splits[member(piece)] += volume(piece.box)
    return splits


def _flat_run(base: torch.Tensor, views: list[torch.Tensor]) -> torch.Tensor | None:
    """A flat view of ``base``'s memory holding ``views`` one after the other, if each
    is a contiguous range starting where the previous one ends; else None."""
    if not views:
        return None
    start = position = views[0].storage_offset()
    for view in views:
        if not view.is_contiguous() or view.storage_offset() != position:
            return None
        position += view.numel()
    return base.as_strided((position - start,), (1,), start)


def _pack(views: list[torch.Tensor], flat: torch.Tensor) -> torch.Tensor:
    """``views`` flattened one after the other into ``flat`` (each copied straight into its
    place: ``reshape`` of a strided view would copy it once more); ``flat``."""
    offset = 0
    for view in views:
        flat[offset : offset + view.numel()].view(view.shape).copy_(view)
        offset += view.numel()
    return flat


def _unflattened(flat: torch.Tensor, pieces: list) -> list[torch.Tensor]:
    """The received pieces as views of ``flat``, each in its box's shape."""
    views, offset = [], 0
    for piece in pieces:
        size = volume(piece.box)
        views.append(flat[offset : offset + size].view([e for _, e in piece.box]))
        offset += size
    return views


def _combine(
    out: torch.Tensor, out_box: Box, parts: list, op: ReduceOp | None, written: set | None = None
) -> None:
    """Writes each ``(source, data, box)`` into ``out``, in source order: the first
    piece of a region is copied, the later ones (only with ``op``) combined with it;
    ``written``: the regions written so far (by earlier rounds)."""
    written = set() if written is None else written
    for _, data, box in sorted(parts, key=lambda part: part[0]):
        region = out[relative(box, out_box)]
        if box not in written:
            region.copy_(data)
            written.add(box)
        else:
            _COMBINE[op](region, data)


_COMBINE = {
    ReduceOp.SUM: lambda region, data: region.add_(data),
    ReduceOp.PROD: lambda region, data: region.mul_(data),
    ReduceOp.MAX: lambda region, data: torch.maximum(region, data, out=region),
    ReduceOp.MIN: lambda region, data: torch.minimum(region, data, out=region),
}
"""In-place combination of a region of ``out`` with a received piece, by op."""
