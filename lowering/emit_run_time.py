"""Emitting ``ragged_all_to_all`` (the frontend's exchange by run-time counts): the counts
read to the host, one ``RaggedAllToAll`` over the mesh axis of dim 0, and its wait
(docs/run_time_extents.md).

Sharding propagation and ``decompose_resharding`` have laid the op out already: its source
and result split dim 0 over one mesh axis (a member's rows per device), its counts whole
on every device of the mesh (an Allgather before it where each device computed its own
row). What is left is the host read and the exchange.
"""

from __future__ import annotations

from collections.abc import Iterator

from hostir import RaggedAllToAll, RequestValue, Symbol, Team, TensorValue, Wait
from hostir.ir.host_reads import RaggedExchange, ToHost
from hostir.ir.instructions import Instruction
from hostir.ir.values import HostValue
from lowering.errors import LoweringError


def emit_ragged_exchange(
    instruction: RaggedExchange,
    requests: Iterator[int],
    host_reads: dict[str, HostValue],
    bound: set[str],
) -> list[Instruction]:
    """``H = to_host(counts)`` (once per counts tensor: ``host_reads`` holds the reads made,
    so the way back reuses the way out's), the RaggedAllToAll of ``src`` into ``out`` along
    dim 1 over dim 0's mesh axis, and its wait. ``bound``: the symbols bound before it
    (the inputs' and those earlier exchanges bound); a symbol of its rows not among them
    is a run-time extent it binds."""
    src, out, counts = instruction.src, instruction.out, instruction.counts
    team = _team(out)
    for value in (counts,):
        sharding = value.sharding
        if sharding is None or any(p.axis is not None for ps in sharding.dims for p in ps):
            raise LoweringError(
                f"ragged_all_to_all defining {out.name}: its counts {value.name} must be whole"
                " on every device of the mesh (every member checks every count)"
            )
    host = host_reads.get(counts.name)
    read: list[Instruction] = []
    if host is None:
        host = host_reads[counts.name] = HostValue(name=f"H{len(host_reads)}")
        read.append(ToHost(out=host, src=counts))
    rows = out.shape[1]
    # The first exchange of a run-time extent binds it; a later one by the same counts (a
    # second tensor, or the way back) fills a buffer of that extent and binds its own name.
    fresh = isinstance(rows, Symbol) and rows.name not in bound
    received = rows if fresh else None
    if fresh:
        bound.add(rows.name)
    request = RequestValue(name=f"R{next(requests)}")
    exchange = RaggedAllToAll(
        received=received or Symbol(name=f"{out.name}_rows"),
        out=out,
        src=src,
        team=team,
        counts=host,
        transpose=instruction.transpose,
        axis=1,
        request=request,
    )
    return [*read, exchange, Wait(request=request)]


def _team(out: TensorValue) -> Team:
    """The team of dim 0's mesh axis: its only one, of as many devices as dim 0 has."""
    sharding = out.sharding
    axes = [] if sharding is None else [p.axis for p in sharding.dims[0] if p.axis is not None]
    if sharding is None or len(axes) != 1 or sharding.mesh.ndim != 1:
        where = "on no mesh" if sharding is None else f"split over {len(axes)} mesh axes"
        raise LoweringError(
            f"ragged_all_to_all defining {out.name}: its dim 0 is {where}; expected dim 0"
            " (one member's rows per device) split over the one axis of a 1-d mesh: schedule"
            " its src so (outer_split(0, D), parallelize on mesh_x), or compute src from a"
            " tensor that is"
        )
    return Team(mesh=sharding.mesh, axes=(axes[0],))
