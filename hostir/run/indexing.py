"""The implementations of the indexing and scan ops (``hostir.ir.indexing``): one torch
call each on local data (lowering makes the indexed or scanned dim whole first).

``index_select``, ``gather``, ``take_along_axis`` and ``cumsum`` are declared: their
implementations are registered with ``hostir.run.implementations`` (an indexing op's call
checks its indices first, so a replay that makes the call directly checks them too).
``topk`` keeps its handler here (one result per instruction, computed once for both:
``hostir.run.shared_results``; the evaluator's table holds it), which takes the instruction,
its resolved operands and the local shape of ``out``, and writes into a preallocated
``out`` with ``copy_``.

``argsort``'s implementation, at the end, is its torch call (docs/extending.md).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, IndexSelect, TopK, TopKResult
from hostir.run.handler_common import into_out
from hostir.run.implementations import TorchCall, implements
from hostir.run.index_checks import check_indices
from hostir.run.shared_results import sharing


def _check_along(
    instruction: IndexSelect | GatherAlong, src: torch.Tensor, index: torch.Tensor
) -> None:
    """The indices of an op that indexes ``src`` along ``dim`` (whole on every rank), checked
    against its extent."""
    dim = instruction.dim
    check_indices(instruction, "index", index, instruction.src.name, dim, src.shape[dim])


@implements("index_select", fresh=True)
def prepare_index_select(instruction: IndexSelect) -> TorchCall:
    """``torch.index_select`` (int32 indices are taken as they are), its indices checked."""
    dim = instruction.dim

    def index_select(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        _check_along(instruction, src, index)
        return torch.index_select(src, dim, index)

    return index_select


@implements("gather", "take_along_axis", fresh=True)
def prepare_gather(instruction: GatherAlong) -> TorchCall:
    """``torch.gather`` or ``torch.take_along_dim`` (which broadcasts dims of extent 1),
    with the indices as int64 (both take no other), checked first (``take_along_dim``
    would wrap a bad one around)."""
    dim, gather = instruction.dim, instruction.kind is GatherKind.GATHER

    def gather_along(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        _check_along(instruction, src, index)
        index = index.to(torch.int64)
        if gather:
            return torch.gather(src, dim, index)
        return torch.take_along_dim(src, index, dim)

    return gather_along


@implements("cumsum", fresh=True)
def prepare_cumsum(instruction: Cumsum) -> TorchCall:
    """``torch.cumsum`` in the output's dtype (torch would widen int32 to int64)."""
    return functools.partial(
        torch.cumsum, dim=instruction.dim, dtype=instruction.out.dtype.to_torch()
    )


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


@implements("argsort", fresh=True)
def prepare_argsort(instruction: Any) -> TorchCall:
    """``torch.argsort`` (int64 positions)."""
    return functools.partial(
        torch.argsort,
        dim=instruction.dim,
        descending=instruction.descending,
        stable=instruction.stable,
    )
