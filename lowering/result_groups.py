"""The results of an op of several (``topk``, ``sdpfa_fwd``, ``sdpfa_bwd``) as one
instruction computes them, for ``decompose_resharding``: its compute layout is decided
once, from its first result (a one-result op's rule); every other result is laid out
where the inputs, moved for the first, put it (:func:`compute_from_inputs`), and all are
chunked alike for a stream loop (:func:`chunked_alike`), which runs the instruction once
per chunk.
"""

from __future__ import annotations

import dataclasses

from hostir import Mesh
from hostir.ir.catalog import keyword
from lowering.errors import LoweringError
from lowering.layouts import copy_layout, local_parts
from lowering.op_layouts import computed_whole
from lowering.snapshot import LoweringOp, LoweringTensor


def compute_from_inputs(
    op: LoweringOp, out: LoweringTensor, inputs: dict[str, LoweringTensor], mesh: Mesh | None
) -> LoweringTensor:
    """A result of an op of several as the op computes it from ``inputs`` (laid out as it
    reads them): each mapped axis laid out like its input axis, the others local."""
    axes = [local_parts(axis) for axis in out.axes]
    for name, pairs in op.axis_maps:
        for o, i in pairs:
            axes[o] = copy_layout(out.axes[o], inputs[name].axes[i], mesh)
    return dataclasses.replace(out, mesh=mesh, axes=tuple(computed_whole(op, axes)))


def stream_splits(tensor: LoweringTensor) -> tuple:
    """Each axis's stream split and swizzle."""
    return tuple((axis.stream, axis.swizzle) for axis in tensor.axes)


def chunked_alike(ops: list[LoweringOp], computes: list[LoweringTensor]) -> list[LoweringTensor]:
    """``computes`` (the results of one op of several, as it computes them) all split into
    the stream chunks of the first one that is, on the axes that iterate with the same
    input axis as its split one (a stream loop runs the op once per chunk, defining a chunk
    of each result); unchanged if none is. A result without such an axis is refused."""
    axes_of = [[o for o, a in enumerate(c.axes) if a.stream is not None] for c in computes]
    leader = next((k for k, streamed in enumerate(axes_of) if streamed), None)
    if leader is None:
        return computes
    axis = axes_of[leader][0]
    sources = {(name, i) for name, pairs in ops[leader].axis_maps for o, i in pairs if o == axis}
    split = computes[leader].axes[axis]
    chunked = []
    for k, (op, compute) in enumerate(zip(ops, computes, strict=True)):
        mapped = [o for name, pairs in op.axis_maps for o, i in pairs if (name, i) in sources]
        mapped = [axis] if k == leader else mapped
        if not mapped:
            raise LoweringError(
                f"{computes[leader].name} is split into stream chunks on axis {axis}, but"
                f" {compute.name}, another result of the same"
                f" {keyword(op.instruction)}, has no axis that iterates with it: the op defines"
                " all its results at once, chunk by chunk or not at all; split a batch axis"
                " every result shares"
            )
        axes = [dataclasses.replace(a, stream=None, swizzle=None) for a in compute.axes]
        axes[mapped[0]] = dataclasses.replace(
            axes[mapped[0]], stream=split.stream, swizzle=split.swizzle
        )
        chunked.append(dataclasses.replace(compute, axes=tuple(axes)))
    return chunked
