"""Bad definitions the table of test_bad_arguments.py cannot cover.

A tensor or scalar of another ``FusionDefinition`` (it used to silently stand for this
definition's input of the same name), int constants and int inputs that do not fit
their dtype or the dtype they are computed in (they used to wrap around), and a rank
whose ``execute`` arguments are bad (its peers must hear of it, by name). Numbers are
checked against torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from frontend import (
    DataType,
    DefinitionError,
    DeviceMesh,
    FusionDefinition,
    InputError,
    OperandError,
    ParallelType,
    TensorView,
    shard_tensor,
)
from hostir.errors import PeerFailureError, SettingError
from hostir.ir.ops import POINTWISE_OPS

X = ParallelType.mesh_x


# ----- ownership: a value of one FusionDefinition used in another -----


def foreign() -> tuple[TensorView, Any]:
    """A float [4, 8] input T0 and a constant scalar s0 of a finished definition."""
    with FusionDefinition() as other:
        a = other.define_tensor((4, 8))
        s = other.define_scalar(2.0)
        other.add_output(other.ops.mul(a, s))
    return a, s


def use_foreign(fd: FusionDefinition, x: TensorView, op: str, a: TensorView, s: Any) -> Any:
    """Calls ``fd.ops.<op>`` with the foreign tensor ``a`` (or scalar ``s``) as one operand
    and this definition's ``x`` ([4, 8]) as the others."""
    w = fd.define_tensor((8, 8))
    calls = {
        "set": lambda: fd.ops.set(a),
        "neg": lambda: fd.ops.neg(a),
        "relu": lambda: fd.ops.relu(a),
        "cast": lambda: fd.ops.cast(a, DataType.Double),
        "add": lambda: fd.ops.add(x, a),
        "sub": lambda: fd.ops.sub(a, x),
        "mul": lambda: fd.ops.mul(x, s),
        "div": lambda: fd.ops.div(s, x),
        "sum": lambda: fd.ops.sum(a, [0]),
        "prod": lambda: fd.ops.prod(a, [0]),
        "max": lambda: fd.ops.max(a, 1),
        "min": lambda: fd.ops.min(a),
        "mean": lambda: fd.ops.mean(a, [0]),
        "var": lambda: fd.ops.var(a, [0]),
        "var_mean": lambda: fd.ops.var_mean(a, [0]),
        "welford": lambda: fd.ops.welford(a, [0]),
        "linear": lambda: fd.ops.linear(x, w, bias=a),
        "matmul": lambda: fd.ops.matmul(x, a),
        "broadcast_in_dim": lambda: fd.ops.broadcast_in_dim(a, [4, 8], [0, 1]),
        "permute": lambda: fd.ops.permute(a, [1, 0]),
        "broadcast": lambda: fd.ops.broadcast(a, [True, False, False]),
        "size": lambda: fd.ops.size(a, 1),
        "shape": lambda: fd.ops.shape(a),
        "full": lambda: fd.ops.full([2], s, DataType.Float),
        "iota": lambda: fd.ops.iota(4, s, dtype=DataType.Double),
        "uniform": lambda: fd.ops.uniform(s, 1.0, [2]),
        "normal": lambda: fd.ops.normal(0.0, s, [2]),
        "triu": lambda: fd.ops.triu(a),
        "index_select": lambda: fd.ops.index_select(a, x, 1),
        "gather": lambda: fd.ops.gather(a, x, 1),
        "take_along_axis": lambda: fd.ops.take_along_axis(a, x, 1),
        "cumsum": lambda: fd.ops.cumsum(a, 0),
        "argsort": lambda: fd.ops.argsort(a, 1),
        "scatter": lambda: fd.ops.scatter(a, x, x, 0),
        "scatter_add": lambda: fd.ops.scatter_add(a, x, x, 0),
        "index_add": lambda: fd.ops.index_add(a, x, x),
        "bincount": lambda: fd.ops.bincount(a, 4),
        "ragged_all_to_all": lambda: fd.ops.ragged_all_to_all(a, x),
        "topk": lambda: fd.ops.topk(a, 2),
        "sdpfa_fwd": lambda: fd.ops.sdpfa_fwd(a, x, x),
        "sdpfa_bwd": lambda: fd.ops.sdpfa_bwd(a, x, x, x, x, x, 0.0, False, x, x, None),
        "grouped_mm": lambda: fd.ops.grouped_mm(a, x, x),
        "embedding_fwd": lambda: fd.ops.embedding_fwd(a, x),
        "reshape": lambda: fd.ops.reshape(a, [8, 4]),
        "slice": lambda: fd.ops.slice(a, [0, 0], [2, 2]),
        "pad": lambda: fd.ops.pad(a, [1, 1]),
        "cat": lambda: fd.ops.cat([a, x], 0),
        "squeeze": lambda: fd.ops.squeeze(a, [0]),
        "expand": lambda: fd.ops.expand(a, [4, 8]),
        "stride_order": lambda: fd.ops.stride_order(a, [1, 0]),
    }
    if op not in calls and op in POINTWISE_OPS:  # the foreign tensor first, then x
        arity = POINTWISE_OPS[op].arity if op != "gelu" else 1
        return getattr(fd.ops, op)(a, *[x] * (arity - 1))
    return calls[op]()


OPS = [name for name in vars(type(FusionDefinition().ops)) if not name.startswith("_")]
"""Every op of fd.ops: a new one fails the test below until use_foreign covers it."""


@pytest.mark.parametrize("op", OPS)
def test_an_operand_of_another_definition_is_refused(op: str) -> None:
    """Every op refuses a tensor or scalar of another definition, naming the op, the value
    and both definitions: it used to stand, silently, for this definition's own T0."""
    a, s = foreign()
    role = {"linear": "bias", "sub": "lhs", "add": "rhs", "matmul": "rhs", "mul": "rhs"}
    role |= {"full": "fill_value", "iota": "start", "uniform": "minval", "normal": "std"}
    role |= {"sdpfa_fwd": "query", "sdpfa_bwd": "grad_output", "grouped_mm": "mat1"}
    role["embedding_fwd"] = "input"
    role["ragged_all_to_all"] = "src"
    role.update(cat="tensors\\[0\\]")  # an ``arg`` parameter is named "operand"
    if op in POINTWISE_OPS and op not in role and POINTWISE_OPS[op].arity > 1:
        role[op] = POINTWISE_OPS[op].params[0]  # the foreign tensor is the first operand
    name = "s0" if op in ("mul", "div", "full", "iota", "uniform", "normal") else "T0"
    pattern = (
        rf"fd.ops.{op}: {role.get(op, 'lhs' if op == 'div' else 'operand')} {name} belongs"
        rf" to another FusionDefinition \(fusion #{a.fusion.number} \(inputs T0\)\), not to"
        r" this one \(fusion #\d+ \(inputs T0, T1\)\)"
    )
    fd = FusionDefinition()
    x = fd.define_tensor((4, 8))
    with pytest.raises(OperandError, match=pattern):
        use_foreign(fd, x, op, a, s)
    assert fd.fusion.exprs() == []


def test_the_issue_repro_is_refused_and_the_own_definition_runs() -> None:
    """The issue's repro: fd2 used fd1's input ``a`` in ``add(a, b)``; it ran as
    ``b + b``. Now the op is refused; with fd2's own tensor the numbers match torch."""
    with FusionDefinition() as fd1:
        a = fd1.define_tensor((4,))
        fd1.add_output(fd1.ops.relu(a))
    with pytest.raises(OperandError, match=r"fd.ops.add: lhs T0 belongs to another Fusion"):
        with FusionDefinition() as fd2:
            b = fd2.define_tensor((4,))
            fd2.add_output(fd2.ops.add(a, b))
    with FusionDefinition() as fd3:
        c = fd3.define_tensor((4,))
        b = fd3.define_tensor((4,))
        fd3.add_output(fd3.ops.add(c, b))
    data = [torch.randn(4), torch.randn(4)]
    (out,) = fd3.execute(data)
    torch.testing.assert_close(out, data[0] + data[1])


def test_add_output_of_another_definition_names_both() -> None:
    """add_output of a tensor of another definition names it and both definitions."""
    a, _ = foreign()
    fd = FusionDefinition()
    fd.define_tensor((4, 8))
    pattern = (
        rf"add_output: T0 is not a tensor of this fusion \(fusion #\d+ \(inputs T0\)\): it"
        rf" belongs to another FusionDefinition \(fusion #{a.fusion.number} \(inputs T0\)\)"
    )
    with pytest.raises(DefinitionError, match=pattern):
        fd.add_output(a)


# ----- int constants and int inputs that do not fit their dtype -----

INT32_MAX = 2**31 - 1


def run_int32_plus(rhs: Callable[[FusionDefinition], Any], data: torch.Tensor) -> torch.Tensor:
    """``x + rhs(fd)`` on an Int32 input ``x``."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4,), dtype=DataType.Int32)
        fd.add_output(fd.ops.add(x, rhs(fd)))
    return fd.execute([data])[0]


@pytest.mark.parametrize(
    ("rhs", "pattern", "edge", "edge_value"),
    [
        (lambda fd: 2**40, r"add: the constant 1099511627776 does not fit Int32 \(int32,"
                           r" -2147483648\.\.2147483647\), the dtype its result is computed in",
         lambda fd: INT32_MAX, INT32_MAX),
        (lambda fd: -(2**31) - 1, r"add: the constant -2147483649 does not fit Int32",
         lambda fd: -(2**31), -(2**31)),
        (lambda fd: fd.define_scalar(2**40), r"add: the constant s0 = 1099511627776 does not"
                                             r" fit Int32",
         lambda fd: fd.define_scalar(INT32_MAX), INT32_MAX),
    ],
    ids=["python-int", "python-int-below", "Int-constant"],
)  # fmt: skip
def test_an_int_constant_that_would_wrap_is_refused(rhs, pattern, edge, edge_value) -> None:
    """``int32_tensor + 2**40`` used to add 0 (torch wraps the constant to int32); the
    constant at the edge of int32 still gives torch's numbers."""
    with pytest.raises(OperandError, match=pattern):
        run_int32_plus(rhs, torch.ones(4, dtype=torch.int32))
    data = torch.randint(1, 100, (4,), dtype=torch.int32)
    data = -data if edge_value > 0 else data  # the sum stays in int32
    torch.testing.assert_close(run_int32_plus(edge, data), data + edge_value)


def test_a_scalar_constant_has_its_dtype() -> None:
    """``define_scalar(2, dtype=Double)`` added to an Int32 tensor is a float64 sum, as
    nvFuser's promotion gives (a Double scalar raises an integer tensor to Double; torch
    would give float32); it used to fail in the verifier (declared float, the program
    computed int32). Float constants stay as given: large, inf and nan."""
    data = torch.randint(-100, 100, (4,), dtype=torch.int32)
    out = run_int32_plus(lambda fd: fd.define_scalar(2, dtype=DataType.Double), data)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, data.double() + 2.0)
    floats = torch.randn(4)
    for constant in (2.0**40, math.inf, math.nan):
        with FusionDefinition() as fd:
            x = fd.define_tensor((4,))
            fd.add_output(fd.ops.sub(x, fd.define_scalar(constant)))
        torch.testing.assert_close(fd.execute([floats])[0], floats - constant, equal_nan=True)


@pytest.mark.parametrize(
    ("declared", "given", "pattern"),
    [
        (DataType.Int32, 2**40, r"input s0: the value 1099511627776 does not fit Int32 \(int32,"
                                r" -2147483648\.\.2147483647\), its dtype"),
        (DataType.Int, 2**70, r"input s0: the value 2\*\*70 does not fit Int \(int64"),
        (DataType.Int, 2**40, r"input s0: the value 1099511627776 does not fit Int32 .*, the"
                              r" dtype of T1 = add\(T0, s0\), which it is computed in"),
    ],
    ids=["Int32-input", "Int-input", "Int-input-computed-in-int32"],
)  # fmt: skip
def test_an_int_input_that_would_wrap_is_refused(declared, given, pattern) -> None:
    """An int scalar input whose value does not fit its dtype, or the int32 result it is
    added into, used to wrap around (or raise a bare OverflowError in torch). Refused on
    every run, also after a run with a value that fits (same input signature)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4,), dtype=DataType.Int32)
        fd.add_output(fd.ops.add(x, fd.define_scalar(dtype=declared)))
    data = torch.randint(-100, 100, (4,), dtype=torch.int32)
    torch.testing.assert_close(fd.execute([data, 7])[0], data + 7)
    with pytest.raises(InputError, match=pattern):
        fd.execute([data, given])


# ----- a rank whose execute arguments are bad: its peers hear of it -----

SHORT_TIMEOUT_S = 5.0
"""What the good rank waits: if the bad rank did not tell it, it fails by this timeout."""

BAD_EXECUTE = [
    ("inputs", {"inputs": None}, InputError, "execute: inputs must be a list or tuple"),
    (
        "device",
        {"device": "banana"},
        SettingError,
        "execute: device='banana': expected a device name",
    ),
    ("options", {"_enable_options": None}, DefinitionError, "execute: _enable_options must"),
]


@pytest.mark.world_sizes(2)
def test_bad_execute_arguments_on_one_rank_stop_the_others_by_name(multidevice_test) -> None:
    """Rank 1 calls execute with bad inputs, device or options: it raises the named error,
    and rank 0, which called execute correctly, raises PeerFailureError naming rank 1 and
    that error (not a timeout of the agreement). Then both run correctly."""
    rank = multidevice_test.rank
    torch.manual_seed(0)
    mesh = DeviceMesh([0, 1])
    full = torch.randn(4, 8)
    for _, arguments, error, message in BAD_EXECUTE:
        with FusionDefinition() as fd:
            x = fd.define_tensor((4, 8))
            fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.axis(0).parallelize(X)
        good = {"inputs": [shard_tensor(full, x, rank)], "timeout": SHORT_TIMEOUT_S}
        if rank == 1:
            with pytest.raises(error, match=message):
                fd.execute(**{**good, **arguments})
        else:
            with pytest.raises(PeerFailureError, match=rf"rank 1: {error.__name__}: {message}"):
                fd.execute(**good)
        (out,) = fd.execute(**good)
        torch.testing.assert_close(out, shard_tensor(torch.relu(full), x, rank))
