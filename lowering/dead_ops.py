"""``drop_dead_ops``: only what the fusion's outputs depend on is computed.

An op whose result no output depends on is dropped with its tensor, as nvFuser computes
only what its outputs need: the ``var_sum`` of a ``welford`` whose ``avg`` alone is
used, a ``sdpfa_fwd`` nobody reads. An op of several results is kept whole when one of
its results is live: its instruction defines them all (one kernel call), and an unused
one (``sdpfa_fwd``'s logsumexp, ``topk``'s indices) is freed right after it
(``lowering.insert_deallocations``). It runs after sharding propagation, so a dead op
still gives its inputs the mesh it would have given them (an input read only by a dead op
is not left without a mesh).
"""

from __future__ import annotations

import dataclasses

from lowering.snapshot import LoweringFusion, LoweringOp, op_units


def drop_dead_ops(fusion: LoweringFusion) -> LoweringFusion:
    """``fusion`` without the ops (and their tensors) no output depends on; the fusion's
    inputs stay, read or not."""
    needed = set(fusion.outputs)
    live: list[LoweringOp] = []
    for ops in reversed(op_units(fusion.ops)):
        if any(op.output in needed for op in ops):
            live += reversed(ops)
            needed.update(name for op in ops for name in op.inputs)
    live.reverse()
    kept = set(fusion.outputs) | set(fusion.inputs)
    kept |= {name for op in live for name in (op.output, *op.inputs)}
    return dataclasses.replace(
        fusion,
        tensors=tuple(t for t in fusion.tensors if t.name in kept),
        ops=tuple(live),
    )
