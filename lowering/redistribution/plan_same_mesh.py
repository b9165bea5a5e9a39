"""Planning a resharding on one mesh (dims laid out in blocks), in normal form.

The rules (:mod:`lowering.redistribution.same_mesh_rules`), in order, each fusing what
it can into one collective over a flattened team (several mesh axes, outer first: a
group's rank order is the shard nesting order): the local slices that can be made at
once; partial sums reduced while the data is smallest (ReduceScatter along a dim the
target extends by them, else Allreduce); a pure permutation of mesh axes as one
CollectivePermute; the axes a dim releases gathered (Allgather) or moved to the dim that
takes them next (AllToAll), inner dims first; then the slices the target adds. Where the
rules would slice away data they moved, pass SPEC §6's bound, or reduce and then move
the sums again, the cost model
(:func:`~lowering.redistribution.same_mesh_candidates.plan_cost`) chooses among them and
the candidates (one AllToAllV; a ReduceScatter then one AllToAllV; the moves of the
unreduced sums then one Allreduce in place; where the rules take three or more
collectives, a CollectivePermute relabelling mesh axes then the rules). docs/design.md
("The planner in normal form") says why this is complete; docs/communication.md tabulates the rules.
"""

from __future__ import annotations

from hostir import Allgather, Allreduce, ReduceScatter
from lowering.redistribution.distribution import Distribution
from lowering.redistribution.planner import Planner
from lowering.redistribution.same_mesh_candidates import _cheaper_instead
from lowering.redistribution.same_mesh_rules import _names, _plan_by_rules


def plan_same_mesh(planner: Planner, target: Distribution) -> None:
    """Steps from ``planner.current`` to ``target`` on the same mesh."""
    start, source, notes = len(planner.steps), planner.current, len(planner.notes)
    _plan_by_rules(planner, target)
    _cheaper_instead(planner, target, (start, notes), source)
    _note_unfused(planner, start)


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
