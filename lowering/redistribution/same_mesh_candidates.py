"""Cheaper plans than the rules on one mesh, and the cost model that chooses.

Where the rules (:mod:`lowering.redistribution.same_mesh_rules`) would slice away data
they moved, pass SPEC §6's bound, or reduce and then move the sums again, the cost model
(:func:`plan_cost`) chooses among them and the candidates: one AllToAllV; a
ReduceScatter then one AllToAllV; the moves of the unreduced sums then one Allreduce in
place. Where the rules take three or more collectives and reduce nothing, the candidates
are a CollectivePermute relabelling mesh axes then the rules
(:mod:`lowering.redistribution.same_mesh_permutes`). docs/design.md ("The planner in
normal form") says why this is complete.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hostir import Allgather, Allreduce, AllToAllV, ReduceScatter
from hostir.ir.communications import LocalShard
from hostir.ir.scalars import Const, Scalar, sub
from lowering.errors import ReshardingError
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.exchange_cost import exchange_rounds_for, step_received
from lowering.redistribution.plan import Plan, Step, local_elements
from lowering.redistribution.plan_memory import memory_bound, peak_temporaries
from lowering.redistribution.planner import Planner
from lowering.redistribution.same_mesh_permutes import Candidate, permute_then_rules
from lowering.redistribution.same_mesh_rules import (
    _in_mesh_order,
    _names,
    _plan_by_rules,
    _reduce,
    _team,
)


def _cheaper_instead(
    planner: Planner, target: Distribution, since: tuple[int, int], source: Distribution
) -> None:
    """Replaces the rule steps (and notes) since ``since`` when they slice data they
    communicated (so they moved data no rank keeps), hold more temporaries than SPEC §6's
    bound, or reduce partial sums and then move them again: by one AllToAllV, or, for
    partial sums, a ReduceScatter (reduce first, while the data is smallest) and then one
    AllToAllV, or the rules' moves of the unreduced sums then one Allreduce; and when the
    rules take three or more collectives and reduce nothing, by a CollectivePermute that
    relabels mesh axes then the rules
    (:func:`~lowering.redistribution.same_mesh_permutes.permute_then_rules`): the
    candidate the cost model (:func:`plan_cost`) prefers, if it beats the rules."""
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
    # The permute candidates' own trigger, narrow so no other plan (nor its planning time)
    # changes: three or more collectives (a permute candidate takes at least two: a
    # relabelling alone is rule 2's plan), nothing reduced.
    relabel = len(communicated) >= 3 and not reduced
    if why is None and not relabel:
        return
    if len({p.op for p in reduced}) > 1:
        planner.note("rules kept: partial sums with different reduce ops")
        return
    candidates: list[Candidate] = []
    if why is not None:
        exchange = functools.partial(_exchange, planner, source, target, why, memory_bound(rules))
        candidates.append(("one AllToAllV", exchange))
        candidates += _reduce_then_exchange(planner, source, target, reduced, why, rules)
        candidates += _move_then_reduce(planner, source, target, reduced)
    permutes = permute_then_rules(planner, source, target, len(communicated)) if relabel else []
    candidates += permutes
    if not candidates:  # only relabellings were tried, and none saves a collective
        planner.considered.append(
            f"{source.notation()} -> {target.notation()}: the rules take"
            f" {len(communicated)} collectives; no relabelling of equal-size mesh axes lets"
            " them take fewer"
        )
        return
    chosen = _cheapest(planner, source, target, candidates, rules)
    if chosen is None:
        planner.note("rules kept: no candidate costs less (bound, calls, bytes received)")
        return
    label, best = chosen
    del planner.steps[start:]
    del planner.notes[notes:]
    planner.steps.extend(best)
    planner.current = target
    permuted = any(label == name for name, _ in permutes)
    planner.note(_chosen_note(best, len(communicated), sliced_after, permuted))


def _chosen_note(
    best: tuple[Step, ...], rule_calls: int, sliced_after: bool, permuted: bool
) -> str:
    """The note that says which candidate replaced the rules' ``rule_calls`` collectives
    (``permuted``: one of :func:`permute_then_rules`'s, by which it won, not by the kind of
    its first step: a candidate moving unreduced sums may start with a permute too)."""
    moved = best
    if permuted:  # the rules after it may slice locally
        moved = tuple(s for s in best if s.team is not None)
        then = "gather" if all(s.kind is Allgather for s in moved[1:]) else "the rules"
        kind = f"permute then {then}"
    else:  # the wording the other candidates always had
        kind = "exchange" if best[-1].kind is AllToAllV else "reduced last"
    return (
        f"{kind}: {'one ' * (len(moved) == 1)}{' + '.join(s.name for s in moved)} over"
        f" {_names(moved[-1].team.axes)} instead of {rule_calls} collective(s)"
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
) -> list[Candidate]:
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
            found.append((f"ReduceScatter along dim {dim}", lambda exact, s=scatter: (s,)))
            continue
        allowance = sub(memory_bound(rules), local_elements(after, planner.shape))
        exchange = functools.partial(_exchange, planner, after, target, why, allowance)
        label = f"ReduceScatter along dim {dim} then one AllToAllV"
        found.append((label, lambda exact, s=scatter, e=exchange: (s, *e(exact))))
    return found


def _move_then_reduce(
    planner: Planner, source: Distribution, target: Distribution, reduced: list
) -> list[Candidate]:
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
    return [("the moves then one Allreduce", lambda exact: tuple(scratch.steps))]


def _cheapest(
    planner: Planner,
    source: Distribution,
    target: Distribution,
    candidates: list[Candidate],
    rules: Plan,
) -> tuple[str, tuple[Step, ...]] | None:
    """The label and steps of the first of the cheapest candidates (:func:`plan_cost`), None
    if none costs less than ``rules``. A candidate is built first with the fewest rounds it can need
    (no rank's pieces computed), and built and costed exactly only if that bound can beat
    the best so far: an AllToAllV of every partial copy, bound to 64 rounds, is dropped
    on its call count without costing a rank. Each comparison goes to
    ``planner.considered`` (``hostir plan --explain``)."""

    def cost(steps: tuple[Step, ...], bound_only: bool = False) -> tuple:
        return plan_cost(_sub_plan(planner, source, target, steps), bound_only)

    bounds = [(cost(build(False), bound_only=True), k) for k, (_, build) in enumerate(candidates)]
    best, chosen = (cost(rules.steps), -1), None  # the rules win ties
    costed = {-1: best[0]}
    for bound in sorted(bounds):
        if bound < best:
            steps = candidates[bound[1]][1](True)
            exact = (cost(steps), bound[1])
            costed[bound[1]] = exact[0]
            if exact < best:
                best, chosen = exact, (candidates[bound[1]][0], steps)
    _record(planner, source, target, candidates, bounds, costed, best[1])
    return chosen


def _record(
    planner: Planner,
    source: Distribution,
    target: Distribution,
    candidates: list[Candidate],
    bounds: list[tuple],
    costed: dict[int, tuple],
    winner: int,
) -> None:
    """Lines for ``planner.considered``: each candidate's cost (or why it was dropped on its
    bound) and the first quantity of :func:`plan_cost`'s order the winner is ahead on."""
    itemsize = planner.dst.dtype.to_torch().itemsize
    names = {-1: "the rules", **{k: label for k, (label, _) in enumerate(candidates)}}

    def shown(c: tuple) -> str:
        over, calls, received, peak = c
        return (
            f"{calls} collective call(s), busiest rank receives {received * itemsize} B,"
            f" temporaries {peak * itemsize} B" + (" (over the bound)" if over else "")
        )

    planner.considered.append(
        f"{source.notation()} -> {target.notation()}: the rules and"
        f" {len(candidates)} candidate(s) compared"
    )
    for k in [-1, *range(len(candidates))]:
        if k in costed:
            text = shown(costed[k])
        else:
            fewest = next(b for b, j in bounds if j == k)[1]
            text = f"dropped: at least {fewest} collective call(s), no fewer than the best"
        planner.considered.append(f"{'chosen' if k == winner else '      '} {names[k]}: {text}")
    if winner == -1:
        planner.considered.append("why: no candidate costs less than the rules (ties keep them)")
        return
    ahead = next(
        what for what, a, b in zip(_ORDER, costed[winner], costed[-1], strict=True) if a != b
    )
    planner.considered.append(f"why: {names[winner]} {ahead}")


_ORDER = (  # plan_cost's order, each as the reason the winner beat the rules
    "keeps the temporaries within max(in, out), which the rules pass",
    "takes fewer collective calls than the rules",
    "has the busiest rank receive fewer bytes than the rules, in as many calls",
    "holds fewer temporaries than the rules, with the same calls and bytes",
)


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
