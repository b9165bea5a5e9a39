"""``FusionDefinition``: definition, operand and input errors, printing, symbolic inputs.

Each error test checks the exception class (all derive from
``hostir.HostIrError``) and that the message names the culprit: the tensor,
the dim, and the extents or dtypes involved.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import hostir
from frontend import (
    DataType,
    DefinitionError,
    DeviceMesh,
    FusionDefinition,
    HostIrError,
    InputError,
    OperandError,
    ParallelType,
    ScheduleError,
    TensorView,
    shard_tensor,
)
from hostir.run import bindings

# ----- helpers -----


def raises(error: type[Exception], *fragments: str) -> Any:
    """``pytest.raises(error)`` whose message must contain every fragment, in order."""
    assert issubclass(error, hostir.HostIrError)
    return pytest.raises(error, match=".*".join(re.escape(f) for f in fragments))


def define(
    specs: Sequence[tuple[Sequence[int], DataType]], build: Callable[..., object]
) -> FusionDefinition:
    """One tensor input per ``(shape, dtype)`` spec; a tensor ``build`` returns is an output."""
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor(shape, dtype=dtype) for shape, dtype in specs]
        result = build(fd, *tvs)
        if isinstance(result, TensorView):
            fd.add_output(result)
    return fd


def relu_fusion(shape: Sequence[int] = (4, 8)) -> FusionDefinition:
    """A one-input fusion ``relu(T0)``; T0 is float32 of ``shape``."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.define_tensor(shape)))
    return fd


F, BF, H, B = DataType.Float, DataType.BFloat16, DataType.Half, DataType.Bool


def test_error_classes_derive_from_hostir_error() -> None:
    """Every frontend error class is a hostir.HostIrError."""
    for error in (DefinitionError, OperandError, InputError, ScheduleError):
        assert issubclass(error, hostir.HostIrError)
    assert HostIrError is hostir.HostIrError


# ----- operand errors at definition -----


def test_linear_inner_size_mismatch() -> None:
    """linear with K = 8 in the input but 9 in the weight names both tensors and extents."""
    with raises(OperandError, "linear", "T0 dim 1 has extent 8", "T1 dim 1 has extent 9"):
        define([((4, 8), F), ((16, 9), F)], lambda fd, x, w: fd.ops.linear(x, w))


def test_linear_bias_size_mismatch() -> None:
    """linear with a bias of 15 for 16 output features names bias and weight."""
    with raises(OperandError, "linear", "T2 dim 0 has extent 15", "T1 dim 0 has extent 16"):
        define(
            [((4, 8), F), ((16, 8), F), ((15,), F)],
            lambda fd, x, w, b: fd.ops.linear(x, w, b),
        )


def test_matmul_inner_size_mismatch() -> None:
    """matmul of [4, 8] by [9, 16] names the K dims of both operands."""
    with raises(OperandError, "matmul", "T0 dim 1 has extent 8", "T1 dim 0 has extent 9"):
        define([((4, 8), F), ((9, 16), F)], lambda fd, a, b: fd.ops.matmul(a, b))


def test_matmul_batch_mismatch() -> None:
    """matmul with batch dims 2 and 3 names the operands and both extents."""
    with raises(OperandError, "matmul", "batch dim 0", "T0", "T1"):
        define([((2, 4, 8), F), ((3, 8, 5), F)], lambda fd, a, b: fd.ops.matmul(a, b))


def test_matmul_zero_dim_operand() -> None:
    """matmul of a 0-d operand is rejected naming the operand (1-d ones are torch's)."""
    with raises(OperandError, "matmul", "T0 has 0 dims"):
        define([((), F), ((8, 5), F)], lambda fd, a, b: fd.ops.matmul(a, b))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_incompatible_extents(op: str) -> None:
    """An elementwise op of [4, 8] and [4, 9] names the output dim and both extents."""
    with raises(OperandError, op, "output dim 1", "T0 dim 1 = 8", "T1 dim 1 = 9"):
        define([((4, 8), F), ((4, 9), F)], lambda fd, a, b: getattr(fd.ops, op)(a, b))


def test_binary_incompatible_extents_different_ranks() -> None:
    """Broadcasting [3] against [2, 4] names the right-aligned dims."""
    with raises(OperandError, "add", "output dim 1", "T0 dim 0 = 3", "T1 dim 1 = 4"):
        define([((3,), F), ((2, 4), F)], lambda fd, a, b: fd.ops.add(a, b))


def test_linear_dtype_mismatch() -> None:
    """linear of a float32 input and a bfloat16 weight names both tensors and dtypes."""
    with raises(OperandError, "linear", "T0", "float32", "T1", "bfloat16", "one dtype"):
        define([((4, 8), F), ((16, 8), BF)], lambda fd, x, w: fd.ops.linear(x, w))


def test_matmul_dtype_mismatch() -> None:
    """matmul of float32 by float16 names both tensors and dtypes."""
    with raises(OperandError, "matmul", "T0", "float32", "T1", "float16", "one dtype"):
        define([((4, 8), F), ((8, 5), H)], lambda fd, a, b: fd.ops.matmul(a, b))


@pytest.mark.parametrize("op", ["sub", "neg"])
def test_bool_arithmetic_rejected(op: str) -> None:
    """sub/neg of bool tensors, which torch rejects, name the tensor and its dtype."""
    with raises(OperandError, op, "T0 is bool"):
        define(
            [((4,), B), ((4,), B)],
            lambda fd, a, b: fd.ops.neg(a) if op == "neg" else fd.ops.sub(a, b),
        )


def test_relu_bool_rejected() -> None:
    """relu of a bool tensor (torch rejects it) fails at definition naming the tensor."""
    with raises(OperandError, "relu", "T0 is bool"):
        define([((4,), B)], lambda fd, x: fd.ops.relu(x))


def test_linear_weight_rank() -> None:
    """linear with a 1-d weight says the weight must have at least 2 dims."""
    with raises(OperandError, "linear", "weight T1 must have at least 2 dims"):
        define([((4, 8), F), ((8,), F)], lambda fd, x, w: fd.ops.linear(x, w))


@pytest.mark.parametrize(
    ("dims", "fragments"),
    [
        ([0, 0, 1], ("permute", "dims [0, 0, 1] of T0 repeat")),
        ([0, -3, 1], ("permute", "dims [0, -3, 1] of T0 repeat")),
        ([0, 1], ("permute", "[0, 1] must be a permutation of the 3 dims of T0")),
        ([0, 1, 3], ("permute", "dim 3 is out of range for T0 with 3 dims")),
        ([0, 1, 2, 3], ("permute", "out of range for T0")),
    ],
    ids=str,
)
def test_permute_not_a_permutation(dims: list[int], fragments: tuple[str, ...]) -> None:
    """permute with repeated, missing or out-of-range dims names T0 and the dims."""
    with raises(OperandError, *fragments):
        define([((2, 3, 4), F)], lambda fd, x: fd.ops.permute(x, dims))


@pytest.mark.parametrize(
    ("dims", "fragments"),
    [
        ([2], ("sum", "dim 2 is out of range for T0 with 2 dims")),
        ([-3], ("sum", "dim -3 is out of range for T0 with 2 dims")),
        (5, ("sum", "dim 5 is out of range for T0")),
        ([0, 2], ("sum", "dim 2 is out of range for T0")),
        ([1, -1], ("sum", "dims [1, -1] of T0 repeat")),
    ],
    ids=str,
)
def test_sum_bad_dims(dims: int | list[int], fragments: tuple[str, ...]) -> None:
    """sum with an out-of-range or repeated dim names T0, the dim and its rank."""
    with raises(OperandError, *fragments):
        define([((2, 3), F)], lambda fd, x: fd.ops.sum(x, dims))


@pytest.mark.parametrize(
    ("shape", "in_shape", "dims", "fragments"),
    [
        ([2, 3], (3,), [0, 1], ("T0 has 1 dims but broadcast_dims [0, 1] names 2",)),
        ([2, 3], (3,), [2], ("broadcast_dims[0] = 2 is out of range", "2 dims")),
        ([2, 3], (3,), [-3], ("broadcast_dims[0] = -3 is out of range",)),
        ([3, 4, 5], (3, 4), [1, 0], ("broadcast_dims [1, 0] must increase",)),
        ([3, 3], (3, 3), [1, 1], ("broadcast_dims [1, 1] name output dim 1 more than once",)),
        ([2, 4], (3,), [1], ("T0 dim 0 has extent 3", "cannot become 4 at output dim 1")),
        ([0, 3], (3,), [1], ("new dim 0 needs a positive size, got 0",)),
    ],
    ids=str,
)
def test_broadcast_in_dim_bad_dims(
    shape: list[int], in_shape: tuple, dims: list[int], fragments: tuple[str, ...]
) -> None:
    """broadcast_in_dim with bad broadcast_dims or sizes names T0, the dims and extents."""
    with raises(OperandError, "broadcast_in_dim", *fragments):
        define([(in_shape, F)], lambda fd, x: fd.ops.broadcast_in_dim(x, shape, dims))


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (lambda fd, x: fd.ops.add(x, "a"), ("add", "rhs 'a' is not a tensor or scalar")),
        (
            lambda fd, x: fd.ops.mul(fd.define_scalar(DataType.Double), 3),
            # A Double input: arithmetic on scalar inputs alone is integer extent arithmetic
            # (tests/frontend/test_scalar_extents.py runs mul of Int inputs).
            ("mul(s0, 3)", "s0 is a scalar input, bound at execute", "with integers"),
        ),
        (lambda fd, x: fd.ops.relu(True), ("relu(True)", "relu computes in bool")),
        (lambda fd, x: fd.ops.linear(x, None), ("linear", "weight must be a TensorView")),
        (lambda fd, x: fd.ops.sum([x], [0]), ("sum", "must be a TensorView")),
    ],
    ids=["add_str", "mul_scalar_input", "relu_bool", "linear_none", "sum_list"],
)
def test_non_tensor_operands(build: Callable, fragments: tuple[str, ...]) -> None:
    """Ops given something other than a tensor or number name the bad operand."""
    with raises(OperandError, *fragments):
        define([((4, 8), F)], build)


# ----- definition errors -----


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, None], ids=repr)
def test_define_tensor_bad_shape_entry(bad: object) -> None:
    """define_tensor with a 0, -2, float, bool or None extent names the dim and the shape."""
    with raises(DefinitionError, "define_tensor", "dim 1 of shape", repr(bad)):
        with FusionDefinition() as fd:
            fd.define_tensor((4, bad))


def test_define_tensor_bad_contiguity() -> None:
    """define_tensor with a contiguity of the wrong length says how many entries it has."""
    with raises(DefinitionError, "contiguity [True]", "1 entries for 2 dims"):
        with FusionDefinition() as fd:
            fd.define_tensor((4, 8), contiguity=[True])


def test_cast_to_bad_dtype() -> None:
    """cast to something that is not a dtype names the bad value."""
    with raises(DefinitionError, "expected a DataType or torch.dtype", "'float'"):
        define([((4,), F)], lambda fd, x: fd.ops.cast(x, "float"))


@pytest.mark.parametrize(
    "make_output",
    [
        lambda fd: 3,
        lambda fd: 2.5,
        lambda fd: fd.define_scalar(1.0),
        lambda fd: torch.zeros(2),
        lambda fd: FusionDefinition().define_tensor((2,)),
    ],
    ids=["int", "float", "scalar", "torch_tensor", "other_fusion_tensor"],
)
def test_add_output_not_a_tensor_of_the_fusion(make_output: Callable) -> None:
    """add_output of a number, scalar, torch tensor or foreign tensor is rejected."""
    with raises(DefinitionError, "add_output", "is not a tensor of this fusion"):
        with FusionDefinition() as fd:
            fd.define_tensor((2,))
            fd.add_output(make_output(fd))


def test_fusion_without_output() -> None:
    """Leaving the definition with no output is an error that says to call add_output."""
    with raises(DefinitionError, "no outputs", "add_output"):
        with FusionDefinition() as fd:
            fd.ops.relu(fd.define_tensor((4,)))


def test_define_after_finish() -> None:
    """Defining more after the ``with`` block ends names the method."""
    fd = relu_fusion()
    with raises(DefinitionError, "define_tensor", "already finished"):
        fd.define_tensor((4,))
    with raises(DefinitionError, "add_output", "already finished"):
        fd.add_output(fd.fusion.inputs()[0])


def test_unknown_execute_option() -> None:
    """The options nvFuser's stream-parallel programs pass are accepted with their lists
    (host_ir_lowering enabled, infer_contiguity and resize_scheduler disabled); an unknown
    one, or one in the wrong list, is named with the known ones of that list."""
    fd = relu_fusion()
    x = torch.randn(4, 8)
    (out,) = fd.execute(
        [x], _enable_options=["host_ir_lowering"], _disable_options=["infer_contiguity"]
    )
    torch.testing.assert_close(out, torch.relu(x))
    (out,) = fd.execute([x], _disable_options=["resize_scheduler"])  # nvFuser's backward's
    torch.testing.assert_close(out, torch.relu(x))
    with raises(DefinitionError, "unknown option", "'fast_mode'", "['host_ir_lowering']"):
        fd.execute([x], _enable_options=["fast_mode"])
    with raises(DefinitionError, "'host_ir_lowering' in _disable_options", "infer_contiguity"):
        fd.execute([x], _disable_options=["host_ir_lowering"])


# ----- input errors at execute -----


@pytest.mark.parametrize("count", [0, 1, 3])
def test_wrong_number_of_inputs(count: int) -> None:
    """execute with the wrong number of inputs lists the expected inputs by name."""
    fd = define([((4, 8), F), ((16, 8), F)], lambda fd, x, w: fd.ops.linear(x, w))
    given = [torch.randn(4, 8), torch.randn(16, 8), torch.randn(1)][:count]
    with raises(InputError, "expected 2 inputs (T0, T1)", f"got {count}"):
        fd.execute(given)


@pytest.mark.parametrize(
    ("given", "fragments"),
    [
        (torch.float64, ("input T0 must have dtype float32", "got float64")),
        (torch.bfloat16, ("input T0 must have dtype float32", "got bfloat16")),
        (torch.int32, ("input T0 must have dtype float32", "got int32")),
    ],
    ids=str,
)
def test_input_wrong_dtype(given: torch.dtype, fragments: tuple[str, ...]) -> None:
    """An input of the wrong dtype names the input and both dtypes."""
    with raises(InputError, *fragments):
        relu_fusion().execute([torch.zeros(4, 8, dtype=given)])


@pytest.mark.parametrize("shape", [(4, 8, 1), (32,)], ids=str)
def test_input_wrong_ndim(shape: tuple[int, ...]) -> None:
    """An input of the wrong rank names the input, its declared shape and the given rank."""
    with raises(InputError, "input T0 must have 2 dims", "[4, 8]", f"got {len(shape)}"):
        relu_fusion().execute([torch.zeros(shape)])


@pytest.mark.parametrize(("shape", "dim"), [((4, 9), 1), ((3, 8), 0)], ids=str)
def test_input_constant_extent_mismatch(shape: tuple[int, int], dim: int) -> None:
    """An input whose constant extent differs from its definition names dim and extents."""
    expected, got = (4, 8)[dim], shape[dim]
    with raises(InputError, f"input T0 dim {dim}", f"{expected}", f"got {got}"):
        relu_fusion().execute([torch.zeros(shape)])


def test_symbolic_input_partly_constant_mismatch() -> None:
    """A (-1, 8) input given [5, 7] names the constant dim, not the symbolic one."""
    with raises(InputError, "input T0 dim 1", "8", "got 7"):
        relu_fusion((-1, 8)).execute([torch.zeros(5, 7)])


def test_input_not_a_tensor() -> None:
    """A tensor input given a Python number names the input and the given type."""
    with raises(InputError, "input T0 must be a torch.Tensor", "got float"):
        relu_fusion().execute([1.0])


@pytest.mark.parametrize("given", [torch.tensor(2.0), "2"], ids=["tensor", "str"])
def test_scalar_input_wrong_type(given: object) -> None:
    """A scalar input given a tensor or a string names the scalar and its dtype."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.mul(fd.define_tensor((4,)), fd.define_scalar()))
    with raises(InputError, "input s0 is a float64 scalar", f"got {type(given).__name__}"):
        fd.execute([torch.zeros(4), given])


def test_symbolic_extents_mismatch_at_execute() -> None:
    """Two symbolic inputs added together but given different sizes fail naming the op."""
    fd = define([((-1,), F), ((-1,), F)], lambda fd, a, b: fd.ops.add(a, b))
    with raises(hostir.HostIrError, "add defining T2"):
        fd.execute([torch.zeros(3), torch.zeros(4)])


# ----- what is not an error -----


def test_symbolic_input_different_extents_across_calls() -> None:
    """The same symbolic input may take different extents in different execute calls."""
    fd = relu_fusion((-1, -1))
    for shape in [(2, 3), (7, 1), (1, 9), (4, 8)]:
        x = torch.randn(shape)
        (out,) = fd.execute([x])
        torch.testing.assert_close(out, torch.relu(x))
    assert fd.lowering_count == 4


def test_programs_and_evaluators_are_kept_for_the_most_recent_signatures(monkeypatch) -> None:
    """A definition kept a lowered program and an evaluator for every input shape it ever
    saw (3,000 shapes: 55 MB, 16 s of lowering); it keeps them, and its CUDA graphs, for
    the MAX_SIGNATURES most recently used signatures. A shape dropped runs again (lowered
    again) and matches torch; a shape kept is not lowered again. Here with a bound of 3
    (the executables' too), so that a few shapes show it."""
    assert FusionDefinition()._programs.size == bindings.MAX_SIGNATURES == 64
    monkeypatch.setattr(bindings, "MAX_SIGNATURES", 3)
    fd = relu_fusion((-1, 2))
    for rows in range(1, 8):
        x = torch.randn(rows, 2)
        (out,) = fd.execute([x])
        torch.testing.assert_close(out, torch.relu(x))
        kept = (fd._programs, fd._evaluators, fd._executables)
        assert [len(cache) for cache in kept] == [min(rows, 3)] * 3
    assert fd.lowering_count == 7
    for rows, lowered in ((4, 8), (7, 8), (4, 8)):  # 4: dropped, lowered and prepared again
        x = torch.randn(rows, 2)
        (out,) = fd.execute([x])
        torch.testing.assert_close(out, torch.relu(x))
        assert fd.lowering_count == lowered
    assert len(fd._programs) == len(fd._evaluators) == 3


def test_datatype_accepts_torch_dtypes() -> None:
    """define_tensor and cast accept torch dtypes as well as DataType."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((3,), dtype=torch.bfloat16)
        fd.add_output(fd.ops.cast(x, torch.float32))
    assert x.dtype is DataType.BFloat16
    data = torch.randn(3).bfloat16()
    (out,) = fd.execute([data])
    torch.testing.assert_close(out, data.float())


# ----- printing -----


def test_print_fusion_names_tensors_and_ops() -> None:
    """print(fd.fusion) lists the inputs, each expression with its tensor names, and outputs."""

    def build(fd: FusionDefinition, x: TensorView, w: TensorView) -> None:
        y = fd.ops.relu(fd.ops.linear(x, w))
        fd.add_output(fd.ops.sum(y, [1]))

    fd = define([((-1, 8), F), ((16, 8), F)], build)
    text = str(fd.fusion)
    assert text.startswith("Fusion {")
    for fragment in [
        "input T0",
        "input T1",
        "T2 = linear(T0, T1)",
        "T3 = relu(T2)",
        "T4 = sum(T3, dims=[1])",
        "outputs T4",
        "i0",
    ]:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert [tv.name for tv in fd.fusion.inputs()] == ["T0", "T1"]
    assert [tv.name for tv in fd.fusion.outputs()] == ["T4"]


def test_host_ir_before_execute() -> None:
    """host_ir() before any execute lowers the fusion and prints a program."""
    fd = relu_fusion((-1, 8))
    text = str(fd.host_ir())
    assert text.startswith("%HostIrContainer {")
    assert "input T0 : float32[i0, 8]" in text
    assert "T1 : float32[i0, 8] = relu(T0)" in text
    assert "output T1" in text


@pytest.mark.world_sizes(2, 4)
def test_an_unscheduled_input_takes_its_propagated_sharding(multidevice_test) -> None:
    """An input without a mesh inherits one (here from its consumer): execute takes its
    shard as ``fd.host_ir().inputs`` describes it. The input check used the user's
    (empty) schedule and refused that shard (found by the fuzzer, seed 5 at 4 ranks)."""
    d, rank = multidevice_test.size, multidevice_test.rank
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 2 * d))
        y = fd.ops.neg(fd.ops.relu(x))
        fd.add_output(y)
    y.set_device_mesh(DeviceMesh(list(range(d))))
    y.outer_split(1, d)
    y.axis(1).parallelize(ParallelType.mesh_x)
    full = torch.randn(3, 2 * d, generator=torch.Generator().manual_seed(0))
    local = shard_tensor(full, fd.host_ir().inputs[0], rank)
    assert local.shape == (3, 2)
    (out,) = fd.execute([local])
    torch.testing.assert_close(out, shard_tensor(-full.relu(), y, rank))
