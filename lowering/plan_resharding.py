"""``plan_resharding``: the steps that turn one sharding of a tensor into another.

A pure function from (source value, target value) to a :class:`Plan`: a list
of steps, each a communication or local slice with the sharding the data has
after it. Emitting instructions from a plan is ``emit_resharding``'s job.

Rules, on one mesh (dims laid out in blocks: mesh axes outer, then local data):

1. Partial axes are reduced first, while the data is smallest: a
   ReduceScatter onto a dim the target shards over that mesh axis, else an
   Allreduce over it.
2. Mesh axes the source uses beyond the target's prefix of a dim are released
   innermost first: by an AllToAll when the target wants the axis on another
   dim next, else by an Allgather.
3. Mesh axes the target adds to a dim are local slices (no communication).

Between meshes: a single source device Scatters or Broadcasts (then slices), a
single target device Gathers or Reduces, and meshes of equal shape exchange
shards pairwise with SendRecv. Anything else raises ReshardingError.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from hostir import Const, Mesh, MeshAxis, ReduceOp, Sharding, ShardPart, TensorValue
from hostir.printer import _MeshNames, print_sharding
from hostir.scalars import Scalar, floordiv
from hostir.team import Team
from lowering.errors import ReshardingError


class StepKind(enum.Enum):
    """What one step of a plan does."""

    ALLGATHER = "Allgather"
    REDUCE_SCATTER = "ReduceScatter"
    ALLREDUCE = "Allreduce"
    ALL_TO_ALL = "AllToAll"
    BROADCAST = "Broadcast"
    SCATTER = "Scatter"
    GATHER = "Gather"
    REDUCE = "Reduce"
    SEND_RECV = "SendRecv"
    LOCAL_SHARD = "local_shard"
    COPY = "set"


@dataclass(frozen=True, kw_only=True)
class Step:
    """One communication or local slice; ``after`` is the data's sharding once done."""

    kind: StepKind
    after: Sharding
    team: Team | None = None
    axis: int | None = None
    concat_axis: int | None = None
    mesh_axis: MeshAxis | None = None
    root: int | None = None
    op: ReduceOp | None = None


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The steps from ``src`` to ``dst`` (empty when only a copy is needed)."""

    src: Sharding
    dst: Sharding
    steps: tuple[Step, ...]


class _Planner:
    """Builds a plan step by step, tracking the current sharding."""

    def __init__(self, src: TensorValue, dst: TensorValue) -> None:
        self.src, self.dst = src, dst
        self.shape = dst.shape
        self.current = src.sharding
        self.steps: list[Step] = []

    def fail(self, why: str) -> ReshardingError:
        names = _MeshNames()
        return ReshardingError(
            f"cannot reshard {self.src.name} {print_sharding(self.src.sharding, names)} to"
            f" {self.dst.name} {print_sharding(self.dst.sharding, names)}"
            f" (meshes: {', '.join(f'{n} = {m}' for m, n in names.names.items())}): {why}"
        )

    def add(self, kind: StepKind, after: Sharding, **fields: object) -> None:
        self.steps.append(Step(kind=kind, after=after, **fields))
        self.current = after

    # ----- block layouts -----
    def axes(self, sharding: Sharding, dim: int) -> tuple[MeshAxis, ...]:
        parts = sharding.dims[dim]
        mesh_parts = [p.axis for p in parts if p.axis is not None]
        if mesh_parts and any(p.axis is None for p in parts[: len(mesh_parts)]):
            raise self.fail(f"dim {dim} is not laid out in blocks (mesh axes first)")
        return tuple(mesh_parts)

    def with_dim(self, sharding: Sharding, dim: int, axes: tuple[MeshAxis, ...]) -> Sharding:
        mesh = sharding.mesh
        factor = math.prod(mesh.axis_size(a) for a in axes)
        parts = [ShardPart(axis=a, extent=Const(value=mesh.axis_size(a))) for a in axes]
        local: Scalar = floordiv(self.shape[dim], factor)
        if not (axes and local == Const(value=1)):
            parts.append(ShardPart(axis=None, extent=local))
        dims = list(sharding.dims)
        dims[dim] = tuple(parts)
        return replace(sharding, dims=tuple(dims))

    def dim_of(self, sharding: Sharding, axis: MeshAxis) -> int | None:
        for dim in range(len(sharding.dims)):
            if axis in self.axes(sharding, dim):
                return dim
        return None


def plan_resharding(src: TensorValue, dst: TensorValue) -> Plan:
    """The plan that reshards ``src`` into ``dst`` (see module docstring)."""
    planner = _Planner(src, dst)
    s, d = src.sharding, dst.sharding
    if s is None or d is None:
        raise planner.fail("both tensors need a mesh")
    if s.mesh == d.mesh:
        _plan_same_mesh(planner, d)
    elif len(s.mesh.devices) == 1:
        _plan_from_device(planner)
    elif len(d.mesh.devices) == 1:
        _plan_to_device(planner)
    elif s.mesh.shape == d.mesh.shape and not set(s.mesh.devices) & set(d.mesh.devices):
        _plan_between_meshes(planner)
    else:
        raise planner.fail("the meshes differ in shape or overlap; no plan connects them")
    return Plan(src=s, dst=d, steps=tuple(planner.steps))


def _plan_same_mesh(planner: _Planner, target: Sharding) -> None:
    """Rules 1-3 of the module docstring, ending in ``target``'s layout."""
    _reduce_partials(planner, target)
    for dim in range(len(target.dims)):
        _release_axes(planner, target, dim)
    for dim in range(len(target.dims)):
        _slice_axes(planner, target, dim)
    layout = [planner.axes(planner.current, d) for d in range(len(target.dims))]
    if layout != [planner.axes(target, d) for d in range(len(target.dims))]:
        raise planner.fail("the per-dim mesh axes do not match after planning")


def _reduce_partials(planner: _Planner, target: Sharding) -> None:
    for partial in planner.current.partial:
        if partial in target.partial:
            continue
        remaining = tuple(p for p in planner.current.partial if p != partial)
        team = Team(mesh=planner.current.mesh, axes=(partial.axis,))
        dim = _scatter_dim(planner, target, partial.axis)
        if dim is None:
            after = replace(planner.current, partial=remaining)
            planner.add(StepKind.ALLREDUCE, after, team=team, op=partial.op)
            continue
        axes = planner.axes(planner.current, dim) + (partial.axis,)
        after = replace(planner.with_dim(planner.current, dim, axes), partial=remaining)
        planner.add(StepKind.REDUCE_SCATTER, after, team=team, axis=dim, op=partial.op)
    if set(target.partial) - set(planner.current.partial):
        raise planner.fail("the target holds partial sums the source does not")


def _scatter_dim(planner: _Planner, target: Sharding, axis: MeshAxis) -> int | None:
    """A dim the target shards over ``axis`` right after the source's axes of that dim."""
    if planner.dim_of(planner.current, axis) is not None:
        return None
    for dim in range(len(target.dims)):
        if planner.axes(target, dim) == planner.axes(planner.current, dim) + (axis,):
            return dim
    return None


def _release_axes(planner: _Planner, target: Sharding, dim: int) -> None:
    """Gathers (or moves with AllToAll) the axes of ``dim`` beyond the target's prefix."""
    wanted = planner.axes(target, dim)
    while True:
        have = planner.axes(planner.current, dim)
        keep = _common_prefix(have, wanted)
        if len(have) == keep:
            return
        axis = have[-1]
        team = Team(mesh=planner.current.mesh, axes=(axis,))
        gathered = planner.with_dim(planner.current, dim, have[:-1])
        destination = planner.dim_of(target, axis)
        if destination is not None and destination != dim:
            dest_axes = planner.axes(planner.current, destination)
            if planner.axes(target, destination)[: len(dest_axes) + 1] == dest_axes + (axis,):
                after = planner.with_dim(gathered, destination, dest_axes + (axis,))
                planner.add(
                    StepKind.ALL_TO_ALL, after, team=team, axis=destination, concat_axis=dim
                )
                continue
        planner.add(StepKind.ALLGATHER, gathered, team=team, axis=dim)


def _slice_axes(planner: _Planner, target: Sharding, dim: int) -> None:
    """Local slices for the axes the target adds to ``dim``, outer first."""
    wanted = planner.axes(target, dim)
    while planner.axes(planner.current, dim) != wanted:
        have = planner.axes(planner.current, dim)
        if wanted[: len(have)] != have:
            raise planner.fail(f"dim {dim} is sharded in an order that cannot be sliced into")
        axis = wanted[len(have)]
        if planner.dim_of(planner.current, axis) is not None:
            raise planner.fail(f"mesh axis {axis.value} is still in use by another dim")
        after = planner.with_dim(planner.current, dim, have + (axis,))
        planner.add(StepKind.LOCAL_SHARD, after, axis=dim, mesh_axis=axis)


def _common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _replicated(planner: _Planner, mesh: Mesh) -> Sharding:
    dims = tuple((ShardPart(axis=None, extent=e),) for e in planner.shape)
    return Sharding(mesh=mesh, dims=dims)


def _flat(mesh: Mesh) -> Mesh:
    return Mesh(devices=mesh.devices, shape=(len(mesh.devices),))


def _plan_from_device(planner: _Planner) -> None:
    """One source device: Scatter into a 1-d target, else Broadcast then slice."""
    device = planner.current.mesh.devices[0]
    target = planner.dst.sharding
    sharded = [d for d in range(len(target.dims)) if planner.axes(target, d)]
    mesh = target.mesh
    if (
        mesh.ndim == 1
        and device in mesh.devices
        and len(sharded) == 1
        and not target.partial
        and not planner.current.partial
    ):
        team = Team(mesh=mesh, axes=(MeshAxis.X,))
        planner.add(
            StepKind.SCATTER, target, team=team, axis=sharded[0], root=mesh.devices.index(device)
        )
        return
    if planner.current.partial:
        raise planner.fail("a partial tensor on one device has nothing to reduce with")
    if device in mesh.devices:
        team_mesh, root = _flat(mesh), mesh.devices.index(device)
    else:
        team_mesh, root = Mesh(devices=(device, *mesh.devices), shape=(len(mesh.devices) + 1,)), 0
    team = Team(mesh=team_mesh, axes=(MeshAxis.X,))
    planner.add(StepKind.BROADCAST, _replicated(planner, mesh), team=team, root=root)
    _plan_same_mesh(planner, target)


def _plan_to_device(planner: _Planner) -> None:
    """One target device: Gather or Reduce from a 1-d source, else replicate and move."""
    device = planner.dst.sharding.mesh.devices[0]
    source = planner.current
    mesh = source.mesh
    sharded = [d for d in range(len(source.dims)) if planner.axes(source, d)]
    if mesh.ndim == 1 and device in mesh.devices:
        team = Team(mesh=mesh, axes=(MeshAxis.X,))
        root = mesh.devices.index(device)
        if len(source.partial) == 1 and not sharded:
            planner.add(
                StepKind.REDUCE, planner.dst.sharding, team=team, root=root, op=source.partial[0].op
            )
            return
        if len(sharded) == 1 and not source.partial:
            planner.add(
                StepKind.GATHER, planner.dst.sharding, team=team, root=root, axis=sharded[0]
            )
            return
    _plan_same_mesh(planner, _replicated(planner, mesh))
    _move(planner, planner.dst.sharding)


def _plan_between_meshes(planner: _Planner) -> None:
    """Equal-shape disjoint meshes: match the target's layout, then SendRecv pairwise."""
    target = planner.dst.sharding
    _plan_same_mesh(planner, replace(target, mesh=planner.current.mesh))
    _move(planner, target)


def _move(planner: _Planner, target: Sharding) -> None:
    """Moves data laid out as ``target`` from the current mesh to ``target``'s mesh."""
    source_mesh = planner.current.mesh
    if len(target.mesh.devices) == 1 and target.mesh.devices[0] in source_mesh.devices:
        planner.add(StepKind.COPY, target)
        return
    senders = source_mesh.devices[: len(target.mesh.devices)]  # one replica per target device
    pairs = Mesh(devices=senders + target.mesh.devices, shape=(2, len(target.mesh.devices)))
    team = Team(mesh=pairs, axes=(MeshAxis.Y,))
    planner.add(StepKind.SEND_RECV, target, team=team)
