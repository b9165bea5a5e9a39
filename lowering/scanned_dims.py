"""The dims an op computes whole: a rank needs all of a dim it scans or indexes along.

``cumsum`` and ``topk`` along ``dim``, and ``gather`` on a dim where ``index`` is smaller
than ``arg`` (their rows do not line up shard by shard), compute those dims unsharded.
``decompose_resharding`` passes each op's compute layout through :func:`computed_whole`,
so a sharded input is gathered by a ``set`` before the op (an Allgather) and a sharded
output sliced after it (no communication), as for any other op whose layout differs.
"""

from __future__ import annotations

import dataclasses

from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, TopK
from lowering.layouts import local_parts
from lowering.snapshot import LoweringOp, LoweringTensor


def _whole_dims(op: LoweringOp) -> set[int]:
    """The output dims ``op`` computes unsharded (see the module docstring)."""
    instruction = op.instruction
    if isinstance(instruction, Cumsum | TopK):
        return {instruction.dim}
    if isinstance(instruction, GatherAlong) and instruction.kind is GatherKind.GATHER:
        mapped = {o for o, _ in dict(op.axis_maps).get(instruction.src.name, ())}
        return {d for d in range(instruction.out.ndim) if d != instruction.dim and d not in mapped}
    return set()


def computed_whole(op: LoweringOp, compute: LoweringTensor) -> LoweringTensor:
    """``compute`` (an op's compute layout) with the dims ``op`` scans or indexes along
    unsharded: a rank needs all of such a dim to compute its part."""
    whole = _whole_dims(op)
    if not whole:
        return compute
    data = [i for i, axis in enumerate(compute.axes) if not axis.reduction]
    axes = list(compute.axes)
    for dim in whole:
        axes[data[dim]] = local_parts(axes[data[dim]])
    return dataclasses.replace(compute, axes=tuple(axes))
