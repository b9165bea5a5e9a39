"""``fd.ops`` checked against torch: each op alone, in fusions, dtypes and symbolic shapes.

Every test builds a fusion, runs it on random data in this process (no
multi-rank harness), compares the outputs with torch on the same inputs, and
checks the lowered host IR text for the expected instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from frontend import FusionDefinition, OperandError, TensorView

# ----- helpers -----

Build = Callable[..., TensorView | Sequence[TensorView]]
Reference = Callable[..., torch.Tensor | Sequence[torch.Tensor]]


def random_tensor(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Random data of ``dtype``: normal floats, small signed ints, or random bools."""
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape)).bool()
    if not dtype.is_floating_point:
        return torch.randint(-5, 6, tuple(shape), dtype=dtype)
    return torch.randn(tuple(shape)).to(dtype)


def as_list(value: Any) -> list:
    """``value`` as a list (a lone tensor becomes a one-element list)."""
    return list(value) if isinstance(value, list | tuple) else [value]


def define_fusion(
    specs: Sequence[tuple[Sequence[int], torch.dtype]], build: Build
) -> FusionDefinition:
    """A fusion with one tensor input per ``(shape, dtype)`` spec; ``build`` returns outputs."""
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(shape, dtype=dtype) for shape, dtype in specs]
        for out in as_list(build(fd, *tvs)):
            fd.add_output(out)
    return fd


def check_outputs(
    fd: FusionDefinition, outputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]
) -> None:
    """Values, shapes and dtypes equal torch's, and the declared output dtypes too."""
    assert len(outputs) == len(expected)
    for out, ref, tv in zip(outputs, expected, fd.fusion.outputs(), strict=True):
        assert out.dtype == ref.dtype, f"{tv.name}: got {out.dtype}, torch gives {ref.dtype}"
        assert tv.dtype.to_torch() == ref.dtype, f"{tv.name} is declared {tv.dtype.name}"
        torch.testing.assert_close(out, ref)


def check_host_ir(fd: FusionDefinition, keywords: Sequence[str]) -> str:
    """The host IR text is a program with one ``= keyword(`` instruction per keyword."""
    text = str(fd.host_ir())
    assert text.startswith("%HostIrContainer {"), text
    for keyword in keywords:
        assert f"= {keyword}(" in text, f"no {keyword} instruction in:\n{text}"
    return text


def run_and_check(
    specs: Sequence[tuple[Sequence[int], torch.dtype]],
    build: Build,
    reference: Reference,
    keywords: Sequence[str],
    scalars: Sequence[Any] = (),
) -> FusionDefinition:
    """Defines, executes and checks a fusion against ``reference`` on the same random inputs."""
    fd = define_fusion(specs, build)
    tensors = [random_tensor(shape, dtype) for shape, dtype in specs]
    outputs = fd.execute(tensors + list(scalars))
    check_outputs(fd, outputs, as_list(reference(*tensors, *scalars)))
    check_host_ir(fd, keywords)
    return fd


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool


# ----- each op alone -----


@dataclass(frozen=True)
class OpCase:
    """One op on inputs of ``shapes``: the fusion, its torch reference, its IR keyword."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    build: Build
    reference: Reference
    keyword: str


OP_CASES = [
    OpCase("set", ((4, 8),), lambda fd, x: fd.ops.set(x), lambda x: x.clone(), "set"),
    OpCase("add", ((4, 8), (4, 8)), lambda fd, x, y: fd.ops.add(x, y), torch.add, "add"),
    OpCase("sub", ((4, 8), (4, 8)), lambda fd, x, y: fd.ops.sub(x, y), torch.sub, "sub"),
    OpCase("mul", ((4, 8), (4, 8)), lambda fd, x, y: fd.ops.mul(x, y), torch.mul, "mul"),
    OpCase("div", ((4, 8), (4, 8)), lambda fd, x, y: fd.ops.div(x, y), torch.div, "div"),
    OpCase("neg", ((4, 8),), lambda fd, x: fd.ops.neg(x), torch.neg, "neg"),
    OpCase("relu", ((4, 8),), lambda fd, x: fd.ops.relu(x), torch.relu, "relu"),
    OpCase(
        "cast",
        ((4, 8),),
        lambda fd, x: fd.ops.cast(x, torch.float64),
        lambda x: x.to(torch.float64),
        "cast",
    ),
    OpCase("sum", ((4, 8),), lambda fd, x: fd.ops.sum(x, [1]), lambda x: x.sum([1]), "sum"),
    OpCase(
        "linear",
        ((6, 8), (16, 8)),
        lambda fd, x, w: fd.ops.linear(x, w),
        torch.nn.functional.linear,
        "linear",
    ),
    OpCase(
        "linear_bias",
        ((2, 6, 8), (16, 8), (16,)),
        lambda fd, x, w, b: fd.ops.linear(x, w, b),
        torch.nn.functional.linear,
        "linear",
    ),
    OpCase(
        "matmul", ((6, 8), (8, 5)), lambda fd, a, b: fd.ops.matmul(a, b), torch.matmul, "matmul"
    ),
    OpCase(
        "matmul_batched",
        ((3, 6, 8), (8, 5)),
        lambda fd, a, b: fd.ops.matmul(a, b),
        torch.matmul,
        "matmul",
    ),
    OpCase(
        "broadcast_in_dim",
        ((3,),),
        lambda fd, x: fd.ops.broadcast_in_dim(x, [2, 3, 4], [1]),
        lambda x: x[None, :, None].expand(2, 3, 4),
        "broadcast_in_dim",
    ),
    OpCase(
        "permute",
        ((2, 3, 4),),
        lambda fd, x: fd.ops.permute(x, [2, 0, 1]),
        lambda x: x.permute(2, 0, 1),
        "permute",
    ),
]


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_op_float32(case: OpCase) -> None:
    """Each op alone on float32 matches torch."""
    specs = [(shape, F32) for shape in case.shapes]
    run_and_check(specs, case.build, case.reference, [case.keyword])


LOW_PRECISION_CASES = [c for c in OP_CASES if c.name in {"add", "mul", "linear", "matmul", "sum"}]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
@pytest.mark.parametrize("case", LOW_PRECISION_CASES, ids=lambda c: c.name)
def test_op_low_precision(case: OpCase, dtype: torch.dtype) -> None:
    """linear/matmul/sum on bfloat16 and float16 match torch on the same dtype; add and
    mul compute and return float32, as nvFuser (docs/ops.md)."""
    specs = [(shape, dtype) for shape in case.shapes]
    reference = case.reference
    if case.name in ("add", "mul"):
        reference = lambda *ts: case.reference(*(t.float() for t in ts))  # noqa: E731
    run_and_check(specs, case.build, reference, [case.keyword])


@pytest.mark.parametrize(
    ("source", "target"),
    [(BF16, F32), (F16, F32), (F32, BF16), (F32, F16), (BF16, F16), (F16, I32), (F32, BOOL)],
    ids=str,
)
def test_cast(source: torch.dtype, target: torch.dtype) -> None:
    """cast between float, bfloat16, float16, int32 and bool matches ``Tensor.to``."""
    run_and_check(
        [((4, 8), source)],
        lambda fd, x: fd.ops.cast(x, target),
        lambda x: x.to(target),
        ["cast"],
    )


# ----- ops with scalars -----


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_with_python_number(op: str) -> None:
    """A binary op with a Python float on either side matches torch."""
    fn = getattr(torch, op)
    run_and_check(
        [((4, 8), F32)],
        lambda fd, x: [getattr(fd.ops, op)(x, 2.5), getattr(fd.ops, op)(-1.5, x)],
        lambda x: [fn(x, 2.5), fn(-1.5, x)],
        [op],
    )


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_with_scalar_input(op: str) -> None:
    """A binary op with a ``define_scalar()`` input bound at execute matches torch."""

    def build(fd: FusionDefinition, x: TensorView) -> TensorView:
        return getattr(fd.ops, op)(x, fd.define_scalar())

    fd = run_and_check(
        [((4, 8), F32)], build, lambda x, s: getattr(torch, op)(x, s), [op], scalars=[0.75]
    )
    assert "input s0 : float64" in str(fd.host_ir())


def test_binary_with_scalar_constant() -> None:
    """A ``define_scalar(value)`` constant is folded into the instruction."""

    def build(fd: FusionDefinition, x: TensorView) -> TensorView:
        return fd.ops.mul(fd.define_scalar(3.0), x)

    fd = run_and_check([((4,), F16)], build, lambda x: 3.0 * x.float(), ["mul"])
    assert "mul(3.0, T0)" in str(fd.host_ir())


# ----- fusions of several ops -----


def test_linear_bias_relu_sum() -> None:
    """linear with bias, then relu, then sum over the features."""
    run_and_check(
        [((6, 8), F32), ((16, 8), F32), ((16,), F32)],
        lambda fd, x, w, b: fd.ops.sum(fd.ops.relu(fd.ops.linear(x, w, b)), [-1]),
        lambda x, w, b: torch.relu(torch.nn.functional.linear(x, w, b)).sum(-1),
        ["linear", "relu", "sum"],
    )


def test_matmul_permute_add_broadcast_bias() -> None:
    """matmul, permute, then add of a bias placed by broadcast_in_dim."""

    def build(fd: FusionDefinition, a: TensorView, b: TensorView, bias: TensorView) -> TensorView:
        y = fd.ops.permute(fd.ops.matmul(a, b), [0, 2, 1])  # [2, 5, 4]
        return fd.ops.add(y, fd.ops.broadcast_in_dim(bias, [2, 5, 4], [1]))

    run_and_check(
        [((2, 4, 8), F32), ((8, 5), F32), ((5,), F32)],
        build,
        lambda a, b, bias: (a @ b).permute(0, 2, 1) + bias[None, :, None],
        ["matmul", "permute", "broadcast_in_dim", "add"],
    )


def test_cast_mul_scalar_sub_neg() -> None:
    """cast to float, multiply by a scalar input, subtract, negate."""

    def build(fd: FusionDefinition, x: TensorView, y: TensorView) -> TensorView:
        scaled = fd.ops.mul(fd.ops.cast(x, torch.float32), fd.define_scalar())
        return fd.ops.neg(fd.ops.sub(scaled, y))

    run_and_check(
        [((4, 8), BF16), ((4, 8), F32)],
        build,
        lambda x, y, s: -(x.float() * s - y),
        ["cast", "mul", "sub", "neg"],
        scalars=[1.5],
    )


def test_set_div_python_float() -> None:
    """set, then division by a Python float."""
    run_and_check(
        [((3, 5), F32)],
        lambda fd, x: fd.ops.div(fd.ops.set(x), 4.0),
        lambda x: x / 4.0,
        ["set", "div"],
    )


def test_mlp_bfloat16_multiple_outputs() -> None:
    """A bfloat16 two-layer MLP with an intermediate also returned as an output."""

    def build(fd: FusionDefinition, x: TensorView, w1: TensorView, w2: TensorView) -> list:
        hidden = fd.ops.relu(fd.ops.linear(x, w1))
        return [hidden, fd.ops.cast(fd.ops.linear(hidden, w2), torch.float32)]

    def reference(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> list:
        hidden = torch.relu(torch.nn.functional.linear(x, w1))
        return [hidden, torch.nn.functional.linear(hidden, w2).float()]

    run_and_check(
        [((4, 8), BF16), ((16, 8), BF16), ((8, 16), BF16)],
        build,
        reference,
        ["linear", "relu", "cast"],
    )


def test_sum_keepdim_then_sub() -> None:
    """x - sum(x, keepdim=True) broadcasts the kept dim back (a centered tensor)."""
    run_and_check(
        [((4, 6), F32)],
        lambda fd, x: fd.ops.sub(x, fd.ops.sum(x, [-1], keepdim=True)),
        lambda x: x - x.sum(-1, keepdim=True),
        ["sum", "broadcast_in_dim", "sub"],
    )


def test_input_reused_and_returned() -> None:
    """An input used twice and also returned as an output."""
    run_and_check(
        [((3, 4), F32)],
        lambda fd, x: [x, fd.ops.mul(x, fd.ops.neg(x))],
        lambda x: [x, x * -x],
        ["neg", "mul"],
    )


# ----- broadcasting -----


@pytest.mark.parametrize(
    ("lhs", "rhs"),
    [
        ((4, 1, 8), (3, 1)),
        ((8,), (2, 3, 8)),
        ((2, 1, 4), (3, 1)),
        ((1,), (5, 2)),
        ((5, 1), (1, 7)),
        ((), (2, 3)),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_broadcasting_different_ranks(op: str, lhs: tuple, rhs: tuple) -> None:
    """Elementwise ops broadcast like torch (dims aligned from the right, size-1 dims expand)."""
    run_and_check(
        [(lhs, F32), (rhs, F32)],
        lambda fd, a, b: getattr(fd.ops, op)(a, b),
        getattr(torch, op),
        [op],
    )


def test_broadcasting_symbolic() -> None:
    """A symbolic [-1, -1] tensor plus a symbolic [-1] tensor, as torch broadcasts."""
    fd = define_fusion([((-1, -1), F32), ((-1,), F32)], lambda fd, a, b: fd.ops.add(a, b))
    a, b = torch.randn(4, 3), torch.randn(3)
    check_outputs(fd, fd.execute([a, b]), [a + b])
    check_host_ir(fd, ["add"])


def test_matmul_batch_broadcast() -> None:
    """matmul broadcasts batch dims of different ranks and size 1."""
    run_and_check(
        [((2, 1, 4, 8), F32), ((3, 8, 5), F32)],
        lambda fd, a, b: fd.ops.matmul(a, b),
        torch.matmul,
        ["matmul"],
    )


@pytest.mark.parametrize(
    ("shape", "out_shape", "dims"),
    [
        ((3,), [2, 3, 4], [1]),
        ((1, 3), [5, 3], [0, 1]),
        ((2, 3), [2, 1, 3], [0, 2]),
        ((4,), [4, 6], [0]),
    ],
    ids=str,
)
def test_broadcast_in_dim_shapes(shape: tuple, out_shape: list, dims: list) -> None:
    """broadcast_in_dim places dims and expands new and size-1 dims like reshape+expand."""

    def reference(x: torch.Tensor) -> torch.Tensor:
        view = [1] * len(out_shape)
        for src_dim, out_dim in enumerate(dims):
            view[out_dim] = x.shape[src_dim]
        return x.reshape(view).expand(out_shape)

    run_and_check(
        [(shape, F32)],
        lambda fd, x: fd.ops.broadcast_in_dim(x, out_shape, dims),
        reference,
        ["broadcast_in_dim"],
    )


# ----- sum -----


@pytest.mark.parametrize(
    ("dims", "keepdim"),
    [
        ([1], False),
        ([-1], True),
        ([0, 2], True),
        ([-3, -1], False),
        ([2, 0], False),
        ([0, 1, 2], False),
        ([0, 1, 2], True),
        (1, False),
        (-2, True),
    ],
    ids=str,
)
def test_sum_dims_keepdim(dims: int | list[int], keepdim: bool) -> None:
    """sum over one or several (negative) dims, with and without keepdim, as torch."""
    run_and_check(
        [((2, 3, 4), F32)],
        lambda fd, x: fd.ops.sum(x, dims, keepdim=keepdim),
        lambda x: torch.sum(x, dims, keepdim=keepdim),
        ["sum"],
    )


@pytest.mark.parametrize(
    ("source", "target"), [(F16, F32), (BF16, F32), (I32, I32), (F32, torch.float64)], ids=str
)
def test_sum_with_dtype(source: torch.dtype, target: torch.dtype) -> None:
    """sum(dtype=...) accumulates and returns in the requested dtype, as torch."""
    run_and_check(
        [((4, 8), source)],
        lambda fd, x: fd.ops.sum(x, [0], dtype=target),
        lambda x: torch.sum(x, [0], dtype=target),
        ["sum"],
    )


@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_empty_dims_consistent(keepdim: bool) -> None:
    """sum with an empty dims list is refused by name. torch reads ``dims=[]`` as every
    dim (the reference below), an IR as none: running it either way would be a wrong
    result for someone."""
    x = torch.randn(2, 3)
    torch.testing.assert_close(torch.sum(x, [], keepdim=keepdim).sum(), x.sum())  # all dims
    assert torch.sum(x, [], keepdim=keepdim).numel() == 1
    with pytest.raises(OperandError, match=r"sum of T0: dims is empty; name at least one dim"):
        define_fusion([((2, 3), F32)], lambda fd, t: fd.ops.sum(t, [], keepdim=keepdim))


# ----- integer and bool inputs -----


INTEGER_CASES = [
    pytest.param(
        [((4, 8), I32)],
        lambda fd, x: fd.ops.sum(x, [1]),
        lambda x: x.sum(1),
        "sum",
        id="sum_int32_to_int64",
    ),
    pytest.param(
        [((4, 8), BOOL)],
        lambda fd, x: fd.ops.sum(x, [0, 1]),
        lambda x: x.sum([0, 1]),
        "sum",
        id="sum_bool_to_int64",
    ),
    pytest.param(
        [((4, 8), I64)],
        lambda fd, x: fd.ops.sum(x, [-1], keepdim=True),
        lambda x: x.sum(-1, keepdim=True),
        "sum",
        id="sum_int64_keepdim",
    ),
    pytest.param(
        [((4,), BOOL), ((4,), I32)],
        lambda fd, x, y: fd.ops.add(x, y),
        torch.add,
        "add",
        id="add_bool_int32",
    ),
    pytest.param(
        [((4,), BOOL), ((4,), BOOL)],
        lambda fd, x, y: fd.ops.add(fd.ops.add(x, 1), y),
        lambda x, y: x.long() + 1 + y.long(),
        "add",
        id="add_bool_python_int",
    ),
    pytest.param(
        [((4,), I32), ((4,), I64)],
        lambda fd, x, y: fd.ops.mul(x, y),
        torch.mul,
        "mul",
        id="mul_int32_int64",
    ),
    pytest.param(
        [((4,), I32)],
        lambda fd, x: fd.ops.mul(x, 3),
        lambda x: x * 3,
        "mul",
        id="mul_int32_python_int",
    ),
    pytest.param(
        [((4,), I32)],
        lambda fd, x: fd.ops.add(x, 0.5),
        lambda x: x.double() + 0.5,  # nvFuser: a Double scalar raises an int tensor to Double
        "add",
        id="add_int32_python_float",
    ),
    pytest.param(
        [((4,), I32)],
        lambda fd, x: fd.ops.div(x, 2),
        lambda x: torch.div(x, 2, rounding_mode="trunc"),
        "div",
        id="div_int32_truncates",
    ),
    pytest.param(
        [((4,), I32)],
        lambda fd, x: fd.ops.truediv(x, 2),
        lambda x: x / 2,
        "truediv",
        id="truediv_int32_float",
    ),
    pytest.param(
        [((4,), BOOL)],
        lambda fd, x: fd.ops.mul(x, 1.5),
        lambda x: x.double() * 1.5,
        "mul",
        id="mul_bool_python_float",
    ),
    pytest.param(
        [((4,), I32), ((4,), F16)],
        lambda fd, x, y: fd.ops.sub(x, y),
        lambda x, y: x.float() - y.float(),
        "sub",
        id="sub_int32_half",
    ),
    pytest.param([((4,), I64)], lambda fd, x: fd.ops.neg(x), torch.neg, "neg", id="neg_int64"),
    pytest.param([((4,), I32)], lambda fd, x: fd.ops.relu(x), torch.relu, "relu", id="relu_int32"),
    pytest.param(
        [((4,), BOOL)],
        lambda fd, x: fd.ops.cast(x, torch.float32),
        lambda x: x.float(),
        "cast",
        id="cast_bool_float",
    ),
    pytest.param(
        [((3, 4), I32), ((4, 2), I32)],
        lambda fd, a, b: fd.ops.matmul(a, b),
        torch.matmul,
        "matmul",
        id="matmul_int32",
    ),
    pytest.param(
        [((3, 4), I64), ((2, 4), I64)],
        lambda fd, x, w: fd.ops.linear(x, w),
        torch.nn.functional.linear,
        "linear",
        id="linear_int64",
    ),
    pytest.param(
        [((2, 3), BOOL)],
        lambda fd, x: fd.ops.permute(fd.ops.set(x), [1, 0]),
        lambda x: x.t(),
        "permute",
        id="set_permute_bool",
    ),
]


@pytest.mark.parametrize(("specs", "build", "reference", "keyword"), INTEGER_CASES)
def test_integer_and_bool(specs: list, build: Build, reference: Reference, keyword: str) -> None:
    """Integer and bool inputs give nvFuser's values and result dtypes."""
    run_and_check(specs, build, reference, [keyword])


@pytest.mark.parametrize(
    ("lhs", "rhs", "result"),
    [
        (F16, F32, F32),
        (BF16, F16, F32),
        (BF16, F32, F32),
        (I32, F16, F32),
        (BOOL, BF16, F32),
        (I64, torch.float64, torch.float64),
        (I32, I64, I64),
    ],
    ids=str,
)
def test_promotion_is_nvfusers(lhs: torch.dtype, rhs: torch.dtype, result: torch.dtype) -> None:
    """Mixed-dtype add promotes as nvFuser: reduced precision computes in float32."""
    run_and_check(
        [((3, 4), lhs), ((3, 4), rhs)],
        lambda fd, a, b: fd.ops.add(a, b),
        lambda a, b: a.to(result) + b.to(result),
        ["add"],
    )


def test_scalar_input_keeps_declared_dtype() -> None:
    """A float scalar input bound to a Python int still gives the declared float result
    (Double: nvFuser's promotion of an int tensor by a Double scalar)."""

    def build(fd: FusionDefinition, x: TensorView) -> TensorView:
        return fd.ops.mul(x, fd.define_scalar())

    fd = define_fusion([((4,), I32)], build)
    (out,) = fd.execute([torch.arange(4, dtype=I32), 2])
    assert out.dtype == fd.fusion.outputs()[0].dtype.to_torch() == torch.float64
    torch.testing.assert_close(out, torch.arange(4, dtype=torch.float64) * 2.0)


# ----- symbolic shapes -----


def _symbolic_mlp(fd: FusionDefinition) -> None:
    x = fd.define_tensor((-1, 8))
    w = fd.define_tensor((16, 8))
    b = fd.define_tensor((16,))
    r = fd.define_tensor((-1, 1))
    y = fd.ops.add(fd.ops.relu(fd.ops.linear(x, w, b)), r)
    fd.add_output(y)
    fd.add_output(fd.ops.sum(y, [0]))


def _symbolic_reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, r: torch.Tensor):
    y = torch.relu(torch.nn.functional.linear(x, w, b)) + r
    return [y, y.sum(0)]


def test_symbolic_shapes_reused_across_sizes() -> None:
    """One fusion with -1 extents runs at 3 sizes; one lowering per shape, same IR text."""
    with FusionDefinition() as fd:
        _symbolic_mlp(fd)
    w, b = torch.randn(16, 8), torch.randn(16)
    texts = []
    for count, rows in enumerate([3, 5, 11], start=1):
        inputs = [torch.randn(rows, 8), w, b, torch.randn(rows, 1)]
        check_outputs(fd, fd.execute(inputs), _symbolic_reference(*inputs))
        assert fd.lowering_count == count
        check_outputs(fd, fd.execute(inputs), _symbolic_reference(*inputs))
        assert fd.lowering_count == count  # same shapes: the cached program
        texts.append(check_host_ir(fd, ["linear", "relu", "add", "sum"]))
    assert texts[0] == texts[1] == texts[2]
    assert "input T0 : float32[i0, 8]" in texts[0]
    assert "float32[i0, 16] = linear(" in texts[0]
    inputs = [torch.randn(3, 8), w, b, torch.randn(3, 1)]
    check_outputs(fd, fd.execute(inputs), _symbolic_reference(*inputs))
    assert fd.lowering_count == 3  # a size seen before is not lowered again


def test_symbolic_lowering_count_after_first_execute() -> None:
    """lowering_count is 1 after the first execute and stays 1 on the same shapes."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.neg(x))
    assert fd.lowering_count == 0
    data = torch.randn(2, 7)
    for _ in range(3):
        check_outputs(fd, fd.execute([data]), [-data])
        assert fd.lowering_count == 1
    assert "float32[i0, i1] = neg(T0)" in check_host_ir(fd, ["neg"])
