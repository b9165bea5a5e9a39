"""``emit_host_ir``: host IR instructions for every op of a decomposed fusion.

Compute ops become one compute instruction each. A ``set`` between two
different shardings becomes the instructions of its resharding plan. Runs of
consecutive ops whose outputs are split into stream chunks become one stream
loop (``lowering/stream_loops.py``).
"""

from __future__ import annotations

from hostir import HostIrContainer
from hostir.ir.catalog import keyword
from hostir.ir.instructions import Instruction
from lowering.emitter import Emitter
from lowering.errors import LoweringError
from lowering.op_layouts import takes_no_stream, whole_axes
from lowering.snapshot import LoweringFusion
from lowering.stream_loops import emit_stream_loop, group_ops, stream_split


def emit_host_ir(fusion: LoweringFusion) -> HostIrContainer:
    """The host IR program computing ``fusion`` (inputs in definition order)."""
    emitter = Emitter(fusion)
    values = emitter.values
    scalars = {s.name: s for s in fusion.scalar_inputs}
    inputs = tuple(scalars.get(name) or values[name] for name in fusion.inputs)
    body: list[Instruction] = []
    segments = group_ops(fusion)
    for index, (stream, ops) in enumerate(segments):
        if stream is None:
            for op in ops:
                body.extend(emitter.emit_op(op, values))
            continue
        later = [op for _, rest in segments[index + 1 :] for op in rest]
        body.extend(emit_stream_loop(emitter, stream, ops, later))
    _refuse_unused_stream_splits(fusion, emitter.chunked)
    outputs = tuple(values[name] for name in fusion.outputs)
    return HostIrContainer(
        inputs=inputs, outputs=outputs, body=tuple(body), requires=fusion.requires
    )


def _refuse_unused_stream_splits(fusion: LoweringFusion, chunked: set[str]) -> None:
    """A stream schedule yields a loop or a named error, never nothing: a tensor split into
    stream chunks that no loop read or wrote chunk by chunk is refused, saying why."""
    tensors = {t.name: t for t in fusion.tensors}
    for tensor in fusion.tensors:
        split = stream_split(tensor)
        if split is None or tensor.name in chunked:
            continue
        axis = next(i for i, a in enumerate(tensor.axes) if a.stream is not None)
        reducing = [
            op
            for op in fusion.ops
            for name, pairs in op.axis_maps
            if name == tensor.name
            for o, i in pairs  # (output axis, input axis)
            if i == axis and tensors[op.output].axes[o].reduction
        ]
        whole = [
            op
            for op in fusion.ops
            for name, pairs in op.axis_maps
            if name == tensor.name
            for o, i in pairs
            if i == axis and (o in whole_axes(op) or takes_no_stream(op))
        ]
        if reducing:
            why = (
                f"{keyword(reducing[0].instruction)} reduces that dim into"
                f" {reducing[0].output}, and a stream loop over a reduced (contraction) dim"
                " would have to accumulate per-chunk partial results, which the lowering does"
                " not do; split a dim the ops keep (the M or N dim of a linear or matmul)"
            )
        elif whole:
            op = whole[0]
            (at,) = {o for n, ps in op.axis_maps if n == tensor.name for o, i in ps if i == axis}
            needs = (
                "attention with dropout takes its mask by the global index of each weight"
                if takes_no_stream(op)
                else "the op computes that axis whole (a chunk alone gives a different result)"
            )
            why = (
                f"{op.output} = {keyword(op.instruction)}(...) reads it with that dim as its"
                f" axis {at},"
                f" and {needs}, so the split stops before it; stream-split an axis the op"
                " computes element by element (a batch or head dim), or none"
            )
        else:
            why = "no op computes it or reads it on that dim in a loop"
        raise LoweringError(
            f"{tensor.name} is split into {split.count} stream chunks on dim {split.dim}, but no"
            f" stream loop reads or writes it chunk by chunk: {why}"
        )
