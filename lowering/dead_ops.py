"""``drop_dead_ops``: only what the fusion's outputs depend on is computed.

An op whose result no output depends on is dropped with its tensor, as nvFuser computes
only what its outputs need: the ``var_sum`` of a ``welford`` whose ``avg`` alone is
used, the ``logsumexp`` of an ``sdpfa_fwd`` nobody reads, a ``topk``'s unused indices.
It runs after sharding propagation, so a dead op still gives its inputs the mesh it
would have given them (an input read only by a dead op is not left without a mesh).
"""

from __future__ import annotations

import dataclasses

from lowering.snapshot import LoweringFusion


def drop_dead_ops(fusion: LoweringFusion) -> LoweringFusion:
    """``fusion`` without the ops (and their tensors) no output depends on; the fusion's
    inputs stay, read or not."""
    needed = set(fusion.outputs)
    live = []
    for op in reversed(fusion.ops):
        if op.output in needed:
            live.append(op)
            needed.update(op.inputs)
    live.reverse()
    kept = set(fusion.outputs) | set(fusion.inputs)
    kept |= {name for op in live for name in (op.output, *op.inputs)}
    return dataclasses.replace(
        fusion,
        tensors=tuple(t for t in fusion.tensors if t.name in kept),
        ops=tuple(live),
    )
