"""Evaluator handlers for communication instructions.

Each handler packs this rank's local buffer so the communicated chunks are
outermost (the Communicator works on ``[team size, *chunk]`` buffers), posts the
communication, and returns ``out`` with a request whose ``wait`` also unpacks
into ``out``. ``out`` is None on ranks of the team that do not hold it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hostir.comm.rank_text import describe_group
from hostir.errors import EvaluationError
from hostir.ir.communications import (
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    Broadcast,
    CollectivePermute,
    Gather,
    LocalShard,
    RaggedAllToAll,
    Reduce,
    ReduceScatter,
    Scatter,
    SendRecv,
    Wait,
)
from hostir.ir.mesh_names import mesh_names
from hostir.ir.scalars import Const, Scalar, add, evaluate_scalar
from hostir.ir.team import print_team
from hostir.run.all_to_all_v import run_all_to_all_v
from hostir.run.handler_common import Request, landing, need, out_buffer
from hostir.run.ragged_exchange import run_ragged_all_to_all

if TYPE_CHECKING:
    from hostir.run.context import RunContext


def _split_dim(t: torch.Tensor, axis: int, inner: int | None, parts: int) -> torch.Tensor:
    """``[parts, *t.shape]`` with dim ``axis`` divided by ``parts``: dim ``axis`` viewed as
    ``[outer, parts, inner]``, the ``parts`` digit moved first (a copy when needed)."""
    size = t.shape[axis]
    inner = size // parts if inner is None else inner
    outer = size // (parts * inner)
    if outer * parts * inner != size:
        raise EvaluationError(
            f"dim {axis} of extent {size} does not split into {parts} chunks of {inner}"
        )
    view = t.reshape(*t.shape[:axis], outer, parts, inner, *t.shape[axis + 1 :])
    return view.movedim(axis + 1, 0).reshape(
        parts, *t.shape[:axis], outer * inner, *t.shape[axis + 1 :]
    )


def _merge_dim(chunks: torch.Tensor, axis: int, inner: int | None) -> torch.Tensor:
    """Inverse of :func:`_split_dim`: ``[parts, ..., d_axis, ...]`` to ``[..., d*parts, ...]``,
    with the parts digit placed above the last ``inner`` elements of dim ``axis``."""
    parts = chunks.shape[0]
    body = chunks.shape[1:]
    size = body[axis]
    inner = size if inner is None else inner
    outer = size // inner
    view = chunks.reshape(parts, *body[:axis], outer, inner, *body[axis + 1 :])
    moved = view.movedim(0, axis + 1)
    return moved.reshape(*body[:axis], outer * parts * inner, *body[axis + 1 :])


def _chunk_places(t: torch.Tensor, axis: int, parts: int) -> torch.Tensor | None:
    """A view of ``t`` as ``[parts, ..., outer, inner, ...]`` where chunk q of
    :func:`_merge_dim` (``inner`` None) lands: dim ``axis`` viewed as ``[parts, inner]``,
    the parts digit moved first; None if ``t``'s strides do not allow a view."""
    size = t.shape[axis]
    try:
        view = t.view(*t.shape[:axis], parts, size // parts, *t.shape[axis + 1 :])
    except RuntimeError:
        return None
    return view.movedim(axis, 0).unsqueeze(axis + 1)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same buffer."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _inner(context: RunContext, instruction: Any) -> int | None:
    inner = instruction.inner
    return None if inner is None else int(evaluate_scalar(inner, context.scalars))


def _group(context: RunContext, instruction: Any) -> tuple[int, ...]:
    return instruction.team.group_of(context.rank)


def _root(context: RunContext, instruction: Any, operands: dict, group: tuple[int, ...]) -> int:
    """The root's position, checked to be one of ``group``'s (the verifier checks a constant
    one; an expression, such as a stream loop's ``root=j``, is checked here)."""
    root = int(operands["root"])
    if not 0 <= root < len(group):
        team = print_team(instruction.team, mesh_names(context.program).name)
        raise EvaluationError(
            f"{type(instruction).__name__} of {instruction.src.name}: root {root} is not"
            f" a member of team {team} on rank {context.rank} (its group {describe_group(group)}"
            f" has {len(group)} member(s)); expected a position from 0 to {len(group) - 1}"
        )
    return root


def run_allgather(context: RunContext, instruction: Allgather, operands: dict) -> list:
    """Allgather: every member's chunk lands straight in its place in ``out`` (a strided
    view of ``out`` when the gathered dim is not outermost: no staging buffer of ours)."""
    group = _group(context, instruction)
    src = need(operands["src"], instruction, "src", context).contiguous()
    out = out_buffer(context, instruction, operands)
    inner = _inner(context, instruction)
    blocks = instruction.axis == 0 and inner in (None, src.shape[0] if src.ndim else None)
    if blocks and out is not None and out.is_contiguous():
        chunks = out.view(len(group), *src.shape)
        return [out, Request(context.communicator.allgather(chunks, src, group))]
    if out is not None:
        chunks = _chunk_views(out, instruction.axis, inner, len(group))
        if chunks is not None:
            chunk_shape = chunks.shape[1:]
            work = context.communicator.allgather(chunks, src.reshape(chunk_shape), group)
            return [out, Request(work)]
    buffer = torch.empty((len(group), *src.shape), dtype=src.dtype, device=src.device)
    work = context.communicator.allgather(buffer, src, group)

    def finish() -> None:
        if out is not None:
            out.copy_(_merge_dim(buffer, instruction.axis, inner))

    return [out, Request(work, finish)]


def _chunk_views(
    out: torch.Tensor, axis: int, inner: int | None, parts: int
) -> torch.Tensor | None:
    """``out`` as ``[parts, ..., outer, inner, ...]``: chunk ``p`` is the elements of dim
    ``axis`` whose parts digit is ``p`` (a strided view), or None if ``out``'s strides do
    not allow one."""
    size = out.shape[axis]
    inner = size // parts if inner is None else inner
    outer = size // (parts * inner)
    split = (*out.shape[:axis], outer, parts, inner, *out.shape[axis + 1 :])
    try:
        return out.view(split).movedim(axis + 1, 0)
    except RuntimeError:
        return None


def run_reduce_scatter(context: RunContext, instruction: ReduceScatter, operands: dict) -> list:
    """ReduceScatter: the chunks along ``axis`` are reduced and scattered, straight into
    ``out`` when it is contiguous. Chunks that are not one contiguous block (a dim other
    than the outermost) are packed first: gloo runs the list form as one all-reduce per
    chunk, the packed form as one call (what DTensor hands it)."""
    group = _group(context, instruction)
    src = need(operands["src"], instruction, "src", context)
    inner = _inner(context, instruction)
    packed = _split_dim(src, instruction.axis, inner, len(group)).contiguous()
    out = out_buffer(context, instruction, operands)
    chunk = packed.shape[1:]
    if out is not None and out.is_contiguous():  # reduce straight into out
        result = out.view(chunk)
        return [
            out,
            Request(context.communicator.reduce_scatter(result, packed, group, instruction.op)),
        ]
    result = torch.empty(chunk, dtype=src.dtype, device=src.device)
    work = context.communicator.reduce_scatter(result, packed, group, instruction.op)

    def finish() -> None:
        if out is not None:
            out.copy_(result.reshape(out.shape))

    return [out, Request(work, finish)]


def run_allreduce(context: RunContext, instruction: Allreduce, operands: dict) -> list:
    """Allreduce in place on ``out`` (one copy of ``src``; none more when ``out`` is
    contiguous)."""
    group = _group(context, instruction)
    src = need(operands["src"], instruction, "src", context)
    out = operands.get("out") if instruction.preallocated else None
    if out is not None and out.is_contiguous():
        if not _same_memory(out, src):  # partial sums written into out's buffer already
            out.copy_(src)
        return [out, Request(context.communicator.allreduce(out, group, instruction.op))]
    buffer = src.clone(memory_format=torch.contiguous_format)
    work = context.communicator.allreduce(buffer, group, instruction.op)
    if out is not None:
        return [out, Request(work, lambda: out.copy_(buffer))]
    held = buffer if context.participates(instruction.out) else None
    return [held, Request(work)]


def run_broadcast(context: RunContext, instruction: Broadcast, operands: dict) -> list:
    """Broadcast from the root's ``src``, received into ``out`` (see
    :func:`~hostir.run.handler_common.landing`); the root's own ``out`` is a copy of its
    ``src``."""
    group = _group(context, instruction)
    root = _root(context, instruction, operands, group)
    out = out_buffer(context, instruction, operands)
    if group[root] == context.rank:
        src = need(operands["src"], instruction, "src", context)
        if out is not None:
            out.copy_(src)
        # The root only sends: its own buffer is never written by the broadcast.
        sent = out if out is not None and out.is_contiguous() else src.contiguous()
        return [out, Request(context.communicator.broadcast(sent, group, root))]
    work = context.communicator.broadcast(landing(context, instruction, out), group, root)
    return [out, Request(work)]


def run_reduce(context: RunContext, instruction: Reduce, operands: dict) -> list:
    """Reduce to the root."""
    group = _group(context, instruction)
    root = _root(context, instruction, operands, group)
    src = need(operands["src"], instruction, "src", context)
    buffer = src.clone(memory_format=torch.contiguous_format)
    work = context.communicator.reduce(buffer, group, root, instruction.op)
    out = out_buffer(context, instruction, operands)
    return [out, Request(work, (lambda: out.copy_(buffer)) if out is not None else None)]


def run_gather(context: RunContext, instruction: Gather, operands: dict) -> list:
    """Gather to the root, which unpacks along ``axis`` (along dim 0 of a contiguous
    ``out`` the members' chunks are its blocks: received in place)."""
    group = _group(context, instruction)
    root = _root(context, instruction, operands, group)
    src = need(operands["src"], instruction, "src", context).contiguous()
    is_root = group[root] == context.rank
    out = out_buffer(context, instruction, operands)
    in_place = is_root and instruction.axis == 0 and out is not None and out.is_contiguous()
    buffer = None
    if in_place:
        buffer = out.view(len(group), *src.shape)
    elif is_root:
        buffer = torch.empty((len(group), *src.shape), dtype=src.dtype, device=src.device)
    work = context.communicator.gather(buffer, src, group, root)

    def finish() -> None:
        if out is not None and buffer is not None and not in_place:
            out.copy_(_merge_dim(buffer, instruction.axis, None))

    return [out, Request(work, finish)]


def run_scatter(context: RunContext, instruction: Scatter, operands: dict) -> list:
    """Scatter from the root, which packs its ``src`` along ``axis``; a member's chunk is
    received into ``out`` (see :func:`~hostir.run.handler_common.landing`)."""
    group = _group(context, instruction)
    root = _root(context, instruction, operands, group)
    is_root = group[root] == context.rank
    packed = None
    if is_root:
        src = need(operands["src"], instruction, "src", context)
        packed = _split_dim(src, instruction.axis, None, len(group)).contiguous()
    out = out_buffer(context, instruction, operands)
    work = context.communicator.scatter(landing(context, instruction, out), packed, group, root)
    return [out, Request(work)]


def run_all_to_all(context: RunContext, instruction: AllToAll, operands: dict) -> list:
    """AllToAll: chunks along ``split_axis`` go out, received chunks concatenate
    along ``concat_axis`` in member order."""
    group = _group(context, instruction)
    src = need(operands["src"], instruction, "src", context)
    packed = _split_dim(src, instruction.split_axis, None, len(group)).contiguous()
    out = out_buffer(context, instruction, operands)
    if instruction.concat_axis == 0 and out is not None and out.is_contiguous():
        # Member q's chunk is out's q-th block of rows: receive in place.
        received = out.view(packed.shape)
        return [out, Request(context.communicator.all_to_all(received, packed, group))]
    received = torch.empty_like(packed)
    work = context.communicator.all_to_all(received, packed, group)

    def finish() -> None:
        if out is not None:
            # Each member's chunk is copied straight into its strided place in out (no
            # merged copy beside received: the plan's memory model counts received only).
            places = _chunk_places(out, instruction.concat_axis, len(group))
            if places is None:
                out.copy_(_merge_dim(received, instruction.concat_axis, None))
            else:
                places.copy_(received.view(places.shape))

    return [out, Request(work, finish)]


def run_send_recv(context: RunContext, instruction: SendRecv, operands: dict) -> list:
    """Point-to-point: the sender's ``src`` lands in the receiver's ``out``."""
    group = _group(context, instruction)
    sender, receiver = int(operands["sender"]), int(operands["receiver"])
    position = group.index(context.rank)
    src = need(operands["src"], instruction, "src", context) if position == sender else None
    out = out_buffer(context, instruction, operands)
    if position not in (sender, receiver):
        return [out, Request(None)]
    received = landing(context, instruction, out) if position == receiver else None
    work = context.communicator.send_recv(received, src, group, sender, receiver)
    return [out, Request(work)]


def run_collective_permute(
    context: RunContext, instruction: CollectivePermute, operands: dict
) -> list:
    """Send ``src`` to one peer while receiving ``out`` from another."""
    group = _group(context, instruction)
    src = need(operands["src"], instruction, "src", context)
    out = out_buffer(context, instruction, operands)
    send_to, recv_from = int(operands["send_peer"]), int(operands["recv_peer"])
    work = context.communicator.permute(out, src, group, send_to, recv_from)
    return [out, Request(work)]


def run_wait(context: RunContext, instruction: Wait, operands: dict) -> list:
    """Completes the request (a no-op on ranks that skipped the communication)."""
    request = operands["request"]
    if request is not None:
        request.wait()
    return []


def run_local_shard(context: RunContext, instruction: LocalShard, operands: dict) -> list:
    """This rank's chunk of ``src`` along ``axis`` (a copy; no communication)."""
    src = operands["src"]
    mesh = instruction.out.sharding.mesh
    size = mesh.axis_size(instruction.mesh_axis)
    coordinate = mesh.coordinate(context.rank, instruction.mesh_axis)
    chunks = _split_dim(src, instruction.axis, _inner(context, instruction), size)
    piece = chunks[coordinate].reshape(context.local_shape(instruction.out))
    if instruction.preallocated:
        operands["out"].copy_(piece)
        return []
    return [piece.contiguous()]


# AllToAllV's handler lives in its own module, which builds on the helpers above; so does
# RaggedAllToAll's (hostir.run.ragged_exchange).

COMMUNICATION_HANDLERS: dict[type, Callable[..., list]] = {
    Allgather: run_allgather,
    ReduceScatter: run_reduce_scatter,
    Allreduce: run_allreduce,
    Broadcast: run_broadcast,
    Reduce: run_reduce,
    Gather: run_gather,
    Scatter: run_scatter,
    AllToAll: run_all_to_all,
    AllToAllV: run_all_to_all_v,
    RaggedAllToAll: run_ragged_all_to_all,
    SendRecv: run_send_recv,
    CollectivePermute: run_collective_permute,
    Wait: run_wait,
    LocalShard: run_local_shard,
}
"""One handler per communication instruction (LocalShard included: it reshards)."""


def handler_buffers(
    instruction: Any, src: Scalar, out: Scalar, src_contiguous: bool, out_contiguous: bool
) -> Scalar:
    """Elements of the packing and receive buffers the handler above allocates for
    ``instruction`` besides its operands, given the local elements of ``src`` and ``out``
    and whether each buffer is contiguous (the planner's memory model reads this; an
    AllToAllV's buffers are ``hostir.analysis.exchange_buffers.round_buffers``)."""
    zero = Const(value=0)
    landing = zero if out_contiguous else out  # chunks land in views of out, else a copy
    if isinstance(instruction, Allgather):
        # The backend sends from a contiguous input: a strided one is copied first.
        return add(zero if src_contiguous else src, landing)
    if isinstance(instruction, ReduceScatter):
        return add(zero if _chunks_are_blocks(instruction, src_contiguous) else src, landing)
    if isinstance(instruction, Allreduce):
        return landing
    if isinstance(instruction, AllToAll):
        packing = zero if instruction.split_axis == 0 else src
        return add(packing, landing if instruction.concat_axis == 0 else out)
    if isinstance(instruction, Scatter):  # the root packs its chunks unless they are blocks
        return add(zero if src_contiguous and instruction.axis == 0 else src, landing)
    if isinstance(instruction, Gather):  # the root's chunks land in out's blocks, or a buffer
        return landing if instruction.axis == 0 else out
    if isinstance(instruction, Reduce):
        return src
    if isinstance(instruction, Broadcast | SendRecv):  # the sender sends a contiguous src
        return add(zero if src_contiguous else src, landing)
    return zero  # a permute sends and receives in place; local slices are views


def _chunks_are_blocks(instruction: ReduceScatter, src_contiguous: bool) -> bool:
    """Whether a ReduceScatter's chunks are consecutive blocks of a contiguous ``src``, so
    the handler packs no copy: chunks of the outermost dim in their natural order."""
    return src_contiguous and instruction.axis == 0 and instruction.inner is None


def gloo_staging(instruction: Any, src: Scalar, out: Scalar) -> Scalar:
    """Elements gloo stages inside the backend call ``instruction``'s handler makes (not
    the handler's own buffers): its all-gather gathers into a flat buffer of the whole
    output, its reduce-scatter all-reduces a copy of the whole input; NCCL needs neither."""
    if isinstance(instruction, Allgather):
        return out
    if isinstance(instruction, ReduceScatter):
        return src
    return Const(value=0)
