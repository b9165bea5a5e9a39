"""Instructions prepared for running, and what a failed instruction raises.

The interpreter (``hostir.run.evaluator``) and compiled programs (``hostir.run.compiled``)
share this module, so both resolve operands, place instructions on ranks and turn a
handler's exception into an error the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from hostir.comm.rank_text import describe_group
from hostir.errors import CommunicationError, DisagreementError, EvaluationError, HostIrError
from hostir.ir.catalog import COMMUNICATING, declaration_of
from hostir.ir.communications import Wait
from hostir.ir.instructions import Deallocate, Instruction, defined_values, keyword
from hostir.ir.mesh import describe_devices
from hostir.ir.mesh_names import mesh_names
from hostir.ir.scalars import BinaryExpr, Const, MeshCoordinate, Symbol, evaluate_scalar
from hostir.ir.sharding import Mesh
from hostir.ir.team import print_team
from hostir.ir.values import NAMED_VALUES, StreamValue, TensorValue
from hostir.run.context import RunContext
from hostir.run.implementations import handler_for

if TYPE_CHECKING:
    from hostir.ir.container import HostIrContainer

Handler = Callable[[RunContext, Any, dict[str, Any]], Sequence[Any]]

UNRESOLVED = frozenset({Deallocate})
"""Instructions whose handlers need only names, not bound values."""


class Step:
    """An instruction prepared once for fast repeated runs: its handler, the devices
    that run it, how to resolve each operand, and which results to bind."""

    __slots__ = (
        "handler",
        "mesh",
        "rank",
        "runs",
        "defined",
        "binds",
        "range_name",
        "operands",
        "optional",
        "written",
        "posts",
    )

    @staticmethod
    def prepare(instruction: Instruction, handler: Handler | None) -> Step:
        """``instruction`` prepared to run with its declared op's implementation
        (``hostir.run.implementations``), else with ``handler`` (its class's)."""
        step = Step()
        step.handler = handler_for(instruction, handler)
        step.mesh = placement(instruction)
        step.rank, step.runs = -1, True
        # A symbol an instruction defines (a run-time extent) is bound by its handler in
        # ``context.scalars``, not among the tensors.
        outs = [value for value in defined_values(instruction) if not isinstance(value, Symbol)]
        step.defined = [value.name for value in outs]
        step.binds = [
            (index, getattr(instruction, name).name)
            for index, name in enumerate(instruction.OUTS)
            if getattr(instruction, name).name in step.defined
        ]
        step.range_name = f"hir::{keyword(instruction)}"
        out = getattr(instruction, "out", None)
        step.written = out.name if getattr(instruction, "preallocated", False) else None
        names = [] if type(instruction) in UNRESOLVED else list(instruction.INS)
        if getattr(instruction, "preallocated", False):
            names.append("out")
        step.operands = [(name, getattr(instruction, name)) for name in names]
        # Communications run on ranks that may not hold their source (a broadcast's
        # receivers); their handlers check what each rank needs.
        communicates = declaration_of(type(instruction)).kind in COMMUNICATING
        step.optional = communicates or isinstance(instruction, Wait)
        request = getattr(instruction, "request", None)
        step.posts = request.name if communicates and request is not None else None
        return step

    def runs_on(self, rank: int) -> bool:
        """Whether ``rank`` runs the instruction (it is on its mesh); remembered per rank."""
        if self.mesh is None:
            return True
        if rank != self.rank:
            self.rank, self.runs = rank, self.mesh.contains(rank)
        return self.runs

    def describe(self) -> str:
        """``defining T3`` or ``into T2_c``, for error messages."""
        if self.written is not None:
            return f"into {self.written}"
        return f"defining {', '.join(self.defined) or '-'}"

    def resolve(self, context: RunContext) -> dict[str, Any]:
        """The operands' values on this rank now."""
        resolved = {}
        for name, operand in self.operands:
            if isinstance(operand, Const):
                resolved[name] = operand.value
            else:
                resolved[name] = resolve_operand(operand, context, self.optional)
        return resolved


def step_failure(
    error: Exception, instruction: Instruction, step: Step, context: RunContext
) -> Exception:
    """What a failed handler raises: HostIrErrors as they are (communication errors prefixed
    with the communication), anything else as an EvaluationError naming the instruction."""
    if isinstance(error, CommunicationError) and not isinstance(error, DisagreementError):
        return type(error)(f"{_describe_communication(instruction, context)}: {error}")
    if isinstance(error, HostIrError):
        return error
    return EvaluationError(
        f"{keyword(instruction)} {step.describe()} failed on rank {context.rank}:"
        f" {type(error).__name__}: {error}"
    )


def skipped_failure(
    instruction: Instruction, rank: int, program: HostIrContainer
) -> EvaluationError | None:
    """The error for ``rank``, which does not run ``instruction`` (it is not on its
    placement's mesh), if the rank holds a tensor the instruction defines: that tensor
    would be None on a rank that holds it, and read as "not held" later or returned as an
    output. None if the rank holds none of them. The verifier refuses such a team
    (``hostir.check.verify_teams``); a value without a mesh (on every rank) in a world
    larger than the team is only caught here."""
    for value in defined_values(instruction):
        if not isinstance(value, TensorValue):
            continue
        if value.sharding is not None and not value.sharding.mesh.contains(rank):
            continue
        names = mesh_names(program)
        team = getattr(instruction, "team", None)
        mesh = placement(instruction)
        runs = (
            f"its team {print_team(team, names.name)}"
            if team is not None
            else f"mesh {names.name(mesh)}"
        )
        held = (
            "on every rank"
            if value.sharding is None
            else f"on mesh {names.name(value.sharding.mesh)}"
            f" (devices {describe_devices(value.sharding.mesh.devices)})"
        )
        return EvaluationError(
            f"{keyword(instruction)} defining {value.name} runs on {runs} (devices"
            f" {describe_devices(mesh.devices)}), without rank {rank}, but {value.name} is"
            f" {held}: rank {rank} holds {value.name} and would have no value for it;"
            f" expected every device that holds {value.name} among those that run it"
        )
    return None


def profiling() -> bool:
    """Whether a torch profiler is recording (then every instruction gets a range)."""
    return torch.autograd.profiler._is_profiler_enabled


def placement(instruction: Instruction) -> Mesh | None:
    """The mesh whose devices run ``instruction`` (None: every rank)."""
    team = getattr(instruction, "team", None)
    if team is not None:
        return team.mesh
    for name in instruction.OUTS + ("tensor",):
        value = getattr(instruction, name, None)
        if isinstance(value, TensorValue):
            return value.sharding.mesh if value.sharding is not None else None
    return None


def resolve_operand(operand: Any, context: RunContext, optional: bool = False) -> Any:
    """The value of one operand on this rank now: a tensor or request (None where this
    rank holds none, allowed only if ``optional``), a stream id, or a scalar."""
    if operand is None:
        return None
    if isinstance(operand, StreamValue):
        if operand.index is not None:
            index = int(evaluate_scalar(operand.index, context.scalars))
            return context.stream_pool.stream_id(index)  # iterations share the pool round-robin
        return context.tensors[operand.name]
    if isinstance(operand, NAMED_VALUES):
        if operand.name not in context.tensors:
            raise EvaluationError(f"{operand.name} is used before it is defined")
        tensor = context.tensors[operand.name]
        if tensor is None and not optional:
            raise EvaluationError(
                f"tensor {operand.name} is not held by rank {context.rank}"
                " (it lives on a mesh without this rank)"
            )
        return tensor
    if isinstance(operand, Const | Symbol | MeshCoordinate | BinaryExpr):
        return evaluate_scalar(operand, context.scalars)
    return operand


def _describe_communication(instruction: Instruction, context: RunContext) -> str:
    """``wait R2 (Allreduce defining T3 over axes (x) of a [2, 2] mesh, group ranks 0-1)``,
    for communication errors (short at any mesh size)."""
    if isinstance(instruction, Wait):
        posted = context.posted.get(instruction.request.name)
        inner = f" ({_describe_posting(posted, context)})" if posted is not None else ""
        return f"wait {instruction.request.name}{inner}"
    return _describe_posting(instruction, context)


def _describe_posting(instruction: Instruction, context: RunContext) -> str:
    out = getattr(instruction, "out", None)
    text = keyword(instruction)
    if out is not None:
        text += f" {'into' if getattr(instruction, 'preallocated', False) else 'defining'}"
        text += f" {out.name}"
    team = getattr(instruction, "team", None)
    if team is not None:
        axes = ", ".join(axis.value for axis in team.axes)
        text += f" over axes ({axes}) of a {list(team.mesh.shape)} mesh"
        group = team.group_of(context.rank)
        if group is not None:
            text += f", group {describe_group(group)}"
    return text
