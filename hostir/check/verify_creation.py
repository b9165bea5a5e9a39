"""The verifier's rule for ``topk`` (``hostir.ir.indexing``), the one indexing op not declared
yet: a result's dtype and extents agree with the op and its operand. Merged into
``COMPUTE_RULES`` (``hostir.check.verify_compute``).

The creation and the other indexing ops are declared (``hostir.ir.creation``,
``hostir.ir.indexing``) and checked by their declarations' ``infer``
(``hostir.check.verify_ops``); ``topk``'s rule goes when it is declared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hostir.check.result_checks import result_problem, shape_text
from hostir.ir.dtypes import DType
from hostir.ir.indexing import TopK, TopKResult
from hostir.ir.values import TensorValue

ScalarTypes = Mapping[str, type]


def _check_dim(op: str, src: TensorValue, dim: int) -> str | None:
    if not 0 <= dim < src.ndim:
        return f"{op}: dim {dim} is out of range for {src.name} {shape_text(src)}"
    return None


def _rule_topk(instruction: TopK, scalars: ScalarTypes) -> str | None:
    src, dim = instruction.src, instruction.dim
    problem = _check_dim("topk", src, dim)
    if problem is not None:
        return problem
    shape = src.shape[:dim] + (instruction.k,) + src.shape[dim + 1 :]
    dtype = src.dtype if instruction.result is TopKResult.VALUES else DType.INT64
    return result_problem(instruction, shape, dtype)


CREATION_RULES: dict[type, Callable[[Any, ScalarTypes], str | None]] = {
    TopK: _rule_topk,
}
"""One rule per instruction class of this family whose op is not declared."""
