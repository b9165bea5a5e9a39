"""Evaluator handlers for the indexing and scan instructions (``hostir.ir.indexing``): one
torch call each on local data (lowering makes the indexed or scanned dim whole first).

A handler takes the instruction, its resolved operands and the local shape of ``out``
(as ``hostir.run.compute``'s), and writes into a preallocated ``out`` with ``copy_``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, IndexSelect, TopK, TopKResult
from hostir.run.handler_common import into_out
from hostir.run.index_checks import check_indices
from hostir.run.shared_results import sharing


def run_index_select(instruction: IndexSelect, operands: dict, out_shape: list[int]) -> Any:
    """``torch.index_select`` (int32 indices are taken as they are), its indices checked."""
    _check_along(instruction, operands)
    result = torch.index_select(operands["src"], instruction.dim, operands["index"])
    return into_out(instruction, operands, result)


def run_gather(instruction: GatherAlong, operands: dict, out_shape: list[int]) -> Any:
    """``torch.gather`` or ``torch.take_along_dim`` (which broadcasts dims of extent 1),
    with the indices as int64 (both take no other), checked first (``take_along_dim``
    would wrap a bad one around)."""
    _check_along(instruction, operands)
    src, index = operands["src"], operands["index"].to(torch.int64)
    if instruction.kind is GatherKind.GATHER:
        result = torch.gather(src, instruction.dim, index)
    else:
        result = torch.take_along_dim(src, index, instruction.dim)
    return into_out(instruction, operands, result)


def _check_along(instruction: IndexSelect | GatherAlong, operands: dict) -> None:
    """The indices of an op that indexes ``src`` along ``dim`` (whole on every rank), checked
    against its extent."""
    dim = instruction.dim
    extent = operands["src"].shape[dim]
    check_indices(instruction, "index", operands["index"], instruction.src.name, dim, extent)


def run_cumsum(instruction: Cumsum, operands: dict, out_shape: list[int]) -> Any:
    """``torch.cumsum`` in the output's dtype (torch would widen int32 to int64)."""
    dtype = instruction.out.dtype.to_torch()
    result = torch.cumsum(operands["src"], instruction.dim, dtype=dtype)
    return into_out(instruction, operands, result)


def topk_results(instruction: TopK, operands: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Both results of ``torch.topk``: (values, indices)."""
    values, indices = torch.topk(
        operands["src"],
        int(operands["k"]),
        instruction.dim,
        largest=instruction.largest,
        sorted=instruction.sorted,
    )
    return values, indices


def run_topk(
    instruction: TopK,
    operands: dict,
    out_shape: list[int],
    results: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Any:
    """``torch.topk``, keeping the result the instruction names; from ``results`` (both,
    hostir.run.shared_results) when given."""
    values, indices = results if results is not None else topk_results(instruction, operands)
    result = values if instruction.result is TopKResult.VALUES else indices
    return into_out(instruction, operands, result)


sharing(TopK)  # its evaluator handler computes values and indices once (hostir.run.evaluator)

INDEXING_HANDLERS: dict[type, Callable[[Any, dict, list[int]], torch.Tensor]] = {
    IndexSelect: run_index_select,
    GatherAlong: run_gather,
    Cumsum: run_cumsum,
    TopK: run_topk,
}
"""One handler per indexing instruction class (merged into ``COMPUTE_HANDLERS``)."""
