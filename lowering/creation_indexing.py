"""The snapshot of ``topk`` (``frontend.indexing_ops.TopKOp``), the one indexing op not
declared yet: :data:`BUILDERS`, its host IR instruction per frontend expression (joined to
``lowering.snapshot``'s table). A ``topk`` result nothing uses is not lowered:
``lowering.snapshot`` keeps only what the fusion's outputs depend on.

The creation and the other indexing ops are declared (``hostir.ir.creation``,
``hostir.ir.indexing``) and ``fd.ops`` records their instructions itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from frontend import indexing_ops as fi
from frontend.exprs import placeholder
from hostir import Scalar, TensorValue
from hostir.ir.indexing import TopK
from hostir.ir.instructions import Instruction


def _topk_k(expr: fi.TopKOp, out: TensorValue) -> Scalar:
    """``k`` is the extent of the results' dim ``dim``."""
    return out.shape[expr.dim]


BUILDERS: dict[type, Callable[[Any, TensorValue], Instruction]] = {
    fi.TopKOp: lambda e, out: TopK(
        out=out,
        src=placeholder(e.src),
        k=_topk_k(e, out),
        dim=e.dim,
        largest=e.largest,
        sorted=e.sorted,
        result=e.result,
    ),
}
"""One instruction builder per frontend expression class of these ops."""
