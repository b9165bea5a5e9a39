"""Index data checked at run time (hostir.run.index_checks): an index out of range or
negative, ``embedding_fwd`` input past the weight's rows, ``grouped_mm`` offsets out of
order, negative or past the extent they split, and ``topk`` indices fed to an op on a
smaller tensor are refused by an IndexDataError naming the op, the index tensor, the first
bad position and its value, and the range, alike interpreted, compiled and replayed;
good data gives torch's results. torch wrapped some of them around (``take_along_dim``
on the CPU) or took any offsets (``_grouped_mm`` and the group-by-group product)."""

from __future__ import annotations

import pytest
import torch

import hostir
from hostir import HostIrEvaluator, IndexDataError, default_communicator
from hostir.run import index_checks
from hostir.run.compiled import LINE_NOTE
from hostir.run.context import RunContext

GATHERS = """%HostIrContainer {
  input T0 : float32[4, 6]
  input T1 : int64[4, 2]
  T2 : float32[4, 2] = OP(T0, T1, dim=1)
  output T2
}
"""
INDEX_SELECT = """%HostIrContainer {
  input T0 : float32[4, 6]
  input T1 : int32[3]
  T2 : float32[4, 3] = index_select(T0, T1, dim=1)
  output T2
}
"""
EMBEDDING = """%HostIrContainer {
  input T0 : int32[2, 2]
  input T1 : float32[6, 3]
  T2 : float32[2, 2, 3] = embedding_fwd(T0, T1)
  output T2
}
"""


@pytest.fixture
def no_twin_runs(monkeypatch) -> None:
    """One run per call, compiled where asked (the suite's race checker listens, and a
    listener makes a run interpreted)."""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")


def _raised_on_every_path(program: hostir.HostIrContainer, good: list, bad: list) -> str:
    """The message each run path raises for ``bad`` (the same on all three): interpreted,
    compiled (a first run) and replayed (a run of a signature that ran with ``good``);
    the compiled and replayed errors carry a note naming the instruction's line."""
    messages = []
    with pytest.raises(IndexDataError) as caught:
        HostIrEvaluator(program, compiled=False).run(bad)
    messages.append(str(caught.value))
    evaluator = HostIrEvaluator(program, compiled=True)
    with pytest.raises(IndexDataError) as caught:
        evaluator.run(bad)
    messages.append(str(caught.value))
    assert any(note.startswith(LINE_NOTE) for note in caught.value.__notes__)
    evaluator.run(good)
    replay = evaluator.replay_program(0, on_cpu=True)
    context = RunContext(evaluator, program, default_communicator(), torch.device("cpu"))
    with pytest.raises(IndexDataError) as caught:
        replay.run(context, bad)
    messages.append(str(caught.value))
    assert messages[0] == messages[1] == messages[2], messages
    return messages[0]


@pytest.mark.parametrize("op", ["take_along_axis", "gather"])
@pytest.mark.parametrize("bad", [7, 6, -1])
def test_gathers_refuse_an_index_out_of_range(op: str, bad: int, no_twin_runs) -> None:
    """7 of 6 used to read index 1 and -1 index 5 in take_along_axis; gather raised
    torch's message. Both now name the first bad position."""
    program = hostir.parse(GATHERS.replace("OP", op))
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=generator)
    index = torch.randint(0, 6, (4, 2), generator=generator)
    (out,) = HostIrEvaluator(program).run([x, index])
    torch.testing.assert_close(out, torch.take_along_dim(x, index, 1), rtol=0, atol=0)
    wrong = index.clone()
    wrong[2, 1] = bad
    wrong[3, 0] = 9  # later in row-major order: not the first
    message = _raised_on_every_path(program, [x, index], [x, wrong])
    assert message == (
        f"{op} defining T2: index T1 holds {bad} at [2, 1], out of range: expected"
        " 0 <= index < 6 (the extent of T0 dim 1)"
    )


@pytest.mark.parametrize("bad", [6, -1])
def test_index_select_and_embedding_refuse_an_index_out_of_range(bad: int, no_twin_runs) -> None:
    """index_select's int32 indices against the dim it selects from; embedding_fwd's input
    against the weight's rows (negative ones too: torch's embedding takes none)."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, generator=generator)
    picks = torch.tensor([5, 0, 3], dtype=torch.int32)
    program = hostir.parse(INDEX_SELECT)
    (out,) = HostIrEvaluator(program).run([x, picks])
    torch.testing.assert_close(out, x.index_select(1, picks), rtol=0, atol=0)
    wrong = torch.tensor([5, bad, 3], dtype=torch.int32)
    assert _raised_on_every_path(program, [x, picks], [x, wrong]) == (
        f"index_select defining T2: index T1 holds {bad} at [1], out of range: expected"
        " 0 <= index < 6 (the extent of T0 dim 1)"
    )
    table = torch.randn(6, 3, generator=generator)
    rows = torch.tensor([[5, 0], [2, 2]], dtype=torch.int32)
    program = hostir.parse(EMBEDDING)
    (out,) = HostIrEvaluator(program).run([rows, table])
    torch.testing.assert_close(out, torch.nn.functional.embedding(rows, table), rtol=0, atol=0)
    wrong = torch.tensor([[5, 0], [bad, 9]], dtype=torch.int32)
    assert _raised_on_every_path(program, [rows, table], [wrong, table]) == (
        f"embedding_fwd defining T2: input T0 holds {bad} at [1, 0], out of range: expected"
        " 0 <= input < 6 (the extent of T1 dim 0)"
    )


def _grouped_program(k: int) -> hostir.HostIrContainer:
    return hostir.parse(
        "%HostIrContainer {\n  input T0 : bfloat16[10, K]\n  input T1 : bfloat16[3, K, 8]\n"
        "  input T2 : int32[3]\n  T3 : bfloat16[10, 8] = grouped_mm(T0, T1, T2)\n"
        "  output T3\n}\n".replace("K", str(k))
    )


@pytest.mark.parametrize("k", [16, 5], ids=["aligned", "unaligned"])
@pytest.mark.parametrize(
    ("offsets", "problem"),
    [
        ([5, 2, 8], "holds 2 at [1], below 5 at [0]"),
        ([2, 5, 12], "holds 12 at [2], past 10"),
        ([-1, 5, 8], "holds -1 at [0], below 0"),
    ],
)
def test_grouped_mm_refuses_offsets_out_of_order_or_range(
    k: int, offsets: list[int], problem: str, no_twin_runs
) -> None:
    """Out of order, past M and negative offsets all returned a result, through torch's
    grouped matmul (K = 16: aligned operands, on CUDA; the CPU goes group by group) and
    group by group (K = 5, where Python's slicing read ``a[0:-1]``); good ones match a loop
    over the groups."""
    program = _grouped_program(k)
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(10, k, generator=generator).bfloat16()
    b = torch.randn(3, k, 8, generator=generator).bfloat16()
    good = torch.tensor([3, 3, 10], dtype=torch.int32)  # an empty group is fine
    (out,) = HostIrEvaluator(program).run([a, b, good])
    expected = torch.cat([a[:3].float() @ b[0].float(), a[3:].float() @ b[2].float()])
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=5e-2)
    wrong = torch.tensor(offsets, dtype=torch.int32)
    assert _raised_on_every_path(program, [a, b, good], [a, b, wrong]) == (
        f"grouped_mm defining T3: offsets T2 {problem}: expected non-decreasing group ends"
        " in [0, 10] (the extent of T0 dim 0)"
    )


TOPK_FED = """%HostIrContainer {
  input T0 : float32[4, 8]
  input T1 : float32[4, 6]
  T4 : float32[4, 2], T2 : int64[4, 2] = topk(T0, k=2, dim=1, largest=true, sorted=true)
  deallocate T4
  T3 : float32[4, 2] = take_along_axis(T1, T2, dim=1)
  output T3
}
"""


def test_topk_indices_past_the_tensor_they_index_are_refused(no_twin_runs) -> None:
    """topk's indices of an [4, 8] tensor taking along an [4, 6] one: in range, torch's
    result; index 7 (row 1's largest) used to wrap around to column 1."""
    program = hostir.parse(TOPK_FED)
    generator = torch.Generator().manual_seed(5)
    scores, values = torch.randn(4, 8, generator=generator), torch.randn(4, 6, generator=generator)
    scores[:, 6:] -= 10  # the top 2 of each row among the first 6 columns
    (out,) = HostIrEvaluator(program).run([scores, values])
    expected = torch.take_along_dim(values, torch.topk(scores, 2, 1).indices, 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    past = scores.clone()
    past[1, 7] = 20.0
    assert _raised_on_every_path(program, [scores, values], [past, values]) == (
        "take_along_axis defining T3: index T2 holds 7 at [1, 0], out of range: expected"
        " 0 <= index < 6 (the extent of T1 dim 1)"
    )


def test_the_device_check_takes_the_same_data(monkeypatch) -> None:
    """The condition CUDA asserts without a host sync (``torch._assert_async``, which on
    the CPU raises at once): it holds for good data and fails for each kind of bad data."""
    monkeypatch.setattr(index_checks, "on_device", lambda tensor: True)
    (op,) = hostir.parse(GATHERS.replace("OP", "take_along_axis")).body
    (grouped,) = _grouped_program(16).body
    index_checks.check_indices(op, "index", torch.tensor([[0, 5]]), "T0", 1, 6)
    for bad in ([[0, 6]], [[-1, 0]]):
        with pytest.raises(RuntimeError, match="take_along_axis defining T2: index T1 out"):
            index_checks.check_indices(op, "index", torch.tensor(bad), "T0", 1, 6)
    for good in ([3, 3, 10], [0, 0, 0], [10, 10, 10]):
        index_checks.check_offsets(grouped, "offsets", torch.tensor(good), "T0", 0, 10)
    for bad in ([5, 2, 8], [2, 5, 12], [-1, 5, 8]):
        with pytest.raises(RuntimeError, match="grouped_mm defining T3: offsets T2 out of"):
            index_checks.check_offsets(grouped, "offsets", torch.tensor(bad), "T0", 0, 10)
