"""The creation ops, the indexing singles and the attention singles, declared
(``hostir.ir.creation``, ``hostir.ir.indexing``, ``hostir.ir.attention``): one declaration
and one implementation each, read by ``fd.ops``, the verifier (in the frontend's words),
lowering (whole axes, an op that reads no tensor, operands read twice) and the runtime
(a rank's slice in a context handler; an index check inside the call a replay makes)."""

from __future__ import annotations

import pytest
import torch

import hostir
from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend.exprs import FusionOp
from frontend.types import DataType as FrontendDataType
from hostir import HostIrEvaluator, VerifyError
from hostir.ir.dtypes import NVFUSER_NAMES
from hostir.ir.opdecl import op_decl, op_named
from hostir.run.implementations import IMPLEMENTATIONS
from lowering.errors import LoweringError

CONTEXT = ("full", "iota", "uniform", "normal", "sdpfa_philox")
PLAIN = ("index_select", "gather", "take_along_axis", "cumsum", "grouped_mm", "embedding_fwd")


def test_each_op_has_one_declaration_and_one_implementation() -> None:
    """The ops whose result depends on the rank (a slice of the global tensor, a drawn
    seed) run a context handler; the others a plain call, a fresh tensor (the ops of
    several results: tests/hostir/test_multi_results.py)."""
    for name in CONTEXT:
        assert IMPLEMENTATIONS[name].handler is not None, name
    for name in PLAIN:
        implementation = IMPLEMENTATIONS[name]
        assert implementation.prepare is not None and implementation.fresh, name
    assert op_named("iota").signature() == "iota(length, start=None, step=None, dtype=DataType.Int)"
    assert op_named("gather").signature() == "gather(arg, index, dim)"
    assert op_named("sdpfa_philox").sharding.reads_no_tensor


def test_messages_name_dtypes_as_fd_ops_does() -> None:
    """``NVFUSER_NAMES`` (what a declaration's refusal calls a dtype) are the frontend's
    ``DataType`` names."""
    assert {d: FrontendDataType(d).name for d in NVFUSER_NAMES} == NVFUSER_NAMES


def _program(line: str, inputs: str) -> str:
    return f"%HostIrContainer {{\n  {inputs}\n  {line}\n  output T9\n}}\n"


@pytest.mark.parametrize(
    ("define", "line", "inputs", "message"),
    [
        (
            lambda fd: fd.ops.cumsum(fd.define_tensor((4, 6), dtype=DataType.Bool), 1),
            "T9 : bool[4, 6] = cumsum(T0, dim=1)",
            "input T0 : bool[4, 6]",
            "cumsum: T0 is Bool; cumsum takes numbers",
        ),
        (
            lambda fd: fd.ops.take_along_axis(
                fd.define_tensor((4, 6)), fd.define_tensor((3, 2), dtype=DataType.Int), 1
            ),
            "T9 : float32[3, 2] = take_along_axis(T0, T1, dim=1)",
            "input T0 : float32[4, 6]\n  input T1 : int64[3, 2]",
            "take_along_axis: dim 0 of T0 (4) and of the index T1 (3) differ; they must be"
            " equal (or one of them 1)",
        ),
        (
            lambda fd: fd.ops.iota(4, 1, dtype=DataType.Float),
            "T9 : float32[4] = iota(1, 1.0)",
            "input T0 : float32[2]",
            "iota: start 1 is a int, but dtype is Float: nvFuser's iota takes a float start for it",
        ),
        (
            lambda fd: fd.ops.embedding_fwd(
                fd.define_tensor((3,), dtype=DataType.Int), fd.define_tensor((4, 6, 2))
            ),
            "T9 : float32[3, 6] = embedding_fwd(T0, T1)",
            "input T0 : int64[3]\n  input T1 : float32[4, 6, 2]",
            "embedding_fwd: weight T1 has 3 dims; expected [V, D]",
        ),
    ],
    ids=["cumsum", "take_along_axis", "iota", "embedding_fwd"],
)
def test_frontend_and_verifier_refuse_in_one_wording(define, line, inputs, message) -> None:
    """``fd.ops`` and the verifier read the same ``infer``: one refusal, one sentence."""
    with FusionDefinition() as fd:
        with pytest.raises(OperandError) as defined:
            define(fd)
        fd.add_output(fd.define_tensor((2,)))
    assert str(defined.value) == message
    with pytest.raises(VerifyError) as verified:
        hostir.parse(_program(line, inputs))
    assert str(verified.value).endswith(message), str(verified.value)


def _infer(line: str, inputs: str):
    program = hostir.parse(_program(line, inputs))
    instruction = program.body[0]
    (result,) = op_decl(instruction).infer_of(instruction)
    return [axis.whole for axis in result.axes]


def test_the_axes_an_op_computes_whole_are_in_its_result_axes() -> None:
    """cumsum's dim; a gather's dims where the index does not line up with the source (off
    ``dim``); grouped_mm's grouped dim (rows, columns, or the groups and K)."""
    assert _infer("T9 : float32[4, 6] = cumsum(T0, dim=1)", "input T0 : float32[4, 6]") == [
        False,
        True,
    ]
    gathered = "input T0 : float32[4, 6, 5]\n  input T1 : int64[2, 3, 5]"
    assert _infer("T9 : float32[2, 3, 5] = gather(T0, T1, dim=1)", gathered) == [
        True,
        False,
        False,
    ]
    mm = "input T0 : bfloat16[8, 4]\n  input T1 : bfloat16[4, 6]\n  input T2 : int32[3]"
    assert _infer("T9 : bfloat16[3, 8, 6] = grouped_mm(T0, T1, T2)", mm) == [
        True,
        False,
        False,
        True,
    ]


def test_sdpfa_philox_takes_its_mesh_from_the_query_and_reads_nothing() -> None:
    """The philox projections are recorded from their declaration with the query as an
    input for its mesh only: no field of the instruction, no axis mapped."""
    with FusionDefinition() as fd:
        q = fd.define_tensor((1, 2, 4, 8), dtype=DataType.BFloat16)
        output, _, seed, _ = fd.ops.sdpfa_fwd(q, q, q)
        fd.add_output(output)
        fd.add_output(seed)
    philox = seed.definition
    assert isinstance(philox, FusionOp) and philox.decl is op_named("sdpfa_philox")
    assert philox.inputs() == [q] and philox.axis_map == {q: []}
    assert philox.describe() == f"{seed.name} = sdpfa_philox({q.name}, result=philox_seed)"


def test_an_operand_read_twice_by_an_indexing_op_on_a_mesh_is_refused() -> None:
    """``take_along_axis(x, x, 0)`` with ``x`` sharded along dim 0: the source's dim 0 must
    be whole, the index's need not; one copy of ``x`` cannot be both, so the op (not
    elementwise, as its declaration says) is refused by name. It lowered to the op on the
    local rows of ``x``, a wrong result."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 4), dtype=DataType.Int)
        fd.add_output(fd.ops.take_along_axis(x, x, 0))
    x.set_device_mesh(DeviceMesh(torch.arange(2)))
    x.outer_split(0, 2)
    x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(LoweringError, match="T0 is read as 2 operands of the op defining T1"):
        fd.host_ir()


def test_a_replay_calls_the_indexing_op_directly() -> None:
    """A later run of a signature replays ``cumsum`` and ``index_select`` as their torch
    calls (no handler), the indices still checked by the call (tests/hostir/
    test_index_checks.py)."""
    program = hostir.parse(
        _program(
            "T9 : float32[4, 3] = index_select(T2, T1, dim=1)",
            "input T0 : float32[4, 6]\n  input T1 : int64[3]\n"
            "  T2 : float32[4, 6] = cumsum(T0, dim=1)",
        )
    )
    evaluator = HostIrEvaluator(program, compiled=True)
    x, picks = torch.randn(4, 6), torch.tensor([5, 0, 2])
    (out,) = evaluator.run([x, picks])
    torch.testing.assert_close(out, torch.cumsum(x, 1).index_select(1, picks))
    source = evaluator.replay_program(0, on_cpu=True).source
    assert source.count(" = F") == 2 and "handler" not in source.lower(), source
