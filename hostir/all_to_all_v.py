"""The evaluator handler of ``AllToAllV``: one alltoallv moving boxes between block layouts.

This rank's part of the pattern (which box it sends to whom, and receives from
whom) comes from :func:`hostir.blocks.member_exchange`; this module moves the
data. The
point of the instruction is a redistribution whose temporaries stay below the
larger of the local input and output, so:

- the piece a rank keeps (source and destination itself) is never sent to
  another rank: it is copied locally, or, where that turns a packed buffer
  into a plain view (a kept row slab between two sent ones), passed through
  the alltoallv as the rank's chunk to itself, which the backend copies;
- the send buffer is a flat view of ``src`` when the pieces it sends, in
  destination order, are consecutive contiguous ranges of ``src``'s memory (row
  slabs, say); otherwise they are packed into one buffer, each copied once;
- the receive buffer is a flat view of ``out`` when there is no ``op`` and the
  pieces it receives, in source order, are consecutive contiguous ranges of
  ``out``; otherwise one flat temporary, unpacked at ``wait``.

With ``rounds=k`` the exchange is k alltoallv calls (``hostir.blocks.exchange_rounds``),
each moving a slab of every piece and waited for before the next, so one
round's buffers exist at a time.

With an ``op``, each region of ``out`` is combined from its pieces in member
order of their sources (the first copied, the others combined), so every
replica of the result is bitwise identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from hostir.blocks import (
    Box,
    Exchange,
    Operand,
    Piece,
    exchange_rounds,
    keeps_through,
    member_exchange,
    relative,
    volume,
)
from hostir.communications import AllToAllV
from hostir.errors import EvaluationError
from hostir.handler_common import Request, need, out_buffer
from hostir.scalars import evaluate_scalar
from hostir.sharding import ReduceOp
from hostir.values import TensorValue

if TYPE_CHECKING:
    from hostir.run_context import RunContext


def run_all_to_all_v(context: RunContext, instruction: AllToAllV, operands: dict) -> list:
    """AllToAllV on this rank: the piece it keeps copied locally (or passed through the
    call), the others through one alltoallv of the group per round; ``out`` and its
    request."""
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
    # Rounds each waited for before the next, so that one round's buffers exist at a time.
    written: set[Box] = set()  # regions of out written so far, for combining partial sums
    request = Request(None)
    for sends, receives in exchange_rounds(exchange, instruction.rounds or 1):
        request.wait()
        request = _call(context, group, exchange, (src, out), (sends, receives), op, written)
    return [out, request]


def _call(
    context: RunContext,
    group: tuple[int, ...],
    exchange: Exchange,
    tensors: tuple,
    pieces: tuple[Sequence[Piece], Sequence[Piece]],
    op: ReduceOp | None,
    written: set[Box],
) -> Request:
    """Posts one alltoallv sending and receiving ``pieces`` (the whole exchange or one
    round of it).

    The piece this rank keeps goes through the call where that makes a buffer a plain
    view (``hostir.blocks.keeps_through``); otherwise it is copied now (no op: out's
    regions are disjoint) or combined at ``wait`` with the received ones, in source order
    (sends come in destination order and receives in source order)."""
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
    if op is None:
        _combine(out_tensor, out_box, kept, None)
    send_views = [src_tensor[relative(p.box, src_box)] for p in sends]
    sent = _flat_run(src_tensor, send_views)
    if sent is None:
        sent = _packed(send_views, src_tensor)
    receive_views = [out_tensor[relative(p.box, out_box)] for p in receives]
    landing = _flat_run(out_tensor, receive_views) if op is None else None
    direct = landing is not None
    out_splits = _splits(exchange.group_size, receives, lambda p: p.source)
    if landing is None:
        landing = torch.empty(sum(out_splits), dtype=out_tensor.dtype, device=out_tensor.device)
    in_splits = _splits(exchange.group_size, sends, lambda p: p.destination)
    work = context.communicator.all_to_all_v(landing, sent, out_splits, in_splits, group)

    def finish() -> None:
        received = _unflattened(landing, receives)
        if op is None:
            if not direct:
                for view, data in zip(receive_views, received, strict=True):
                    view.copy_(data)
            return
        parts = [(p.source, data, p.box) for p, data in zip(receives, received, strict=True)]
        _combine(out_tensor, out_box, parts + kept, op, written)

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


def _packed(views: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``views`` flattened and concatenated into one new buffer (each copied straight into
    its place: ``reshape`` of a strided view would copy it once more), or an empty one."""
    total = sum(view.numel() for view in views)
    flat = torch.empty(total, dtype=like.dtype, device=like.device)
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
