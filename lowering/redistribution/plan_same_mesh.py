"""Planning a resharding on one mesh (dims laid out in blocks), in normal form.

The rules, in order, each fusing what it can into one collective over a
flattened team (several mesh axes, outer first: a group's rank order is the
shard nesting order): the local slices that can be made at once; partial sums
reduced while the data is smallest (ReduceScatter along a dim the target
extends by them, else Allreduce); a pure permutation of mesh axes as one
CollectivePermute; the axes a dim releases gathered (Allgather) or moved to
the dim that takes them next (AllToAll), inner dims first; then the slices
the target adds. Where the rules would slice away data they moved, pass SPEC
§6's bound, or reduce and then move the sums again, the cost model
(:func:`plan_cost`) chooses among them and the candidates (one AllToAllV; a
ReduceScatter then one AllToAllV; the moves of the unreduced sums then one
Allreduce in place). docs/design.md ("The planner in normal form") says why
this is complete; docs/communication.md tabulates the rules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from hostir import (
    Allgather,
    Allreduce,
    AllToAll,
    AllToAllV,
    CollectivePermute,
    MeshAxis,
    ReduceOp,
    ReduceScatter,
)
from hostir.ir.communications import LocalShard
from hostir.ir.scalars import Const, Scalar, sub
from hostir.ir.team import Team
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.exchange_cost import exchange_rounds_for, step_received
from lowering.redistribution.plan import Plan, Step, local_elements
from lowering.redistribution.plan_memory import memory_bound, peak_temporaries
from lowering.redistribution.planner import Planner


def plan_same_mesh(planner: Planner, target: Distribution) -> None:
    """Steps from ``planner.current`` to ``target`` on the same mesh."""
    start, source, notes = len(planner.steps), planner.current, len(planner.notes)
    _plan_by_rules(planner, target)
    _cheaper_instead(planner, target, (start, notes), source)
    _note_unfused(planner, start)


def _plan_by_rules(planner: Planner, target: Distribution) -> None:
    for dim in range(len(target.dims)):  # first the slices that can be made now: less data
        _slice_axes(planner, target, dim, ready_only=True)
    _reduce_partials(planner, target)
    if not _permute(planner, target):
        # Inner dims first, on the smaller data: the last gather is then the outermost
        # dim's, which lands straight in the output buffer (no packing temporary).
        for dim in reversed(range(len(target.dims))):
            _release_axes(planner, target, dim)
        for dim in range(len(target.dims)):
            _slice_axes(planner, target, dim)
    if planner.current.dims != target.dims:
        raise planner.fail("the per-dim mesh axes do not match after planning")


def _team(planner: Planner, axes: tuple[MeshAxis, ...]) -> Team:
    return Team(mesh=planner.current.mesh, axes=axes)


def _in_mesh_order(planner: Planner, axes: list[MeshAxis]) -> tuple[MeshAxis, ...]:
    return tuple(a for a in planner.current.mesh.axes() if a in axes)


def _names(axes: tuple[MeshAxis, ...]) -> str:
    return "(" + ", ".join(a.value for a in axes) + ")"


# ----- cheaper candidates than the rules: exchanges, reducing last -----
def _cheaper_instead(
    planner: Planner, target: Distribution, since: tuple[int, int], source: Distribution
) -> None:
    """Replaces the rule steps (and notes) since ``since`` when they slice data they
    communicated (so they moved data no rank keeps), hold more temporaries than SPEC §6's
    bound, or reduce partial sums and then move them again: by one AllToAllV, or, for
    partial sums, a ReduceScatter (reduce first, while the data is smallest) and then one
    AllToAllV, or the rules' moves of the unreduced sums then one Allreduce; the candidate
    the cost model (:func:`plan_cost`) prefers, if it beats the rules."""
    start, notes = since
    steps = tuple(planner.steps[start:])
    communicated = [k for k, s in enumerate(steps) if s.kind is not LocalShard]
    if not communicated:
        return
    sliced_after = any(s.kind is LocalShard and k > communicated[0] for k, s in enumerate(steps))
    reduced = [p for p in source.partial if p not in target.partial]
    # Reduced, then moved again (a reduction's own steps are not a move).
    moved_after = bool(reduced) and any(
        steps[k].kind not in (Allreduce, ReduceScatter) for k in communicated
    )
    rules = _sub_plan(planner, source, target, steps)
    over = _exceeds(peak_temporaries(rules), memory_bound(rules))
    flagged = (
        (sliced_after, "the rules would gather data and slice part of it away"),
        (over, "the rules would hold more temporaries than max(in, out)"),
        (moved_after, "the rules would reduce the partial sums and then move them again"),
    )
    why = next((text for flag, text in flagged if flag), None)
    if why is None:
        return
    if len({p.op for p in reduced}) > 1:
        planner.note("rules kept: partial sums with different reduce ops")
        return
    candidates = [functools.partial(_exchange, planner, source, target, why, memory_bound(rules))]
    candidates += _reduce_then_exchange(planner, source, target, reduced, why, rules)
    candidates += _move_then_reduce(planner, source, target, reduced)
    best = _cheapest(planner, source, target, candidates, rules)
    if best is None:
        planner.note("rules kept: no candidate costs less (bound, calls, bytes received)")
        return
    del planner.steps[start:]
    del planner.notes[notes:]
    planner.steps.extend(best)
    planner.current = target
    planner.note(
        f"{'exchange' if best[-1].kind is AllToAllV else 'reduced last'}:"
        f" {'one ' * (len(best) == 1)}{' + '.join(s.name for s in best)} over"
        f" {_names(best[-1].team.axes)} instead of {len(communicated)} collective(s)"
        + (" followed by local slices" if sliced_after else "")
    )


def _exchange(
    planner: Planner,
    source: Distribution,
    target: Distribution,
    why: str,
    allowance: Scalar,
    exact: bool = True,
) -> tuple[Step]:
    """One AllToAllV from ``source`` to ``target`` over the mesh axes either involves, in
    as many rounds as keep its buffers within ``allowance`` elements (``exact`` False:
    the fewest it can need, costing no rank's pieces)."""
    idle = set(source.replicated_axes()) & set(target.replicated_axes())
    involved = tuple(a for a in source.mesh.axes() if a not in idle)
    ops = {p.op for p in source.partial if p not in target.partial}
    team = _team(planner, involved)
    before, after = planner.sharding(source), planner.sharding(target)
    rounds = exchange_rounds_for(before, after, team, planner.shape, bool(ops), allowance, exact)
    return (
        Step(
            kind=AllToAllV,
            after=after,
            team=team,
            attrs={"op": next(iter(ops)) if ops else None, "rounds": rounds},
            reason=f"{why}; one all-to-all with uneven splits sends each rank just the pieces"
            " of its block it lacks" + (" (partial sums combined on arrival)" if ops else ""),
        ),
    )


def _reduce_then_exchange(
    planner: Planner,
    source: Distribution,
    target: Distribution,
    reduced: list,
    why: str,
    rules: Plan,
) -> list[Callable[[bool], tuple[Step, ...]]]:
    """For each dim the reduced partial axes can split: a ReduceScatter along it (the
    axes appended to the dim's), then one AllToAllV to ``target`` (if still needed), its
    buffers within the bound less the scattered intermediate it holds."""
    if not reduced:
        return []
    axes = _in_mesh_order(planner, [p.axis for p in reduced])
    found = []
    for dim in range(len(target.dims)):
        extent, factor = planner.shape[dim], _team(planner, axes + source.dims[dim]).size
        if not isinstance(extent, Const) or extent.value % factor:
            continue
        scratch = planner.scratch(source)
        _reduce(scratch, ReduceScatter, axes, reduced[0].op, dim)
        after, (scatter,) = scratch.current, scratch.steps
        if after.dims == target.dims:  # the ReduceScatter alone reaches the target
            found.append(lambda exact, s=scatter: (s,))
            continue
        allowance = sub(memory_bound(rules), local_elements(after, planner.shape))
        exchange = functools.partial(_exchange, planner, after, target, why, allowance)
        found.append(lambda exact, s=scatter, e=exchange: (s, *e(exact)))
    return found


def _move_then_reduce(
    planner: Planner, source: Distribution, target: Distribution, reduced: list
) -> list[Callable[[bool], tuple[Step, ...]]]:
    """For partial sums: the rules move them to the target's layout first, and one
    Allreduce over the reduced axes ends the plan, in place in the output (reducing first
    can hold the reduced copy next to a packing buffer: ``S0P -> S1R``)."""
    if not reduced:
        return []
    scratch = planner.scratch(source)
    try:
        _plan_by_rules(scratch, replace(target, partial=source.partial))
    except ReshardingError:
        return []
    axes = _in_mesh_order(planner, [p.axis for p in reduced])
    _reduce(scratch, Allreduce, axes, reduced[0].op, None, "last, in place in the output")
    return [lambda exact: tuple(scratch.steps)]


def _cheapest(
    planner: Planner,
    source: Distribution,
    target: Distribution,
    candidates: list[Callable[[bool], tuple[Step, ...]]],
    rules: Plan,
) -> tuple[Step, ...] | None:
    """The steps of the first of the cheapest candidates (:func:`plan_cost`), None if none costs
    less than ``rules``. A candidate is built first with the fewest rounds it can need
    (no rank's pieces computed), and built and costed exactly only if that bound can beat
    the best so far: an AllToAllV of every partial copy, bound to 64 rounds, is dropped
    on its call count without costing a rank."""

    def cost(steps: tuple[Step, ...], bound_only: bool = False) -> tuple:
        return plan_cost(_sub_plan(planner, source, target, steps), bound_only)

    bounds = [(cost(build(False), bound_only=True), k) for k, build in enumerate(candidates)]
    best, chosen = (cost(rules.steps), -1), None  # the rules win ties
    for bound in sorted(bounds):
        if bound < best:
            steps = candidates[bound[1]](True)
            exact = (cost(steps), bound[1])
            if exact < best:
                best, chosen = exact, steps
    return chosen


def plan_cost(plan: Plan, bound_only: bool = False) -> tuple:
    """What the planner minimises, in order: temporaries over SPEC §6's bound, backend calls
    (an AllToAllV's rounds each count), elements received by the busiest rank, temporaries.
    Symbolic quantities count as 0 (plans of symbolic shapes keep the rules).
    ``bound_only``: a lower bound without costing the temporaries (taken as 0)."""
    calls = sum(s.get("rounds") or 1 for s in plan.steps if s.kind is not LocalShard)
    total = sum(filter(None, (step_received(plan, k) for k in range(len(plan.steps)))))
    if bound_only:
        return (False, calls, total, 0)
    peak, bound = peak_temporaries(plan), memory_bound(plan)
    return (_exceeds(peak, bound), calls, total, peak.value if isinstance(peak, Const) else 0)


def _sub_plan(
    planner: Planner, source: Distribution, target: Distribution, steps: tuple[Step, ...]
) -> Plan:
    src, dst = planner.sharding(source), planner.sharding(target)
    return Plan(src=src, dst=dst, steps=steps, shape=planner.shape)


def _exceeds(a: Scalar, b: Scalar) -> bool:
    """``a > b`` for constants; False when symbolic."""
    return isinstance(a, Const) and isinstance(b, Const) and a.value > b.value


def _note_unfused(planner: Planner, start: int) -> None:
    """For ``ExplainedPlan.explain``: why consecutive collectives since ``start`` stay separate."""
    steps = [s for s in planner.steps[start:] if s.team is not None]
    for first, second in zip(steps, steps[1:], strict=False):
        teams = " and ".join(f"{s.name} over {_names(s.team.axes)}" for s in (first, second))
        if first.kind is second.kind is Allgather:
            planner.note(
                f"not fused: {teams} fill different dims ({first.get('axis')} and"
                f" {second.get('axis')}); one gather over a flattened team fills one dim, and"
                " both at once would need the output rearranged through a buffer of its size"
            )
        elif first.kind is not second.kind:
            first_reduces = first.kind in (Allreduce, ReduceScatter)
            planner.note(
                f"not fused: {teams} are different collectives"
                + " (the reduction first, while the data is smallest)" * first_reduces
            )


# ----- rule 1: reductions -----
def _reduce_partials(planner: Planner, target: Distribution) -> None:
    todo = [p for p in planner.current.partial if p not in target.partial]
    if set(target.partial) - set(planner.current.partial):
        raise planner.fail("the target holds partial sums the source does not")
    for op in dict.fromkeys(p.op for p in todo):
        axes = [p.axis for p in todo if p.op is op]
        for dim, appended in _scatters(planner, target, axes):
            _reduce(planner, ReduceScatter, appended, op, dim)
            axes = [a for a in axes if a not in appended]
        if axes:
            _reduce(planner, Allreduce, _in_mesh_order(planner, axes), op, None)


def _scatters(
    planner: Planner, target: Distribution, axes: list[MeshAxis]
) -> list[tuple[int, tuple[MeshAxis, ...]]]:
    """Dims the target extends by partial ``axes`` only (after the source's axes)."""
    found = []
    for dim, (have, want) in enumerate(zip(planner.current.dims, target.dims, strict=True)):
        appended = want[len(have) :]
        if want[: len(have)] == have and appended and set(appended) <= set(axes):
            found.append((dim, appended))
    return found


def _reduce(
    planner: Planner,
    kind: type,
    axes: tuple[MeshAxis, ...],
    op: ReduceOp,
    dim: int | None,
    when: str = "first, while the data is smallest",
) -> None:
    current = planner.current
    partial = tuple(p for p in current.partial if not (p.axis in axes and p.op is op))
    after = replace(current, partial=partial)
    if dim is not None:
        after = after.with_dim(dim, current.dims[dim] + axes)
    where = f" along dim {dim}" if dim is not None else ""
    planner.add(
        kind,
        after,
        team=_team(planner, axes),
        reason=f"reduce the partial sums over {_names(axes)}{where} {when}",
        op=op,
        **({} if dim is None else {"axis": dim}),
    )
    if len(axes) > 1:
        planner.note(f"fused: one {planner.steps[-1].name} over the flattened team {_names(axes)}")


# ----- rule 2: permutations -----
def _axis_map(planner: Planner, target: Distribution) -> dict[MeshAxis, MeshAxis] | None:
    """sigma with: the target's axes of each dim are sigma-images of the source's, in
    order and of equal sizes, extended over the unused axes; None if there is none."""
    mesh = planner.current.mesh
    sigma = {p.axis: p.axis for p in planner.current.partial}  # partial sums stay in place
    for dim in range(len(target.dims)):
        want, have = target.dims[dim], planner.current.dims[dim]
        if len(want) != len(have):
            return None
        for a, b in zip(want, have, strict=True):
            if sigma.setdefault(a, b) != b or mesh.axis_size(a) != mesh.axis_size(b):
                return None
    if len(set(sigma.values())) != len(sigma):
        return None
    free_src = [b for b in mesh.axes() if b not in sigma.values()]
    for a in (a for a in mesh.axes() if a not in sigma):
        match = next((b for b in free_src if mesh.axis_size(b) == mesh.axis_size(a)), None)
        if match is None:
            return None
        free_src.remove(match)
        sigma[a] = match
    return sigma


def _permute(planner: Planner, target: Distribution) -> bool:
    """Rule 2: one CollectivePermute when the change is a relabelling of mesh axes (the
    partial ones, if any, fixed)."""
    if planner.current.partial != target.partial:
        return False
    sigma = _axis_map(planner, target)
    if sigma is None or all(a == b for a, b in sigma.items()):
        return False
    # Peers as positions in the whole mesh, row-major: the one this rank receives from has
    # on each axis b this rank's coordinate on sigma^-1(b); the one it sends to has on
    # each axis a this rank's coordinate on sigma(a) (mapped axes have equal sizes).
    axes = planner.current.mesh.axes()
    inverse = {b: a for a, b in sigma.items()}
    recv = _team(planner, tuple(inverse[b] for b in axes)).my_position()
    send = _team(planner, tuple(sigma[a] for a in axes)).my_position()
    swaps = ", ".join(f"{a.value}->{b.value}" for a, b in sigma.items() if a != b)
    planner.add(
        CollectivePermute,
        target,
        team=_team(planner, axes),
        send_peer=send,
        recv_peer=recv,
        reason=f"every device needs one other device's block (mesh axes {swaps}): a pure"
        " permutation, nothing gathered",
    )
    planner.note("permutation: one CollectivePermute instead of gathering and re-slicing")
    return True


# ----- rule 3: releasing axes -----
def _release_axes(planner: Planner, target: Distribution, dim: int) -> None:
    """Gathers (or moves with AllToAll) the axes of ``dim`` beyond the target's prefix."""
    wanted = target.dims[dim]
    while True:
        have = planner.current.dims[dim]
        pairs = enumerate(zip(have, wanted, strict=False))  # keep their common prefix
        keep = next((i for i, (a, b) in pairs if a != b), min(len(have), len(wanted)))
        if len(have) == keep:
            return
        released = have[keep:]
        move = _move(planner.current, target, dim, released)
        if move is not None:
            destination, moved = move
            gathered = planner.current.with_dim(dim, have[: len(have) - len(moved)])
            dest_axes = planner.current.dims[destination]
            planner.add(
                AllToAll,
                gathered.with_dim(destination, dest_axes + moved),
                team=_team(planner, moved),
                split_axis=destination,
                concat_axis=dim,
                reason=f"mesh axes {_names(moved)} move from dim {dim} to dim {destination}: an"
                " all-to-all over their team, not a gather",
            )
            if len(moved) > 1:
                planner.note(f"fused: one AllToAll over the flattened team {_names(moved)}")
            continue
        planner.add(
            Allgather,
            planner.current.with_dim(dim, have[:keep]),
            team=_team(planner, released),
            axis=dim,
            reason=f"dim {dim} is no longer split over {_names(released)}",
        )
        if len(released) > 1:
            planner.note(
                f"fused: one Allgather over the flattened team {_names(released)} (the"
                f" nesting order of dim {dim})"
            )


def _move(
    current: Distribution, target: Distribution, dim: int, released: tuple
) -> tuple[int, tuple] | None:
    """The dim that takes innermost axes of ``dim`` next, and those axes: all of
    ``released`` when another dim takes exactly them next, in the same nesting order
    (``S0S0 -> S1S1``), else the innermost alone if it is the next axis of another dim;
    None if neither (a gather)."""
    for destination, axes in enumerate(current.dims):
        if len(released) > 1 and destination != dim and target.dims[destination] == axes + released:
            return destination, released
    destination = target.dim_of(released[-1])
    axes = () if destination is None else current.dims[destination]
    if destination not in (None, dim) and target.dims[destination][: len(axes) + 1] == (
        axes + released[-1:]
    ):
        return destination, released[-1:]
    return None


# ----- rule 4: slices -----
def _slice_axes(planner: Planner, target: Distribution, dim: int, ready_only: bool = False) -> None:
    """Local slices for the axes the target adds to ``dim``, outer first (``ready_only``:
    while the next is replicated and the dim's axes are a prefix of the target's)."""
    wanted = target.dims[dim]
    while planner.current.dims[dim] != wanted:
        have = planner.current.dims[dim]
        prefix = wanted[: len(have)] == have
        if ready_only and not (prefix and wanted[len(have)] in planner.current.replicated_axes()):
            return
        if not prefix:
            raise planner.fail(f"dim {dim} is sharded in an order that cannot be sliced into")
        axis = wanted[len(have)]
        if planner.current.dim_of(axis) is not None:
            raise planner.fail(f"mesh axis {axis.value} is still in use by another dim")
        after = planner.current.with_dim(dim, have + (axis,))
        planner.add(
            LocalShard,
            after,
            axis=dim,
            mesh_axis=axis,
            reason=f"replicated data split over {axis.value}: a local slice, no communication",
        )
