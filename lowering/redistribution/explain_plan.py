"""``explain_plan``: a resharding plan as readable lines; ``ExplainedPlan``, the plan
``plan_resharding`` returns, offers them as ``explain()``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hostir import AllToAllV
from hostir.ir.mesh_names import MeshNames
from hostir.ir.scalars import Const, Scalar, print_scalar
from hostir.ir.team import print_team
from hostir.text.printer import print_sharding
from lowering.redistribution.exchange_cost import (
    received_in_all,
    received_lower_bound,
    step_received,
    temporaries_bounded,
)
from lowering.redistribution.plan import Plan
from lowering.redistribution.plan_memory import (
    memory_bound,
    peak_of,
    step_staging,
    step_temporaries,
)


@dataclass(frozen=True, kw_only=True)
class ExplainedPlan(Plan):
    """A :class:`~lowering.redistribution.plan.Plan` with :meth:`explain`, as
    ``plan_resharding`` returns it. The method lives on this subclass, not on ``Plan``,
    because the explanation reads the cost and memory modules, which read ``Plan``: the
    arrows point one way."""

    def explain(self, candidates: bool = False) -> str:
        """One line per step: what runs over which team, bytes and memory per rank, why;
        then the fusions applied or refused (:func:`explain_plan`); ``candidates``: also
        the plans the cost model compared and why the chosen one won."""
        return explain_plan(self, candidates)


def explain_plan(plan: Plan, candidates: bool = False) -> str:
    """Each step with its team, bytes received and temporaries per rank (besides the
    input and the output; ``lowering.redistribution.plan_memory``; "at most" where an
    AllToAllV's are bounded rather than listed: ``hostir.analysis.exchange_bound``), and
    why; then the plan's peak against SPEC §6's bound and the fusions applied or refused;
    with ``candidates``, the cost model's comparisons (``Plan.considered``)."""
    names = MeshNames()
    shape = plan.shape

    def size(elements: Scalar | int | None) -> str:
        if elements is None:
            return "? B (symbolic extents)"
        elements = elements.value if isinstance(elements, Const) else elements
        if isinstance(elements, int):
            return f"{elements * plan.itemsize} B"
        return f"{print_scalar(elements, names.name)} x {plan.itemsize} B"

    lines = [
        f"reshard {print_sharding(plan.src, names, shape)} -> "
        f"{print_sharding(plan.dst, names, shape)}"
    ]
    temporaries, staging = step_temporaries(plan), step_staging(plan)
    # An AllToAllV on a large mesh: its temporaries bounded, not listed piece by piece.
    bounded = [
        step.kind is AllToAllV and temporaries_bounded(plan, k) for k, step in enumerate(plan.steps)
    ]
    peak = peak_of(temporaries)
    peak_bounded = any(b and t == peak for b, t in zip(bounded, temporaries, strict=True))
    for k, step in enumerate(plan.steps):
        team = f" over {print_team(step.team, names.name)}" if step.team is not None else ""
        in_rounds = f" in {step.get('rounds')} rounds" if (step.get("rounds") or 1) > 1 else ""
        staged = "" if staging[k] == Const(value=0) else f" (gloo stages {size(staging[k])})"
        lines.append(
            f"{k + 1}. {step.name}{team}{in_rounds}: receives"
            f" {size(step_received(plan, k))} per rank, temporaries"
            f" {'at most ' * bounded[k]}{size(temporaries[k])}"
            + staged
            + (f" -- {step.reason}" if step.reason else "")
        )
    lines.append(
        f"{sum(s.team is not None for s in plan.steps)} collective(s), {len(plan.steps)} step(s),"
        f" peak temporaries {'at most ' * peak_bounded}{size(peak)}"
        f" (bound max(in, out) = {size(memory_bound(plan))});"
        f" backend staging apart: {size(peak_of(staging))} (gloo)"
    )
    received, lower = received_in_all(plan), received_lower_bound(plan)
    if lower is not None and received is not None:
        lines.append(
            f"receives {size(received)} per rank in all (lower bound: the target block less"
            f" what the rank holds, {size(lower)})"
        )
        if received > lower:
            lines.append(f"trade: {_trade(plan)}")
    lines.extend(f"note: {note}" for note in plan.notes)
    if candidates:
        lines.extend(f"candidates: {line}" for line in plan.considered)
        if not plan.considered:
            lines.append(f"candidates: none compared: {_NO_CANDIDATES}")
    meshes = ", ".join(f"{name} = {mesh}" for mesh, name in names.names.items())
    lines.append(f"meshes: {meshes}")
    return "\n".join(lines)


_NO_CANDIDATES = (
    "the rules' plan slices no data it moved, keeps the memory bound and moves no reduced"
    " sums, and takes fewer than 3 collectives or reduces partial sums (no relabelling is"
    " tried), so no other plan is costed"
)


def _trade(plan: Plan) -> str:
    """Why a plan receives more than the lower bound."""
    if plan.src.partial:
        copies = math.prod(plan.src.mesh.axis_size(p.axis) for p in plan.src.partial)
        return (
            f"the source holds partial sums: {copies} copies of every value are combined, and"
            " what a rank receives for that is beyond the lower bound, which counts final"
            " values only"
        )
    return "fewer collectives for more bytes received (the steps above say which)"
