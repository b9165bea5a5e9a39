"""Software-pipelined loops: a ``for`` body split into stages by ``pipeline_stage``.

A loop body ``S0; pipeline_stage depth=d1; S1; pipeline_stage depth=d2; S2 ...``
runs its stages interleaved across iterations: at step ``t`` (from the loop's
start to its stop plus the total depth, minus one) it runs stage ``S0`` of
iteration ``t``, then ``S1`` of iteration ``t - d1``, then ``S2`` of iteration
``t - d1 - d2``, and so on, each only for iterations inside the loop's range.
That is the prologue, steady state and epilogue of a software pipeline, with
the body written once. Each iteration keeps its own values from one of its
stages to the next: the tensors and requests it defined, and its current
stream; the loop index reads the iteration's own number in every stage.

With one marker of depth 1 after a communication is posted and before its
``wait``, chunk ``t``'s communication is in flight while chunk ``t + 1`` is
computed (the evaluator blocks the host only in ``wait``, as gloo does): the
overlap a skilled user writes by hand, on every backend.

Run unpipelined (``HOSTIR_PIPELINE=0`` or ``HostIrEvaluator(pipeline=False)``),
the markers do nothing: each iteration runs whole, in order. A correct program
gives bitwise-equal results both ways (its stages touch disjoint chunks across
iterations; the race checker checks the streams either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hostir.analysis.pipeline_stages import stages
from hostir.errors import EvaluationError, SettingError
from hostir.ir.instructions import (
    ForLoop,
    Instruction,
    defined_values,
)
from hostir.ir.program_info import walk_instructions
from hostir.run.stream_handlers import make_current
from hostir.settings import flag_setting

if TYPE_CHECKING:
    from hostir.run.context import RunContext

PIPELINE_VARIABLE = "HOSTIR_PIPELINE"
"""``0`` runs pipelined loops unpipelined (each iteration whole, in order); ``1``, the
default, runs them as their stages say."""


def pipelining(pipeline: bool | None = None) -> bool:
    """Whether to run loops pipelined: ``pipeline`` if given, else ``HOSTIR_PIPELINE``
    (``1`` by default); SettingError for any other setting or a ``pipeline`` that is
    not a bool."""
    if pipeline is None:
        return flag_setting(PIPELINE_VARIABLE, default=True)
    if not isinstance(pipeline, bool):
        raise SettingError(f"pipeline: expected True, False or None, got {pipeline!r}")
    return pipeline


def _defined_names(body: Sequence[Instruction]) -> set[str]:
    """Every name ``body`` defines (nested loops included): what one iteration owns."""
    return {v.name for i in walk_instructions(body) for v in defined_values(i)}


def run_pipelined(context: RunContext, loop: ForLoop, start: int, stop: int) -> None:
    """Runs ``loop`` over ``range(start, stop)`` stage by stage (module docstring)."""
    staged = stages(loop.body)
    index = loop.index.name
    names = _defined_names(loop.body)
    saved: dict[int, tuple[dict, dict, object]] = {}  # iteration -> its values and stream
    for step in range(start, stop + staged[-1][0]):
        for number, (lag, body) in enumerate(staged):
            iteration = step - lag
            if not start <= iteration < stop:
                continue
            if number:
                tensors, posted, stream = saved.pop(iteration)
                context.tensors.update(tensors)
                context.posted.update(posted)
                make_current(context, stream)  # torch's current stream too, on CUDA
            context.scalars[index] = iteration
            context.run_body(body)
            if number + 1 < len(staged):
                saved[iteration] = (
                    {n: context.tensors.pop(n) for n in names if n in context.tensors},
                    {n: context.posted.pop(n) for n in names if n in context.posted},
                    context.current_stream,
                )
    context.scalars.pop(index, None)


CHECK_VARIABLE = "HOSTIR_CHECK_PIPELINE"
"""Set to ``1`` (the test suite does) to run every program that has a pipelined loop a
second time unpipelined and compare the outputs bitwise (hostir.run.self_checks)."""


def pipeline_checking_enabled() -> bool:
    """Whether ``HOSTIR_CHECK_PIPELINE=1`` asks to compare pipelined and unpipelined runs
    (``0`` or unset: no; SettingError for any other value). The check skips runs made
    while a profiler records (hostir.run.self_checks)."""
    return flag_setting(CHECK_VARIABLE)


def check_same_outputs(pipelined: Sequence[Any], unpipelined: Sequence[Any]) -> None:
    """Raises EvaluationError unless the two runs' outputs are bitwise equal."""
    for index, (a, b) in enumerate(zip(pipelined, unpipelined, strict=True)):
        same = a is None and b is None or (a is not None and b is not None and torch.equal(a, b))
        if not same:
            raise EvaluationError(
                f"output {index} of the pipelined run differs from the same program run"
                " unpipelined (HOSTIR_PIPELINE=0): a pipeline stage touches what another"
                " iteration's stage uses"
            )
