"""Stream chunks written in place (issue 33, item 5): a compute instruction whose result
is a stream chunk of a preallocated tensor writes it there through torch's ``out=`` forms
(``hostir.run.implementations.write_call``), so the profiler sees one torch op per chunk
with the chunk as its output argument and no ``aten::copy_``, as nvFuser's
stream-parallel matmul test checks (tests/python/multidevice of NVIDIA/Fuser:
``aten::mm`` with input shapes ``[[5, 7], [7, 2], [5, 2]]``).

Numbers against torch on random data; the writes in every run mode (interpreted,
compiled, replayed: a profiler runs the interpreter, so the others are watched with a
``TorchDispatchMode``); the fallbacks to a copy (an ``out`` that shares memory with an
operand, a batched product into a strided chunk)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from frontend import DataType, FusionDefinition, ParallelType
from hostir import HostIrEvaluator, parse
from hostir.ir.reductions import REDUCTION_OPS
from hostir.run.compiled_runs import bitwise_equal
from tests.frontend.test_pointwise_ops import BINARY_REFERENCES, UNARY_REFERENCES

STREAMS = 3
F = torch.nn.functional


def _split(dim: int, *tensors) -> None:
    for tv in tensors:
        tv.outer_split(dim, STREAMS)
        tv.axis(dim).parallelize(ParallelType.stream)


def _profile(fd: FusionDefinition, inputs: list) -> tuple[list, list]:
    """(outputs, the profiler's events) of a second run of ``fd`` (the first lowers)."""
    fd.execute(inputs)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        outputs = fd.execute(inputs)
    return outputs, list(prof.events())


def _shapes(events: list, name: str) -> list:
    """The input shapes of every ``name`` event (an ``out=`` tensor comes last)."""
    return [[list(s) for s in e.input_shapes if s] for e in events if e.name == name]


def _copies(events: list) -> list:
    """The ``aten::copy_`` events not made inside another torch op (``addmm`` copies its
    bias into ``out`` first: its own added term, not a copy of a result)."""
    return [
        e
        for e in events
        if e.name == "aten::copy_"
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]


@pytest.mark.parametrize("dim", [1, 0], ids=["columns", "rows"])
def test_a_stream_parallel_matmul_writes_each_chunk_with_one_mm(dim):
    """nvFuser's test_matmul (columns: a strided chunk, the BLAS's leading dimension) and
    its split of the rows: one ``aten::mm`` per chunk, the chunk its third argument."""
    with FusionDefinition() as fd:
        inp, w = fd.define_tensor((-1, -1)), fd.define_tensor((-1, -1))
        out = fd.ops.matmul(inp, w)
        fd.add_output(out)
    _split(dim, out)
    rows, cols = (5, 2 * STREAMS) if dim == 1 else (2 * STREAMS, 5)
    a, b = torch.randn(rows, 7), torch.randn(7, cols)
    (result,), events = _profile(fd, [a, b])
    torch.testing.assert_close(result, a @ b)
    chunk = [5, 2] if dim == 1 else [2, 5]
    operands = [[5, 7], [7, 2]] if dim == 1 else [[2, 7], [7, 5]]
    assert _shapes(events, "aten::mm") == [[*operands, chunk]] * STREAMS
    assert _copies(events) == []
    assert "matmul(T0, T1_c, out=T2_c)" in str(fd.host_ir()) or dim == 0


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dim", [0, 1], ids=["rows", "features"])
def test_a_stream_parallel_linear_writes_each_chunk_in_place(dim, bias):
    """Without a bias one ``aten::mm`` per chunk, with one one ``aten::addmm`` (the bias
    its added term, as torch.nn.functional.linear computes it): each chunk holds bitwise
    what F.linear gives on the chunk's operands."""
    with FusionDefinition() as fd:
        x, w = fd.define_tensor((6, 7)), fd.define_tensor((9, 7))
        b = fd.define_tensor((9,)) if bias else None
        y = fd.ops.linear(x, w, b) if bias else fd.ops.linear(x, w)
        fd.add_output(y)
    _split(dim, y)
    inputs = [torch.randn(6, 7), torch.randn(9, 7)] + ([torch.randn(9)] if bias else [])
    (result,), events = _profile(fd, inputs)
    torch.testing.assert_close(result, F.linear(*inputs))
    rows, cols = (2, 9) if dim == 0 else (6, 3)
    if dim == 0:  # the chunk's rows of the input
        pieces = [F.linear(inputs[0][2 * j : 2 * j + 2], *inputs[1:]) for j in range(STREAMS)]
    else:  # the chunk's rows of the weight and the bias
        pieces = [
            F.linear(inputs[0], *[t[3 * j : 3 * j + 3] for t in inputs[1:]]) for j in range(3)
        ]
    assert bitwise_equal(result, torch.cat(pieces, dim))
    product = [[rows, 7], [7, cols]]
    if bias:
        assert _shapes(events, "aten::addmm") == [[[cols], *product, [rows, cols]]] * STREAMS
    else:
        assert _shapes(events, "aten::mm") == [[*product, [rows, cols]]] * STREAMS
    assert _copies(events) == []


def test_pointwise_chunks_of_a_strided_split_are_written_in_place():
    """relu then add, split on dim 1 (strided chunks): per chunk one ``clamp_min`` (torch's
    relu, which has no in-place ``out=`` form of its own) and one ``add``, each with the
    chunk as its out; no copy."""
    with FusionDefinition() as fd:
        x, y = fd.define_tensor((4, 6)), fd.define_tensor((4, 6))
        r = fd.ops.relu(x)
        s = fd.ops.add(r, y)
        fd.add_output(r)
        fd.add_output(s)
    _split(1, r, s)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    (relu, total), events = _profile(fd, [a, b])
    torch.testing.assert_close(relu, a.relu())
    torch.testing.assert_close(total, a.relu() + b)
    assert _shapes(events, "aten::clamp_min") == [[[4, 2], [4, 2]]] * STREAMS
    assert _shapes(events, "aten::add") == [[[4, 2], [4, 2], [4, 2]]] * STREAMS
    assert _copies(events) == []


@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduction_chunks_are_written_in_place(op):
    """A reduction of dim 2 into an output split on its dim 1 (strided chunks): one
    ``aten::sum`` (``aten::amax``) per chunk with the chunk as its out; no copy."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 6, 5))
        y = getattr(fd.ops, op)(x, [2])
        fd.add_output(y)
    _split(1, y)
    a = torch.randn(4, 6, 5)
    (result,), events = _profile(fd, [a])
    torch.testing.assert_close(result, a.sum(2) if op == "sum" else a.amax(2))
    name = "aten::sum" if op == "sum" else "aten::amax"
    assert [shapes[-1] for shapes in _shapes(events, name)] == [[4, 2]] * STREAMS
    assert _copies(events) == []


class _Calls(TorchDispatchMode):
    """Records the torch ops that run (their overload names) and each ``out=`` shape."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = kwargs.get("out")
        self.calls.append((str(func), list(out.shape) if out is not None else None))
        return func(*args, **kwargs)


def _chain() -> tuple[FusionDefinition, list]:
    """A matmul, a linear with a bias, a comparison (a Bool chunk) and a sum, each an
    output split in stream chunks of its rows; the inputs."""
    with FusionDefinition() as fd:
        a, b = fd.define_tensor((6, 7)), fd.define_tensor((7, 5))
        w, bias = fd.define_tensor((4, 5)), fd.define_tensor((4,))
        mm = fd.ops.matmul(a, b)
        lin = fd.ops.linear(mm, w, bias)
        lt = fd.ops.lt(lin, 0.5)
        total = fd.ops.sum(lin, [1])
        for tv in (mm, lin, lt, total):
            fd.add_output(tv)
    _split(0, mm, lin, lt, total)
    torch.manual_seed(3)
    return fd, [torch.randn(6, 7), torch.randn(7, 5), torch.randn(4, 5), torch.randn(4)]


def test_every_run_mode_writes_the_chunks_in_place(monkeypatch):
    """Interpreted, compiled and replayed runs make the same out= calls (a replay calls
    the writes directly, without the handlers), no copy, and the same bits."""
    for check in ("COMPILED", "RACES", "PIPELINE", "ROUND_TRIP"):
        monkeypatch.setenv(f"HOSTIR_CHECK_{check}", "0")  # one run per run
    fd, inputs = _chain()
    program = fd.host_ir()
    a, b, w, bias = inputs
    mm = a @ b
    lin = F.linear(mm, w, bias)
    expected = [mm, lin, lin < 0.5, lin.sum(1)]
    wanted = [
        ("aten.mm.out", [2, 5]),
        ("aten.addmm.out", [2, 4]),
        ("aten.lt.Scalar_out", [2, 4]),
        ("aten.sum.IntList_out", [2]),
    ] * STREAMS
    results = []
    for compiled in (False, True):
        evaluator = HostIrEvaluator(program, compiled=compiled)
        for _ in range(3):  # compiled: the first run compiled, the next two replayed
            with _Calls() as calls:
                outputs = evaluator.run(inputs)
            assert [c for c in calls.calls if c[1] is not None] == wanted
            assert not any(name.startswith("aten.copy_") for name, _ in calls.calls)
            results.append(outputs)
    for got, want in zip(results[0], expected, strict=True):
        torch.testing.assert_close(got, want)
    assert all(bitwise_equal(g, w) for r in results for g, w in zip(r, results[0], strict=True))
    source = evaluator.replay_program(0).source
    writes = [line.strip() for line in source.splitlines() if line.strip().startswith("F")]
    assert writes == [  # the write of each chunk: out first, then the operands
        "F10(v_T4_c, v_T0_c, v_T1)",
        "F13(v_T5_c, v_T4_c, v_T2, v_T3)",
        "F16(v_T6_c, v_T5_c, 0.5)",
        "F19(v_T7_c, v_T5_c)",
    ]


ALIASED = """%HostIrContainer {
  input T0 : float32[4, 4]
  input T1 : float32[4, 4]
  T2 : float32[4, 4] = neg(T0)
  matmul(T2, T1, out=T2)
  add(T2, T2, out=T2)
  output T2
}
"""


@pytest.mark.parametrize("compiled", [False, True])
def test_an_out_that_is_an_operand_is_computed_then_copied(compiled):
    """``matmul(T2, T1, out=T2)``: torch's mm(out=) would overwrite its operand while it
    reads it (the program gave zeros before the writes checked); an ``out`` sharing
    memory with an operand gets the result computed, then copied."""
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    evaluator = HostIrEvaluator(parse(ALIASED), compiled=compiled)
    for _ in range(3):
        (result,) = evaluator.run([x, w])
        assert bitwise_equal(result, 2 * ((-x) @ w))


def test_a_batched_product_into_a_strided_chunk_is_copied():
    """A 3-d linear split on its middle dim: torch's batched matmul(out=) cannot write
    the strided chunk (it folds the batch and reshapes ``out``), so the chunk gets a
    copy of the result: the one fallback of matmul and linear."""
    with FusionDefinition() as fd:
        x, w = fd.define_tensor((2, 6, 5)), fd.define_tensor((4, 5))
        y = fd.ops.linear(x, w)
        fd.add_output(y)
    _split(1, y)
    a, b = torch.randn(2, 6, 5), torch.randn(4, 5)
    (result,), events = _profile(fd, [a, b])
    torch.testing.assert_close(result, F.linear(a, b))
    assert [list(e.input_shapes[0]) for e in _copies(events)] == [[2, 2, 4]] * STREAMS


def test_chunks_of_another_dtype_than_their_operands():
    """Half operands: ``add`` computes and writes Float chunks (its operands cast first,
    as the plain call does), ``sum(dtype=Float)`` accumulates into Float chunks (torch's
    ``dtype=``),
    a comparison writes Bool chunks, and a ``cast`` into a chunk is one copy (which
    casts) where it was a cast and then a copy."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((6, 4), dtype=DataType.Half)
        outs = [
            fd.ops.add(x, x),
            fd.ops.sum(x, [1], dtype=DataType.Float),
            fd.ops.gt(x, x),
            fd.ops.cast(x, DataType.Float),
        ]
        for tv in outs:
            fd.add_output(tv)
    _split(0, *outs)
    a = torch.randn(6, 4).half()
    results, events = _profile(fd, [a])
    expected = [a.float() + a.float(), a.sum(1, dtype=torch.float32), a > a, a.float()]
    for got, want in zip(results, expected, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    # the cast's own copies (Half into a Float chunk), one per chunk; no other
    assert [[list(s) for s in e.input_shapes[:2]] for e in _copies(events)] == [
        [[2, 4], [2, 4]]
    ] * STREAMS


def _every_op_fusion(dtype: DataType, split: bool) -> FusionDefinition:
    """Every pointwise op and every reduction of ``x`` (and ``y``), each an output; with
    ``split``, each output split in stream chunks of its dim 1 (strided chunks)."""
    with FusionDefinition() as fd:
        x, y = fd.define_tensor((3, 6, 5), dtype=dtype), fd.define_tensor((3, 6, 5), dtype=dtype)
        outs = [getattr(fd.ops, name)(x) for name in UNARY_REFERENCES]
        outs += [getattr(fd.ops, name)(x, y) for name in BINARY_REFERENCES]
        outs.append(fd.ops.where(fd.ops.lt(x, y), x, y))
        outs += [getattr(fd.ops, name)(x, [2]) for name in REDUCTION_OPS]
        outs.append(fd.ops.cast(x, DataType.Double))
        outs.append(fd.ops.set(x))
        for out in outs:
            fd.add_output(out)
    if split:
        _split(1, *outs)
    return fd


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Double])
def test_every_op_written_into_strided_chunks_computes_what_it_does_fresh(dtype):
    """Every op with an in-place form (each pointwise op, each reduction, cast, set),
    written into strided stream chunks of its output, against the same ops computing
    fresh results: torch's out= forms must not be trusted blindly (torch 2.13's erf gelu
    wrote wrong values into a strided out; a fuzz seed found it), so an op whose out= form
    is wrong here must compute and copy. Tolerance: a strided out takes torch's scalar
    loop, not its vector one, so the last bits may differ."""
    generator = torch.Generator().manual_seed(11)
    inputs = [
        (torch.rand(3, 6, 5, generator=generator) * 1.5 + 0.5).to(dtype.to_torch())
        for _ in range(2)
    ]
    chunked = _every_op_fusion(dtype, split=True).execute(inputs)
    fresh = _every_op_fusion(dtype, split=False).execute(inputs)
    names = [*UNARY_REFERENCES, *BINARY_REFERENCES, "where", *REDUCTION_OPS, "cast", "set"]
    assert len(chunked) == len(names)
    for name, got, want in zip(names, chunked, fresh, strict=True):
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")
