"""The creation and indexing instructions in host IR text: they print, parse back and
round-trip through JSON, run, and the verifier refuses wrong dtypes and extents."""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir import VerifyError

PROGRAM = """%HostIrContainer {
  input T0 : float32[4, 6]
  input T1 : int32[3]
  input T2 : int64[4, 2]
  input S0 : int64
  T3 : float32[4, 3] = index_select(T0, T1, dim=1)
  T4 : float32[4, 2] = gather(T0, T2, dim=1)
  T5 : float32[4, 2] = take_along_axis(T0, T2, dim=1)
  T6 : float32[4, 6] = cumsum(T0, dim=0)
  T12 : float32[4, 2], T7 : int64[4, 2] = topk(T0, k=2, dim=1, largest=false, sorted=true)
  deallocate T12
  T8 : bfloat16[2, 3] = full(-1)
  T9 : float64[5] = iota(1.0, 0.5)
  T10 : float32[4, 3] = uniform(-1.0, 1.0, seed=S0, offset=3)
  T11 : float16[4, 3] = normal(0.0, 2.0)
  output T3
  output T4
  output T5
  output T6
  output T7
  output T8
  output T9
  output T10
  output T11
}
"""


def test_text_json_and_run() -> None:
    """The program prints as it parsed, round-trips through JSON, and computes torch's
    results (the seeded draw is a function of the seed: equal on a second run)."""
    program = hostir.parse(PROGRAM)
    assert str(program) == PROGRAM
    assert hostir.HostIrContainer.from_json(program.to_json()) == program
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, generator=generator)
    picks = torch.tensor([5, 1, 1], dtype=torch.int32)
    along = torch.randint(0, 6, (4, 2), generator=generator)
    outs = hostir.HostIrEvaluator(program).run([x, picks, along, 9])
    expected = [
        x.index_select(1, picks),
        torch.gather(x, 1, along),
        torch.take_along_dim(x, along, 1),
        torch.cumsum(x, 0),
        torch.topk(x, 2, 1, largest=False, sorted=True).indices,
        torch.full((2, 3), -1, dtype=torch.bfloat16),
        torch.arange(5, dtype=torch.float64) * 0.5 + 1.0,
    ]
    for got, want in zip(outs, expected, strict=False):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    again = hostir.HostIrEvaluator(program).run([x, picks, along, 9])
    assert torch.equal(outs[7], again[7]) and -1.0 <= outs[7].min() and outs[7].max() < 1.0
    assert outs[8].dtype == torch.float16 and outs[8].shape == (4, 3)


INPUTS = (
    "input T0 : float32[4, 6]\n  input T1 : int64[3]\n  input T2 : int64[5, 2]\n"
    "  input T3 : bool[4, 6]"
)


def _program(line: str, inputs: str = INPUTS) -> str:
    return f"%HostIrContainer {{\n  {inputs}\n  {line}\n  output T9\n}}\n"


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("T9 : float32[4, 4] = index_select(T0, T1, dim=1)", "the op gives [4, 3]"),
        ("T9 : float32[4, 3] = index_select(T0, T0, dim=1)", "indices are Int or Int32"),
        ("T9 : float32[4, 3] = index_select(T0, T1, dim=2)", "dim 2 is out of range"),
        ("T9 : float32[4, 3] = gather(T0, T1, dim=1)", "has 1 dims"),
        ("T9 : int32[4, 6] = cumsum(T0, dim=1)", "the op gives float32"),
        ("T9 : float32[4, 2], T8 : float32[4, 2] = topk(T0, k=2, dim=1)", "the op gives int64"),
        ("T9 : float32[4, 2], T8 : int64[4, 2] = topk(T0, k=2.0, dim=1)", "expected an integer"),
        ("T9 : bool[4, 2], T8 : int64[4, 2] = topk(T3, k=2, dim=1)", "topk compares numbers"),
        ("T9 : int64[4, 3] = iota(0, 1)", "must be 1-d"),
        ("T9 : float32[4] = iota(0, 1)", "iota takes a float start"),
        ("T9 : bool[4] = iota(0, 1)", "neither an integer nor a float dtype"),
        ("T9 : int64[4] = uniform(0.0, 1.0)", "floating-point tensors"),
        ("T9 : float32[4] = normal(0.0, 1.0, seed=3)", "together"),
        ("T9 : float32[4] = full(T0)", "must be a number or a scalar"),
        # the frontend's rules, now the verifier's too (one declaration)
        ("T9 : int64[4] = iota(0, 0)", "iota: step must not be 0"),
        ("T9 : float32[4] = iota(inf, 1.0)", "iota: start must be finite, got inf"),
        ("T9 : float32[5, 2] = gather(T0, T2, dim=1)", "dim 0 of the index T2 (5) is larger"),
    ],
)
def test_verifier_refusals(line: str, fragment: str) -> None:
    """Each wrong instruction is refused by its rule, naming what is wrong."""
    with pytest.raises(VerifyError) as caught:
        hostir.parse(_program(line))
    assert fragment in str(caught.value), str(caught.value)
