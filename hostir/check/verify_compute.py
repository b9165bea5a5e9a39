"""The verifier's rule for ``shard_by_stream``, the one instruction that makes a tensor
without an op declaration (an alias of a stream chunk): its result's dtype and extents
agree with its source.

A compute instruction is checked against its op's declaration
(``hostir.check.verify_ops.check_declared``); :data:`COMPUTE_RULES` holds the rule of each
class that has none, as a sentence or None. Extents are global and compared symbolically
(:mod:`hostir.ir.extents`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hostir.check.result_checks import shape_text
from hostir.ir.extents import differ
from hostir.ir.instructions import ShardByStream

ScalarTypes = Mapping[str, type]
"""The Python type (bool, int, float) of each scalar input and loop index by name."""


def _rule_shard_by_stream(instruction: ShardByStream, scalars: ScalarTypes) -> str | None:
    src, out, axis = instruction.src, instruction.out, instruction.axis
    if not 0 <= axis < src.ndim or out.ndim != src.ndim:
        return f"shard_by_stream: axis {axis} of the {src.ndim}-d {src.name} into {out.ndim}-d"
    others = [d for d in range(src.ndim) if d != axis]
    if any(differ(src.shape[d], out.shape[d]) for d in others):
        return (
            f"shard_by_stream: {out.name} {shape_text(out)} must keep every extent of {src.name}"
            f" {shape_text(src)} but the one of axis {axis}"
        )
    if out.dtype is not src.dtype:
        return f"{out.name} is declared {out.dtype.value}, but it aliases {src.dtype.value} data"
    return None


COMPUTE_RULES: dict[type, Callable[[Any, ScalarTypes], str | None]] = {
    ShardByStream: _rule_shard_by_stream,
}
"""One rule per instruction class that computes (or aliases) a tensor without an op
declaration."""
