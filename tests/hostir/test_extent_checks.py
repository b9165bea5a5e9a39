"""Extents are checked when the inputs bind their symbols (hostir.check.extent_checks): a split
that does not divide, a loop too short for the chunks it writes, a chunk index out of
range are named errors on every rank, never an output returned unwritten."""

from __future__ import annotations

import pytest
import torch

import hostir
import hostir.check.extent_checks
from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import ExtentError, HostIrEvaluator

CHUNKED_RELU = """%HostIrContainer {
  input T0 : float32[i0, 4]
  allocate T1 : float32[i0, 4]
  for j0 in range(START, STOP) {
    T0_c : float32[i0 // 2, 4] = shard_by_stream(T0, axis=0, index=READ)
    T1_c : float32[i0 // 2, 4] = shard_by_stream(T1, axis=0, index=WRITE)
    relu(T0_c, out=T1_c)
  }
  output T1
}
"""


def chunked_relu(start="0", stop="2", read="j0", write="j0") -> hostir.HostIrContainer:
    """A loop writing relu of chunk ``read`` of T0 into chunk ``write`` of T1 (2 chunks)."""
    text = CHUNKED_RELU.replace("START", start).replace("STOP", stop)
    return hostir.parse(text.replace("READ", read).replace("WRITE", write))


def random(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + 1))


def test_chunks_that_divide_run_and_match_torch():
    for rows in (2, 4, 6):
        x = random(rows, 4)
        (out,) = HostIrEvaluator(chunked_relu()).run([x])
        torch.testing.assert_close(out, x.relu())


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_stream_chunks_that_do_not_divide_are_named(rows):
    with pytest.raises(
        ExtentError,
        match=rf"T0_c dim 0: extent i0 // 2 divides i0 = {rows} by 2 \(2 stream chunks:"
        rf" shard_by_stream of T0 along axis 0\).*i0 must be a multiple of 2.*i0 = {rows}"
        r" \(from input T0 dim 0\)",
    ):
        HostIrEvaluator(chunked_relu()).run([random(rows, 4)])


def test_empty_tensors_split_into_empty_chunks():
    (out,) = HostIrEvaluator(chunked_relu()).run([torch.empty(0, 4)])
    assert out.shape == (0, 4)


def test_a_symbolic_loop_range_that_is_empty_at_run_time_is_named():
    """The verifier counts a symbolic range as running; with i0 = 4, range(0, i0 - 10) is
    empty and the output would come back as allocated."""
    program = chunked_relu(stop="i0 - 10", read="0", write="0")
    with pytest.raises(
        ExtentError,
        match=r"output T1 \(local shape \[4, 4\]\) would not be written whole: its elements"
        r" \[0:4, 0:4\] are never written \(loop j0 in range\(0, i0 - 10\) runs 0"
        r" iterations\); i0 = 4 \(from input T0 dim 0\)",
    ):
        HostIrEvaluator(program).run([random(4, 4)])


def test_a_loop_shorter_than_its_chunks_is_named():
    """range(0, 1) writes chunk 0 of 2: rows 2:4 would stay unwritten."""
    with pytest.raises(ExtentError, match=r"its elements \[2:4, 0:4\] are never written"):
        HostIrEvaluator(chunked_relu(stop="1")).run([random(4, 4)])


def test_a_loop_whose_range_fits_at_run_time_runs():
    """The same symbolic range with enough rows: both chunks written, once each."""
    index = "j0 - i0 + 14"
    program = chunked_relu(start="i0 - 14", stop="i0 - 12", read=index, write=index)
    x = random(14, 4)
    (out,) = HostIrEvaluator(program).run([x])
    torch.testing.assert_close(out, x.relu())


@pytest.mark.parametrize(
    ("read", "write", "shown"),
    [
        ("j0 - 1", "j0", "index j0 - 1 = -1 at j0 = 0"),
        ("j0 + 1", "j0", "index j0 \\+ 1 = 2 at j0 = 1"),
        ("j0", "1 - j0 - 1", "index 1 - j0 - 1 = -1 at j0 = 1"),
    ],
)
def test_chunk_indices_out_of_range_are_named(read, write, shown):
    """A negative index used to wrap around (torch's narrow); one past the end is refused."""
    with pytest.raises(ExtentError, match=rf"shard_by_stream defining T\d_c: {shown} is out of"):
        HostIrEvaluator(chunked_relu(read=read, write=write)).run([random(4, 4)])


def test_indices_past_the_enumeration_budget_are_checked_as_the_loop_runs(monkeypatch):
    """With nothing left to enumerate, an index with no closed form (``j0 * j0 - 1``) is
    checked as the loop runs; an affine one (``j0 - 1``) is still refused before."""
    monkeypatch.setattr(hostir.check.extent_checks, "MAX_ENUMERATED_ITERATIONS", 0)
    with pytest.raises(ExtentError, match=r"shard_by_stream defining T0_c: index -1 is out of"):
        HostIrEvaluator(chunked_relu(read="j0 * j0 - 1")).run([random(4, 4)])
    with pytest.raises(ExtentError, match=r"index j0 - 1 = -1 at j0 = 0 is out of range"):
        HostIrEvaluator(chunked_relu(read="j0 - 1")).run([random(4, 4)])
    x = random(4, 4)
    (out,) = HostIrEvaluator(chunked_relu(read="1 - j0", write="1 - j0")).run([x])
    torch.testing.assert_close(out, x.relu())


def test_coverage_past_the_enumeration_budget_is_computed_from_the_index(monkeypatch):
    """With nothing left to enumerate, chunk j0 of 2 over range(0, 1) still leaves rows
    2:4 unwritten, named before anything runs (it used to go unchecked: the rows came back
    as allocated); the coverage of an affine index is computed, not enumerated."""
    monkeypatch.setattr(hostir.check.extent_checks, "MAX_ENUMERATED_ITERATIONS", 0)
    with pytest.raises(ExtentError, match=r"its elements \[2:4, 0:4\] are never written"):
        HostIrEvaluator(chunked_relu(stop="1")).run([random(4, 4)])


def test_a_reversed_chunk_order_covers_the_output_and_matches_torch():
    x = random(4, 4)
    (out,) = HostIrEvaluator(chunked_relu(read="1 - j0", write="1 - j0")).run([x])
    torch.testing.assert_close(out, x.relu())


def test_each_binding_is_checked_once_and_a_bad_one_after_a_good_one_is_caught():
    evaluator = HostIrEvaluator(chunked_relu())
    for rows in (4, 4, 6):
        x = random(rows, 4)
        torch.testing.assert_close(evaluator.run([x])[0], x.relu())
    with pytest.raises(ExtentError, match="i0 = 5"):
        evaluator.run([random(5, 4)])


@pytest.mark.world_sizes(8)
def test_one_row_per_device_split_into_two_stream_chunks_is_named_on_every_rank(
    multidevice_test,
):
    """Fuzz seed 90116 at 8 ranks: T1's symbolic extent over 8 devices leaves one row per
    device, which the stream loop chunked into 0 rows: the output came back as allocated
    (3.2e+37 on rank 0). Now every rank names the split; with 16 rows it runs."""
    mesh = DeviceMesh(list(range(8)))
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((8, 8))
        t1 = fd.define_tensor((-1, 8))
        t2 = fd.define_tensor((-1,))
        fd.add_output(fd.ops.linear(t0, t1, t2))
    t1.set_device_mesh(mesh)
    t1.outer_split(0, 8)
    t1.axis(0).parallelize(ParallelType.mesh_x)
    t2.outer_split(0, 2)
    t2.axis(0).parallelize(ParallelType.stream)
    rank = multidevice_test.rank
    generator = torch.Generator().manual_seed(90116)
    a, b, c = (torch.randn(*s, generator=generator) for s in ((8, 8), (8, 8), (8,)))
    inputs = fd.host_ir().inputs

    def local(*tensors):
        return [shard_tensor(t, value, rank) for t, value in zip(tensors, inputs, strict=True)]

    with pytest.raises(
        ExtentError,
        match=r"T1_c dim 0: extent i0 // 8 // 2 divides i0 // 8 = 1 by 2 \(2 stream chunks:"
        r" shard_by_stream of T1 along axis 0\).*i0 must be a multiple of 16.*i0 = 8"
        r" \(from input T1 dim 0\)",
    ):
        fd.execute(local(a, b, c))
    a, b, c = (torch.randn(*s, generator=generator) for s in ((8, 8), (16, 8), (16,)))
    (out,) = fd.execute(local(a, b, c))
    expected = torch.nn.functional.linear(a, b, c)
    torch.testing.assert_close(out, shard_tensor(expected, fd.host_ir().outputs[0], rank))


@pytest.mark.parametrize(
    ("dtype", "given"), [("int32", 2**31), ("int32", -(2**31) - 1), ("int64", 2**63)]
)
def test_an_int_scalar_input_outside_its_dtype_is_refused(dtype, given):
    """torch would wrap it around: int32 2**31 added to a tensor gives -2**31."""
    program = hostir.parse(
        f"%HostIrContainer {{\n  input s : {dtype}\n  input T0 : {dtype}[4]\n"
        "  T1 : DTYPE[4] = add(T0, s)\n  output T1\n}\n".replace("DTYPE", dtype)
    )
    x = torch.randint(-100, 100, (4,), dtype=getattr(torch, dtype))
    with pytest.raises(hostir.InputError, match=rf"input s is an {dtype} scalar, got {given}"):
        HostIrEvaluator(program).run([given, x])
    (out,) = HostIrEvaluator(program).run([7, x])
    torch.testing.assert_close(out, x + 7)
