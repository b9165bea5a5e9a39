"""The implementations of the indexing and scan ops (``hostir.ir.indexing``): one torch
call each on local data (lowering makes the indexed or scanned dim whole first),
registered with ``hostir.run.implementations``. An indexing op's call checks its indices
first, so a replay that makes the call directly checks them too; ``topk``'s call returns
both of its results from one ``torch.topk``.

``argsort``'s implementation, at the end, is its torch call (docs/extending.md).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from hostir.ir.indexing import Cumsum, GatherAlong, GatherKind, IndexSelect, TopK
from hostir.run.implementations import TorchCall, implements
from hostir.run.index_checks import check_indices


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
        if _picks_rows(src, index, dim):
            return _rows_along(src, index, dim)
        return torch.take_along_dim(src, index, dim)

    return gather_along


def _picks_rows(src: torch.Tensor, index: torch.Tensor, dim: int) -> bool:
    """Whether ``take_along_dim(src, index, dim)`` picks whole rows: ``index`` matches
    ``src`` before ``dim`` and has extent 1 after it (broadcast), ``src`` contiguous."""
    return (
        index.dim() == src.dim()
        and index.shape[:dim] == src.shape[:dim]
        and all(extent == 1 for extent in index.shape[dim + 1 :])
        and src.is_contiguous()
    )


def _rows_along(src: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``take_along_dim`` of whole rows as one ``index_select`` of ``src`` flattened up to
    ``dim``: the same values. ``take_along_dim`` expands the index to the result's shape,
    then wraps it (``remainder``) and gathers element by element; picking a MoE layer's
    token rows so took 2.5x the time of ``index_select``."""
    lead, extent, rest = src.shape[:dim], src.shape[dim], src.shape[dim + 1 :]
    batches, picks = math.prod(lead), index.shape[dim]
    flat = index.reshape(batches, picks)
    if extent:  # wrapped as take_along_dim wraps it (only reachable with the check off)
        flat = flat.remainder(extent)
    if batches > 1:  # batch b's rows start at b * extent in the flattened src
        flat = flat + torch.arange(batches, device=index.device).unsqueeze(1) * extent
    rows = src.reshape(batches * extent, *rest).index_select(0, flat.reshape(-1))
    return rows.reshape(*lead, picks, *rest)


@implements("cumsum", fresh=True)
def prepare_cumsum(instruction: Cumsum) -> TorchCall:
    """``torch.cumsum`` in the output's dtype (torch would widen int32 to int64)."""
    return functools.partial(
        torch.cumsum, dim=instruction.dim, dtype=instruction.out.dtype.to_torch()
    )


@implements("topk", fresh=True)
def prepare_topk(instruction: TopK) -> TorchCall:
    """``torch.topk``: the values and their indices, from one call."""
    dim, largest, ordered = instruction.dim, instruction.largest, instruction.sorted

    def topk(src: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(src, int(k), dim, largest=largest, sorted=ordered)
        return values, indices

    return topk


@implements("argsort", fresh=True)
def prepare_argsort(instruction: Any) -> TorchCall:
    """``torch.argsort`` (int64 positions)."""
    return functools.partial(
        torch.argsort,
        dim=instruction.dim,
        descending=instruction.descending,
        stable=instruction.stable,
    )
