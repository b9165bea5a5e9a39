"""Op declarations (``hostir.ir.opdecl``): the declared ops, the checked and the generating
forms of ``declare_op``, and every layer reading one declaration."""

from __future__ import annotations

import functools

import pytest
import torch

import hostir
from frontend import FusionDefinition, OperandError
from hostir import HostIrContainer, HostIrEvaluator, TensorValue, Unary, VerifyError
from hostir.ir.catalog import declaration_of
from hostir.ir.opdecl import (
    AxisKind,
    AxisSource,
    OpArgs,
    OpSharding,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
    declared_ops,
    op_decl,
    op_named,
)
from hostir.ir.ops import POINTWISE_OPS
from hostir.ir.reductions import REDUCTION_OPS
from hostir.run.evaluator import HANDLERS
from hostir.run.implementations import IMPLEMENTATIONS, implementation_of, implements


def test_the_pointwise_ops_and_reductions_are_declared_and_implemented() -> None:
    """Each op of the two families has one declaration on its instruction class (checked
    against the class's fields when it was made) and one implementation."""
    names = [d.name for d in declared_ops()]
    assert set(POINTWISE_OPS) | set(REDUCTION_OPS) <= set(names)
    assert len(names) == len(set(names))
    assert set(names) <= set(IMPLEMENTATIONS)
    assert op_named("where").signature() == "where(condition, x, y)"
    assert op_named("sum").signature() == "sum(arg, dims=None, keepdim=False, dtype=None)"
    relu = Unary(op=hostir.UnaryOpKind.RELU, out=_tensor("T1"), src=_tensor("T0"))
    assert op_decl(relu) is op_named("relu") and implementation_of(relu).fresh


def _tensor(name: str, dtype=hostir.DType.FLOAT32, shape=(4,)) -> TensorValue:
    return TensorValue(name=name, dtype=dtype, shape=tuple(hostir.Const(value=e) for e in shape))


def test_the_checked_form_names_what_differs_from_the_class() -> None:
    """``declare_op(..., cls=...)`` on an existing class refuses fields, types or defaults
    other than the class's, and a keyword the class does not have, by name."""
    src = Param("src", ParamKind.TENSOR, TensorValue)

    def declare(name: str, *params: Param) -> None:
        declare_op(
            name, cls=Unary, params=params, infer=lambda a: "", summary="", dtype_rule="same"
        )

    with pytest.raises(TypeError, match=r"fields \['op', 'out', 'src', 'preallocated'\]"):
        declare("neg", src, Param("alpha", ParamKind.ATTRIBUTE, int, 1))
    with pytest.raises(TypeError, match="src is .*TensorValue.*, declared <class 'int'>"):
        declare("neg", Param("src", ParamKind.TENSOR, int))
    with pytest.raises(TypeError, match=r"Unary has keywords \['abs', "):
        declare("negate", src)
    assert op_named("neg").params[0].nvfuser == "x"  # the real declaration is untouched


# ----- a new op, declared in the generating form ------------------------------------------


def _infer_scale(args: OpArgs) -> tuple[ResultType, ...] | str:
    src, factor = args["src"], args["factor"]
    if factor <= 0:
        return f"scale_by: factor must be positive, got {factor}"
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),)) for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


SCALE_BY = declare_op(
    "scale_by",
    class_name="ScaleBy",
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("factor", ParamKind.ATTRIBUTE, int, 2),
    ),
    positional=("src",),
    infer=_infer_scale,
    summary="``arg * factor``.",
    dtype_rule="same",
    sharding=OpSharding(elementwise=True),
)


@implements("scale_by", fresh=True)
def _prepare_scale(instruction):
    return functools.partial(torch.mul, other=instruction.factor)


def test_an_op_has_one_implementation_never_one_replaced_by_import_order() -> None:
    """A second implementation of a declared op, by another function, is refused by name
    (the plain attention handler was once replaced by the dropout one through the order
    of a dict merge); the same function registered again (its module run again) is not."""
    before = IMPLEMENTATIONS["scale_by"]

    def other_scale(instruction):
        return functools.partial(torch.mul, other=instruction.factor)

    with pytest.raises(TypeError, match="op 'scale_by' is already implemented by .*_prepare_scale"):
        implements("scale_by", fresh=True)(other_scale)
    with pytest.raises(TypeError, match="op 'relu' is already implemented by"):
        implements("relu")(other_scale)
    assert IMPLEMENTATIONS["scale_by"] is before
    implements("scale_by", fresh=True)(_prepare_scale)  # its module run again
    assert IMPLEMENTATIONS["scale_by"].prepare is _prepare_scale


TEXT = """%HostIrContainer {
  input T0 : float32[4, 6]
  T1 : float32[4, 6] = scale_by(T0, factor=3)
  output T1
}
"""


def test_a_new_op_prints_parses_serializes_verifies_and_runs() -> None:
    """The generating form makes the instruction class and declares it: its text and JSON
    come from the catalog, the verifier checks it with its ``infer`` (refusal and result
    types), and the runtime runs its implementation, compiled and interpreted."""
    cls = SCALE_BY.cls
    assert cls.__name__ == "ScaleBy" and declaration_of(cls).keyword == "scale_by"
    assert (cls.OUTS, cls.INS) == (("out",), ("src",))
    program = hostir.parse(TEXT)
    assert str(program) == TEXT
    assert HostIrContainer.from_json(program.to_json()) == program
    with pytest.raises(VerifyError, match="scale_by: factor must be positive, got 0"):
        hostir.parse(TEXT.replace("factor=3", "factor=0"))
    with pytest.raises(VerifyError, match=r"T1 is declared with extents \[4, 7\], but the op"):
        hostir.parse(TEXT.replace("T1 : float32[4, 6]", "T1 : float32[4, 7]"))
    # The evaluator's class table does not know the class: it runs its op's implementation.
    assert cls not in HANDLERS
    x = torch.randn(4, 6)
    for compiled in (True, False):
        (out,) = HostIrEvaluator(program, compiled=compiled).run([x])
        assert torch.equal(out, x * 3)


# ----- one rule for frontend and verifier -------------------------------------------------


def test_frontend_and_verifier_refuse_extents_that_do_not_broadcast_in_one_wording() -> None:
    """Both read the pointwise declaration's broadcasting rule (hostir.ir.broadcasting)."""
    message = r"add: output dim 1 has incompatible extents \(T0 dim 1 = 4, T1 dim 1 = 3\)"
    with FusionDefinition() as fd:
        a = fd.define_tensor((2, 4))
        b = fd.define_tensor((2, 3))
        with pytest.raises(OperandError, match=message):
            fd.ops.add(a, b)
        fd.add_output(fd.ops.add(a, a))
    text = """%HostIrContainer {
  input T0 : float32[2, 4]
  input T1 : float32[2, 3]
  T2 : float32[2, 4] = add(T0, T1)
  output T2
}
"""
    with pytest.raises(VerifyError, match=message):  # the same words, once
        hostir.parse(text)


def test_a_recorded_op_keeps_its_declared_axis_kinds() -> None:
    """``fd.ops.sum`` keeps its reduced axes as reduction axes (AxisKind.REDUCTION), and a
    broadcast against a dim of extent 1 maps only the operand that is not 1."""
    decl = op_named("sum")
    (inferred,) = decl.infer(
        OpArgs(
            values={
                "src": _tensor("T0", shape=(4, 6)),
                "dims": (1,),
                "keepdim": False,
                "dtype": None,
            }
        )
    )
    assert [a.kind for a in inferred.axes] == [AxisKind.INHERIT, AxisKind.REDUCTION]
    assert inferred.shape == (hostir.Const(value=4),)
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 1))
        b = fd.define_tensor((4, 6))
        c = fd.ops.mul(a, b)
        fd.add_output(fd.ops.sum(c, [1]))
    (mul, total) = fd.fusion.exprs()
    assert [len(pairs) for pairs in mul.axis_map.values()] == [1, 2]
    assert total.describe() == "T3 = sum(T2, dims=[1])"
    assert total.output.get_logical_domain()[1].is_reduction()
