"""The MoE ops' instructions in host IR text (``scatter``, ``scatter_add``, ``index_add``,
``bincount``; ``hostir.ir.scatter_ops``): they print, parse back and round-trip through
JSON, run to torch's results, and the verifier and the bound-value checks refuse wrong
dtypes and extents by name."""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir import BoundRequirementError, IndexDataError, VerifyError

PROGRAM = """%HostIrContainer {
  input T0 : float32[i0, 6]
  input T1 : int32[i1, 6]
  input T2 : float32[i2, 6]
  input T3 : int64[i3]
  T4 : float32[i0, 6] = scatter(T0, T1, src=T2, dim=0)
  T5 : float32[i0, 6] = scatter(T0, T1, src=-1.5, dim=1)
  T6 : float32[i0, 6] = scatter_add(T0, T1, src=T2, dim=0)
  T7 : float32[i0, 6] = index_add(T4, T3, src=T2, dim=0)
  T8 : int64[5] = bincount(T3, length=5)
  output T5
  output T6
  output T7
  output T8
}
"""


def _inputs(rows: int, index_rows: int, seed: int) -> list[torch.Tensor]:
    """Random data: ``arg`` of ``rows`` rows, an index of ``index_rows`` (values repeating
    down each column: 4 rows of values below 5 or fewer), src
    with the index's rows, a 1-d index as long as src."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=generator)
    index = torch.randint(0, min(rows, 5), (index_rows, 6), generator=generator)
    src = torch.randn(index_rows, 6, generator=generator)
    line = torch.randint(0, min(rows, 5), (index_rows,), generator=generator)
    return [x, index.to(torch.int32), src, line]


def test_text_json_and_run() -> None:
    """The program prints as it parsed, round-trips through JSON, and computes torch's
    results on two signatures (repeated indices; an empty index)."""
    program = hostir.parse(PROGRAM)
    assert str(program) == PROGRAM
    assert hostir.HostIrContainer.from_json(program.to_json()) == program
    evaluator = hostir.HostIrEvaluator(program)
    for rows, index_rows in ((5, 4), (6, 0)):
        x, index, src, line = _inputs(rows, index_rows, seed=rows)
        outs = evaluator.run([x, index, src, line])
        i = index.long()
        written = torch.scatter(x, 0, i, src)  # distinct rows per column or not: CPU order
        expected = [
            torch.scatter(x, 1, i, -1.5),
            torch.scatter_add(x, 0, i, src),
            torch.index_add(written, 0, line, src),
            torch.bincount(line, minlength=5),
        ]
        for got, want in zip(outs, expected, strict=True):
            assert torch.equal(got, want), (rows, index_rows)


def test_bound_extents_and_index_data_are_checked() -> None:
    """An index larger than src (symbolic extents: refused when the inputs bind them, by
    name), an index_add src of another length than its index, and a counted value past
    ``length``."""
    evaluator = hostir.HostIrEvaluator(hostir.parse(PROGRAM))
    x, index, src, line = _inputs(5, 4, seed=1)
    with pytest.raises(BoundRequirementError, match=r"scatter: dim 0 of the index T1 \(i1 = 4\)"):
        evaluator.run([x, index, src[:3], line[:3]])
    with pytest.raises(BoundRequirementError, match="index_add: dim 0 of src T2 is i2 = 4; it"):
        evaluator.run([x, index, src, line[:3]])
    x, index, src, line = _inputs(6, 4, seed=2)  # 5 is a row of T4 but past length 5
    with pytest.raises(IndexDataError, match=r"bincount defining T8: src T3 holds 5 at \[2\]"):
        evaluator.run([x, index, src, torch.tensor([0, 1, 5, 2])])


@pytest.mark.parametrize(
    ("line", "replacement", "message"),
    [
        ("scatter(T0, T1, src=T2, dim=0)", "scatter(T0, T2, src=T2, dim=0)", "T2 is Float"),
        ("scatter(T0, T1, src=T2, dim=0)", "scatter(T0, T1, src=T2, dim=2)", "dim 2 is out"),
        ("scatter_add(T0, T1, src=T2", "scatter_add(T0, T1, src=1.0", "must be a tensor"),
        ("index_add(T4, T3, src=T2", "index_add(T4, T1, src=T2", "T1 has 2 dims; it must"),
        ("T8 : int64[5] = bincount(T3", "T8 : int64[5] = bincount(T2", "bincount: T2 is Float"),
        ("T8 : int64[5]", "T8 : int64[4]", "T8"),
    ],
)
def test_the_verifier_refuses_by_name(line: str, replacement: str, message: str) -> None:
    """Wrong dtypes, dims and result extents, in the declarations' words."""
    assert line in PROGRAM
    with pytest.raises(VerifyError, match=message):
        hostir.parse(PROGRAM.replace(line, replacement))
