"""The self-checks: hostir checking its own runs, on every entry point alike.

Four checks, each a setting the test suite turns on (tests/conftest.py), read once when an
evaluator is made (:meth:`SelfChecks.from_settings`) or given to it
(``HostIrEvaluator(checks=...)``):

- ``round_trip`` (``HOSTIR_CHECK_ROUND_TRIP``): a program is printed and parsed back, and
  written to JSON and read back, and must be the same (``hostir.text.round_trip``), when
  an evaluator takes it in (``FusionDefinition`` checks it where it lowers it, and runs
  the parsed copy);
- ``races`` (``HOSTIR_CHECK_RACES``): a ``RaceChecker`` listens to every interpreted run:
  with ``compiled``, to the interpreted twin of every run; without, to the run itself,
  which it makes interpreted, as any listener does;
- ``compiled`` (``HOSTIR_CHECK_COMPILED``): every run runs a second time the other way
  (compiled or interpreted, the interpreted one with the listeners) and the outputs must
  be bitwise equal (``hostir.run.compiled_runs``); a known signature's prepared call,
  the compiled replay, has the interpreted run as its twin;
- ``pipeline`` (``HOSTIR_CHECK_PIPELINE``): a program with a pipelined loop runs a second
  time unpipelined, on a twin evaluator, and the outputs must be bitwise equal
  (``hostir.run.pipelined_loops``).

A second run of a check draws the same random numbers (:func:`drawing_again`), and no
second run is made while a torch profiler records (it would double the events a test
counts). Runs captured as CUDA graphs are not checked (a replay runs no Python).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from hostir.errors import SettingError
from hostir.ir.container import HostIrContainer
from hostir.run.compiled_runs import check_compiled_outputs, compiled_checking_enabled
from hostir.run.context import Listener
from hostir.run.pipelined_loops import check_same_outputs, pipeline_checking_enabled
from hostir.run.race_checker import RaceChecker, race_checking_enabled
from hostir.text.round_trip import check_round_trip, round_trip_checking_enabled


@dataclass(frozen=True, slots=True)
class SelfChecks:
    """Which self-checks an evaluator makes (see the module docstring); none by default."""

    pipeline: bool = False
    compiled: bool = False
    races: bool = False
    round_trip: bool = False

    @staticmethod
    def from_settings() -> SelfChecks:
        """The checks the environment asks for (SettingError for a value other than 0 or 1)."""
        return SelfChecks(
            pipeline=pipeline_checking_enabled(),
            compiled=compiled_checking_enabled(),
            races=race_checking_enabled(),
            round_trip=round_trip_checking_enabled(),
        )

    def of_runs(self) -> bool:
        """Whether a check runs a program a second time (compiled or pipeline)."""
        return self.compiled or self.pipeline


NO_CHECKS = SelfChecks()


def checked_checks(checks: object) -> SelfChecks:
    """``checks`` if it is SelfChecks, the environment's for None; SettingError otherwise."""
    if checks is None:
        return SelfChecks.from_settings()
    if not isinstance(checks, SelfChecks):
        raise SettingError(
            f"checks: expected hostir.run.self_checks.SelfChecks (or None: the settings'),"
            f" got {type(checks).__name__}"
        )
    return checks


def take_in(program: HostIrContainer, checks: SelfChecks) -> None:
    """The checks made when an evaluator takes ``program`` in: its round trip through text
    and JSON (VerifyError naming the difference)."""
    if checks.round_trip:
        check_round_trip(program)


def with_checkers(listeners: tuple[Listener, ...], checks: SelfChecks) -> tuple[Listener, ...]:
    """``listeners`` and, with ``races``, a race checker (unless one listens already)."""
    if checks.races and not any(isinstance(listener, RaceChecker) for listener in listeners):
        return (*listeners, RaceChecker())
    return listeners


def draws_for(checks: SelfChecks) -> torch.Tensor | None:
    """The state of torch's default generator before a run that ``checks`` will run a
    second time, so the second run draws the same numbers; None where no second run is
    made (no such check, or a profiler records)."""
    if not checks.of_runs() or _profiler._is_profiler_enabled:
        return None
    return torch.random.get_rng_state()


def check_run(
    executable: Any,
    inputs: Sequence[Any],
    outputs: list,
    draws: torch.Tensor | None,
    compiled: bool,
) -> None:
    """The second runs of a run of ``executable`` (a ``hostir.run.executable.Executable``)
    on ``inputs`` that gave ``outputs`` (``compiled``: whether it ran compiled), made from
    generator state ``draws`` (nothing where it is None): the unpipelined twin's, then the
    other way's; EvaluationError naming the first output that differs."""
    if draws is None:
        return
    checks = executable.checks
    if checks.pipeline and executable.pipelines:
        twin = executable.evaluator.unpipelined()
        again = drawing_again(draws, lambda: twin.run(inputs, timeout=executable.timeout))
        check_same_outputs(outputs, again)
    if checks.compiled:
        other = drawing_again(draws, lambda: executable.run(inputs, compiled=not compiled))
        check_compiled_outputs(outputs, other, compiled)


def checked_call(
    executable: Any, call: Callable[[Sequence[Any]], list], compiled: bool
) -> Callable[[Sequence[Any]], list]:
    """``call`` (a run of ``executable``'s signature, compiled or not), each run followed
    by :func:`check_run`."""

    def checked(inputs: Sequence[Any]) -> list:
        draws = draws_for(executable.checks)
        outputs = call(inputs)
        check_run(executable, inputs, outputs, draws, compiled)
        return outputs

    return checked


def drawing_again(draws: torch.Tensor, run: Callable[[], list]) -> list:
    """``run()`` with torch's default generator as it was (``draws``) before the run it
    checks, so that an unseeded random op draws the same seed again
    (``hostir.run.creation``); the generator is left as the checked run left it."""
    after = torch.random.get_rng_state()
    torch.random.set_rng_state(draws)
    try:
        return run()
    finally:
        torch.random.set_rng_state(after)
