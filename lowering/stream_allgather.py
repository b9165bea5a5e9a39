"""A stream loop's Allgather taken apart: a set reading a tensor whole into stream chunks.

Where the planner reshards the whole input into the whole output with one Allgather of
the loop's dim in blocks, iteration ``j`` receives the block of one team member: a
Broadcast from the chunk it handles, or, swizzled, a CollectivePermute (receive from
``(r + j) % D``, send to ``(r - j) % D``). Any other plan is refused.
"""

from __future__ import annotations

import dataclasses

from hostir import (
    Allgather,
    Allocate,
    Broadcast,
    CollectivePermute,
    Const,
    MeshCoordinate,
    RequestValue,
    Set,
    ShardByStream,
    TensorValue,
    Wait,
)
from hostir.ir.instructions import Instruction
from hostir.ir.scalars import add, floordiv, mod, mul, sub
from hostir.ir.team import Team
from lowering.emitter import bind_values
from lowering.errors import LoweringError
from lowering.redistribution.plan_resharding import plan_resharding
from lowering.snapshot import LoweringOp
from lowering.stream_checks import check_allgather, print_parts
from lowering.stream_chunks import LoopChunks
from lowering.stream_splits import StreamSplit, chunk_value
from lowering.swizzle_teams import check_swizzled_communication


def stream_allgather(
    loop: LoopChunks, op: LoweringOp, values: dict[str, TensorValue], preallocated: bool
) -> list[Instruction]:
    """A set that reads its input whole into stream chunks. The planner reshards the
    whole input into the whole output; when its plan is one Allgather of the loop's
    dim in blocks, with one team member per chunk, the loop takes that Allgather apart
    by sender: iteration ``j`` receives the block of team position ``j`` (a Broadcast
    from ``j``), or, swizzled, of position ``(p + j) % count`` (a CollectivePermute).
    Any other plan cannot be cut into chunks here: a LoweringError names it."""
    (name,) = op.inputs
    src, dst = loop.emitter.values[name], loop.emitter.values[op.output]
    split = loop.split_of(op.output)
    steps = plan_resharding(src, dst).steps if src.sharding.mesh == dst.sharding.mesh else ()
    step = steps[0] if len(steps) == 1 else None
    gathers_dim = step is not None and step.kind is Allgather and step.get("axis") == split.dim
    if not gathers_dim or step.get("inner") is not None:  # inner: not in blocks
        planned = ", ".join(s.name for s in steps) or "steps between two meshes"
        raise LoweringError(
            f"{dst.name} is split into {split.count} stream chunks on dim {split.dim} and"
            f" reads {name} whole; a stream loop takes apart one Allgather of that dim"
            f" in blocks, but the planner reshards {name} into {dst.name} (dim"
            f" {split.dim}: {print_parts(src.sharding.dims[split.dim])} to"
            f" {print_parts(dst.sharding.dims[split.dim])}) with {planned}; reshard it"
            " with a set before the loop"
        )
    team = step.team
    check_allgather(name, op.output, team, split)
    instruction = bind_values(op.instruction, values)
    if split.swizzle is None and split.count != team.size:
        return _local_on_one_device(
            _blocks_of_several_chunks(loop, instruction, team, split, preallocated), team
        )
    request = RequestValue(name=f"R{next(loop.emitter.requests)}")
    common = {
        "out": instruction.out,
        "src": instruction.src,
        "team": team,
        "request": request,
        "preallocated": preallocated,
    }
    if split.swizzle is None:
        # The root holds the chunk this iteration writes: chunk j, or in a loop that
        # another tensor swizzles, (j + coordinate) % count, the same on the team's
        # members unless the team spans the swizzled axis (then refused).
        comm = Broadcast(**common, root=loop.chunk)
        if loop.swizzle is not None:
            check_swizzled_communication(op, [comm], loop.swizzle, loop.swizzled, loop.count)
    else:
        me = MeshCoordinate(mesh=team.mesh, axis=split.swizzle)
        comm = CollectivePermute(
            **common,
            send_peer=mod(sub(me, loop.index), loop.count),
            recv_peer=mod(add(me, loop.index), loop.count),
        )
    return _local_on_one_device([comm, Wait(request=request)], team)


def _blocks_of_several_chunks(
    loop: LoopChunks, instruction: Set, team: Team, split: StreamSplit, preallocated: bool
) -> list[Instruction]:
    """The Allgather taken apart into ``split.count`` chunks over a team of another size
    (unswizzled): with ``m`` chunks per member's block, iteration ``j`` receives chunk
    ``j % m`` of member ``j // m``'s block (a Broadcast of that slice of its shard); with
    ``n`` members' blocks per chunk, it receives ``n`` whole blocks, one Broadcast from
    member ``j n + t`` into piece ``t`` of the chunk (allocated in the iteration unless it
    is a buffer's chunk already)."""
    src, out, dim = instruction.src, instruction.out, split.dim
    emitted: list[Instruction] = []
    comms: list[Instruction] = []
    if split.count % team.size == 0:
        per_block = split.count // team.size
        part = StreamSplit(dim=dim, count=per_block, swizzle=None, mesh=split.mesh)
        piece = chunk_value(src, part)
        piece = dataclasses.replace(piece, name=loop.fresh_chunk_name(src.name))
        index = mod(loop.chunk, per_block)
        emitted.append(ShardByStream(out=piece, src=src, axis=dim, index=index))
        sends = [(piece, out, floordiv(loop.chunk, per_block))]
    else:
        blocks = team.size // split.count
        if not preallocated:
            emitted.append(Allocate(out=out))
        part = StreamSplit(dim=dim, count=blocks, swizzle=None, mesh=split.mesh)
        sends = []
        for t in range(blocks):
            piece = chunk_value(out, part)
            piece = dataclasses.replace(piece, name=loop.fresh_chunk_name(out.name))
            emitted.append(ShardByStream(out=piece, src=out, axis=dim, index=Const(value=t)))
            sends.append((src, piece, add(mul(loop.chunk, blocks), t)))
    for source, target, root in sends:
        request = RequestValue(name=f"R{next(loop.emitter.requests)}")
        comms.append(
            Broadcast(
                out=target,
                src=source,
                team=team,
                root=root,
                request=request,
                preallocated=preallocated or len(sends) > 1,
            )
        )
    waits = [Wait(request=comm.request) for comm in comms]
    return emitted + comms + waits


def _local_on_one_device(instructions: list[Instruction], team: Team) -> list[Instruction]:
    """``instructions`` with each Broadcast or CollectivePermute a copy (and no wait) when
    ``team`` has one device: the device already holds every chunk, so no collective is
    issued (as ``emit_resharding`` copies for a plan's step on a one-device team)."""
    if team.size != 1:
        return instructions
    local: list[Instruction] = []
    for instruction in instructions:
        if isinstance(instruction, Broadcast | CollectivePermute):
            local.append(
                Set(out=instruction.out, src=instruction.src, preallocated=instruction.preallocated)
            )
        elif not isinstance(instruction, Wait):
            local.append(instruction)
    return local
