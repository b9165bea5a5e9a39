"""nvFuser's definition API: ``define_tensor``'s keywords and its sizes/strides form,
``from_pytorch``, ``define_scalar``, scalar arithmetic, ``tv.size``/``tv.shape`` as
extents, ``fd.fusion.inputs()``/``outputs()`` and ``execute``'s keywords.

Numbers are checked against torch on random data; layouts against the expected values of
nvFuser's own ``test_compute_tensor_descriptor``; errors by class and by a message naming
the argument.
"""

from __future__ import annotations

import re

import pytest
import torch

from frontend import DataType, DefinitionError, FusionDefinition, OperandError
from frontend.strides import tensor_descriptor

# (sizes, strides, contiguity, stride_order): nvFuser's tests/python/direct/
# test_python_frontend.py::test_compute_tensor_descriptor, values as nvFuser expects them.
NVFUSER_DESCRIPTORS = [
    ([2, 1, 3, 1, 4, 3], [12, 4, 4, 4, 1, 0], [True, None, True, None, True, None],
     [5, 4, 3, 2, 1, 0]),
    ([2, 3, 1, 5, 4], [28, 4, 14, 0, 1], [False, None, True, None, True], [4, 2, 3, 1, 0]),
    ([2, 2, 1, 1, 2, 2, 2], [8, 4, 3, 9, 2, 0, 1], [None, True, True, None, True, None, True],
     [5, 4, 3, 6, 2, 1, 0]),
    ([2, 2, 1, 2, 4, 2], [2, 32, 1, 8, 0, 4], [False, True, True, False, None, None],
     [2, 5, 0, 4, 1, 3]),
    ([2, 2, 2, 2], [8, 4, 2, 1], [True, True, True, True], [3, 2, 1, 0]),
    ([2, 1, 3, 1, 4], [24, 4, 8, 4, 2], [True, True, None, None, False], [4, 2, 3, 1, 0]),
    ([2, 2, 2, 2], [8, 4, 0, 2], [True, True, None, False], [3, 2, 1, 0]),
]  # fmt: skip


def refused(error: type[Exception], *fragments: str) -> pytest.RaisesContext:
    """``pytest.raises(error)`` whose message holds every fragment, in order."""
    return pytest.raises(error, match=".*".join(re.escape(f) for f in fragments))


@pytest.mark.parametrize(("sizes", "strides", "contiguity", "order"), NVFUSER_DESCRIPTORS)
def test_layout_from_strides_is_nvfusers(sizes, strides, contiguity, order) -> None:
    """Contiguity and stride order read from strides equal nvFuser's expected values, and
    ``define_tensor(sizes=, strides=)`` records them with nvFuser's symbolic sizes."""
    assert tensor_descriptor(sizes, strides) == (contiguity, order)
    with FusionDefinition() as fd:
        tv = fd.define_tensor(sizes=sizes, strides=strides, dtype=DataType.Half)
        fd.add_output(tv)
    assert (tv.contiguity, tv.stride_order, tv.dtype) == (contiguity, order, DataType.Half)
    shown = [
        axis.extent.value if hasattr(axis.extent, "value") else -1 for axis in tv.shape_domain()
    ]
    assert shown == [1 if size == 1 else -1 for size in sizes]


def test_nvfusers_define_tensor_keywords_run_as_torch() -> None:
    """A definition written as nvFuser's tests write it (every keyword, BFloat16, a stride
    order, a CPU scalar) runs and agrees with torch."""
    torch.manual_seed(0)
    with FusionDefinition() as fd:
        x = fd.define_tensor(
            shape=[-1, 8], contiguity=True, dtype=DataType.BFloat16, is_cpu=False,
            stride_order=[0, -1],
        )  # fmt: skip
        scale = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(fd.ops.cast(x, DataType.Float), scale))
        fd.add_output(scale)
    assert (x.stride_order, x.is_cpu, scale.is_cpu) == ([0, 1], False, True)
    data, factor = torch.randn(5, 8, dtype=torch.bfloat16), torch.tensor(1.5)
    product, passed = fd.execute([data, factor])
    torch.testing.assert_close(product, data.float() * factor)
    assert torch.equal(passed, factor) and passed.shape == torch.Size([])
    assert fd.fusion.inputs() == [x, scale] and len(fd.fusion.outputs()) == 2


def test_from_pytorch_reads_dtype_sizes_and_layout() -> None:
    """``from_pytorch`` gives the tensor's dtype and layout, symbolic sizes unless
    ``static_sizes``, and a CPU scalar for a 0-dim tensor; the fusion runs on it."""
    torch.manual_seed(1)
    data = torch.randn(4, 6, dtype=torch.float64).t()  # transposed: stride order [0, 1]
    seed = torch.tensor(3, dtype=torch.int64)
    with FusionDefinition() as fd:
        dynamic = fd.from_pytorch(data)
        static = fd.from_pytorch(data, static_sizes=True)
        scalar = fd.from_pytorch(seed)
        fd.add_output(fd.ops.add(fd.ops.mul(dynamic, scalar), static))
    assert dynamic.dtype is DataType.Double and dynamic.stride_order == [0, 1]
    assert [axis.extent.value for axis in static.shape_domain()] == [6, 4]
    assert scalar.is_cpu and not dynamic.is_cpu
    other = torch.randn(6, 4, dtype=torch.float64)
    (out,) = fd.execute([data, other, seed])
    torch.testing.assert_close(out, data * 3 + other)


def test_sizes_are_extents_in_ops_and_shapes() -> None:
    """``tv.size(i)``/``tv.shape()`` are usable as a pointwise op's scalar operand, in
    arithmetic on scalars alone and as ``broadcast_in_dim`` shape entries, symbolic or
    constant, and give torch's numbers (issue 25, item 5: nothing fails at execute)."""
    torch.manual_seed(2)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        rows, cols = x.shape()
        twice = fd.ops.mul(rows, 2)
        fd.add_output(fd.ops.div(x, rows))
        fd.add_output(fd.ops.mul(x, fd.ops.add(twice, cols)))
        fd.add_output(fd.ops.broadcast_in_dim(x, [3, x.size(0), x.size(-1)], [1, 2]))
    assert (cols.value, rows.value) == (4, None)
    data = torch.randn(5, 4)
    mean, scaled, spread = fd.execute([data])
    torch.testing.assert_close(mean, data / 5)
    torch.testing.assert_close(scaled, data * 14)
    assert torch.equal(spread, data.expand(3, 5, 4))


@pytest.mark.parametrize(
    ("lhs", "rhs", "op", "dtype", "value"),
    [
        (2, 3, "mul", DataType.Int, 6),
        (1.5, 2, "add", DataType.Double, 3.5),
        (7, 2, "div", DataType.Int, 3),  # nvFuser's div on Ints is C++'s: truncates
        (-7, 2, "div", DataType.Int, -3),
        (7, 2, "truediv", DataType.Float, 3.5),  # float_op_config: Ints compute in Float
        ((1.1, DataType.Float), (3.0, DataType.Float), "mul", DataType.Float, None),
        ((2**40, DataType.Int), (2**22, DataType.Int), "mul", DataType.Int, 2**62),
    ],
)
def test_arithmetic_on_constants_alone(lhs, rhs, op, dtype, value) -> None:
    """Constants give a constant of the promoted dtype, computed in it (a Float in float32,
    as torch); used with a tensor the result agrees with torch."""

    def scalar(fd, spec):
        return fd.define_scalar(*spec) if isinstance(spec, tuple) else fd.define_scalar(spec)

    with FusionDefinition() as fd:
        x = fd.define_tensor([3], dtype=DataType.Double)
        result = getattr(fd.ops, op)(scalar(fd, lhs), scalar(fd, rhs))
        fd.add_output(fd.ops.add(x, result))
    expected = value if value is not None else (torch.tensor(1.1) * 3.0).item()
    assert (result.dtype, result.value) == (dtype, expected)
    data = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(fd.execute([data])[0], data + expected)


def test_define_scalar_takes_a_dtype_alone() -> None:
    """``define_scalar(DataType.Int)`` is an Int input, as in nvFuser."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([3], dtype=DataType.Int)
        s = fd.define_scalar(DataType.Int)
        fd.add_output(fd.ops.add(x, s))
    assert s.is_input() and s.dtype is DataType.Int
    data = torch.arange(3)
    assert torch.equal(fd.execute([data, 5])[0], data + 5)


def _bad_definition(build) -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 4])
        fd.add_output(build(fd, x) or x)


@pytest.mark.parametrize(
    ("build", "error", "fragments"),
    [
        (lambda fd, x: fd.define_tensor(shape=[2], is_cpu=True), DefinitionError,
         ("is_cpu=True is for a CPU scalar tensor of shape []", "got shape [2]")),
        (lambda fd, x: fd.define_tensor(shape=[], is_cpu="yes"), DefinitionError,
         ("is_cpu must be True or False",)),
        (lambda fd, x: fd.define_tensor(shape=[2], sizes=[2], strides=[1]), DefinitionError,
         ("give either shape", "with shape")),
        (lambda fd, x: fd.define_tensor(sizes=[2, 3], strides=[1]), DefinitionError,
         ("2 sizes [2, 3] but 1 strides",)),
        (lambda fd, x: fd.define_tensor(sizes=[2]), DefinitionError, ("strides is missing",)),
        (lambda fd, x: fd.define_tensor(sizes=[2], strides=[-1]), DefinitionError,
         ("strides[0] = -1",)),
        (lambda fd, x: fd.define_tensor(shape=[2, 3], static_sizes=True), DefinitionError,
         ("static_sizes goes with sizes and strides",)),
        (lambda fd, x: fd.define_tensor(shape=[2, 3], stride_order=[0, 0]), DefinitionError,
         ("stride_order [0, 0] must be a permutation of 0..1",)),
        (lambda fd, x: fd.from_pytorch([1, 2]), DefinitionError, ("from_pytorch", "torch.Tensor")),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [3, -1, -1], [1, 0]), OperandError,
         ("broadcast_dims [1, 0] must increase", "use permute")),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [3, -1, -1], [-1, 2]), OperandError,
         ("broadcast_dims [-1, 2] name output dim 2 more than once",)),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [3, -1, -1], [0, -4]), OperandError,
         ("broadcast_dims[1] = -4 is out of range for an output of 3 dims",)),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [3, -1, 2.0], [1, 2]), OperandError,
         ("shape[2] must be an int or an Int scalar, got 2.0",)),
        (lambda fd, x: fd.ops.broadcast_in_dim(x, [fd.define_scalar(2.0), -1, -1], [1, 2]),
         OperandError, ("shape[0] = s0 must be an integer scalar, got a Double",)),
        (lambda fd, x: fd.ops.add(fd.define_scalar(DataType.Double), 1.0), OperandError,
         ("add(s0, 1.0): s0 is a scalar input",)),
        (lambda fd, x: fd.ops.div(x.size(0), 2), OperandError,
         ("div(s0, 2): s0 is the size i0", "add, sub or mul")),
        (lambda fd, x: fd.ops.lt(x.size(0), 2), OperandError,
         ("lt(s0, 2): s0 is the size i0", "add, sub or mul")),
        (lambda fd, x: fd.ops.reciprocal(fd.define_scalar(DataType.Double)), OperandError,
         ("reciprocal(s0): s0 is a scalar input",)),
        (lambda fd, x: fd.ops.neg(fd.define_scalar(True)), OperandError,
         ("neg(s0): neg computes in bool", "it takes float or int")),
        (lambda fd, x: fd.ops.div(fd.define_scalar(1), 0), OperandError,
         ("div(s0, 0): integer division by zero",)),
        (lambda fd, x: fd.ops.pow(fd.define_scalar(2), -1), OperandError,
         ("pow(s0, -1): an integer to a negative power",)),
        (lambda fd, x: fd.ops.pow(fd.define_scalar(3), 200), OperandError,
         ("pow(s0, 200): the result is past 64 bits",)),
        (lambda fd, x: fd.ops.neg(fd.define_scalar(-2**63)), OperandError,
         ("neg(s0): the result 9223372036854775808 does not fit Int",)),
        (lambda fd, x: fd.ops.where(fd.define_scalar(1), 2.0, 3.0), OperandError,
         ("where(s0, 2.0, 3.0): the condition must be Bool, got Int",)),
        (lambda fd, x: fd.ops.mul(fd.define_scalar(2**40), fd.define_scalar(2**40)),
         OperandError, ("mul(s0, s1): the result 2**80 does not fit Int",)),
        (lambda fd, x: x.size(2), OperandError, ("size: dim 2 is out of range for T0",)),
    ],
)  # fmt: skip
def test_what_is_not_supported_is_refused_at_definition(build, error, fragments) -> None:
    """Each refusal happens when the fusion is defined, with the class and the argument."""
    with refused(error, *fragments):
        _bad_definition(build)


def test_execute_keywords_by_nvfusers_names() -> None:
    """nvFuser's execute flags are accepted as False and refused as True with why; an
    unknown keyword is refused with the known ones listed."""
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.neg(fd.define_tensor([-1])))
    data = torch.randn(3)
    (out,) = fd.execute([data], save_repro_inputs=False, profile=False, device="cpu")
    assert torch.equal(out, -data)
    with refused(DefinitionError, "execute: save_repro_inputs=True is not supported"):
        fd.execute([data], save_repro_inputs=True)
    with refused(DefinitionError, "unknown keyword argument 'inptus'", "'device'", "'profile'"):
        fd.execute([data], inptus=[data])
