"""Every collective instruction on both axes of a 2x2 mesh, from hand-written programs.

The lowering only emits some of these shapes (rooted collectives on 1-d meshes),
but the instructions themselves work on any team; these tests pin that down
with exact numbers at 4 ranks.
"""

from __future__ import annotations

import pytest
import torch

from hostir import (
    Allgather,
    Allreduce,
    AllToAll,
    Broadcast,
    Const,
    DType,
    Gather,
    HostIrContainer,
    HostIrEvaluator,
    MeshAxis,
    PartialAxis,
    Reduce,
    ReduceOp,
    ReduceScatter,
    RequestValue,
    Scatter,
    SendRecv,
    Sharding,
    ShardPart,
    TensorValue,
    Wait,
)
from hostir.ir.sharding import Mesh
from hostir.ir.team import Team

MESH = Mesh(devices=(0, 1, 2, 3), shape=(2, 2))
ROWS, COLS = 4, 6


def value(name: str, shape: tuple[int, ...], dims=None, partial=(), mesh=MESH) -> TensorValue:
    """A float32 value on ``mesh``; ``dims`` maps a dim to its parts (replicated otherwise),
    ``partial`` lists (axis, op) pairs it is partial over."""
    parts = []
    for d, extent in enumerate(shape):
        given = (dims or {}).get(d)
        parts.append(given or (ShardPart(axis=None, extent=Const(value=extent)),))
    partial_axes = tuple(PartialAxis(axis=a, op=op) for a, op in partial)
    sharding = Sharding(mesh=mesh, dims=tuple(parts), partial=partial_axes)
    return TensorValue(
        name=name,
        dtype=DType.FLOAT32,
        shape=tuple(Const(value=e) for e in shape),
        sharding=sharding,
    )


def block(axis: MeshAxis, local: int) -> tuple[ShardPart, ...]:
    """A block sharding over ``axis`` (size 2) with ``local`` elements per device."""
    return (
        ShardPart(axis=axis, extent=Const(value=2)),
        ShardPart(axis=None, extent=Const(value=local)),
    )


def run(instruction, src: TensorValue, given: torch.Tensor) -> torch.Tensor | None:
    """Runs ``src -> instruction -> wait`` and returns this rank's output."""
    program = HostIrContainer(
        inputs=(src,),
        outputs=(instruction.out,),
        body=(instruction, Wait(request=instruction.request)),
    )
    (out,) = HostIrEvaluator(program).run([given])
    return out


def per_rank(rank: int) -> torch.Tensor:
    """Rank-specific data every rank can recompute."""
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS) * (rank + 1)


def random_per_rank(rank: int) -> torch.Tensor:
    """Random data of either sign, different on each rank, that every rank can recompute."""
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(100 + rank))


def team(axis: MeshAxis) -> Team:
    """The groups along ``axis`` of MESH: rows for x, columns for y."""
    return Team(mesh=MESH, axes=(axis,))


def members(axis: MeshAxis, rank: int) -> tuple[int, ...]:
    """The group of ``rank`` along ``axis``."""
    return team(axis).group_of(rank)


def receivers(axis: MeshAxis, position: int) -> Mesh:
    """The members at ``position`` of the groups along ``axis``: where the output of a
    collective only they receive (a Reduce's, a Gather's, a SendRecv's) lives."""
    devices = tuple(group[position] for group in team(axis).groups)
    return Mesh(devices=devices, shape=(len(devices),))


R = RequestValue(name="R0")
AXES = [MeshAxis.X, MeshAxis.Y]


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("dim", [0, 1])
def test_allgather_and_reduce_scatter(multidevice_test, axis, dim):
    """Allgather along dim 0 or 1 (each member holds its block of the gathered tensor), and
    ReduceScatter back (members hold partial sums: the sum of members' data)."""
    rank = multidevice_test.rank
    group = members(axis, rank)
    shape = (ROWS * 2 if dim == 0 else ROWS, COLS * 2 if dim == 1 else COLS)
    blocks = value("a", shape, {dim: block(axis, (ROWS, COLS)[dim])})
    full = value("b", shape)
    out = run(
        Allgather(out=full, src=blocks, team=team(axis), axis=dim, request=R),
        blocks,
        per_rank(rank),
    )
    torch.testing.assert_close(out, torch.cat([per_rank(m) for m in group], dim))
    src = value("a", (ROWS, COLS), partial=[(axis, ReduceOp.SUM)])
    local = block(axis, (ROWS if dim == 0 else COLS) // 2)
    scattered = value("c", (ROWS, COLS), {dim: local})
    out = run(
        ReduceScatter(out=scattered, src=src, team=team(axis), axis=dim, request=R),
        src,
        per_rank(rank),
    )
    total = sum(per_rank(m) for m in group)
    torch.testing.assert_close(out, total.chunk(2, dim)[group.index(rank)])


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("axis", AXES)
def test_allreduce_max(multidevice_test, axis):
    """Allreduce with max within each group (members hold partial maxima). The data are
    random per rank, so the maximum takes elements from every member: a result copied from
    one member, or the group's sum, differs."""
    rank = multidevice_test.rank
    group = members(axis, rank)
    src = value("a", (ROWS, COLS), partial=[(axis, ReduceOp.MAX)])
    out_value = value("b", (ROWS, COLS))
    out = run(
        Allreduce(out=out_value, src=src, team=team(axis), op=ReduceOp.MAX, request=R),
        src,
        random_per_rank(rank),
    )
    data = torch.stack([random_per_rank(m) for m in group])
    expected = data.amax(0)
    assert all((expected != member).any() for member in data)  # no member alone is the max
    torch.testing.assert_close(out, expected)


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("axis", AXES)
def test_rooted_collectives_with_root_one(multidevice_test, axis):
    """Broadcast, Reduce, Gather and Scatter with the second member of each group as root
    (a Reduce's or a Gather's output on the roots alone: the other members hold none)."""
    rank = multidevice_test.rank
    group = members(axis, rank)
    root, is_root, roots = Const(value=1), group.index(rank) == 1, receivers(axis, 1)
    src = value("a", (ROWS, COLS))
    out = run(
        Broadcast(out=value("b", (ROWS, COLS)), src=src, team=team(axis), root=root, request=R),
        src,
        per_rank(rank),
    )
    torch.testing.assert_close(out, per_rank(group[1]))
    out = run(
        Reduce(
            out=value("b", (ROWS, COLS), mesh=roots), src=src, team=team(axis), root=root, request=R
        ),
        src,
        per_rank(rank),
    )
    if is_root:
        torch.testing.assert_close(out, per_rank(group[0]) + per_rank(group[1]))
    else:
        assert out is None
    gathered = value("b", (ROWS, COLS * 2), mesh=roots)
    out = run(
        Gather(out=gathered, src=src, team=team(axis), root=root, axis=1, request=R),
        src,
        per_rank(rank),
    )
    if is_root:
        torch.testing.assert_close(out, torch.cat([per_rank(m) for m in group], 1))
    else:
        assert out is None
    scattered = value("b", (ROWS, COLS), {1: block(axis, COLS // 2)})
    out = run(
        Scatter(out=scattered, src=src, team=team(axis), root=root, axis=1, request=R),
        src,
        per_rank(rank),
    )
    torch.testing.assert_close(out, per_rank(group[1]).chunk(2, 1)[group.index(rank)])


@pytest.mark.world_sizes(4)
@pytest.mark.parametrize("axis", AXES)
def test_all_to_all_and_send_recv(multidevice_test, axis):
    """AllToAll swaps the split and concatenated dims; SendRecv moves member 0's data to 1."""
    rank = multidevice_test.rank
    group = members(axis, rank)
    position = group.index(rank)
    src = value("a", (ROWS, COLS))
    out_value = value("b", (ROWS * 2, COLS), {1: block(axis, COLS // 2)})  # local [8, 3]
    out = run(
        AllToAll(out=out_value, src=src, team=team(axis), split_axis=1, concat_axis=0, request=R),
        src,
        per_rank(rank),
    )
    expected = torch.cat([per_rank(m).chunk(2, 1)[position] for m in group], 0)
    torch.testing.assert_close(out, expected)
    out = run(
        SendRecv(
            out=value("b", (ROWS, COLS), mesh=receivers(axis, 1)),
            src=src,
            team=team(axis),
            sender=Const(value=0),
            receiver=Const(value=1),
            request=R,
        ),
        src,
        per_rank(rank),
    )
    if position == 1:
        torch.testing.assert_close(out, per_rank(group[0]))
    else:
        assert out is None
