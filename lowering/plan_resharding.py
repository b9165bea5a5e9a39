"""``plan_resharding``: the steps that turn one sharding of a tensor into another.

A pure function from (source value, target value) to a :class:`Plan` of steps,
each a communication or local slice with the sharding it leaves; emitting them
is ``emit_resharding``'s job. One mesh: ``lowering/plan_same_mesh.py``. Between
meshes (one source device, one target device, or disjoint meshes of one shape)
the functions below; docs/communication.md tabulates both. Anything else
raises ReshardingError.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hostir import (
    Broadcast,
    Const,
    Gather,
    Mesh,
    MeshAxis,
    Reduce,
    Scatter,
    SendRecv,
    Set,
    TensorValue,
)
from hostir.team import Team
from lowering.distribution import Distribution
from lowering.plan import Plan, Planner, Step
from lowering.plan_same_mesh import plan_same_mesh

__all__ = ["Plan", "Step", "plan_resharding"]


@functools.lru_cache(maxsize=1024)
def plan_resharding(src: TensorValue, dst: TensorValue) -> Plan:
    """The plan that reshards ``src`` into ``dst`` (see module docstring). Plans are
    cached by (source, target): values carry shape, dtype and sharding."""
    planner = Planner(src, dst)
    s, d = src.sharding, dst.sharding
    if s.mesh == d.mesh:
        plan_same_mesh(planner, planner.target)
    elif len(s.mesh.devices) == 1:
        _plan_from_device(planner)
    elif len(d.mesh.devices) == 1:
        _plan_to_device(planner)
    elif s.mesh.shape == d.mesh.shape and not set(s.mesh.devices) & set(d.mesh.devices):
        _plan_between_meshes(planner)
    else:
        raise planner.fail("the meshes differ in shape or overlap; no plan connects them")
    return Plan(
        src=s,
        dst=d,
        steps=tuple(planner.steps),
        shape=dst.shape,
        itemsize=dst.dtype.to_torch().itemsize,
        notes=tuple(planner.notes),
    )


def _replicated(mesh: Mesh, ndim: int) -> Distribution:
    return Distribution(mesh=mesh, dims=((),) * ndim)


def _plan_from_device(planner: Planner) -> None:
    """One source device: Scatter into a 1-d target, else Broadcast then slice."""
    device = planner.current.mesh.devices[0]
    target = planner.target
    sharded = [d for d, axes in enumerate(target.dims) if axes]
    mesh = target.mesh
    if (
        mesh.ndim == 1
        and device in mesh.devices
        and len(sharded) == 1
        and not target.partial
        and not planner.current.partial
    ):
        team = Team(mesh=mesh, axes=(MeshAxis.X,))
        root = Const(value=mesh.devices.index(device))
        planner.add(Scatter, target, team=team, axis=sharded[0], root=root)
        return
    if planner.current.partial:
        raise planner.fail("a partial tensor on one device has nothing to reduce with")
    if device in mesh.devices:
        team_mesh, root = Mesh(devices=mesh.devices, shape=(mesh.size,)), mesh.devices.index(device)
    else:
        team_mesh, root = Mesh(devices=(device, *mesh.devices), shape=(len(mesh.devices) + 1,)), 0
    team = Team(mesh=team_mesh, axes=(MeshAxis.X,))
    planner.add(Broadcast, _replicated(mesh, len(planner.shape)), team=team, root=Const(value=root))
    plan_same_mesh(planner, target)


def _plan_to_device(planner: Planner) -> None:
    """One target device: Gather or Reduce from a 1-d source, else replicate and move."""
    device = planner.target.mesh.devices[0]
    source = planner.current
    mesh = source.mesh
    sharded = [d for d, axes in enumerate(source.dims) if axes]
    if mesh.ndim == 1 and device in mesh.devices:
        team = Team(mesh=mesh, axes=(MeshAxis.X,))
        root = Const(value=mesh.devices.index(device))
        if len(source.partial) == 1 and not sharded:
            op = source.partial[0].op
            planner.add(Reduce, planner.target, team=team, root=root, op=op)
            return
        if len(sharded) == 1 and not source.partial:
            planner.add(Gather, planner.target, team=team, root=root, axis=sharded[0])
            return
    plan_same_mesh(planner, _replicated(mesh, len(planner.shape)))
    _move(planner, planner.target)


def _plan_between_meshes(planner: Planner) -> None:
    """Equal-shape disjoint meshes: match the target's layout, then SendRecv pairwise."""
    target = planner.target
    plan_same_mesh(planner, replace(target, mesh=planner.current.mesh))
    _move(planner, target)


def _move(planner: Planner, target: Distribution) -> None:
    """Moves data laid out as ``target`` from the current mesh to ``target``'s mesh."""
    source_mesh = planner.current.mesh
    if len(target.mesh.devices) == 1 and target.mesh.devices[0] in source_mesh.devices:
        planner.add(Set, target)
        return
    senders = source_mesh.devices[: len(target.mesh.devices)]  # one replica per target device
    pairs = Mesh(devices=senders + target.mesh.devices, shape=(2, len(target.mesh.devices)))
    team = Team(mesh=pairs, axes=(MeshAxis.Y,))
    planner.add(SendRecv, target, team=team, sender=Const(value=0), receiver=Const(value=1))
