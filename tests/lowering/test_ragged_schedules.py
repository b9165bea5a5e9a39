"""Ragged schedules: a symbolic dim that an op ties to a constant extent, split by a factor
that does not divide the constant. Lowering used to carry the split over to the
constant-extent tensor (``2 // 8 = 0`` rows per device) and crash in its own verifier
(VerifyError from ``lower_fusion``); it now refuses the split by name before emitting
anything. Each test is a fuzz case (seed and world size in its docstring) reduced by
hand; the refusal happens while lowering, so one process is enough."""

from __future__ import annotations

import re

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from lowering import LoweringError

X, Y, Z = ParallelType.mesh_x, ParallelType.mesh_y, ParallelType.mesh_z


def _split(tv, dim: int, factor: int, parallel_type: ParallelType, mesh=None) -> None:
    if mesh is not None:
        tv.set_device_mesh(mesh)
    tv.outer_split(dim, factor)
    tv.axis(dim).parallelize(parallel_type)


def _refused(fd, tv, dim: int, parts: str, value: int, fixed_by: str | None) -> None:
    """``fd`` refuses to lower, naming ``tv``'s dim, its split, the constant and the dim
    that fixes it (None: ``tv``'s own constant extent)."""
    name = rf"{tv.name} dim {dim}" + (r" \(extent i\d+\)" if fixed_by is not None else "")
    message = rf"{name} is split \[{parts}\] on mesh .*which does not divide its extent {value}"
    if fixed_by is not None:
        message += rf" \(fixed by {re.escape(fixed_by)}, a constant extent mapped to it\)"
    else:
        message += ":"
    with pytest.raises(LoweringError, match=message + ".*uneven shards are not supported"):
        fd.host_ir()


def test_linear_bias_fixes_the_split_output_dim():
    """A linear's bias of size [2] fixes the output dim that the user splits over 8
    devices; propagation gave the bias the parts [x, 0] (seed 90252 at 8 ranks)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 12, 3))
        w = fd.define_tensor((-1, -1))
        bias = fd.define_tensor((2,))
        out = fd.ops.linear(x, w, bias)
        fd.add_output(out)
    _split(out, 2, 8, X, DeviceMesh([3, 5, 6, 2, 1, 7, 0, 4]))
    _refused(fd, out, 2, r"x, .*", 2, f"{bias.name} dim 0")


def test_matmul_contraction_fixed_by_the_rhs():
    """A divisor's dim 1 becomes the contraction dim of a matmul whose rhs has 2 rows; the
    divisor splits it over the 4 devices of mesh_y (seed 90237 at 8 ranks: an AllToAll
    that did not verify)."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((-1, -1))
        b = fd.define_tensor((-1, -1))
        rhs = fd.define_tensor((2, -1))
        fd.add_output(fd.ops.matmul(fd.ops.div(a, b), rhs))
    _split(b, 1, 4, Y, DeviceMesh(torch.arange(8).reshape(4, 2)))
    _refused(fd, b, 1, r"y, i\d+ // 4", 2, f"{rhs.name} dim 0")


def test_elementwise_operand_fixes_the_split_dim():
    """``div(t0, t1)`` with t0 of extent 2 in dim 0 and t1 split there over 4 devices; t0
    is left unscheduled and got the parts [x, 0] (seed 90352 at 8 ranks)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((2, -1, 2))
        t1 = fd.define_tensor((-1, -1, -1))
        fd.add_output(fd.ops.div(t0, t1))
    _split(t1, 0, 4, X, DeviceMesh(torch.arange(8).reshape(2, 4)))
    _refused(fd, t1, 0, r"x, i\d+ // 4", 2, f"{t0.name} dim 0")


def test_linear_weight_rows_fixed_by_the_bias():
    """A linear's weight split over 4 devices in dim 0 (N), whose bias has 3 entries
    (seed 201 at 4 ranks)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8,))
        w = fd.define_tensor((-1, -1))
        bias = fd.define_tensor((3,))
        fd.add_output(fd.ops.linear(x, w, bias))
    _split(w, 0, 4, X, DeviceMesh(torch.tensor([[0, 1, 2, 3]])))
    _refused(fd, w, 0, r"x, i\d+ // 4", 3, f"{bias.name} dim 0")


def test_a_split_that_leaves_a_remainder():
    """Extent 3 split over the 2 devices of mesh_z: the parts [2, 1] are not empty but
    still do not make up 3 (seed 610 at 4 ranks)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((-1, 3, -1))
        t2 = fd.define_tensor((-1, -1, -1))
        fd.add_output(fd.ops.div(t0, t2))
    _split(t2, 1, 2, Z, DeviceMesh(torch.arange(4).reshape(2, 2, 1)))
    _refused(fd, t2, 1, r"z, i\d+ // 2", 3, f"{t0.name} dim 1")


def test_linear_contraction_fixed_through_an_add():
    """A linear's weight split over 4 devices in its K dim, which an add ties to a
    constant 6; the contraction was then sharded [x, 1] (seed 620 at 4 ranks)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((3, 6))
        t2 = fd.define_tensor((-1, 6))
        w = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.linear(fd.ops.add(t0, t2), w))
    _split(w, 1, 4, X, DeviceMesh([0, 1, 2, 3]))
    _refused(fd, w, 1, r"x, i\d+ // 4", 6, f"{t0.name} dim 1")


def test_linear_contraction_fixed_through_a_sum():
    """The K dim of a linear is the kept dim of a sum over a [6, n] tensor; the weight
    splits K over 4 devices (seed 5156 at 4 ranks)."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor((6, -1))
        w = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.linear(fd.ops.sum(t0, [1], keepdim=False), w))
    _split(w, 1, 4, X, DeviceMesh([0, 1, 2, 3]))
    _refused(fd, w, 1, r"x, i\d+ // 4", 6, f"{t0.name} dim 0")


def test_own_constant_extent_refused_by_host_ir():
    """A split of a tensor's own constant extent: ``execute`` refuses it in the frontend,
    ``host_ir`` lowered it and failed in the verifier."""
    with FusionDefinition() as fd:
        t = fd.define_tensor((2,))
        fd.add_output(fd.ops.neg(t))
    _split(t, 0, 4, X, DeviceMesh([0, 1, 2, 3]))
    _refused(fd, t, 0, "x, 0", 2, None)


@pytest.mark.world_sizes(2)
def test_a_split_that_divides_the_tied_constant_runs(multidevice_test):
    """The same tie as seed 90252 with a bias of 4 split over 2 devices: it divides, so the
    check lets it through and the output matches torch."""
    rank = multidevice_test.rank
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 3))
        w = fd.define_tensor((-1, 3))
        bias = fd.define_tensor((4,))
        out = fd.ops.linear(x, w, bias)
        fd.add_output(out)
    _split(out, 1, 2, X, DeviceMesh([0, 1]))
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(shape, generator=generator) for shape in ((5, 3), (4, 3), (4,))]
    program = fd.host_ir()
    local = [shard_tensor(t, value, rank) for t, value in zip(full, program.inputs, strict=True)]
    (result,) = fd.execute(local)
    expected = torch.nn.functional.linear(*full)
    torch.testing.assert_close(result, shard_tensor(expected, program.outputs[0], rank))
