"""``emit_host_ir``: host IR instructions for every op of a decomposed fusion.

Compute ops become one compute instruction each. A ``set`` between two
different shardings becomes the instructions of its resharding plan. Runs of
consecutive ops whose outputs are split into stream chunks become one stream
loop (``lowering/stream_loops.py``).
"""

from __future__ import annotations

from hostir import HostIrContainer
from hostir.instructions import Instruction
from lowering.emitter import Emitter
from lowering.snapshot import LoweringFusion
from lowering.stream_loops import emit_stream_loop, group_ops


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
    outputs = tuple(values[name] for name in fusion.outputs)
    return HostIrContainer(inputs=inputs, outputs=outputs, body=tuple(body))
