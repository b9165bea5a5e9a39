"""The implementations of ``scatter``, ``scatter_add``, ``index_add`` and ``bincount``
(``hostir.ir.scatter_ops``): one torch call each on local data, the indices (or counted
values) checked first (``hostir.run.index_checks``), so the interpreter, compiled
programs and replays refuse out-of-range data alike, with an ``IndexDataError`` naming
the op, the tensor, the first bad position and the range expected. torch itself would
raise its own message for some (``scatter``) and silently grow the result for others
(``bincount`` past ``minlength``).

Order of sums: on the CPU ``scatter_add`` and ``index_add`` add the values for one
position in index order (one loop along ``dim``), so a run gives the same bits every
time and as the single-device reference; on CUDA torch uses atomics (the order, and the
low bits of a float sum, may vary). ``scatter`` with a position indexed twice stores one
of the values, which one torch leaves unspecified.
"""

from __future__ import annotations

from typing import Any

import torch

from hostir.ir.scatter_ops import ScatterAlong, ScatterKind
from hostir.run.implementations import TorchCall, implements
from hostir.run.index_checks import check_indices, on_device


@implements("scatter", "scatter_add", fresh=True)
def prepare_scatter(instruction: ScatterAlong) -> TorchCall:
    """``torch.scatter`` (a tensor or a scalar ``src``) or ``torch.scatter_add``, with the
    indices as int64 (both take no other), checked first."""
    dim, adds = instruction.dim, instruction.kind is ScatterKind.SCATTER_ADD
    name = instruction.arg.name

    def scatter(arg: torch.Tensor, index: torch.Tensor, src: Any) -> torch.Tensor:
        check_indices(instruction, "index", index, name, dim, arg.shape[dim])
        index = index.to(torch.int64)
        if adds:
            return torch.scatter_add(arg, dim, index, src)
        if not isinstance(src, torch.Tensor):  # a scalar: torch's value form
            return torch.scatter(arg, dim, index, value=src)
        return torch.scatter(arg, dim, index, src)

    return scatter


@implements("index_add", fresh=True)
def prepare_index_add(instruction: Any) -> TorchCall:
    """``torch.index_add`` (int32 indices are taken as they are), its indices checked."""
    dim, name = instruction.dim, instruction.arg.name

    def index_add(arg: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        check_indices(instruction, "index", index, name, dim, arg.shape[dim])
        return torch.index_add(arg, dim, index, src)

    return index_add


@implements("bincount", fresh=True)
def prepare_bincount(instruction: Any) -> TorchCall:
    """``torch.bincount(src, minlength=length)`` after every value is checked in ``[0,
    length)``, so the result has exactly ``length`` counts; on CUDA an ``index_add`` of
    ones instead (``torch.bincount`` reads the maximum back to the host)."""
    name = instruction.out.name

    def bincount(src: torch.Tensor, length: Any) -> torch.Tensor:
        length = int(length)
        check_indices(instruction, "src", src, name, 0, length)
        if on_device(src):
            ones = torch.ones(src.shape, dtype=torch.int64, device=src.device)
            counts = torch.zeros(length, dtype=torch.int64, device=src.device)
            return counts.index_add_(0, src, ones)
        return torch.bincount(src, minlength=length)

    return bincount
