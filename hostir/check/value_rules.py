"""The ops' rules on the values the inputs bind: run-time values checked as constants are.

A rule an op applies to its constants when it is made (a slice's ``start <= stop``, a pad
width ``>= 0``, topk's ``k <= extent``, a variance's ``correction <= count``) is a
:class:`~hostir.ir.requirements.Requirement`; the frontend and the verifier refuse one
that constants break. Where a side reads a symbol, :class:`ValueRules` checks it when the
inputs bind it: once per binding, after the inputs are bound and before the ranks'
agreement (``hostir.check.extent_checks`` calls it first, so a negative pad width is named
as one, not as the negative extent it makes), so a failure reaches every rank. The error
is a :class:`~hostir.errors.BoundRequirementError` (an ``ExtentError`` and a
``RequirementError``) with the sentence the constant case gives, each
symbolic side shown with its value, and where each symbol was bound from::

    var of T0: correction 5 is larger than the i1 = 3 elements each result reduces over
    dims [1]; i1 = 3 (from input T0 dim 1)

The requirements are the program's own (``HostIrContainer.requires``) and those its
instructions show (``hostir.ir.requirements.instruction_requirements``), loop bodies
included. One whose sides read a symbol this rank does not bind (an input it holds no
shard of, a loop index) is not checked here: the ranks that bind it check it, and an
instruction whose bounds read a loop index checks them when it runs (the slice handler).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hostir.errors import BoundRequirementError
from hostir.ir.container import HostIrContainer
from hostir.ir.program_info import walk_instructions
from hostir.ir.requirements import (
    Requirement,
    explain,
    holds,
    instruction_requirements,
    symbols_read,
)
from hostir.ir.scalars import Scalar

Env = Mapping[str, int | float | bool]
Describe = Callable[[Sequence[Scalar], Env], str]
"""Says where the symbols of some expressions were bound (``i1 = 3 (from input T0 dim 1)``)."""


class ValueRules:
    """The requirements of ``program`` that read symbols (collected once); :meth:`check`
    checks them on one binding."""

    def __init__(self, program: HostIrContainer) -> None:
        found: dict[Requirement, None] = dict.fromkeys(program.requires)
        for instruction in walk_instructions(program.body):
            found.update(dict.fromkeys(instruction_requirements(instruction)))
        self.requirements = tuple(r for r in found if symbols_read(r))
        self.reads = frozenset().union(*(symbols_read(r) for r in self.requirements))

    def check(self, env: Env, describe: Describe) -> None:
        """Raises BoundRequirementError naming the first requirement the values in ``env`` break."""
        for requirement in self.requirements:
            if holds(requirement, env) is False:
                bound = describe([requirement.low, requirement.high], env)
                raise BoundRequirementError(f"{explain(requirement, env)}; {bound}")
