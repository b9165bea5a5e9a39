"""Stream-loop refusals: the checks a stream loop makes, each a LoweringError naming why.

A tensor's chunks must split its per-device indices evenly; an input read chunk by chunk
must have chunks holding the same indices as the output's; a tensor read as two
operands in different roles cannot be chunked for both; an Allgather a loop takes apart
needs one team member per chunk (and, swizzled, the swizzled mesh axis as its team).
"""

from __future__ import annotations

from hostir import Const, Set, ShardPart, TensorValue
from hostir.ir.opdecl import op_decl
from hostir.ir.scalars import print_scalar
from hostir.ir.team import Team
from lowering.errors import LoweringError
from lowering.snapshot import LoweringOp, LoweringTensor
from lowering.stream_splits import StreamSplit, chunks_alike


def check_chunks_divide(name: str, whole: TensorValue, split: StreamSplit) -> None:
    """Refuses chunks of ``name`` (``whole``) whose split dim holds a number of indices
    per device that ``split``'s chunk count does not divide."""
    if whole.sharding is not None:
        parts = whole.sharding.dims[split.dim]
        local = [p.extent for p in parts if p.axis is None]
        count = 1
        for extent in local:
            count *= extent.value if isinstance(extent, Const) else 0
        if all(isinstance(e, Const) for e in local) and count % split.count:
            raise LoweringError(
                f"{name} dim {split.dim} holds {count} index(es) per device"
                f" ({print_parts(parts)}), which do not split into {split.count} stream"
                " chunks; use fewer chunks or shard that dim over fewer devices"
            )


def check_same_chunks(op: LoweringOp, name: str, producer, output, stream_axis: int) -> None:
    """An input with its own stream split is read chunk by chunk only where its chunk
    ``j`` holds the same indices as the output's: its split dim maps to the output's
    and both are laid out over the same mesh axes. (A stream split inside a sharded
    dim, ``[x, stream, 1]``, holds rows ``{2 d + j}``, an unsharded dim's chunk ``j``
    a block of rows: mixing them computed wrong numbers, fuzzer seed 53.)"""
    for o, i in dict(op.axis_maps).get(name, ()):
        if producer.axes[i].stream is None and o != stream_axis:
            continue
        mine, theirs = producer.axes[i].layout(), output.axes[o].layout()
        sizes = (_axis_sizes(producer, mine), _axis_sizes(output, theirs))
        alike = chunks_alike(isinstance(op.instruction, Set), producer, i, output, o)
        if o == stream_axis and alike and (mine != theirs or sizes[0] == sizes[1]):
            return
        if o == stream_axis and mine == theirs:  # one layout over meshes of other sizes
            raise LoweringError(
                f"{name} is split into stream chunks on an axis laid out"
                f" {layout_text(mine)} over mesh axes of sizes {sizes[0]}, but"
                f" {output.name}'s loop chunks it over sizes {sizes[1]}: their chunk j"
                " holds different indices (fuzz seed 830156); give both the same mesh"
                f" and stream splits, or reshard {name} with a set before the loop"
            )
        raise LoweringError(
            f"{name} is split into stream chunks on an axis laid out"
            f" {layout_text(mine)}, but {output.name}'s loop chunks an axis laid out"
            f" {layout_text(theirs) if o == stream_axis else 'differently'}: their chunk j"
            f" holds different indices; give both the same mesh and stream splits, or"
            f" reshard {name} with a set before the loop"
        )


def check_allgather(src: str, dst: str, team: Team, split: StreamSplit) -> None:
    """An Allgather of ``src`` into ``dst`` a loop takes apart: one member of ``team`` per
    chunk and, swizzled, the swizzled mesh axis as its team."""
    axes = "mesh axis " + " and ".join(a.value for a in team.axes)
    if split.swizzle is not None and team.size != split.count:
        raise LoweringError(
            f"{dst} gathers {src} over {split.count} stream chunks swizzled over"
            f" mesh_{split.swizzle.value}, but {src} is sharded over {team.size} devices of"
            f" {axes}; a swizzled loop receives one device's block per iteration, so they"
            " must match (without swizzle1d any multiple or divisor of it is taken)"
        )
    if split.count % team.size and team.size % split.count:
        raise LoweringError(
            f"{dst} gathers {src} over {split.count} stream chunks, but {src} is sharded"
            f" over {team.size} devices of {axes}; each chunk must be a whole number of"
            " devices' blocks or each block a whole number of chunks (a multiple or a"
            " divisor of it)"
        )
    if split.swizzle is not None and (split.swizzle,) != team.axes:
        raise LoweringError(
            f"{dst} is swizzled over mesh_{split.swizzle.value}, but {src} is sharded over"
            f" {' and '.join(f'mesh_{a.value}' for a in team.axes)}; swizzle1d must name"
            " the producer's mesh axis"
        )


def check_repeated_operands(op: LoweringOp) -> None:
    """A tensor read as two operands in different roles (``linear(t0, t0)``: rows of the
    input, rows of the weight) cannot be read by one chunking in both: chunked (or not)
    for one role, it is read wrongly in the other (fuzz seeds 430076 and 300376 at 8
    ranks). Only an elementwise op's operands play one role (its declaration says it,
    ``OpSharding.elementwise``)."""
    decl = op_decl(op.instruction)
    if decl is not None and decl.sharding.elementwise:
        return
    for name in dict.fromkeys(op.inputs):
        if op.inputs.count(name) > 1:
            raise LoweringError(
                f"{name} is read as {op.inputs.count(name)} operands of the op defining"
                f" {op.output} in a stream loop: each operand needs its own chunks of {name};"
                f" pass a copy for one of them (fd.ops.set({name}))"
            )


def _axis_sizes(tensor: LoweringTensor, layout: tuple) -> tuple:
    """The size of each mesh axis of ``layout`` on ``tensor``'s mesh (chunk ``j`` of one
    layout holds the same indices on two meshes only where these agree)."""
    if tensor.mesh is None:
        return ()
    return tuple(tensor.mesh.axis_size(a) for a in layout if a is not None)


def layout_text(axes: tuple) -> str:
    """An axis layout as messages show it: ``[x, local]``."""
    return "[" + ", ".join(a.value if a is not None else "local" for a in axes) + "]"


def print_parts(parts: tuple[ShardPart, ...]) -> str:
    """A dim's parts as the messages show them: ``[x, 4]``."""
    return "[" + ", ".join(p.axis.value if p.axis else print_scalar(p.extent) for p in parts) + "]"
