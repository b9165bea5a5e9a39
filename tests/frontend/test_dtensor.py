"""DTensors given to ``fd.execute``: refused by name at every world size (it takes local
shards), the refusal saying what to pass instead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from frontend import (
    DeviceMesh,
    FusionDefinition,
    InputError,
    ParallelType,
    ScheduleError,
    execute_with_dtensors,
    schedule_from_dtensors,
    shard_tensor,
)
from hostir import HostIrEvaluator


@contextlib.contextmanager
def default_group() -> Iterator[None]:
    """The default process group DTensor's meshes need: the pool's at world size > 1, a
    one-rank gloo group (destroyed on exit) in the pytest process at world size 1."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sharded_add(d: int) -> FusionDefinition:
    """x + y with x sharded on dim 0 over ``d`` ranks, y replicated."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        y = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.add(x, y))
    mesh = DeviceMesh(list(range(d)))
    for tv in (x, y):
        tv.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def test_execute_refuses_dtensors_by_name(multidevice_test) -> None:
    """At every world size (at 1 rank a DTensor used to run as DTensor's own ops and come
    back a DTensor; at 2 and 4 it failed on an extent), the first DTensor is named by
    position and fusion tensor, with its placements and mesh; local shards still run."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    d, rank = multidevice_test.size, multidevice_test.rank
    fd = _sharded_add(d)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * d, 3, generator=gen), torch.randn(2 * d, 3, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        dy = distribute_tensor(y, mesh, [Replicate()])
        with pytest.raises(InputError, match=r"input 0 \(T0\) is a DTensor") as error:
            fd.execute([dx, dy])
        for fragment in ["Shard(dim=0)", "DeviceMesh", "global shape [", "dt.to_local()"]:
            assert fragment in str(error.value), str(error.value)
        tvs = fd.fusion.inputs()
        inputs = [shard_tensor(t, tv, rank) for t, tv in zip((x, y), tvs, strict=True)]
        (out,) = fd.execute(inputs)  # the refusal left no rank waiting
        torch.testing.assert_close(out, shard_tensor(x + y, fd.host_ir().outputs[0], rank))
        # a known program (same local shapes at 1 rank) does not let a DTensor through
        with pytest.raises(InputError, match=r"input 1 \(T1\) is a DTensor.*Replicate"):
            fd.execute([inputs[0], dy])
        # nor does the runtime's entry point, given the program itself
        evaluator = HostIrEvaluator(fd.host_ir())
        with pytest.raises(InputError, match=r"input T0 is a DTensor \(placements \(Shard"):
            evaluator.run([dx, dy])
        (again,) = evaluator.run(inputs)
        torch.testing.assert_close(again, out)


# ---------------------------------------------------------------------------
# execute_with_dtensors: round trips against DTensor's own ops


def _collectives(fd: FusionDefinition) -> list[str]:
    keywords = ("Allreduce", "Allgather", "ReduceScatter", "Broadcast", "AllToAll", "SendRecv")
    return [
        line.strip() for line in str(fd.host_ir()).splitlines() if any(k in line for k in keywords)
    ]


def _check_round_trip(ours, theirs) -> None:
    """Our DTensor holds what DTensor's own op gives, in the same placements."""
    assert ours.placements == theirs.placements, (ours.placements, theirs.placements)
    assert ours.device_mesh == theirs.device_mesh
    torch.testing.assert_close(ours.to_local(), theirs.to_local())
    torch.testing.assert_close(ours.full_tensor(), theirs.full_tensor())


def test_pointwise_on_a_1d_mesh(multidevice_test) -> None:
    """An unscheduled fusion scheduled from Shard(0) and Replicate inputs: x + y comes back
    Shard(0) on the inputs' mesh, as DTensor's own add; no collective. Then placements
    other than the schedule, a Partial input and a plain tensor are refused by name."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    d = multidevice_test.size
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        y = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.add(x, y))
    gen = torch.Generator().manual_seed(1)
    full_x, full_y = torch.randn(2 * d, 3, generator=gen), torch.randn(2 * d, 3, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,), mesh_dim_names=("tp",))
        dx = distribute_tensor(full_x, mesh, [Shard(0)])
        dy = distribute_tensor(full_y, mesh, [Replicate()])
        (out,) = execute_with_dtensors(fd, [dx, dy])
        _check_round_trip(out, dx + dy)
        assert out.device_mesh.mesh_dim_names == ("tp",)
        assert _collectives(fd) == []
        # the fusion is scheduled now: placements that differ are refused by name
        with pytest.raises(InputError, match=r"input 1 \(T1\) is a DTensor with placements"):
            execute_with_dtensors(fd, [dx, distribute_tensor(full_y, mesh, [Shard(1)])])
        partial = DTensor.from_local(full_y, mesh, [Partial()])
        with pytest.raises(InputError, match=r"input 1 \(T1\) is Partial"):
            execute_with_dtensors(fd, [dx, partial])
        with pytest.raises(InputError, match=r"input 1 \(T1\) must be a DTensor, got Tensor"):
            execute_with_dtensors(fd, [dx, full_y])


def _matmul(scheduled: bool, mesh: DeviceMesh | None = None) -> FusionDefinition:
    """x @ w; ``scheduled``: row-parallel on ``mesh``'s x axis (K sharded), the output
    left partial over it (and on a 2-d mesh, M sharded over y)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        w = fd.define_tensor((-1, -1))
        out = fd.ops.matmul(x, w)
        fd.add_output(out)
    if not scheduled:
        return fd
    for tv in (x, w, out):
        tv.set_device_mesh(mesh)
    x.outer_split(1, mesh.shape[-1])
    x.axis(1).parallelize(ParallelType.mesh_x)
    w.outer_split(0, mesh.shape[-1])
    w.axis(0).parallelize(ParallelType.mesh_x)
    out.outer_split(2, mesh.shape[-1])  # the reduction axis: partial sums
    out.axis(2).parallelize(ParallelType.mesh_x)
    if mesh.ndim == 2:
        for tv in (x, out):
            tv.outer_split(0, mesh.shape[0])
            tv.axis(0).parallelize(ParallelType.mesh_y)
    return fd


def _allreduces(fd: FusionDefinition) -> int:
    return sum("Allreduce" in line for line in _collectives(fd))


@pytest.mark.world_sizes(2, 4)
def test_matmuls_on_a_1d_mesh(multidevice_test) -> None:
    """Column-parallel (Replicate @ Shard(1): Shard(1), no collective), row-parallel with
    the output left partial (Shard(1) @ Shard(0): Partial(sum), no collective) and
    row-parallel unscheduled (one Allreduce: Replicate), each against DTensor's matmul;
    schedule_from_dtensors, then the output left partial by hand, as the first."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    d = multidevice_test.size
    gen = torch.Generator().manual_seed(2)
    full_x, full_w = torch.randn(4, 2 * d, generator=gen), torch.randn(2 * d, 2 * d, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,))
        column = [distribute_tensor(full_x, mesh, [Replicate()])]
        column.append(distribute_tensor(full_w, mesh, [Shard(1)]))
        fd = _matmul(scheduled=False)
        (out,) = execute_with_dtensors(fd, column)
        _check_round_trip(out, column[0] @ column[1])
        assert _collectives(fd) == []
        row = [distribute_tensor(full_x, mesh, [Shard(1)])]
        row.append(distribute_tensor(full_w, mesh, [Shard(0)]))
        fd = _matmul(scheduled=True, mesh=DeviceMesh(list(range(d))))
        (out,) = execute_with_dtensors(fd, row)
        assert out.placements == (Partial("sum"),)
        _check_round_trip(out, row[0] @ row[1])
        assert _collectives(fd) == []
        fd = _matmul(scheduled=False)
        (out,) = execute_with_dtensors(fd, row)
        _check_round_trip(out, (row[0] @ row[1]).redistribute(mesh, [Replicate()]))
        assert _allreduces(fd) == 1 and len(_collectives(fd)) == 1, _collectives(fd)
        # the inputs scheduled from the placements, the output then left partial by hand
        fd = _matmul(scheduled=False)
        schedule_from_dtensors(fd, row)
        (tv,) = fd.fusion.outputs()
        tv.set_device_mesh(DeviceMesh(list(range(d))))
        tv.outer_split(2, d)
        tv.axis(2).parallelize(ParallelType.mesh_x)
        (out,) = execute_with_dtensors(fd, row)
        _check_round_trip(out, row[0] @ row[1])
        assert _collectives(fd) == []
        with pytest.raises(ScheduleError, match=r"input 0 \(T0\) has a mesh already"):
            schedule_from_dtensors(fd, row)


@pytest.mark.world_sizes(4)
def test_a_2d_mesh(multidevice_test) -> None:
    """On a 2x2 mesh: x (Shard(0), Shard(1)) + y (Replicate, Shard(0)) scheduled from the
    placements, against DTensor's add (y moved by one AllToAll); x @ w row-parallel over
    the inner mesh dim with the output (Shard(0), Partial(sum)) as DTensor's matmul leaves
    it, no collective."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(3)
    full_x, full_y = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    full_w = torch.randn(6, 3, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dx = distribute_tensor(full_x, mesh, [Shard(0), Shard(1)])
        dy = distribute_tensor(full_y, mesh, [Replicate(), Shard(0)])
        with FusionDefinition() as fd:
            x = fd.define_tensor((-1, -1))
            y = fd.define_tensor((-1, -1))
            fd.add_output(fd.ops.add(x, y))
        (out,) = execute_with_dtensors(fd, [dx, dy])
        _check_round_trip(out, dx + dy)  # (Shard(0), Shard(1))
        torch.testing.assert_close(out.full_tensor(), full_x + full_y)
        (moved,) = _collectives(fd)  # y to x's placements: one AllToAll over the x axis
        assert "AllToAll(" in moved and "team=M0(x)" in moved, moved
        fd = _matmul(scheduled=True, mesh=DeviceMesh(torch.arange(4).reshape(2, 2)))
        dw = distribute_tensor(full_w, mesh, [Replicate(), Shard(0)])
        (out,) = execute_with_dtensors(fd, [dx, dw])
        assert out.placements == (Shard(0), Partial("sum"))
        _check_round_trip(out, dx @ dw)
        torch.testing.assert_close(out.full_tensor(), full_x @ full_w)
        assert _collectives(fd) == []
