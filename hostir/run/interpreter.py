"""The interpreter's step: one instruction run on this rank.

``HostIrEvaluator.run_instruction`` runs each instruction of an interpreted run through
:func:`run_step`: it resolves the operands, lets the listeners see them, calls the
handler (inside a ``hir::<keyword>`` profiler range while a torch profiler records),
binds the results and records a posted request. Handlers never touch the environment.
An instruction off this rank's meshes binds what it defines to None (or raises, where the
rank holds it: ``hostir.run.steps.skipped_failure``).
"""

from __future__ import annotations

import torch

from hostir.ir.instructions import Instruction
from hostir.run.context import RunContext
from hostir.run.steps import Step, profiling, skipped_failure, step_failure


def run_step(step: Step, instruction: Instruction, context: RunContext) -> None:
    """Runs ``instruction``, prepared as ``step``, in ``context`` (see the module docstring)."""
    if not step.runs_on(context.rank):
        failure = skipped_failure(instruction, context.rank, context.program)
        if failure is not None:  # this rank holds what it would leave None
            raise failure
        for name in step.defined:
            context.tensors[name] = None
        return
    # Whatever a handler or a listener raises becomes an EvaluationError naming the
    # instruction and rank (HostIrErrors stay what they are): the peers are told of it.
    try:
        operands = step.resolve(context)
        listeners = context.listeners
        for listener in listeners:
            listener.before(instruction, context, operands)
        if profiling():
            with _profiler_range(step.range_name):
                results = step.handler(context, instruction, operands)
        else:
            results = step.handler(context, instruction, operands)
        tensors = context.tensors
        for index, name in step.binds:
            tensors[name] = results[index]
        if step.posts is not None:
            context.posted[step.posts] = instruction
        for listener in listeners:
            listener.after(instruction, context, operands)
    except Exception as error:
        failure = step_failure(error, instruction, step, context)
        if failure is error:
            raise
        raise failure from error


# ``record_function`` costs microseconds even when nothing records; the fast variant
# gives the same ``hir::<keyword>`` events, and ranges are only opened while profiling.
_profiler_range = getattr(torch._C._profiler, "_RecordFunctionFast", None) or (
    torch.profiler.record_function
)
