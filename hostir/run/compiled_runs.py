"""When runs are compiled, and the check that compiled and interpreted runs agree.

``HostIrEvaluator`` runs a program compiled (``hostir.run.compiled``) unless listeners
observe it, a torch profiler records (the interpreter opens a ``hir::<keyword>`` range
per instruction), or ``HOSTIR_INTERPRET=1`` / ``HostIrEvaluator(compiled=False)`` asks
for the interpreter. ``HOSTIR_CHECK_COMPILED=1`` (the test suite sets it) makes every
run, through ``FusionDefinition.execute`` or ``HostIrEvaluator.run``, run the other way
too and compare (a self-check: hostir.run.self_checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hostir.errors import EvaluationError, SettingError
from hostir.settings import flag_setting

INTERPRET_VARIABLE = "HOSTIR_INTERPRET"
"""``1`` runs programs interpreted, instruction by instruction; ``0``, the default, runs
them compiled where nothing observes the instructions."""

CHECK_VARIABLE = "HOSTIR_CHECK_COMPILED"
"""Set to ``1`` (the test suite does) to run every program both compiled and interpreted
and compare the outputs bitwise (hostir.run.self_checks)."""


def compiling(compiled: bool | None = None) -> bool:
    """Whether to run programs compiled: ``compiled`` if given, else not
    ``HOSTIR_INTERPRET`` (``0`` by default); SettingError for any other setting or a
    ``compiled`` that is not a bool."""
    if compiled is None:
        return not flag_setting(INTERPRET_VARIABLE)
    if not isinstance(compiled, bool):
        raise SettingError(f"compiled: expected True, False or None, got {compiled!r}")
    return compiled


def compiled_checking_enabled() -> bool:
    """Whether ``HOSTIR_CHECK_COMPILED=1`` asks to compare compiled and interpreted runs
    (``0`` or unset: no; SettingError for any other value). The check skips runs made
    while a profiler records (hostir.run.self_checks)."""
    return flag_setting(CHECK_VARIABLE)


def check_compiled_outputs(first: Sequence[Any], second: Sequence[Any], compiled: bool) -> None:
    """Raises EvaluationError unless two runs' outputs are bitwise equal; ``compiled``:
    whether the first run was the compiled one."""
    for index, (a, b) in enumerate(zip(first, second, strict=True)):
        if not (a is None and b is None or bitwise_equal(a, b)):
            runs = ("compiled", "interpreted") if compiled else ("interpreted", "compiled")
            raise EvaluationError(
                f"output {index} of the {runs[0]} run differs from the same program run"
                f" {runs[1]} (HOSTIR_INTERPRET={int(compiled)}): a bug in hostir.run.compiled"
            )


def bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether ``a`` and ``b`` are tensors of one dtype and shape with the same bits (NaNs
    in the same places compare equal, unlike ``torch.equal``)."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(_bits(a), _bits(b))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor``'s elements, in order."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)
