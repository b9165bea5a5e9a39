"""A stream loop's Allgather taken apart: a set reading a tensor whole into stream chunks.

Where the planner reshards the whole input into the whole output with one Allgather of
the loop's dim in blocks, iteration ``j`` receives the block of one team member: a
Broadcast from the chunk it handles, or, swizzled, a CollectivePermute (receive from
``(r + j) % D``, send to ``(r - j) % D``). Any other plan is refused.
"""

from __future__ import annotations

from hostir import (
    Allgather,
    Broadcast,
    CollectivePermute,
    MeshCoordinate,
    RequestValue,
    TensorValue,
    Wait,
)
from hostir.ir.instructions import Instruction
from hostir.ir.scalars import add, mod, sub
from lowering.emitter import bind_values
from lowering.errors import LoweringError
from lowering.redistribution.plan_resharding import plan_resharding
from lowering.snapshot import LoweringOp
from lowering.stream_checks import check_allgather, print_parts
from lowering.stream_chunks import LoopChunks
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
    return [comm, Wait(request=request)]
