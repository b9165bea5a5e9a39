"""Stream splits: how a tensor is split into stream chunks, and the value of one chunk.

A tensor's data dim whose axis has a ``stream`` count is split into that many chunks
(swizzled, or not, over a mesh axis); :func:`chunk_value` is the value one iteration of a
stream loop (``lowering/stream_loops.py``) reads or writes of it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hostir import Mesh, MeshAxis, ShardPart, TensorValue
from hostir.ir.scalars import floordiv
from hostir.ir.sharding import normalized
from lowering.snapshot import LoweringTensor


@dataclass(frozen=True, kw_only=True)
class StreamSplit:
    """How a tensor is split into stream chunks: data dim, chunk count, swizzle."""

    dim: int
    count: int
    swizzle: MeshAxis | None
    mesh: Mesh | None
    blocks: int = 1  # AxisLayout.stream_blocks: chunk j of each of that many blocks


def stream_split(tensor: LoweringTensor) -> StreamSplit | None:
    """The stream split of ``tensor``, if one of its data dims has one."""
    data = [axis for axis in tensor.axes if not axis.reduction]
    for dim, axis in enumerate(data):
        if axis.stream is not None:
            return StreamSplit(
                dim=dim,
                count=axis.stream,
                swizzle=axis.swizzle,
                mesh=tensor.mesh,
                blocks=axis.stream_blocks,
            )
    return None


def chunk_blocks(tensor: LoweringTensor, index: int) -> int:
    """Into how many blocks chunk ``j`` of ``tensor``'s stream axis ``index`` falls,
    globally: the sizes of the mesh axes sharding it times its ``stream_blocks``. Two
    axes whose chunks hold the same global indices have the same count (``[x, 8]`` over 2
    devices, chunked: each rank's chunk ``j``; ``[16]`` in 2 blocks: the same rows,
    joined), so a ``set`` between them is planned chunk by chunk."""
    axis = tensor.axes[index]
    sizes = [tensor.mesh.axis_size(a) for a in axis.mesh_axes()] if tensor.mesh else []
    return math.prod(sizes) * axis.stream_blocks


def chunks_alike(
    op_is_set: bool, producer: LoweringTensor, i: int, output: LoweringTensor, o: int
) -> bool:
    """Whether chunk ``j`` of stream-split ``producer``'s axis ``i`` is what an op needs
    for chunk ``j`` of ``output``'s axis ``o``: laid out over the same mesh axes and in
    the same blocks, or, for a ``set`` (which reshards each chunk), holding the same
    global indices (:func:`chunk_blocks`)."""
    mine, theirs = producer.axes[i], output.axes[o]
    if mine.layout() == theirs.layout() and mine.stream_blocks == theirs.stream_blocks:
        return True
    return op_is_set and chunk_blocks(producer, i) == chunk_blocks(output, o)


def chunk_value(value: TensorValue, split: StreamSplit) -> TensorValue:
    """One stream chunk of ``value``: its split dim divided by the chunk count (the
    first local part of that dim is the one the stream axis splits)."""
    shape = list(value.shape)
    shape[split.dim] = floordiv(shape[split.dim], split.count)
    sharding = value.sharding
    if sharding is not None:
        parts = list(sharding.dims[split.dim])
        for index, part in enumerate(parts):
            if part.axis is None:
                parts[index] = ShardPart(axis=None, extent=floordiv(part.extent, split.count))
                break
        dims = list(sharding.dims)
        dims[split.dim] = tuple(parts)
        sharding = normalized(dataclasses.replace(sharding, dims=tuple(dims)), tuple(shape))
    return TensorValue(
        name=f"{value.name}_c", dtype=value.dtype, shape=tuple(shape), sharding=sharding
    )
