"""The CPU paths the MoE layer spends its time in (benchmarks/moe_hand.py): take_along_axis
picking whole rows (one index_select) and grouped_mm's batched rows form (each group's
product written in place, the rows past the last group zeroed) give torch's values
bitwise, batches past the first included."""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir.run.attention import grouped_mm
from hostir.run.indexing import _picks_rows, _rows_along

ROWS = """%HostIrContainer {{
  input T0 : float32{src}
  input T1 : int64{index}
  T2 : float32{out} = take_along_axis(T0, T1, dim={dim})
  output T2
}}
"""


@pytest.mark.parametrize(
    ("src", "index", "dim"),
    [
        ([1, 7, 5], [1, 9, 1], 1),  # the layer's form: one local batch
        ([3, 7, 5], [3, 4, 1], 1),  # batches past the first: their rows offset
        ([2, 3, 6, 4], [2, 3, 5, 1], 2),
        ([6, 4], [3, 1], 0),
    ],
)
def test_take_along_axis_picking_rows_is_torchs(src, index, dim) -> None:
    generator = torch.Generator().manual_seed(len(src) + dim)
    out = index[: dim + 1] + src[dim + 1 :]
    program = hostir.parse(ROWS.format(src=src, index=index, out=out, dim=dim))
    x = torch.randn(src, generator=generator)
    picks = torch.randint(0, src[dim], index, generator=generator)
    (got,) = hostir.HostIrEvaluator(program).run([x, picks])
    assert torch.equal(got, torch.take_along_dim(x, picks, dim))


BATCHED = """%HostIrContainer {
  input T0 : float32[2, 9, 4]
  input T1 : float32[2, 3, 4, 5]
  input T2 : int32[2, 3]
  T3 : float32[2, 9, 5] = grouped_mm(T0, T1, T2)
  output T3
}
"""


def test_batched_grouped_mm_is_a_matmul_per_group() -> None:
    """Each batch's groups (an empty one among them) equal one matmul each, bitwise, and
    the rows past a batch's last group are zeros."""
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 9, 4, generator=generator), torch.randn(2, 3, 4, 5, generator=generator)
    ends = torch.tensor([[2, 2, 6], [0, 3, 9]], dtype=torch.int32)
    (got,) = hostir.HostIrEvaluator(hostir.parse(BATCHED)).run([a, b, ends])
    expected = torch.zeros(2, 9, 5)
    for batch, row in enumerate(ends.tolist()):
        for g, (start, end) in enumerate(zip([0] + row[:-1], row, strict=True)):
            expected[batch, start:end] = a[batch, start:end] @ b[batch, g]
    assert torch.equal(got, expected)


def test_grouped_mm_into_a_buffer_zeroes_the_rows_past_the_last_group() -> None:
    """Written into a buffer of NaNs (what a fresh one may hold), the rows no group
    covers come back zeros and the others are the products."""
    a, b = torch.randn(6, 4), torch.randn(2, 4, 3)
    out = torch.full((6, 3), float("nan"))
    grouped_mm(a, b, torch.tensor([1, 4], dtype=torch.int32), out)
    assert torch.equal(out[:1], a[:1] @ b[0]) and torch.equal(out[1:4], a[1:4] @ b[1])
    assert torch.equal(out[4:], torch.zeros(2, 3))


def test_rows_picked_wrap_negative_indices_as_take_along_dim() -> None:
    """Unchecked (the fuzzer turns the check off), negative indices wrap around as in
    ``take_along_dim``: the fast path changes no value, not even a wrong one."""
    x = torch.randn(2, 5, 3)
    picks = torch.tensor([[-1, 0, -5], [4, -2, 1]]).unsqueeze(-1)
    assert _picks_rows(x, picks, 1)
    assert torch.equal(_rows_along(x, picks, 1), torch.take_along_dim(x, picks, 1))
