"""``explain_plan``: a resharding plan as readable lines (``Plan.explain``)."""

from __future__ import annotations

from hostir.printer import _MeshNames, print_sharding, print_team
from hostir.scalars import Const, Scalar, floordiv, mul, print_scalar, sub
from lowering.exchange_cost import exchange_received
from lowering.plan import Plan, StepKind, local_elements
from lowering.plan_memory import memory_bound, peak_of, step_temporaries


def _bytes(elements: Scalar, itemsize: int, names: _MeshNames) -> str:
    if isinstance(elements, Const):
        return f"{elements.value * itemsize} B"
    return f"{print_scalar(elements, names.name)} x {itemsize} B"


def _received(plan: Plan, k: int, before: Scalar, after: Scalar) -> Scalar:
    """Elements a rank receives in step ``k``, at the lower bound of what it lacks."""
    step = plan.steps[k]
    size = step.team.size if step.team is not None else 1
    if step.kind is StepKind.ALL_TO_ALL_V:
        exact = exchange_received(plan, k)
        return exact if exact is not None else after
    if step.kind is StepKind.ALLGATHER or step.kind is StepKind.GATHER:
        return sub(after, before)
    if step.kind is StepKind.REDUCE_SCATTER:
        return sub(before, after)
    if step.kind is StepKind.ALL_TO_ALL:
        return floordiv(mul(before, size - 1), size)
    if step.kind in (StepKind.ALLREDUCE, StepKind.REDUCE):
        return floordiv(mul(before, size - 1), size)
    if step.kind in (StepKind.LOCAL_SHARD, StepKind.COPY):
        return Const(value=0)
    return after


def explain_plan(plan: Plan) -> str:
    """Each step with its team, bytes received and temporaries per rank (besides the
    input and the output; ``lowering.plan_memory``), and why; then the plan's peak against
    SPEC §6's bound and the fusions applied or refused."""
    names = _MeshNames()
    shape = plan.shape
    lines = [
        f"reshard {print_sharding(plan.src, names, shape)} -> "
        f"{print_sharding(plan.dst, names, shape)}"
    ]
    current = plan.src
    collectives = 0
    temporaries = step_temporaries(plan)
    for index, step in enumerate(plan.steps, 1):
        before = local_elements(current, shape)
        after = local_elements(step.after, shape)
        team = f" over {print_team(step.team, names)}" if step.team is not None else ""
        if step.kind not in (StepKind.LOCAL_SHARD, StepKind.COPY):
            collectives += 1
        lines.append(
            f"{index}. {step.kind.value}{team}: receives"
            f" {_bytes(_received(plan, index - 1, before, after), plan.itemsize, names)} per"
            " rank,"
            f" temporaries {_bytes(temporaries[index - 1], plan.itemsize, names)}"
            + (f" -- {step.reason}" if step.reason else "")
        )
        current = step.after
    lines.append(
        f"{collectives} collective(s), {len(plan.steps)} step(s), peak temporaries"
        f" {_bytes(peak_of(temporaries), plan.itemsize, names)} (bound max(in, out)"
        f" = {_bytes(memory_bound(plan), plan.itemsize, names)})"
    )
    lines.extend(f"note: {note}" for note in plan.notes)
    meshes = ", ".join(f"{name} = {mesh}" for mesh, name in names.names.items())
    lines.append(f"meshes: {meshes}")
    return "\n".join(lines)
