"""An op declared outside the package, as docs/extending.md ("Adding an op") says a user
declares one: ``ext_roll`` (``torch.roll`` along one dim) has one declaration and one torch
implementation, here, and nothing else. It is then defined through ``fd.ops`` (a method
made from the declaration), verified (a program that breaks its rule is refused in its
words), lowered sharded at 1, 2 and 4 ranks (a rolled dim that is sharded is gathered
first, another dim computes locally), printed, parsed back, serialized, run compiled and
interpreted, and listed by the docs check (``tests.test_ops_doc``).

The registry is process-global and the multi-rank pools' workers are reused, so the op is
declared once, when this module is imported, under a name no other test uses; an op
declared later is no method of ``Ops`` (``fd.ops`` finds it through ``Ops.__getattr__``),
so the package's docs check (``vars(Ops)``) does not see it.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

import hostir
from frontend import DeviceMesh, FusionDefinition, OperandError, ParallelType
from frontend import shard_tensor as shard
from frontend.ops import Ops
from hostir import HostIrContainer, HostIrError, HostIrEvaluator, TensorValue, VerifyError
from hostir.ir.opdecl import (
    AxisSource,
    OpArgs,
    Param,
    ParamKind,
    ResultAxis,
    ResultType,
    declare_op,
)
from hostir.run.implementations import implements
from tests.test_ops_doc import PAGE, missing_rows, row_problems, rows_of

# ----- the op: one declaration, one implementation ---------------------------------------


def _infer_roll(args: OpArgs) -> tuple[ResultType, ...] | str:
    """``src``'s dtype and extents; the rolled dim is computed whole (a rank needs all of
    it), every other dim iterates with ``src``'s."""
    src, dim = args["src"], args["dim"]
    if not 0 <= dim < src.ndim:
        return f"ext_roll: dim {dim} is out of range for {src.name} with {src.ndim} dims"
    axes = tuple(
        ResultAxis(extent=e, sources=(AxisSource("src", d),), whole=d == dim)
        for d, e in enumerate(src.shape)
    )
    return (ResultType(dtype=src.dtype, axes=axes),)


EXT_ROLL = declare_op(
    "ext_roll",
    class_name="ExtRoll",
    params=(
        Param("src", ParamKind.TENSOR, TensorValue, nvfuser="arg"),
        Param("shifts", ParamKind.ATTRIBUTE, int),
        Param("dim", ParamKind.ATTRIBUTE, int, 0, dim_of="src"),
    ),
    positional=("src",),
    infer=_infer_roll,
    summary="``arg`` rolled by ``shifts`` along ``dim``, cyclically (``torch.roll``).",
    dtype_rule="same",
)


@implements("ext_roll", fresh=True)
def prepare_ext_roll(instruction) -> functools.partial:
    """``torch.roll`` of the instruction's ``src``."""
    return functools.partial(torch.roll, shifts=instruction.shifts, dims=instruction.dim)


# ----- the tests -------------------------------------------------------------------------


def _rolled(x: torch.Tensor, *dims: int) -> tuple[FusionDefinition, list]:
    """A definition of ``ext_roll`` of ``x`` by 2 along each of ``dims``, each an output."""
    with FusionDefinition() as fd:
        tx = fd.define_tensor(tuple(x.shape))
        outs = [fd.ops.ext_roll(tx, 2, dim) for dim in dims]
        for out in outs:
            fd.add_output(out)
    return fd, [tx, *outs]


def test_fd_ops_has_its_method_made_from_the_declaration() -> None:
    """No method is written for it: ``fd.ops.ext_roll`` has nvFuser's signature from the
    params (``arg`` for ``src``, ``dim``'s default), wraps a negative dim, and refuses
    arguments of the wrong form, and what its ``infer`` refuses, by name."""
    assert "ext_roll" not in vars(Ops)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    fd, (tx, out) = _rolled(x, -1)
    assert "ext_roll" in dir(fd.ops)
    assert str(inspect.signature(fd.ops.ext_roll)) == "(arg, shifts, dim=0)"
    assert fd.ops.ext_roll.__doc__.startswith(EXT_ROLL.summary)
    assert "T1 = ext_roll(T0, shifts=2, dim=1)" in str(fd.fusion)
    (got,) = fd.execute([x])
    assert torch.equal(got, torch.roll(x, 2, 1))
    with FusionDefinition() as fd:
        t = fd.define_tensor((4, 6))
        with pytest.raises(OperandError, match="ext_roll: dim 2 is out of range for T0"):
            fd.ops.ext_roll(t, 1, 2)
        with pytest.raises(OperandError, match="ext_roll: arg must be a TensorView, got 3"):
            fd.ops.ext_roll(3, 1)
        with pytest.raises(OperandError, match="ext_roll: shifts must be an int, got 1.5"):
            fd.ops.ext_roll(t, 1.5)
        with pytest.raises(OperandError, match=r"ext_roll\(arg, shifts, dim\)"):
            fd.ops.ext_roll(t)
        fd.add_output(fd.ops.ext_roll(t, 1))


TEXT = """%HostIrContainer {
  input T0 : float32[4, 6]
  T1 : float32[4, 6] = ext_roll(T0, shifts=2, dim=1)
  output T1
}
"""


def test_the_verifier_refuses_a_program_that_breaks_its_rule() -> None:
    """A parsed program is verified with the declaration's ``infer``: a dim out of range
    in its words, a result of other extents or another dtype by the common check."""
    assert hostir.parse(TEXT) is not None
    with pytest.raises(VerifyError, match="ext_roll: dim 2 is out of range for T0 with 2 dims"):
        hostir.parse(TEXT.replace("dim=1", "dim=2"))
    with pytest.raises(VerifyError, match=r"T1 is declared with extents \[4, 5\]"):
        hostir.parse(TEXT.replace("T1 : float32[4, 6]", "T1 : float32[4, 5]"))
    with pytest.raises(VerifyError, match="float64"):
        hostir.parse(TEXT.replace("T1 : float32", "T1 : float64"))


def test_printed_parsed_serialized_and_run_compiled_and_interpreted() -> None:
    """The lowered program prints and parses back to itself, round-trips through JSON,
    and runs compiled and interpreted to torch's result (so does the program read back)."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    fd, _ = _rolled(x, 1)
    program = fd.host_ir()
    assert str(program) == TEXT
    parsed = hostir.parse(str(program))
    assert parsed == program
    assert HostIrContainer.from_json(program.to_json()) == program
    for compiled in (True, False):
        for run in (program, parsed):
            (got,) = HostIrEvaluator(run, compiled=compiled).run([x])
            assert torch.equal(got, torch.roll(x, 2, 1)), compiled


@pytest.mark.world_sizes(1, 2, 4)
def test_lowered_sharded(multidevice_test) -> None:
    """Dim 0 of the input and outputs split over the ranks: rolled along dim 1, each rank
    rolls its rows (no communication); rolled along the sharded dim 0, which the
    declaration computes whole, the input is gathered first (one Allgather) and each rank
    keeps its rows of the result. Both match torch on random data, compiled and
    interpreted."""
    d, rank = multidevice_test.size, multidevice_test.rank
    x = torch.randn(2 * d, 6, generator=torch.Generator().manual_seed(2))
    mesh = DeviceMesh(torch.arange(d))
    for dim, gathers in ((1, 0), (0, 1 if d > 1 else 0)):  # on one device, a copy instead
        fd, tvs = _rolled(x, dim)
        for tv in tvs:
            tv.set_device_mesh(mesh)
            tv.outer_split(0, d)
            tv.axis(0).parallelize(ParallelType.mesh_x)
        local = shard(x, tvs[0], rank)
        want = shard(torch.roll(x, 2, dim), tvs[1], rank)
        (got,) = fd.execute([local])
        assert torch.equal(got, want), dim
        program = fd.host_ir()
        (interpreted,) = HostIrEvaluator(program, compiled=False).run([local])
        assert torch.equal(interpreted, want), dim
        text = str(program)
        assert "= ext_roll(" in text
        assert text.count("Allgather") == gathers, text
        assert "Allreduce" not in text and "AllToAll" not in text, text


def test_a_stream_split_of_the_rolled_dim_is_refused() -> None:
    """The rolled dim is computed whole: split into stream chunks it is refused by name,
    as cumsum's is; the other dim split into chunks runs chunk by chunk."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    for dim in (0, 1):
        fd, (_, out) = _rolled(x, 0)
        out.outer_split(dim, 2)
        out.axis(dim).parallelize(ParallelType.stream)
        if dim == 0:
            with pytest.raises(HostIrError, match=r"T1 = ext_roll\(...\): its axis 0"):
                fd.execute([x])
            continue
        assert "for " in str(fd.host_ir())
        (got,) = fd.execute([x])
        assert torch.equal(got, torch.roll(x, 2, 0))


ROW = (
    "| op | signature | computes | dtype rule |\n"
    "|---|---|---|---|\n"
    "| `ext_roll` | `ext_roll(arg, shifts, dim=0)` | `arg` rolled by `shifts` along `dim`,"
    " cyclically (`torch.roll`). | `same` |\n"
)


def test_the_docs_check_lists_it() -> None:
    """The docs check, given the op, says docs/ops.md has no row for it; a page with its
    row (signature, summary and dtype rule from the declaration) passes, and a row that
    says otherwise is named."""
    assert missing_rows((EXT_ROLL,), rows_of(PAGE.read_text())) == ["ext_roll"]
    assert row_problems((EXT_ROLL,), rows_of(ROW)) == []
    wrong = rows_of(ROW.replace("`same`", "`promote`"))
    assert row_problems((EXT_ROLL,), wrong) == ["ext_roll: dtype rule `promote`, declared same"]
