"""Index data checked before an op reads it: the indices of ``index_select``, ``gather``
and ``take_along_axis``, ``embedding_fwd``'s input and ``grouped_mm``'s offsets.

torch does not refuse all bad index data: on the CPU ``take_along_dim`` wraps an index
past the extent, or a negative one, around (7 of 6 reads index 1), and ``_grouped_mm``
and the group-by-group product take any offsets (a negative end slices ``a[0:-1]``); the
ops that do refuse raise torch's own messages, or on CUDA a device-side assert. Every
handler that reads indices or offsets calls this module first, so the interpreter, the
compiled programs and the replays (all of which call the handlers) refuse such data
alike, with an :class:`~hostir.errors.IndexDataError` naming the op, the index tensor,
the first bad position with its value, and the range expected:

- on the CPU, a host check: one ``aminmax`` pass over the indices (a few µs at small
  sizes, docs/reliability.md) and, only when it fails, a second pass for the first bad
  position in row-major order; offsets (one per group) are read as a list;
- on CUDA, ``torch._assert_async`` of the same condition, built on the device: no host
  sync per call. The error surfaces at the next synchronization as a device-side assert,
  without the position (run the program on the CPU to find it).

Indices are global along the dim they index: the lowering makes that dim whole on every
rank (docs/ops.md, "Scanned and indexed dims are whole"; ``grouped_mm``'s grouped dim is
gathered first too), so the range is the extent of the local source, which is the global
one. The position is one in the tensor this rank holds (its shard, or a stream chunk).
"""

from __future__ import annotations

from typing import Any

import torch

from hostir.errors import IndexDataError
from hostir.ir.instructions import keyword


def check_indices(
    instruction: Any, role: str, index: torch.Tensor, source: str, dim: int, extent: int
) -> None:
    """Raises IndexDataError unless every value of ``index`` (the operand ``role`` of
    ``instruction``) lies in ``[0, extent)``, ``extent`` being dim ``dim`` of the tensor
    named ``source``. Negative indices are refused too: nvFuser's ops and torch's
    ``gather``, ``index_select`` and ``embedding`` do not take them."""
    if index.numel() == 0:
        return
    low, high = torch.aminmax(index)
    if on_device(index):
        what = f"{_op(instruction)}: {role} {getattr(instruction, role).name} out of range"
        expected = _in_range(role, extent, source, dim)
        torch._assert_async((low >= 0) & (high < extent), f"{what}; {expected}")
        return
    if int(low) >= 0 and int(high) < extent:
        return
    bad = (index < 0) | (index >= extent)
    position = [int(i) for i in bad.nonzero()[0]]  # nonzero lists in row-major order
    value = int(index[tuple(position)])
    raise IndexDataError(
        f"{_op(instruction)}: {_held(instruction, role)} holds {value} at {position}, out of"
        f" range: {_in_range(role, extent, source, dim)}"
    )


def _in_range(role: str, extent: int, source: str, dim: int) -> str:
    """What indices must be, for messages."""
    return f"expected 0 <= {role} < {extent} (the extent of {source} dim {dim})"


def check_offsets(
    instruction: Any, role: str, offsets: torch.Tensor, source: str, dim: int, extent: int
) -> None:
    """Raises IndexDataError unless ``offsets`` (the operand ``role`` of ``instruction``:
    cumulative group ends, one per group) are non-decreasing and within ``[0, extent]``,
    ``extent`` being dim ``dim`` of the tensor named ``source`` that the groups split."""
    if on_device(offsets):
        ends = offsets.reshape(-1)
        ordered = (ends[1:] >= ends[:-1]).all()
        within = (ends[:1] >= 0).all() & (ends[-1:] <= extent).all()
        what = f"{_op(instruction)}: {role} {getattr(instruction, role).name} out of order"
        expected = _group_ends(extent, source, dim)
        torch._assert_async(ordered & within, f"{what} or range; {expected}")
        return
    previous = 0
    for group, end in enumerate(offsets.tolist()):
        if end < 0:
            problem = "below 0"
        elif end < previous:
            problem = f"below {previous} at [{group - 1}]"
        elif end > extent:
            problem = f"past {extent}"
        else:
            previous = end
            continue
        raise IndexDataError(
            f"{_op(instruction)}: {_held(instruction, role)} holds {end} at [{group}], {problem}:"
            f" {_group_ends(extent, source, dim)}"
        )


def _group_ends(extent: int, source: str, dim: int) -> str:
    """What offsets must be, for messages."""
    return f"expected non-decreasing group ends in [0, {extent}] (the extent of {source} dim {dim})"


def on_device(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s check runs on its device (``torch._assert_async``, CUDA),
    rather than on the host (a sync there would cost every call)."""
    return tensor.device.type == "cuda"


def _op(instruction: Any) -> str:
    """``take_along_axis defining T2`` (``into T2`` where ``out`` is preallocated)."""
    verb = "into" if getattr(instruction, "preallocated", False) else "defining"
    return f"{keyword(instruction)} {verb} {instruction.out.name}"


def _held(instruction: Any, role: str) -> str:
    """``index T1``, and whether the positions are those of this rank's shard (a dim split
    over more than one device)."""
    value = getattr(instruction, role)
    sharding = value.sharding
    split = sharding is not None and any(
        sharding.shard_factor(dim) > 1 for dim in range(len(sharding.dims))
    )
    shard = " (this rank's shard)" if split else ""
    return f"{role} {value.name}{shard}"
