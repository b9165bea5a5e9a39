"""The pointwise ops of ``hostir.ir.ops`` against torch: every op unsharded, every op in one
program sharded over 1, 2 and 4 ranks, nvFuser's dtype promotion, and the refusals."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    OperandError,
    ParallelType,
    shard_tensor,
)
from hostir import HostIrError
from hostir.ir.ops import POINTWISE_OPS

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
I32, I64, BOOL = torch.int32, torch.int64, torch.bool

UNARY_REFERENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg,
    "abs": torch.abs,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": torch.nn.functional.silu,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "tanh_gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "erf": torch.erf,
}
BINARY_REFERENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "truediv": torch.true_divide,
    "pow": torch.pow,
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
}


def test_references_cover_every_declared_op() -> None:
    """A new declaration fails here until the tests below cover it."""
    assert set(UNARY_REFERENCES) | set(BINARY_REFERENCES) | {"where"} == set(POINTWISE_OPS)


def _positive(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Floats in [0.5, 2): every op defined, no division by near zero."""
    return torch.rand(shape, generator=generator) * 1.5 + 0.5


def _run(build: Callable, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(tuple(t.shape), dtype=t.dtype) for t in inputs]
        for out in build(fd, *tvs):
            fd.add_output(out)
    return fd.execute(inputs)


@pytest.mark.parametrize("name", list(UNARY_REFERENCES))
def test_unary_op(name: str) -> None:
    """Each unary op on float32 (values of both signs, positive for log and the roots)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, generator=generator)
    if name in ("log", "sqrt", "rsqrt"):
        x = _positive((4, 6), generator)
    (out,) = _run(lambda fd, t: [getattr(fd.ops, name)(t)], [x])
    torch.testing.assert_close(out, UNARY_REFERENCES[name](x))


@pytest.mark.parametrize("name", list(BINARY_REFERENCES))
def test_binary_op(name: str) -> None:
    """Each binary op on float32 tensors broadcast together, and with a scalar each side."""
    generator = torch.Generator().manual_seed(2)
    x, y = _positive((4, 6), generator), _positive((6,), generator)
    y[0] = x[0, 0]  # an equal pair, for the comparisons
    ref = BINARY_REFERENCES[name]

    def build(fd, a, b):
        op = getattr(fd.ops, name)
        return [op(a, b), op(a, 1.25), op(0.75, b)]

    outs = _run(build, [x, y])
    expected = [ref(x, y), ref(x, torch.tensor(1.25)), ref(torch.tensor(0.75), y)]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want)


def test_where_and_gelu_forms() -> None:
    """where with tensors and scalars; gelu's two approximations by keyword."""
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(4, 6, generator=generator), torch.randn(6, generator=generator)

    def build(fd, a, b):
        condition = fd.ops.gt(a, b)
        return [
            fd.ops.where(condition, a, b),
            fd.ops.where(condition, a, 0.0),
            fd.ops.where(condition, 1.0, -1.0),
            fd.ops.gelu(a, approximate="tanh"),
            fd.ops.gelu(a),
        ]

    outs = _run(build, [x, y])
    condition = x > y
    expected = [
        torch.where(condition, x, y),
        torch.where(condition, x, 0.0),
        torch.where(condition, 1.0, -1.0).double(),  # two Double scalars: a Double result
        torch.nn.functional.gelu(x, approximate="tanh"),
        torch.nn.functional.gelu(x),
    ]
    for out, want in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, want)


# ----- nvFuser's promotion ------------------------------------------------------------------

PROMOTION_CASES = [
    # (op, operand dtypes or Python scalars, the result dtype nvFuser gives)
    ("add", (F16, F16), F32),  # reduced precision computes in Float and returns Float
    ("mul", (BF16, BF16), F32),
    ("add", (F16, BF16), F32),
    ("sub", (F16, 2.0), F32),
    ("add", (I32, I64), I64),
    ("add", (I32, 3), I32),  # a scalar does not raise a tensor within its category
    ("mul", (F32, 2.5), F32),
    ("mul", (I64, 2.5), F64),  # ... but an int tensor with a Double scalar is Double
    ("add", (BOOL, 1), I64),
    ("div", (I64, I64), I64),  # C++ division: truncates towards zero
    ("truediv", (I64, I64), F32),
    ("pow", (I32, I32), I32),
    ("exp", (I64,), F32),  # float ops on integers give Float
    ("sqrt", (BOOL,), F32),
    ("gelu", (I32,), F32),
    ("tanh", (F16,), F32),
    ("exp", (F64,), F64),
    ("neg", (F16,), F32),  # neg promotes (nvFuser issue #1541) ...
    ("abs", (F16,), F16),  # ... abs, relu and silu keep Half
    ("relu", (BF16,), BF16),
    ("silu", (F16,), F16),
    ("lt", (F16, F32), BOOL),  # comparisons give Bool
    ("eq", (I32, 2.5), BOOL),
    ("ne", (BOOL, BOOL), BOOL),
    ("where", (BOOL, F16, F16), F16),  # where keeps Half
    ("where", (BOOL, F16, F32), F32),
    ("where", (BOOL, I32, 2.5), F64),
]


def _data(dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Small random values of ``dtype``: nonzero integers (divisors), positive floats."""
    if dtype is BOOL:
        return torch.rand(3, 4, generator=generator) > 0.5
    if not dtype.is_floating_point:
        signs = torch.where(torch.rand(3, 4, generator=generator) > 0.5, 1, -1)
        return (torch.randint(1, 4, (3, 4), generator=generator) * signs).to(dtype)
    return _positive((3, 4), generator).to(dtype)


def _reference(name: str, operands: list, result: torch.dtype) -> torch.Tensor:
    """torch on the operands cast up front as the promotion table says (comparisons in the
    wider of the two dtypes), checked against the stated result dtype."""
    if name == "where":
        condition, *values = operands
        values = [v.to(result) if isinstance(v, torch.Tensor) else v for v in values]
        return torch.where(condition, *values).to(result)
    tensors = [o for o in operands if isinstance(o, torch.Tensor)]
    compute = result
    if result is BOOL:
        compute = torch.promote_types(*[t.dtype for t in tensors]) if len(tensors) > 1 else F64
        compute = F32 if compute in (F16, BF16) else compute
    cast = [o.to(compute) if isinstance(o, torch.Tensor) else o for o in operands]
    if name == "div" and not compute.is_floating_point:
        return torch.div(*cast, rounding_mode="trunc")
    if name in UNARY_REFERENCES:
        return UNARY_REFERENCES[name](*cast)
    lhs, rhs = cast
    return BINARY_REFERENCES[name](
        lhs, torch.tensor(rhs) if not isinstance(rhs, torch.Tensor) else rhs
    )


@pytest.mark.parametrize(("name", "dtypes", "result"), PROMOTION_CASES, ids=str)
def test_promotion(name: str, dtypes: tuple, result: torch.dtype) -> None:
    """The declared result dtype and the values, on random data."""
    generator = torch.Generator().manual_seed(4)
    operands = [d if not isinstance(d, torch.dtype) else _data(d, generator) for d in dtypes]
    tensors = [o for o in operands if isinstance(o, torch.Tensor)]

    def build(fd, *tvs):
        it = iter(tvs)
        args = [next(it) if isinstance(o, torch.Tensor) else o for o in operands]
        return [getattr(fd.ops, name)(*args)]

    (out,) = _run(build, tensors)
    assert out.dtype == result
    torch.testing.assert_close(out, _reference(name, operands, result))


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (lambda fd, f, b: fd.ops.neg(b), ("neg", "T1", "bool")),
        (lambda fd, f, b: fd.ops.silu(fd.ops.cast(f, DataType.Int)), ("silu", "int64", "float")),
        (lambda fd, f, b: fd.ops.where(f, f, f), ("where", "condition T0", "bool")),
        (lambda fd, f, b: fd.ops.sub(b, b), ("sub", "T1", "bool")),
        (lambda fd, f, b: fd.ops.gelu(f, approximate="erf"), ("gelu", "'none' or 'tanh'")),
    ],
    ids=["neg_bool", "silu_int", "where_float_condition", "sub_bool", "gelu_erf"],
)
def test_refusals(build: Callable, fragments: tuple[str, ...]) -> None:
    """An operand an op does not take is refused at definition, naming the op and it."""
    with FusionDefinition() as fd:
        f = fd.define_tensor((4,))
        b = fd.define_tensor((4,), dtype=DataType.Bool)
        with pytest.raises(OperandError) as caught:
            build(fd, f, b)
        fd.add_output(f)
    assert isinstance(caught.value, HostIrError)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


# ----- sharded ----------------------------------------------------------------------------


@pytest.mark.world_sizes(1, 2, 4)
def test_every_op_sharded(multidevice_test) -> None:
    """One program with every op, its inputs' dim 0 sharded over the ranks: each rank
    computes its rows, no communication."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(5)
    x, y = _positive((2 * d, 6), generator), _positive((2 * d, 6), generator)
    with FusionDefinition() as fd:
        a, b = fd.define_tensor((2 * d, 6)), fd.define_tensor((2 * d, 6))
        outs = [getattr(fd.ops, name)(a) for name in UNARY_REFERENCES]
        outs += [getattr(fd.ops, name)(a, b) for name in BINARY_REFERENCES]
        outs.append(fd.ops.where(fd.ops.lt(a, b), a, 2.0))
        for out in outs:
            fd.add_output(out)
    for tv in [a, b, *outs]:
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    results = fd.execute([shard_tensor(x, a, rank), shard_tensor(y, b, rank)])
    expected = [ref(x) for ref in UNARY_REFERENCES.values()]
    expected += [ref(x, y) for ref in BINARY_REFERENCES.values()]
    expected.append(torch.where(x < y, x, 2.0))
    for out, tv, want in zip(results, outs, expected, strict=True):
        torch.testing.assert_close(out, shard_tensor(want, tv, rank))
    text = str(fd.host_ir())
    assert "Allgather" not in text and "Allreduce" not in text, text
