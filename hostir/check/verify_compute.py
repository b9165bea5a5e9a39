"""The verifier's rules for the instructions that compute (or alias) a tensor and that no
op declaration covers: a result's dtype and extents agree with the instruction and its
operands.

A declared op's instruction is checked against its declaration
(``hostir.check.verify_ops.check_declared``); the rules here, one per class in
:data:`COMPUTE_RULES`, serve the others: ``shard_by_stream`` (an alias of a stream chunk,
no op), and the ops of several results not declared yet (``sdpfa_fwd`` and ``sdpfa_bwd``:
``hostir.check.verify_attention``; ``topk``: ``hostir.check.verify_creation``). A rule
returns the problem as a sentence, or None. Extents are global and compared symbolically
(:mod:`hostir.ir.extents`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hostir.check.result_checks import shape_text
from hostir.check.verify_attention import ATTENTION_RULES
from hostir.check.verify_creation import CREATION_RULES
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
    **ATTENTION_RULES,  # sdpfa_fwd, sdpfa_bwd
    **CREATION_RULES,  # topk
}
"""One rule per instruction class that computes (or aliases) a tensor and whose ops are
not declared."""
