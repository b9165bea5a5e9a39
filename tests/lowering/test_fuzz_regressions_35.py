"""What the differential fuzzer found drawing issue 35's features (scalar inputs as extents,
the MoE ops, run-time extents), each reduced to a few lines and run against torch (the
seed and world size of the fuzz case are in each docstring)."""

from __future__ import annotations

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir.errors import BoundRequirementError
from lowering import LoweringError

X = ParallelType.mesh_x


@pytest.mark.world_sizes(2)
def test_a_scalar_extent_tied_by_a_broadcast_is_checked_when_the_inputs_bind_it(
    multidevice_test,
):
    """Drawing bad scalar extents (tests/fuzz/scalar_extents.py): ``full([s0, 4]) + T0[8,
    4]`` and ``T0 * iota(s1)`` need ``s0 = 8`` and ``s1 = 4``; other values ran into torch's
    size mismatch mid-run (an EvaluationError). They are requirements of the program now,
    checked on every rank before anything runs, in the extent checks' words for a negative
    one."""
    d, rank = multidevice_test.size, multidevice_test.rank
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(35))
    refusals = {
        (9, 4): "add: dim 0 of T1 (s0 = 9) is larger than the extent 8 it broadcasts with"
        " (output dim 0); the extents must be equal; s0 = 9",
        (-1, 4): "T1 dim 0: extent s0 = -1 is not a whole number >= 0; s0 = -1",
        (8, 3): "mul: dim 0 of T4 (s1 = 3) is smaller than the extent 4 it broadcasts with"
        " (output dim 1); the extents must be equal; s1 = 3",
    }
    # One definition per call: a definition refusing new values after its ranks agreed on
    # others does not wait for its peers (hostir.run.agreements), see the report of issue 35.
    for values, message in refusals.items():
        fd, t0 = _tied(d)
        with pytest.raises(BoundRequirementError) as error:
            fd.execute([shard_tensor(x, t0, rank), *values])
        assert str(error.value) == message
    fd, t0 = _tied(d)
    added, scaled = fd.execute([shard_tensor(x, t0, rank), 8, 4])
    program = fd.host_ir()
    expected = (x + 2.0, x * torch.tensor([1.0, 3, 5, 7]))
    for out, value, ref in zip((added, scaled), program.outputs, expected, strict=True):
        assert torch.equal(out, shard_tensor(ref, value, rank))


def _tied(d: int) -> tuple[FusionDefinition, object]:
    """``full([s0, 4]) + T0[8, 4]`` and ``T0 * iota(s1)``, T0's rows split over ``d``
    devices; the definition and T0."""
    with FusionDefinition() as fd:
        t0 = fd.define_tensor([8, 4])
        s0, s1 = fd.define_scalar(DataType.Int), fd.define_scalar(DataType.Int)
        fd.add_output(fd.ops.add(fd.ops.full([s0, 4], 2.0, DataType.Float), t0))
        iota = fd.ops.cast(fd.ops.iota(s1, 1, 2, DataType.Int), DataType.Float)
        fd.add_output(fd.ops.mul(t0, iota))
    t0.set_device_mesh(DeviceMesh(torch.arange(d)))
    t0.outer_split(0, d)
    t0.axis(0).parallelize(X)
    return fd, t0


@pytest.mark.world_sizes(2)
def test_bincount_into_a_sharded_result_counts_every_bin_then_lays_them_out(multidevice_test):
    """Fuzz seed 8600041 at 8 ranks: a ``bincount`` whose bins were split over a mesh axis
    was computed into its local shape, but torch counts every bin (an EvaluationError:
    *bincount produced a tensor of shape [4], but T4 is declared with local shape [2]*).
    Its bins are computed whole now and laid out afterwards: a block split runs, a cyclic
    one is refused by name, as for any op."""
    d, rank = multidevice_test.size, multidevice_test.rank
    values = torch.randint(0, 4, (11,), generator=torch.Generator().manual_seed(4))
    for cyclic in (False, True):
        with FusionDefinition() as fd:
            t0 = fd.define_tensor([-1], dtype=DataType.Int32)
            t1 = fd.ops.bincount(t0, 4)
            fd.add_output(t1)
        mesh = DeviceMesh(torch.arange(d))
        t0.set_device_mesh(mesh)
        t1.set_device_mesh(mesh)
        if cyclic:
            t1.inner_split(0, d)
            t1.axis(1).parallelize(X)
            with pytest.raises(LoweringError, match="not laid out in blocks"):
                fd.host_ir()
            continue
        t1.outer_split(0, d)
        t1.axis(0).parallelize(X)
        (out,) = fd.execute([values.int()])
        expected = torch.bincount(values, minlength=4)
        assert out.shape == (4 // d,)
        assert torch.equal(out, shard_tensor(expected, fd.host_ir().outputs[0], rank))
