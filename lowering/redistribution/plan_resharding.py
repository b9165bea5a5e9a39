"""``plan_resharding``: the steps that turn one sharding of a tensor into another.

A pure function from (source value, target value) to a :class:`Plan` of steps,
each a communication or local slice with the sharding it leaves (an
``ExplainedPlan``: ``explain()`` says why); emitting them is
``emit_resharding``'s job. One mesh: ``lowering/redistribution/plan_same_mesh.py``. Between
meshes (one source device, one target device, or disjoint meshes of one shape)
the functions below; docs/communication.md tabulates both. Anything else
raises ReshardingError.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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
from hostir.ir.team import Team
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.explain_plan import ExplainedPlan
from lowering.redistribution.plan import Plan, Step
from lowering.redistribution.plan_same_mesh import plan_same_mesh
from lowering.redistribution.planner import Planner
from lowering.redistribution.same_mesh_candidates import plan_cost

__all__ = ["ExplainedPlan", "Plan", "Step", "plan_resharding"]


@functools.lru_cache(maxsize=1024)
def plan_resharding(src: TensorValue, dst: TensorValue) -> ExplainedPlan:
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
    return ExplainedPlan(
        src=s,
        dst=d,
        steps=tuple(planner.steps),
        shape=dst.shape,
        itemsize=dst.dtype.to_torch().itemsize,
        notes=tuple(planner.notes),
        considered=tuple(planner.considered),
    )


def _replicated(mesh: Mesh, ndim: int) -> Distribution:
    return Distribution(mesh=mesh, dims=((),) * ndim)


def _split_dims(planner: Planner, mesh: Mesh) -> list[int]:
    """The dims whose (constant) extent divides over every device of ``mesh``."""
    shape = planner.shape
    return [d for d, e in enumerate(shape) if isinstance(e, Const) and e.value % mesh.size == 0]


def _cheapest(planner: Planner, builders: list[Callable[[Planner], None]]) -> None:
    """Builds each candidate on a scratch planner and keeps the first of the cheapest by
    the same-mesh planner's cost model (``plan_cost``); raises the first candidate's error
    when none can be built."""
    best, errors = None, []
    for build in builders:
        scratch = planner.scratch(planner.current)
        try:
            build(scratch)
        except ReshardingError as error:
            errors.append(error)
            continue
        steps, shape = tuple(scratch.steps), planner.shape
        plan = Plan(src=planner.src.sharding, dst=planner.dst.sharding, steps=steps, shape=shape)
        cost = plan_cost(plan)
        best = (cost, scratch) if best is None or cost < best[0] else best
    if best is None:
        raise errors[0]
    planner.steps, planner.notes = planner.steps + best[1].steps, planner.notes + best[1].notes
    planner.considered += best[1].considered
    planner.current = best[1].current


def _candidate(parts: tuple, scratch: Planner) -> None:
    """Runs ``parts`` in order: a Distribution is reached with the same-mesh planner, a
    tuple (kind, layout after, team, fields) is one step, None moves to the target mesh."""
    for part in parts:
        if isinstance(part, Distribution):
            plan_same_mesh(scratch, part)
        elif part is None:
            _move(scratch, scratch.target)
        else:
            kind, after, team, attrs = part
            scratch.add(kind, after, team=team, **attrs)


def _plan_from_device(planner: Planner) -> None:
    """One source device: Broadcast to the target mesh, or (the device in it) Scatter along
    a dim over the flattened mesh; then the same-mesh planner to the target."""
    device, target = planner.current.mesh.devices[0], planner.target
    if planner.current.partial:
        raise planner.fail("a partial tensor on one device has nothing to reduce with")
    mesh, whole = target.mesh, _replicated(target.mesh, len(planner.shape))
    members = mesh.devices if device in mesh.devices else (device, *mesh.devices)
    line = Team(mesh=Mesh(devices=members, shape=(len(members),)), axes=(MeshAxis.X,))
    firsts = [(Broadcast, whole, line, {"root": Const(value=members.index(device))})]
    if device in mesh.devices:
        flat = Team(mesh=mesh, axes=mesh.axes())
        at = {"root": Const(value=flat.position(device))}
        for dim in _split_dims(planner, mesh):
            firsts.append((Scatter, whole.with_dim(dim, mesh.axes()), flat, {"axis": dim, **at}))
    _cheapest(planner, [functools.partial(_candidate, (first, target)) for first in firsts])


def _plan_to_device(planner: Planner) -> None:
    """One target device: Reduce from a 1-d partial source; the same-mesh planner to a dim
    split over the flattened mesh, then Gather (the device in it); or to replicated, then
    move."""
    device, source, target = planner.target.mesh.devices[0], planner.current, planner.target
    mesh, whole = source.mesh, _replicated(source.mesh, len(planner.shape))
    flat = Team(mesh=mesh, axes=mesh.axes())
    ways = []
    if device in mesh.devices:
        at = {"root": Const(value=flat.position(device))}
        if mesh.ndim == 1 and len(source.partial) == 1 and not any(source.dims):
            ways.append((source, (Reduce, target, flat, {"op": source.partial[0].op, **at})))
        for dim in _split_dims(planner, mesh):
            layout = whole.with_dim(dim, mesh.axes())
            ways.append((layout, (Gather, target, flat, {"axis": dim, **at})))
    ways.append((whole, None))
    _cheapest(planner, [functools.partial(_candidate, way) for way in ways])


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
