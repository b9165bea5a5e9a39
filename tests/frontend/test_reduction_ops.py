"""The reductions of ``hostir.ir.reductions`` and their composites against torch: each op
unsharded, nvFuser's dtype rules, the refusals, and sharded over 1, 2 and 4 ranks (partial
results finished by one collective with the op's combine, nvFuser's reduce-scatter form,
two-pass var_mean on data with a large mean, softmax and layernorm with no gather)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

import hostir
from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    OperandError,
    ParallelType,
    ScheduleError,
    shard_tensor,
)
from hostir import HostIrError, VerifyError
from hostir.ir.reductions import REDUCTION_OPS

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
I32, I64, BOOL = torch.int32, torch.int64, torch.bool


def _prod(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


REFERENCES: dict[str, Callable[[torch.Tensor, tuple[int, ...], bool], torch.Tensor]] = {
    "sum": lambda x, dims, keepdim: torch.sum(x, dims, keepdim),
    "prod": _prod,
    "max": lambda x, dims, keepdim: torch.amax(x, dims, keepdim),
    "min": lambda x, dims, keepdim: torch.amin(x, dims, keepdim),
}


def test_references_cover_every_declared_reduction() -> None:
    """A new declaration fails here until the tests below cover it."""
    assert set(REFERENCES) == set(REDUCTION_OPS)


def _run(build: Callable, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], str]:
    """The outputs of ``build(fd, *input tensors)`` on ``inputs``, and the host IR text."""
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(tuple(t.shape), dtype=t.dtype) for t in inputs]
        for out in build(fd, *tvs):
            fd.add_output(out)
    return fd.execute(inputs), str(fd.host_ir())


@pytest.mark.parametrize("name", list(REFERENCES))
def test_reduction(name: str) -> None:
    """Each reduction over one dim, a negative dim kept, two dims, and every dim (None)."""
    x = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(1)) + 0.5
    cases = [(1, (1,), False), (-1, (2,), True), ([0, 2], (0, 2), False), (None, (0, 1, 2), False)]

    def build(fd, a):
        return [getattr(fd.ops, name)(a, dims, keepdim=keep) for dims, _, keep in cases]

    outs, text = _run(build, [x])
    for out, (_, dims, keep) in zip(outs, cases, strict=True):
        torch.testing.assert_close(out, REFERENCES[name](x, dims, keep))
    assert f"= {name}(T0, dims=[1]" in text, text  # one instruction, the op's own keyword


DTYPE_CASES = [
    # op, operand dtype, dtype argument, result dtype (nvFuser's rules, docs/ops.md)
    ("sum", F16, None, F16),
    ("sum", I32, None, I64),
    ("sum", BOOL, None, I64),
    ("sum", F16, DataType.Float, F32),
    ("sum", I32, torch.float64, F64),
    ("sum", F32, DataType.Null, F32),
    ("prod", I32, None, I64),
    ("prod", BF16, None, BF16),
    ("max", F16, None, F16),
    ("max", I32, None, I32),
    ("min", BOOL, None, BOOL),
    ("mean", F16, None, F32),
    ("mean", I32, None, F64),
    ("var", BF16, None, F32),
    ("var", I64, None, F64),
]


def _data(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype is BOOL:
        return torch.rand(4, 6, generator=generator) > 0.5
    if dtype in (I32, I64):
        return torch.randint(-3, 4, (4, 6), generator=generator, dtype=dtype)
    return (torch.rand(4, 6, generator=generator) + 0.5).to(dtype)


def _reference(op: str, x: torch.Tensor, result: torch.dtype) -> torch.Tensor:
    if op in ("mean", "var"):
        wide = x.to(result)
        return wide.mean(1) if op == "mean" else wide.var(1)
    if op in ("sum", "prod"):
        return REFERENCES[op](x.to(result), (1,), False)
    return REFERENCES[op](x, (1,), False)


@pytest.mark.parametrize(("op", "operand", "dtype", "result"), DTYPE_CASES, ids=str)
def test_dtype_rule(op: str, operand: torch.dtype, dtype, result: torch.dtype) -> None:
    """The declared result dtype, and the values, on random data."""
    x = _data(operand, torch.Generator().manual_seed(2))
    keywords = {"dtype": dtype} if dtype is not None else {}
    (out,), _ = _run(lambda fd, a: [getattr(fd.ops, op)(a, [1], **keywords)], [x])
    assert out.dtype == result
    torch.testing.assert_close(out, _reference(op, x, result))


def test_composites() -> None:
    """mean, var (three corrections), var_mean kept and not, welford: torch's values."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3), dtype=F64)

    def build(fd, a):
        outs = [fd.ops.mean(a, [0, 2]), fd.ops.mean(a, -1, keepdim=True), fd.ops.mean(a)]
        outs += [fd.ops.var(a, [1], correction=c) for c in (0, 1, 2)]
        outs += [*fd.ops.var_mean(a, [2], correction=0, keepdim=True), *fd.ops.var_mean(a, 0)]
        return outs + list(fd.ops.welford(a, [0, 2]))

    outs, _ = _run(build, [x])
    centred = x - x.mean((0, 2), keepdim=True)
    expected = [x.mean((0, 2)), x.mean(-1, keepdim=True), x.mean()]
    expected += [x.var(1, correction=c) for c in (0, 1, 2)]
    expected += [*torch.var_mean(x, 2, correction=0, keepdim=True), *torch.var_mean(x, 0)]
    expected += [x.mean((0, 2)), (centred * centred).sum((0, 2)), torch.full((4,), 15)]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want)


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (lambda fd, f, h: fd.ops.max(f, 0, dtype=DataType.Double), ("max of T0", "no dtype")),
        (lambda fd, f, h: fd.ops.sum(f, [0, -2]), ("sum", "repeat")),
        (lambda fd, f, h: fd.ops.min(f, 2), ("min", "dim 2", "T0")),
        (lambda fd, f, h: fd.ops.prod(f, []), ("prod of T0", "empty")),
        (lambda fd, f, h: fd.ops.sum(f, 0, dtype="float"), ("sum", "dtype")),
        (lambda fd, f, h: fd.ops.mean(f, 0, keepdim=1), ("mean", "keepdim")),
        (lambda fd, f, h: fd.ops.welford(h, [0]), ("welford", "T1", "Half", "upcast")),
        (lambda fd, f, h: fd.ops.var_mean(fd.ops.cast(f, DataType.Int), [0]), ("var_mean", "Int")),
        (lambda fd, f, h: fd.ops.var(f, 1, correction=-1), ("var of T0", "correction")),
        (lambda fd, f, h: fd.ops.var(f, 1, correction=9), ("var of T0", "correction 9", "8")),
    ],
    ids=[
        "max_dtype",
        "repeated_dims",
        "dim_out_of_range",
        "empty_dims",
        "dtype_not_a_dtype",
        "keepdim_not_bool",
        "welford_half",
        "var_mean_int",
        "negative_correction",
        "correction_too_large",
    ],
)
def test_refusals(build: Callable, fragments: tuple[str, ...]) -> None:
    """Bad operands and arguments are refused when the op is defined, by name."""
    with FusionDefinition() as fd:
        f = fd.define_tensor((4, 8))
        h = fd.define_tensor((4, 8), dtype=DataType.Half)
        with pytest.raises(OperandError) as caught:
            build(fd, f, h)
        fd.add_output(f)
    assert isinstance(caught.value, HostIrError)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def test_the_instruction_prints_parses_and_is_verified() -> None:
    """``Reduction`` round-trips through text and JSON, and the verifier checks the declared
    dtype rule (sum of int32 is int64; max takes no dtype) and the reduced extents."""
    text = """%HostIrContainer {
  input T0 : int32[4, 6]
  T1 : int64[4] = sum(T0, dims=[1], keepdim=false)
  T2 : int32[1, 6] = max(T0, dims=[0], keepdim=true)
  T3 : float64[] = prod(T0, dims=[0, 1], keepdim=false, dtype=float64)
  output T1
  output T2
  output T3
}
"""
    program = hostir.parse(text)
    assert str(program) == text
    assert hostir.HostIrContainer.from_json(program.to_json()) == program
    x = torch.randint(-2, 3, (4, 6), dtype=I32)
    outs = hostir.HostIrEvaluator(program).run([x])
    expected = [x.sum(1), x.amax(0, keepdim=True), x.double().prod()]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want)
    sum_line = "T1 : int64[4] = sum(T0, dims=[1], keepdim=false)"
    max_line = "T2 : int32[1, 6] = max(T0, dims=[0], keepdim=true)"
    edits = [
        (sum_line, sum_line.replace("int64", "int32"), "int64"),
        (sum_line, sum_line.replace("[4]", "[6]"), "extents"),
        (max_line, max_line.replace("true)", "true, dtype=int64)"), "takes no dtype"),
    ]
    for line, wrong, fragment in edits:
        with pytest.raises(VerifyError, match=fragment):
            hostir.parse(text.replace(line, wrong))


# ----- sharded ----------------------------------------------------------------------------


def _shard(tvs, mesh: DeviceMesh, dim: int, d: int) -> None:
    """Each of ``tvs`` on ``mesh``, logical axis ``dim`` split over mesh_x."""
    for tv in tvs:
        tv.set_device_mesh(mesh)
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)


def _collectives(text: str) -> list[str]:
    """The collective lines of host IR text."""
    return [line.strip() for line in text.splitlines() if re.search(r"= [A-Z]\w+\(", line)]


@pytest.mark.world_sizes(1, 2, 4)
def test_reductions_over_a_sharded_dim(multidevice_test) -> None:
    """Over a sharded dim, each op leaves partial results that one Allreduce with the op's
    combine finishes (never a sum of maxes); with the output sharded on the same mesh axis
    (nvFuser's reduce-scatter form) one ReduceScatter instead. Over an unsharded dim of
    the sharded tensor: local."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x = torch.rand(2 * d, 3 * d, generator=torch.Generator().manual_seed(5)) + 0.5
    with FusionDefinition() as fd:
        a = fd.define_tensor((2 * d, 3 * d))
        replicated = [getattr(fd.ops, name)(a, [1]) for name in REFERENCES]
        scattered = [fd.ops.sum(a, [1]), fd.ops.max(a, [1])]
        local = fd.ops.min(a, [0])
        for out in [*replicated, *scattered, local]:
            fd.add_output(out)
    _shard([a, *scattered], mesh, 1, d)  # the inputs' dim, the outputs' reduction axis
    _shard(scattered, mesh, 0, d)  # and the outputs' data dim: reduce-scatter
    _shard([local], mesh, 1, d)  # its data axis (logical axis 0 is the reduced one)
    outs = fd.execute([shard_tensor(x, a, rank)])
    expected = [ref(x, (1,), False) for ref in REFERENCES.values()]
    expected += [x.sum(1), x.amax(1), x.amin(0)]
    tvs = [*replicated, *scattered, local]
    for out, want, tv in zip(outs, expected, tvs, strict=True):
        torch.testing.assert_close(out, shard_tensor(want, tv, rank))
    collectives = _collectives(str(fd.host_ir()))
    if d > 1:
        kinds = [re.search(r"= (\w+)\(.*op=(\w+)", line).groups() for line in collectives]
        assert kinds == [("Allreduce", op) for op in REFERENCES] + [
            ("ReduceScatter", "sum"),
            ("ReduceScatter", "max"),
        ], collectives


@pytest.mark.world_sizes(1, 2, 4)
def test_var_mean_with_a_large_mean_sharded_over_the_reduced_dim(multidevice_test) -> None:
    """Two passes (the global mean, then the squared deviations from it) agree with torch at
    float32 tolerance on 1e4 + randn; each pass one Allreduce of a row statistic."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x = 1e4 + torch.randn(3, 16 * d, generator=torch.Generator().manual_seed(6))
    with FusionDefinition() as fd:
        a = fd.define_tensor((3, 16 * d))
        var, mean = fd.ops.var_mean(a, [1])
        avg, var_sum, n = fd.ops.welford(a, [1])
        for out in (var, mean, fd.ops.var(a, 1, correction=0), avg, var_sum, n):
            fd.add_output(out)
    _shard([a], mesh, 1, d)
    outs = fd.execute([shard_tensor(x, a, rank)])
    centred = x.double() - x.double().mean(1, keepdim=True)
    expected = [*torch.var_mean(x, 1), x.var(1, correction=0), x.mean(1)]
    expected += [(centred * centred).sum(1).float(), torch.full((3,), 16 * d)]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want)
    collectives = _collectives(str(fd.host_ir()))
    if d > 1:
        assert len(collectives) == 6 and all("Allreduce" in c for c in collectives), collectives
        assert all("float32[3]" in c for c in collectives), collectives


@pytest.mark.world_sizes(1, 2, 4)
def test_softmax_and_layernorm_over_a_sharded_dim_gather_nothing(multidevice_test) -> None:
    """A softmax and a layernorm over the sharded dim, written with these ops: the host IR
    reduces only the per-row statistics (Allreduces of [rows] tensors), gathers nothing,
    and the outputs stay sharded like the input."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x = torch.randn(4, 4 * d, generator=torch.Generator().manual_seed(7)) * 3 + 1
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 4 * d))
        row_max = fd.ops.broadcast(fd.ops.max(a, [1]), [False, True])
        e = fd.ops.exp(fd.ops.sub(a, row_max))
        softmax = fd.ops.div(e, fd.ops.sum(e, [1], keepdim=True))
        var, mean = fd.ops.var_mean(a, [1], correction=0, keepdim=True)
        layernorm = fd.ops.mul(fd.ops.sub(a, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        fd.add_output(softmax)
        fd.add_output(layernorm)
    _shard([a, softmax, layernorm], mesh, 1, d)
    outs = fd.execute([shard_tensor(x, a, rank)])
    expected = [torch.softmax(x, 1), torch.nn.functional.layer_norm(x, (4 * d,), eps=1e-5)]
    for out, want, tv in zip(outs, expected, [softmax, layernorm], strict=True):
        torch.testing.assert_close(out, shard_tensor(want, tv, rank))
    collectives = _collectives(str(fd.host_ir()))
    if d > 1:
        assert len(collectives) == 4, collectives  # max, sum; mean, squared deviations
        assert all("Allreduce" in c and "float32[4]" in c for c in collectives), collectives


@pytest.mark.world_sizes(1, 2, 4)
def test_rfactor(multidevice_test) -> None:
    """nvFuser's manual rfactor: the rfactored tensor reduces each rank's shard (its
    reduction axis parallelized over mesh_x: partial results), the original finishes the
    reduction with one Allreduce of the reduction's op."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    x = torch.randn(3, 4 * d, generator=torch.Generator().manual_seed(8))
    with FusionDefinition() as fd:
        a = fd.define_tensor((3, 4 * d))
        outs = [fd.ops.sum(a, [1]), fd.ops.max(a, [1])]
        for out in outs:
            fd.add_output(out)
        _shard([a], mesh, 1, d)
        for out in outs:
            out.set_device_mesh(mesh)
            out.outer_split(1, d)  # [i{3}, r{d}, r{4}]
            local = out.rfactor(axes=[-1])
            local.axis(1).parallelize(ParallelType.mesh_x)
    results = fd.execute([shard_tensor(x, a, rank)])
    torch.testing.assert_close(results, [x.sum(1), x.amax(1)])
    collectives = _collectives(str(fd.host_ir()))
    if d > 1:
        assert ["Allreduce" in c for c in collectives] == [True, True], collectives
        assert "op=sum" in collectives[0] and "op=max" in collectives[1], collectives


def test_rfactor_refusals() -> None:
    """rfactor names reduction loop axes of a tensor an op defines; anything else is refused
    by name."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((3, 4))
        out = fd.ops.sum(a, [1])
        fd.add_output(out)
    with pytest.raises(ScheduleError, match=r"rfactor of T1: loop axis 0 .* is not a reduction"):
        out.rfactor([0])
    with pytest.raises(ScheduleError, match=r"rfactor of T0: loop axis 1 .* is not a reduction"):
        a.rfactor(1)
    with pytest.raises(ScheduleError, match="out of range for T1"):
        out.rfactor([5])
