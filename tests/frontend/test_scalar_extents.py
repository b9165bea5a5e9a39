"""Scalar inputs as extents (issue 35): a shape entry of ``reshape``, ``full``,
``broadcast_in_dim``, ``iota`` or ``topk``'s k that is a scalar input is its symbol, bound at
execute as nvFuser binds it; the fusion is lowered once per kind of inputs, not per value.
A value the program cannot run with is a named error before anything runs, and ranks
passing different values to a scalar that sizes a collective's buffer all raise
DisagreementError naming it.

The first programs are nvFuser's own (NVIDIA/Fuser at 81c4b22,
tests/python/direct/test_python_frontend.py, and the legacy
tests/python/test_inline_definitions.py before a092ad9e3), their FusionDefinition bodies
unchanged, each run for several scalar values against torch."""

from __future__ import annotations

import pytest
import torch

import hostir.cli
from frontend import DataType, DeviceMesh, FusionDefinition, OperandError, ParallelType
from hostir import ExtentError, parse
from hostir.errors import BoundRequirementError, DisagreementError
from hostir.run.agreements import extent_scalars
from hostir.run.signature import agreement_kinds, input_kinds


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _defined(fusion_func) -> FusionDefinition:
    with FusionDefinition() as fd:
        fusion_func(fd)
    return fd


# ----- nvFuser's programs, unchanged --------------------------------------------------------


def test_dynamic_bcast_in_dim() -> None:
    """nvFuser's test_dynamic_bcast_in_dim: broadcast_in_dim to (c4, c5), scalar inputs."""

    def fusion_func(fd: FusionDefinition) -> None:
        tv0 = fd.define_tensor(
            shape=[1, -1], contiguity=[None, True], dtype=DataType.Float, is_cpu=False
        )
        c4 = fd.define_scalar(None, dtype=DataType.Int)
        c5 = fd.define_scalar(None, dtype=DataType.Int)
        tv1 = fd.define_tensor(
            shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False
        )
        tv3 = fd.ops.broadcast_in_dim(tv0, (c4, c5), (0, 1))
        tv4 = fd.ops.add(tv3, tv1)
        fd.add_output(tv4)

    fd = _defined(fusion_func)
    for c4, c5 in ((5, 10), (3, 7), (1, 4)):
        t0, t1 = _random(1, c5, seed=c4), _random(c4, c5, seed=c5)
        (out,) = fd.execute([t0, c4, c5, t1])
        torch.testing.assert_close(out, t0.expand(c4, c5) + t1)
    # The input's dim 1 maps to size c5: equal, checked at execute (nvFuser checks it then).
    with pytest.raises(BoundRequirementError, match=r"dim 1 \(extent i0 = 6\) maps to output"):
        fd.execute([_random(1, 6), 5, 10, _random(5, 10)])


def test_dynamic_full() -> None:
    """nvFuser's test_dynamic_full: full((c4, c5), c6), every scalar an input."""

    def fusion_func(fd: FusionDefinition) -> None:
        c4 = fd.define_scalar(None, dtype=DataType.Int)
        c5 = fd.define_scalar(None, dtype=DataType.Int)
        c6 = fd.define_scalar(None, dtype=DataType.Float)
        tv1 = fd.define_tensor(
            shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, is_cpu=False
        )
        tv3 = fd.ops.full((c4, c5), c6, DataType.Float)
        tv4 = fd.ops.add(tv3, tv1)
        fd.add_output(tv4)

    fd = _defined(fusion_func)
    for c4, c5, c6 in ((5, 10, 2.5), (2, 3, -1.25), (4, 1, 0.5)):
        t1 = _random(c4, c5, seed=c4)
        (out,) = fd.execute([c4, c5, c6, t1])
        torch.testing.assert_close(out, t1 + c6)
    assert "T1 : float32[s0, s1] = full(s2)" in str(fd.host_ir())
    with pytest.raises(ExtentError, match="extent s0 = -5 is not a whole number >= 0; s0 = -5"):
        fd.execute([-5, 10, 2.5, _random(5, 10)])


def test_dynamic_reshape() -> None:
    """nvFuser's test_dynamic_reshape: [x.size(0), d1, d2] with Int32 scalar inputs, run
    for three factorings of x's 4 columns; lowered once (one kind of inputs)."""

    def dynamic_reshape(fd: FusionDefinition) -> None:
        x = fd.define_tensor([-1, -1], [True, True])
        d0 = fd.ops.size(x, 0)
        d1 = fd.define_scalar(dtype=DataType.Int32)
        d2 = fd.define_scalar(dtype=DataType.Int32)
        y = fd.ops.reshape(x, [d0, d1, d2])
        fd.add_output(y)

    fd = _defined(dynamic_reshape)
    x = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    for d1, d2 in ((2, 2), (4, 1), (1, 4)):
        (y,) = fd.execute([x, d1, d2])
        assert y.shape == torch.Size([3, d1, d2])
        assert torch.equal(x.flatten(), y.flatten())
    assert fd.lowering_count == 1
    with pytest.raises(BoundRequirementError, match="the element counts must be equal"):
        fd.execute([x, 3, 2])


def test_inline_def_mixed_bcast_in_dim() -> None:
    """nvFuser's mixed_bcast_in_dim_example (test_inline_definitions): a new dim of size S1."""

    def nvfuser_fusion_id0(fd: FusionDefinition) -> None:
        T0 = fd.define_tensor(
            shape=[-1, -1], contiguity=[False, False], dtype=DataType.Float, is_cpu=False
        )
        S1 = fd.define_scalar(None, dtype=DataType.Int)
        T5 = fd.ops.broadcast_in_dim(T0, shape=[2, 2, S1], broadcast_dims=[0, 1])
        fd.add_output(T5)

    fd = _defined(nvfuser_fusion_id0)
    t0 = _random(2, 2)
    for s1 in (1, 3, 5):
        (out,) = fd.execute([t0, s1])
        assert torch.equal(out, t0[:, :, None].expand(2, 2, s1))
    assert fd.lowering_count == 1


def test_inline_def_mixed_reshape() -> None:
    """nvFuser's mixed_reshape_example (test_inline_definitions): [i0] -> [2, S1] requires
    i0 == 2 * S1, checked when the inputs bind them."""

    def nvfuser_fusion_id0(fd: FusionDefinition) -> None:
        T0 = fd.define_tensor(shape=[-1], contiguity=[False], dtype=DataType.Float, is_cpu=False)
        S1 = fd.define_scalar(None, dtype=DataType.Int)
        T4 = fd.ops.reshape(T0, new_shape=[2, S1])
        fd.add_output(T4)

    fd = _defined(nvfuser_fusion_id0)
    for s1 in (5, 3, 0):
        t0 = _random(2 * s1, seed=s1)
        (out,) = fd.execute([t0, s1])
        assert torch.equal(out, t0.reshape(2, s1))
    text = str(fd.host_ir())
    assert "T1 : float32[2, s0] = reshape(T0)" in text, text
    with pytest.raises(BoundRequirementError) as error:
        fd.execute([_random(10), 4])
    assert str(error.value).startswith(
        "reshape of T0 to [2, s0]: T0 holds i0 = 10 elements, more than the 2 * s0 = 8 of the"
        " new shape; the element counts must be equal"
    ), error.value


# ----- what binding at execute takes ------------------------------------------------------


def test_reshape_by_a_product_of_scalar_inputs_and_a_minus_one() -> None:
    """``fd.ops.mul(s0, s1)`` is an extent (lowered once for every value); a -1 next to a
    scalar input is ``i0 // s0``, exact or refused by name; iota's length and topk's k
    read scalar inputs too."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s0 = fd.define_scalar(DataType.Int)
        s1 = fd.define_scalar(DataType.Int)
        grid = fd.ops.reshape(x, [fd.ops.mul(s0, s1)])
        fd.add_output(fd.ops.reshape(grid, [s1, -1]))  # -1: s0, exactly
        fd.add_output(fd.ops.reshape(x, [-1, s1]))
        fd.add_output(fd.ops.iota(s0, 1, 2, DataType.Int))
        fd.add_output(fd.ops.topk(x, s1, 0, True, True)[0])
    x = _random(12)
    for a, b in ((3, 4), (6, 2), (12, 1)):
        grid, rows, iota, top = fd.execute([x, a, b])
        assert torch.equal(grid, x.reshape(b, a)) and torch.equal(rows, x.reshape(-1, b))
        assert torch.equal(iota, torch.arange(a) * 2 + 1)
        assert torch.equal(top, torch.topk(x, b, 0).values)
    assert fd.lowering_count == 1
    assert "float32[i0 // s1, s1] = reshape(" in str(fd.host_ir())
    with pytest.raises(BoundRequirementError, match="element counts"):
        fd.execute([x, 5, 2])  # 5 * 2 != 12
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        fd.add_output(fd.ops.topk(x, fd.define_scalar(DataType.Int), 0)[1])
    with pytest.raises(BoundRequirementError, match="topk: k = s0 = 13 is larger than dim 0"):
        fd.execute([_random(12), 13])


def test_slice_pad_and_expand_by_scalar_inputs() -> None:
    """A slice's bounds, a pad's widths and expand's size read scalar inputs: one lowering
    for every value, torch's results, and the slice's rules on the bound values."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1])
        a, b = fd.define_scalar(DataType.Int), fd.define_scalar(DataType.Int)
        fd.add_output(fd.ops.slice(x, [0, a], [x.size(0), b]))
        fd.add_output(fd.ops.pad(x, [a, b]))
        fd.add_output(fd.ops.expand(fd.ops.broadcast(x, [True, False, False]), [b, -1, -1]))
    x = _random(3, 6)
    for a, b in ((1, 4), (0, 6), (2, 2)):
        cut, padded, expanded = fd.execute([x, a, b])
        assert torch.equal(cut, x[:, a:b]) and torch.equal(expanded, x.expand(b, 3, 6))
        assert torch.equal(padded, torch.nn.functional.pad(x, [a, b]))
    assert fd.lowering_count == 1
    with pytest.raises(BoundRequirementError, match="end s1 = 2 is before start s0 = 4"):
        fd.execute([x, 4, 2])


def test_arithmetic_on_a_float_scalar_input_alone_is_refused() -> None:
    """An extent is an integer: a Double scalar input in a shape is refused by name."""
    fd = FusionDefinition()
    s0 = fd.define_scalar(DataType.Double)
    with pytest.raises(OperandError, match=r"full: shape\[0\] = s0 must be an integer"):
        fd.ops.full([s0], 1.0, DataType.Float)
    with pytest.raises(OperandError, match="s0 is a scalar input, bound at execute"):
        fd.ops.add(s0, 1)


def test_only_scalars_that_extents_read_are_agreed_on() -> None:
    """A scalar input that sizes a tensor is part of what ranks agree on; one that is only
    a pointwise operand is not (its agreement costs nothing: the coarse kinds alone)."""
    program = parse(
        """%HostIrContainer {
  input T0 : float32[i0]
  input s0 : int64
  input s1 : float32
  T1 : float32[s0] = full(s1)
  T2 : float32[i0] = mul(T0, s1)
  output T1
  output T2
}"""
    )
    assert extent_scalars(program) == ((1, "s0"),)
    inputs = [torch.ones(3), 4, 0.5]
    assert agreement_kinds(inputs, extent_scalars(program)) != agreement_kinds(
        [torch.ones(3), 5, 0.5], extent_scalars(program)
    )
    assert agreement_kinds(inputs, ()) == input_kinds(inputs)


def test_traffic_binds_a_scalar_input(tmp_path, capsys) -> None:
    """``hostir traffic --bind s0=...`` takes a scalar input that an extent reads."""
    fd = _broadcast_then_gathered(2)
    path = tmp_path / "gathered.hir"
    path.write_text(str(fd.host_ir(world_size=2)))
    argv = ["traffic", str(path), "--world-size", "2", "--bind", "i0=8"]
    assert hostir.cli.main([*argv, "--bind", "s0=3"]) == 0
    report = capsys.readouterr().out
    assert "Allgather" in report, report
    assert hostir.cli.main(argv) != 0  # s0 unbound: the count names the symbolic extents
    assert "--bind" in capsys.readouterr().err


# ----- ranks agree on the scalars extents read ---------------------------------------------


def _broadcast_then_gathered(d: int) -> FusionDefinition:
    """x [h] sharded over d ranks, broadcast to [s0, h] (local), then gathered whole: the
    Allgather's buffers are sized by the scalar input s0."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        s0 = fd.define_scalar(DataType.Int)
        y = fd.ops.broadcast_in_dim(x, [s0, x.size(0)], [1])
        z = fd.ops.set(y)
        fd.add_output(z)
    mesh = DeviceMesh(torch.arange(d))
    for tv in (x, y, z):
        tv.set_device_mesh(mesh)
    for tv, dim in ((x, 0), (y, 1)):
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)
    return fd


@pytest.mark.world_sizes(2)
def test_ranks_passing_different_scalars_disagree_by_name(multidevice_test) -> None:
    """Rank 0 passes s0 = 3, rank 1 s0 = 2 to a program gathering a [s0, h] tensor: both
    raise DisagreementError naming scalar input s0 and both values, before the Allgather
    (which would mis-size or hang). Once the ranks agreed on one value (its kind of inputs
    agreed), new values are compared again: a differing pair raises, an equal one runs and
    matches torch. (A value a rank already ran is its executable's, run unchecked, as a
    tensor shape is: the ranks repeat signatures together, docs/frontend_api.md.)"""
    d, rank = multidevice_test.size, multidevice_test.rank
    fd = _broadcast_then_gathered(d)
    x = _random(4 * d)
    local = x.chunk(d)[rank]
    with pytest.raises(DisagreementError) as error:
        fd.execute([local, 3 - rank])
    message = str(error.value)
    assert "scalar input s0" in message and "rank 0 passed 3" in message, message
    assert "rank 1 passed 2" in message and f"this is rank {rank}" in message, message
    (out,) = fd.execute([local, 3])
    assert torch.equal(out, x.expand(3, 4 * d))
    with pytest.raises(DisagreementError, match="rank 0 passed 4, rank 1 passed 6"):
        fd.execute([local, 4 + 2 * rank])
    (out,) = fd.execute([local, 5])
    assert torch.equal(out, x.expand(5, 4 * d))
    text = str(fd.host_ir())
    assert text.count("Allgather") == 1 and "float32[s0, i0]" in text, text
    assert fd.lowering_count == 1


@pytest.mark.world_sizes(2)
def test_a_sharded_reshape_by_scalar_inputs(multidevice_test) -> None:
    """[i0] split over the ranks, reshaped to [s0, s1] split on s0: the symbols cannot show
    the blocks stay, so the input is gathered first (one Allgather) and each rank keeps
    its rows; s0 not a multiple of the ranks is an ExtentError on every rank."""
    d, rank = multidevice_test.size, multidevice_test.rank
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1])
        y = fd.ops.reshape(x, [fd.define_scalar(DataType.Int), fd.define_scalar(DataType.Int)])
        fd.add_output(y)
    mesh = DeviceMesh(torch.arange(d))
    for tv in (x, y):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    full = _random(12 * d)
    for s0 in (2 * d, 4 * d):
        (out,) = fd.execute([full.chunk(d)[rank], s0, 12 * d // s0])
        assert torch.equal(out, full.reshape(s0, -1).chunk(d)[rank])
    assert str(fd.host_ir()).count("Allgather") == 1
    with pytest.raises(ExtentError, match="s0 // 2"):
        fd.execute([full.chunk(d)[rank], 3, 8])
