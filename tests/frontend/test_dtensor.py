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

pytestmark = pytest.mark.real_ranks(reason="torch DTensor on a torch.distributed device mesh")


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
    other than the schedule, a Partial("avg") input and a plain tensor are refused by name."""
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
        average = DTensor.from_local(full_y, mesh, [Partial("avg")])
        with pytest.raises(
            InputError, match=r"input 1 \(T1\): Partial\(avg\) on mesh dim 0 is not supported"
        ):
            execute_with_dtensors(fd, [dx, average])
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


# ---------------------------------------------------------------------------
# Partial inputs: reduced by a resharding program of ours (frontend.partial_inputs)


def _partial(parts: torch.Tensor, mesh, placements):
    """A DTensor on ``mesh`` whose rank ``r`` holds ``parts[r]`` as its local tensor: with
    ``Partial`` placements, its value is a reduction of the parts over the partial ranks."""
    from torch.distributed.tensor import DTensor

    rank = dist.get_rank() if dist.is_initialized() else 0
    return DTensor.from_local(parts[rank].clone(), mesh, placements, run_check=False)


def _reduction_text(given, target_placements) -> list[str]:
    """The collectives of the reduction program execute_with_dtensors ran for Partial
    DTensor ``given`` into ``target_placements`` (the kept one: a cache hit, no re-plan)."""
    from frontend.partial_inputs import reduction_fusion
    from lowering.redistribution.distribution import Distribution

    mesh, ndim = given.device_mesh, given.ndim
    src = Distribution.from_placements(mesh, given.placements, ndim=ndim)
    dst = Distribution.from_placements(mesh, target_placements, ndim=ndim)
    before = reduction_fusion.cache_info()
    fd = reduction_fusion(src, dst, tuple(given.shape), given.dtype)
    assert reduction_fusion.cache_info().hits == before.hits + 1, "not the program that ran"
    return _collectives(fd)


def _scheduled_add(mesh: DeviceMesh, x_sharded: bool, y_sharded: bool) -> FusionDefinition:
    """x + y on a 1-d ``mesh``, x and y each Shard(0) or Replicate."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        y = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.add(x, y))
    for tv, sharded in ((x, x_sharded), (y, y_sharded)):
        tv.set_device_mesh(mesh)
        if sharded:
            tv.outer_split(0, mesh.size)
            tv.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def test_partial_inputs_on_a_1d_mesh(multidevice_test) -> None:
    """A Partial(sum) x into x + y: (a) a fusion scheduled Replicate for x (its reduction
    one Allreduce), (b) one scheduled Shard(0) (one ReduceScatter), (c) an unscheduled one
    (x scheduled Replicate: one Allreduce); each against DTensor's own ops on the same
    DTensors and against torch on the summed parts; a second call plans nothing new."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    from frontend.partial_inputs import reduction_fusion
    from lowering.redistribution.distribution import Distribution

    d = multidevice_test.size
    gen = torch.Generator().manual_seed(4)
    parts, full_y = torch.randn(d, 2 * d, 3, generator=gen), torch.randn(2 * d, 3, generator=gen)
    reference = parts.sum(0) + full_y
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,))
        dx = _partial(parts, mesh, [Partial()])
        for y_placements, sharded, kind in (
            ([Replicate()], False, "Allreduce"),
            ([Shard(0)], True, "ReduceScatter"),
        ):
            dy = distribute_tensor(full_y, mesh, y_placements)
            fd = _scheduled_add(DeviceMesh(list(range(d))), sharded, sharded)
            (out,) = execute_with_dtensors(fd, [dx, dy])
            _check_round_trip(out, dx.redistribute(mesh, y_placements) + dy)
            torch.testing.assert_close(out.full_tensor(), reference)
            moves = _reduction_text(dx, y_placements)
            if d > 1:
                assert len(moves) == 1 and f"= {kind}(" in moves[0], moves
            else:  # a one-device team: the reduction is a local copy, no collective
                assert moves == [], moves
            assert _collectives(fd) == []
        # (c) no mesh: x scheduled Replicate (the Partial replaced), y as given (Shard(0))
        with FusionDefinition() as fd:
            x = fd.define_tensor((-1, -1))
            y = fd.define_tensor((-1, -1))
            fd.add_output(fd.ops.add(x, y))
        (out,) = execute_with_dtensors(fd, [dx, dy])
        scheduled = Distribution.from_sharding(fd.host_ir().inputs[0].sharding)
        assert scheduled.to_placements() == (Replicate(),), scheduled
        _check_round_trip(out, (dx + dy).redistribute(mesh, out.placements))
        torch.testing.assert_close(out.full_tensor(), reference)
        moves = _reduction_text(dx, [Replicate()])
        assert (len(moves) == 1 and "= Allreduce(" in moves[0]) if d > 1 else moves == [], moves
        misses = reduction_fusion.cache_info().misses
        (again,) = execute_with_dtensors(fd, [dx, dy])  # kept: nothing planned again
        assert reduction_fusion.cache_info().misses == misses
        torch.testing.assert_close(again.to_local(), out.to_local())


@pytest.mark.world_sizes(4)
def test_partial_inputs_on_a_2d_mesh(multidevice_test) -> None:
    """On a 2x2 mesh: (Shard(0), Partial()) x + (Shard(0), Replicate()) y, unscheduled (x
    scheduled (Shard(0), Replicate()): one Allreduce over the inner mesh dim); then a
    (Partial(), Replicate()) x into a fusion scheduled (Shard(0), Replicate()) for it (one
    ReduceScatter over the outer mesh dim), and the same with Partial("max"); against
    DTensor's add and torch."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(5)
    parts, full_y = torch.randn(4, 2, 6, generator=gen), torch.randn(4, 6, generator=gen)
    # rank r = 2 * dp + tp holds rows [2 dp, 2 dp + 2) of x, partial over tp
    full_x = torch.cat([parts[0] + parts[1], parts[2] + parts[3]])
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dx = _partial(parts, mesh, [Shard(0), Partial()])
        dy = distribute_tensor(full_y, mesh, [Shard(0), Replicate()])
        with FusionDefinition() as fd:
            x = fd.define_tensor((-1, -1))
            y = fd.define_tensor((-1, -1))
            fd.add_output(fd.ops.add(x, y))
        (out,) = execute_with_dtensors(fd, [dx, dy])
        assert out.placements == (Shard(0), Replicate())
        _check_round_trip(out, (dx + dy).redistribute(mesh, out.placements))
        torch.testing.assert_close(out.full_tensor(), full_x + full_y)
        (moved,) = _reduction_text(dx, [Shard(0), Replicate()])
        assert "= Allreduce(" in moved and "team=M0(x)" in moved, moved
        # (Partial(), Replicate()): the ranks of one tp index hold the same partial value
        base = torch.randn(2, 4, 6, generator=gen)
        dx = _partial(base.repeat_interleave(2, dim=0), mesh, [Partial(), Replicate()])
        with FusionDefinition() as fd:
            x = fd.define_tensor((-1, -1))
            y = fd.define_tensor((-1, -1))
            fd.add_output(fd.ops.add(x, y))
        for tv in (x, y):
            tv.set_device_mesh(DeviceMesh(torch.arange(4).reshape(2, 2)))
            tv.outer_split(0, 2)
            tv.axis(0).parallelize(ParallelType.mesh_y)
        (out,) = execute_with_dtensors(fd, [dx, dy])
        _check_round_trip(out, dx.redistribute(mesh, [Shard(0), Replicate()]) + dy)
        torch.testing.assert_close(out.full_tensor(), base.sum(0) + full_y)
        (moved,) = _reduction_text(dx, [Shard(0), Replicate()])
        assert "= ReduceScatter(" in moved and "team=M0(y)" in moved, moved
        # Partial("max") as DTensor has it: a max over the parts, one ReduceScatter(max)
        dx = _partial(base.repeat_interleave(2, dim=0), mesh, [Partial("max"), Replicate()])
        (out,) = execute_with_dtensors(fd, [dx, dy])
        _check_round_trip(out, dx.redistribute(mesh, [Shard(0), Replicate()]) + dy)
        torch.testing.assert_close(out.full_tensor(), base.amax(0) + full_y)
        (moved,) = _reduction_text(dx, [Shard(0), Replicate()])
        assert "= ReduceScatter(" in moved and "op=max" in moved, moved


@pytest.mark.world_sizes(2, 4)
def test_partial_output_round_trip(multidevice_test) -> None:
    """A row-parallel x @ w left Partial(sum) (no collective) fed to a second, unscheduled
    matmul with a Shard(1) w2: the partial input reduced to Replicate (one Allreduce), the
    result Shard(1), as DTensor's own (x @ w) @ w2 chain and torch give."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    d = multidevice_test.size
    gen = torch.Generator().manual_seed(6)
    full_x, full_w = torch.randn(4, 2 * d, generator=gen), torch.randn(2 * d, 3, generator=gen)
    full_w2 = torch.randn(3, 2 * d, generator=gen)
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (d,))
        dx = distribute_tensor(full_x, mesh, [Shard(1)])
        dw = distribute_tensor(full_w, mesh, [Shard(0)])
        dw2 = distribute_tensor(full_w2, mesh, [Shard(1)])
        (h,) = execute_with_dtensors(
            _matmul(scheduled=True, mesh=DeviceMesh(list(range(d)))), [dx, dw]
        )
        assert h.placements == (Partial("sum"),)
        fd = _matmul(scheduled=False)
        (out,) = execute_with_dtensors(fd, [h, dw2])
        assert out.placements == (Shard(1),)
        _check_round_trip(out, ((dx @ dw) @ dw2).redistribute(mesh, out.placements))
        torch.testing.assert_close(out.full_tensor(), full_x @ full_w @ full_w2)
        assert _collectives(fd) == []
        (moved,) = _reduction_text(h, [Replicate()])
        assert "= Allreduce(" in moved, moved


def test_partial_values_of_two_ops_are_refused() -> None:
    """Partial values combined by two ops (which DTensor's placements refuse too) are
    refused by name: one reduction cannot say in which order they combine."""
    from frontend.partial_inputs import check_reducible
    from lowering.redistribution.distribution import parse_notation

    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, -1))
        fd.add_output(fd.ops.neg(x))
    src = parse_notation("PP(max)", DeviceMesh(torch.arange(4).reshape(2, 2)), ndim=2)
    with pytest.raises(InputError, match=r"input 0 \(T0\) is partial with PP\(max\) .*one"):
        check_reducible(0, x, src)


@pytest.mark.world_sizes(8)
def test_a_3d_mesh(multidevice_test) -> None:
    """On a 2x2x2 mesh (the 8-rank pool other tests start): (Shard(0), Partial(),
    Replicate()) x + (Shard(0), Replicate(), Shard(1)) y, unscheduled: x reduced to
    (Shard(0), Replicate(), Replicate()) by one Allreduce over the middle mesh dim (y);
    against DTensor's add and torch."""
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    gen = torch.Generator().manual_seed(7)
    base, full_y = torch.randn(2, 2, 2, 6, generator=gen), torch.randn(4, 6, generator=gen)
    # rank 4a + 2b + c holds base[a, b]: rows [2a, 2a + 2), partial over b, same over c
    full_x = torch.cat([base[0].sum(0), base[1].sum(0)])
    with default_group():
        mesh = dist.device_mesh.init_device_mesh("cpu", (2, 2, 2))
        dx = _partial(
            base.repeat_interleave(2, dim=1).reshape(8, 2, 6),
            mesh,
            [Shard(0), Partial(), Replicate()],
        )
        dy = distribute_tensor(full_y, mesh, [Shard(0), Replicate(), Shard(1)])
        with FusionDefinition() as fd:
            x = fd.define_tensor((-1, -1))
            y = fd.define_tensor((-1, -1))
            fd.add_output(fd.ops.add(x, y))
        (out,) = execute_with_dtensors(fd, [dx, dy])
        _check_round_trip(out, (dx + dy).redistribute(mesh, out.placements))
        torch.testing.assert_close(out.full_tensor(), full_x + full_y)
        (moved,) = _reduction_text(dx, [Shard(0), Replicate(), Replicate()])
        assert "= Allreduce(" in moved and "team=M0(y)" in moved, moved
