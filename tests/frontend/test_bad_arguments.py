"""Bad arguments at every public entry point of the frontend, one table.

Each one ends in a named ``HostIrError`` subclass whose message names the object and
what was expected: never a bare Python or torch exception (TypeError, AttributeError,
OverflowError, RuntimeError, MemoryError), never a silent success. ``BAD`` lists, per
entry point (``FusionDefinition``'s methods, ``fd.ops``, the schedule methods,
``DeviceMesh``, ``shard_tensor``, ``tensor_sharding``, ``execute``, ``host_ir``), bad
arguments with the error each must give. tests/frontend/test_bad_definitions.py covers
what a table cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import hostir
from frontend import (
    DataType,
    DefinitionError,
    DeviceMesh,
    FusionDefinition,
    InputError,
    MeshError,
    OperandError,
    ParallelType,
    ScheduleError,
    TensorView,
    shard_tensor,
    tensor_sharding,
)
from hostir.errors import SettingError

X = ParallelType.mesh_x


# ----- fixtures of the table: each call builds fresh objects -----


def open_fd() -> tuple[FusionDefinition, TensorView]:
    """A definition still open (its ``with`` block not left), with a float [4, 8] input."""
    fd = FusionDefinition()
    return fd, fd.define_tensor((4, 8))


def ops_call(op: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """``fd.ops.<op>(x, *args)`` on a fresh open definition's input ``x``."""

    def call() -> Any:
        fd, x = open_fd()
        return getattr(fd.ops, op)(x, *args, **kwargs)

    return call


def define_call(method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
    """``fd.<method>(*args)`` on a fresh open definition."""
    return lambda: getattr(open_fd()[0], method)(*args, **kwargs)


def relu_fd() -> tuple[FusionDefinition, TensorView]:
    """A finished ``relu(T0)`` definition of a float [4, 8] input, and T0."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 8))
        fd.add_output(fd.ops.relu(x))
    return fd, x


def tv_call(method: str, *args: Any) -> Callable[[], Any]:
    """``T0.<method>(*args)`` on a fresh relu definition's input."""
    return lambda: getattr(relu_fd()[1], method)(*args)


def sharded_tv() -> TensorView:
    """T0 [4, 8] of a relu definition, rows split over a mesh of 2."""
    x = relu_fd()[1]
    x.set_device_mesh(DeviceMesh([0, 1]))
    x.outer_split(0, 2)
    x.axis(0).parallelize(X)
    return x


def execute_call(inputs: Any = None, **kwargs: Any) -> Callable[[], Any]:
    """``fd.execute(...)`` on a fresh relu definition; ``inputs`` None means good inputs."""

    def call() -> Any:
        good = [torch.randn(4, 8)]
        return relu_fd()[0].execute(good if inputs is None else inputs, **kwargs)

    return call


def other_rows(n: int) -> list:
    """``n`` references to one row of ``n`` device ids: little memory, ``n * n`` devices."""
    row = list(range(n))
    return [row] * n


NOT_AN_INT = "must be an int"

BAD: list[tuple[str, Callable[[], Any], type[hostir.HostIrError], str]] = [
    # define_tensor
    ("define_tensor-shape-None", define_call("define_tensor", None), DefinitionError,
     r"define_tensor: shape must be a list or tuple of ints, got None"),
    ("define_tensor-shape-int", define_call("define_tensor", 5), DefinitionError,
     r"define_tensor: shape must be a list or tuple of ints, got 5"),
    ("define_tensor-extent-2**70", define_call("define_tensor", (2**70,)), DefinitionError,
     r"dim 0 of shape \[1180591620717411303424\] must be a positive int \(at most 9223"),
    ("define_tensor-contiguity-int", define_call("define_tensor", (4,), contiguity=3),
     DefinitionError, r"define_tensor: contiguity must be True, False, None or a list"),
    ("define_tensor-contiguity-str", define_call("define_tensor", (4,), contiguity=["a"]),
     DefinitionError, r"contiguity\[0\] must be True, False or None, got 'a'"),
    ("define_tensor-stride_order-int", define_call("define_tensor", (4,), stride_order=3),
     DefinitionError, r"define_tensor: stride_order must be a list or tuple of ints, got 3"),
    ("define_tensor-stride_order-float",
     define_call("define_tensor", (4,), stride_order=[0.0]), DefinitionError,
     r"stride_order\[0\] must be an int, got 0.0"),
    ("define_tensor-dtype-complex", define_call("define_tensor", (4,), dtype=torch.complex64),
     DefinitionError, r"dtype torch.complex64 is not supported; expected one of DataType.Float"),
    # define_scalar
    ("define_scalar-str", define_call("define_scalar", "a"), DefinitionError,
     r"define_scalar: value 'a' must be a bool, an int or a float"),
    ("define_scalar-list", define_call("define_scalar", [1]), DefinitionError,
     r"define_scalar: value \[1\] must be a bool, an int or a float"),
    ("define_scalar-complex", define_call("define_scalar", 1j, dtype=DataType.Double),
     DefinitionError, r"define_scalar\(1j, dtype=Double\): the value must be a bool, an int"),
    ("define_scalar-1.5-Int", define_call("define_scalar", 1.5, dtype=DataType.Int),
     DefinitionError, r"define_scalar\(1.5, dtype=Int\): an Int scalar is a whole number"),
    ("define_scalar-1-Bool", define_call("define_scalar", 1, dtype=DataType.Bool),
     DefinitionError, r"define_scalar\(1, dtype=Bool\): a Bool scalar is True or False"),
    ("define_scalar-2**40-Int32", define_call("define_scalar", 2**40, dtype=DataType.Int32),
     DefinitionError, r"the value 1099511627776 does not fit Int32 \(int32, -2147483648\.\."),
    ("define_scalar-2**70", define_call("define_scalar", 2**70), DefinitionError,
     r"define_scalar\(1180591620717411303424, dtype=Int\): the value 2\*\*70 does not fit Int"),
    ("define_scalar-2**1100-Double", define_call("define_scalar", 2**1100, dtype=DataType.Double),
     DefinitionError, r"the value does not fit a float64"),
    # fd.ops: wrong types, values, dims, arity
    ("add-2**70", ops_call("add", 2**70), OperandError,
     r"add: the constant 2\*\*70 does not fit Int \(int64, .*Python int as an int64 scalar"),
    ("add-missing-operand", ops_call("add"), OperandError,
     r"fd.ops.add\(lhs, rhs\): missing a required argument: 'rhs'"),
    ("relu-extra-argument", ops_call("relu", 1), OperandError,
     r"fd.ops.relu\(x\): too many positional arguments"),
    ("cast-complex", ops_call("cast", torch.complex64), DefinitionError,
     r"dtype torch.complex64 is not supported"),
    ("sum-dims-str", ops_call("sum", "01"), OperandError,
     r"sum: dims must be a list or tuple of ints \(or one int\), got '01'"),
    ("sum-dims-True", ops_call("sum", True), OperandError,
     r"sum: dims must be a list or tuple of ints \(or one int\), got True"),
    ("sum-keepdim-str", ops_call("sum", 0, keepdim="yes"), OperandError,
     r"sum: keepdim must be True or False, got 'yes'"),
    ("broadcast_in_dim-shape-None", ops_call("broadcast_in_dim", None, [0, 1]), OperandError,
     r"broadcast_in_dim: shape must be a list or tuple of ints or Int scalars, got None"),
    ("broadcast_in_dim-dims-None", ops_call("broadcast_in_dim", [4, 8], None), OperandError,
     r"broadcast_in_dim: broadcast_dims must be a list or tuple of ints, got None"),
    ("broadcast_in_dim-size-float", ops_call("broadcast_in_dim", [4, 8.0], [0, 1]),
     OperandError, r"broadcast_in_dim: shape\[1\] must be an int or an Int scalar, got 8.0"),
    ("broadcast_in_dim-dim-bool", ops_call("broadcast_in_dim", [4, 8], [0, True]),
     OperandError, rf"broadcast_dims\[1\] {NOT_AN_INT}, got True"),
    ("broadcast_in_dim-size-2**70", ops_call("broadcast_in_dim", [4, 8, 2**70], [0, 1]),
     OperandError, r"shape\[2\] = 1180591620717411303424 of T0's output is larger than an"),
    ("permute-dims-None", ops_call("permute", None), OperandError,
     r"permute: dims must be a list or tuple of ints, got None"),
    ("permute-dims-bool", ops_call("permute", [0, True]), OperandError,
     rf"permute: dims\[1\] {NOT_AN_INT}, got True"),
    # schedule methods
    ("axis-True", tv_call("axis", True), ScheduleError,
     r"axis: axis True is out of range for T0, whose loop domain has 2 axes"),
    ("split-factor-2**70", tv_call("split", 0, 2**70), ScheduleError,
     r"split factor must be a positive int \(at most 9223372036854775807\), got 1180591"),
    ("split-inner_split-str", tv_call("split", 0, 2, "x"), ScheduleError,
     r"split of T0: inner_split must be True or False, got 'x'"),
    ("reorder-None", tv_call("reorder", None), ScheduleError,
     r"reorder of T0: expected a dict \{old axis: new axis\}, got None"),
    ("reorder-list", tv_call("reorder", [1, 0]), ScheduleError,
     r"reorder of T0: expected a dict \{old axis: new axis\}, got \[1, 0\]"),
    ("reorder-axis-named-twice", tv_call("reorder", {0: 1, -2: 0}), ScheduleError,
     r"reorder of T0: loop axis 0 is named twice in \{0: 1, -2: 0\}"),
    ("set_allocation_domain-None", tv_call("set_allocation_domain", None), ScheduleError,
     r"set_allocation_domain of T0: axes must be a list or tuple of IterDomains, got None"),
    ("set_allocation_domain-list-axis", tv_call("set_allocation_domain", [[0]]), ScheduleError,
     r"set_allocation_domain: \[0\] is not an axis of T0 \(loop \[iS\d+\{4\}"),
    ("set_allocation_domain-contiguity-int",
     lambda: (lambda x: x.set_allocation_domain(x.get_loop_domain(), 3))(relu_fd()[1]),
     ScheduleError, r"set_allocation_domain of T0: contiguity must be True, False, None or"),
    ("set_allocation_domain-axis-twice",
     lambda: (lambda x: x.set_allocation_domain([x.axis(0), x.axis(0)]))(relu_fd()[1]),
     ScheduleError, r"set_allocation_domain of T0: axes \[iS\d+\{4\}, iS\d+\{4\}\] name an"),
    ("tensor_sharding-None", lambda: tensor_sharding(None), ScheduleError,
     r"tensor_sharding: expected a TensorView, got None"),
    # DeviceMesh
    ("mesh-device-2**70", lambda: DeviceMesh([2**70]), MeshError,
     r"mesh device 1180591620717411303424 is not a rank: ranks are below 1048576"),
    ("mesh-99999x99999-tensor", lambda: DeviceMesh(torch.arange(99999).expand(99999, 99999)),
     MeshError, r"a mesh of shape \(99999, 99999\) has 9999800001 devices; at most 1048576"),
    ("mesh-99999x99999-lists", lambda: DeviceMesh(other_rows(99999)), MeshError,
     r"a mesh of shape \(99999, 99999\) has 9999800001 devices"),
    ("mesh-99999x99999-ranges", lambda: DeviceMesh([range(99999)] * 99999), MeshError,
     r"a mesh of shape \(99999, 99999\) has 9999800001 devices"),
    ("mesh-ragged-long-row", lambda: DeviceMesh([[0, 1], range(10**12)]), MeshError,
     r"mesh rows must all have the same shape, got \[\[0, 1\], range\(0, 1000000000000\)\]"),
    ("mesh-index-str", lambda: DeviceMesh([0, 1]).index("a"), MeshError,
     r"DeviceMesh\(\[0, 1\]\): device: expected a device id \(an int >= 0\), got 'a'"),
    ("mesh-coordinates-None", lambda: DeviceMesh([0, 1]).coordinates(None), MeshError,
     r"device: expected a device id \(an int >= 0\), got None"),
    ("mesh-shard_tensor-None", lambda: DeviceMesh([0, 1]).shard_tensor(None, 0, 0), MeshError,
     r"shard_tensor: expected a torch.Tensor to shard, got None"),
    ("mesh-shard_tensor-dim-str",
     lambda: DeviceMesh([0, 1]).shard_tensor(torch.randn(4), "a", 0), MeshError,
     r"dim 'a' is out of range for a 1-d tensor"),
    ("mesh-shard_tensor-rank-str",
     lambda: DeviceMesh([0, 1]).shard_tensor(torch.randn(4), 0, "a"), MeshError,
     r"shard_tensor: rank: expected a device id \(an int >= 0\), got 'a'"),
    # shard_tensor
    ("shard_tensor-tensor-None", lambda: shard_tensor(None, sharded_tv(), 0), ScheduleError,
     r"shard_tensor: expected a torch.Tensor to shard, got None"),
    ("shard_tensor-tv-None", lambda: shard_tensor(torch.randn(4, 8), None, 0), ScheduleError,
     r"shard_tensor: expected the TensorView \(or host IR TensorValue\) whose schedule"),
    ("shard_tensor-rank-str", lambda: shard_tensor(torch.randn(4, 8), sharded_tv(), "a"),
     MeshError, r"shard_tensor: rank: expected a device id \(an int >= 0\), got 'a'"),
    ("shard_tensor-rank-negative", lambda: shard_tensor(torch.randn(4, 8), sharded_tv(), -1),
     MeshError, r"shard_tensor: rank: expected a device id \(an int >= 0\), got -1"),
    ("shard_tensor-rank-float", lambda: shard_tensor(torch.randn(4, 8), sharded_tv(), 1.0),
     MeshError, r"shard_tensor: rank: expected a device id \(an int >= 0\), got 1.0"),
    ("shard_tensor-rank-bool", lambda: shard_tensor(torch.randn(4, 8), sharded_tv(), True),
     MeshError, r"shard_tensor: rank: expected a device id \(an int >= 0\), got True"),
    # execute and host_ir
    ("execute-None", lambda: relu_fd()[0].execute(None), InputError,
     r"execute: inputs must be a list or tuple with one tensor or scalar per fusion input,"
     r" got None"),
    ("execute-int", lambda: relu_fd()[0].execute(5), InputError,
     r"inputs must be a list or tuple .* got 5"),
    ("execute-tensor", lambda: relu_fd()[0].execute(torch.randn(4, 8)), InputError,
     r"inputs must be a list or tuple .* got a Tensor"),
    ("execute-device-banana", execute_call(device="banana"), SettingError,
     r"execute: device='banana': expected a device name like 'cpu' or 'cuda:0' \(not a device"),
    ("execute-device-list", execute_call(device=[]), SettingError,
     r"execute: device: expected a torch.device or a name like 'cpu' or 'cuda:0', got list"),
    ("execute-timeout-1e308", execute_call(timeout=1e308), SettingError,
     r"timeout: expected a positive number of seconds"),
    ("execute-options-None", execute_call(_enable_options=None), DefinitionError,
     r"execute: _enable_options must be a list or tuple of option names, got None"),
    ("execute-options-str", execute_call(_disable_options="infer_contiguity"), DefinitionError,
     r"execute: _disable_options must be a list or tuple of option names, got 'infer_cont"),
    ("execute-options-list", execute_call(_enable_options=[[1]]), DefinitionError,
     r"execute: unknown option \[1\] in _enable_options; known there: \['host_ir_lowering'\]"),
    ("host_ir-world_size-str", lambda: relu_fd()[0].host_ir("a"), SettingError,
     r"host_ir: world_size must be a positive int \(or None\), got 'a'"),
    ("host_ir-world_size-0", lambda: relu_fd()[0].host_ir(0), SettingError,
     r"host_ir: world_size must be a positive int \(or None\), got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "pattern"), [row[1:] for row in BAD],
                         ids=[row[0] for row in BAD])  # fmt: skip
def test_a_bad_argument_is_refused_by_name(call: Callable, error: type, pattern: str) -> None:
    """Each row of BAD raises its named error (not a bare TypeError, AttributeError,
    OverflowError, RuntimeError or MemoryError, and not a silent success)."""
    with pytest.raises(error, match=pattern):
        call()
