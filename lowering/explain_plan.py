"""``explain_plan``: a resharding plan as readable lines (``Plan.explain``)."""

from __future__ import annotations

from hostir import Sharding
from hostir.printer import _MeshNames, print_sharding, print_team
from hostir.scalars import Const, Scalar, floordiv, mul, print_scalar, sub
from lowering.plan import Plan, Step, StepKind


def local_elements(sharding: Sharding, shape: tuple[Scalar, ...]) -> Scalar:
    """Elements of one device's shard (a scalar expression for symbolic shapes)."""
    total: Scalar = Const(value=1)
    for dim, extent in enumerate(shape):
        factor = sharding.shard_factor(dim)
        total = _times(total, floordiv(extent, factor))
    return total


def _times(a: Scalar, b: Scalar | int) -> Scalar:
    return mul(a, b)


def _bytes(elements: Scalar, itemsize: int, names: _MeshNames) -> str:
    if isinstance(elements, Const):
        return f"{elements.value * itemsize} B"
    return f"{print_scalar(elements, names.name)} x {itemsize} B"


def _received(step: Step, before: Scalar, after: Scalar) -> Scalar:
    """Elements a rank receives in ``step``, at the lower bound of what it lacks."""
    size = step.team.size if step.team is not None else 1
    if step.kind is StepKind.ALLGATHER or step.kind is StepKind.GATHER:
        return _minus(after, before)
    if step.kind is StepKind.REDUCE_SCATTER:
        return _minus(before, after)
    if step.kind is StepKind.ALL_TO_ALL:
        return floordiv(_times(before, size - 1), size)
    if step.kind in (StepKind.ALLREDUCE, StepKind.REDUCE):
        return floordiv(_times(before, size - 1), size)
    if step.kind in (StepKind.LOCAL_SHARD, StepKind.COPY):
        return Const(value=0)
    return after


def _minus(a: Scalar, b: Scalar) -> Scalar:
    return sub(a, b)


def explain_plan(plan: Plan) -> str:
    """Each step with its team, bytes received and peak extra memory per rank, and why;
    then the fusions applied or refused."""
    names = _MeshNames()
    shape = plan.shape
    lines = [
        f"reshard {print_sharding(plan.src, names, shape)} -> "
        f"{print_sharding(plan.dst, names, shape)}"
    ]
    current = plan.src
    collectives = 0
    for index, step in enumerate(plan.steps, 1):
        before = local_elements(current, shape)
        after = local_elements(step.after, shape)
        team = f" over {print_team(step.team, names)}" if step.team is not None else ""
        if step.kind not in (StepKind.LOCAL_SHARD, StepKind.COPY):
            collectives += 1
        lines.append(
            f"{index}. {step.kind.value}{team}: receives"
            f" {_bytes(_received(step, before, after), plan.itemsize, names)} per rank,"
            f" peak extra {_bytes(after, plan.itemsize, names)}"
            + (f" -- {step.reason}" if step.reason else "")
        )
        current = step.after
    lines.append(f"{collectives} collective(s), {len(plan.steps)} step(s)")
    lines.extend(f"note: {note}" for note in plan.notes)
    meshes = ", ".join(f"{name} = {mesh}" for mesh, name in names.names.items())
    lines.append(f"meshes: {meshes}")
    return "\n".join(lines)
