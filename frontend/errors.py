"""Errors raised by the frontend; all derive from ``hostir.HostIrError``."""

from __future__ import annotations

from hostir.errors import HostIrError, InputError, MeshError, RequirementError


class FrontendError(HostIrError):
    """Base class of errors in what the user wrote (definition or schedule)."""


class DefinitionError(FrontendError):
    """A fusion is defined wrongly: bad shape, dtype, output, or context use."""


class OperandError(FrontendError):
    """An op's operands do not fit together (shapes, dtypes, dims)."""


class OperandRequirementError(OperandError, RequirementError):
    """An op's rule on its values broken by constants when the op is defined: the same
    sentence a ``BoundRequirementError`` gives when values bound at execute break it, and
    both are ``RequirementError``s."""


class ScheduleError(FrontendError):
    """A schedule is invalid: axis out of range, bad split, bad parallelization."""


__all__ = [
    "DefinitionError",
    "FrontendError",
    "HostIrError",
    "InputError",
    "MeshError",
    "OperandError",
    "OperandRequirementError",
    "RequirementError",
    "ScheduleError",
]
