"""Checks of the arguments the frontend's entry points take.

Each helper either returns the argument in the form the caller uses (a list of
ints, a bool) or raises the error class the caller names, with a message that
starts with the caller's name (``define_tensor: shape ...``), names the
argument and says what was expected. Python's ``bool`` is an ``int``, but no
entry point takes ``True`` for an index, a size or a factor: it is refused.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence
from typing import Any

import torch

from frontend.errors import DefinitionError, HostIrError, MeshError
from frontend.types import DataType
from hostir.ir.dtypes import INT_RANGES as HOSTIR_INT_RANGES

INT_RANGES = {DataType(dtype): limits for dtype, limits in HOSTIR_INT_RANGES.items()}
"""The values an integer dtype holds (hostir.ir.dtypes.INT_RANGES); an int constant outside
its range would wrap."""

INT64_MIN, INT64_MAX = INT_RANGES[DataType.Int]
"""The range of an Int (int64) scalar, of an extent and of a Python int operand (torch
converts a Python int to an int64 scalar)."""

MAX_EXTENT = INT64_MAX
"""The largest extent (of a dim, a new broadcast dim or a split factor): an int64."""

_SHOW = reprlib.Repr()
_SHOW.maxlist = _SHOW.maxtuple = 8
_SHOW.maxstring = _SHOW.maxother = 60


def shown(value: Any) -> str:
    """``repr(value)``, cut short: a message never grows with the argument's size."""
    return _SHOW.repr(value)


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_list(error: type[HostIrError], where: str, what: str, value: Any, of: str) -> list:
    """``value`` (a list, tuple or ``torch.Size``) as a list; raises ``error`` naming
    ``where`` and ``what``, a list of ``of``, otherwise (a string or a set is refused)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | torch.Size):
        raise error(f"{where}: {what} must be a list or tuple of {of}, got {shown(value)}")
    return list(value)


def int_list(
    error: type[HostIrError], where: str, what: str, value: Any, *, allow_int: bool = False
) -> list[int]:
    """``value`` as a list of ints: a list, tuple or ``torch.Size`` of ints (or, with
    ``allow_int``, one int); raises ``error`` naming ``where`` and ``what`` otherwise."""
    if allow_int and is_int(value):
        return [value]
    items = as_list(error, where, what, value, "ints (or one int)" if allow_int else "ints")
    for position, item in enumerate(items):
        if not is_int(item):
            raise error(
                f"{where}: {what}[{position}] must be an int, got {shown(item)} in {shown(value)}"
            )
    return items


def check_rank(where: str, rank: Any) -> int:
    """``rank`` if it is a device id (an int >= 0, not a bool); raises MeshError otherwise."""
    if not is_int(rank) or rank < 0:
        raise MeshError(f"{where}: expected a device id (an int >= 0), got {shown(rank)}")
    return rank


def check_bool(error: type[HostIrError], where: str, what: str, value: Any) -> bool:
    """``value`` if it is a bool; raises ``error`` naming ``where`` and ``what`` otherwise."""
    if not isinstance(value, bool):
        raise error(f"{where}: {what} must be True or False, got {shown(value)}")
    return value


def check_fits(
    error: type[HostIrError], where: str, what: str, value: int, dtype: DataType, why: str = ""
) -> None:
    """Raises ``error`` if the int ``value`` is outside what ``dtype`` holds: it would wrap
    around in the kernel, silently, as torch does (``int32_tensor + 2**40``). The message
    reads ``{where}: {what} {value} does not fit {dtype} (range){why}``."""
    low, high = INT_RANGES.get(dtype, (INT64_MIN, INT64_MAX))
    if not low <= value <= high:
        raise error(
            f"{where}: {what} {_int_text(value)} does not fit {dtype.name}"
            f" ({dtype.to_hostir().value}, {low}..{high}){why}"
        )


def _int_text(value: int) -> str:
    """``value`` in decimal, or as a power of two (``2**70``) when that is shorter."""
    magnitude = abs(value)
    if magnitude.bit_length() > 64 and magnitude & (magnitude - 1) == 0:
        return f"{'-' if value < 0 else ''}2**{magnitude.bit_length() - 1}"
    if magnitude.bit_length() > 256:
        return f"{'-' if value < 0 else ''}(an int of {magnitude.bit_length()} bits)"
    return str(value)


def contiguity_flags(
    error: type[HostIrError], where: str, contiguity: Any, count: int
) -> list[bool | None]:
    """``contiguity`` as one flag (True, False or None: unknown) per dim of ``count`` dims:
    one bool (or None: all True) for every dim, or a list of ``count`` flags."""
    if contiguity is None or isinstance(contiguity, bool):
        return [True if contiguity is None else contiguity] * count
    if isinstance(contiguity, str | bytes) or not isinstance(contiguity, Sequence):
        raise error(
            f"{where}: contiguity must be True, False, None or a list of them, one per dim,"
            f" got {shown(contiguity)}"
        )
    flags = list(contiguity)
    if len(flags) != count:
        raise error(f"{where}: contiguity {shown(flags)} has {len(flags)} entries for {count} dims")
    for position, flag in enumerate(flags):
        if flag is not None and not isinstance(flag, bool):
            raise error(
                f"{where}: contiguity[{position}] must be True, False or None, got {shown(flag)}"
            )
    return flags


def scalar_dtype(value: Any, dtype: Any) -> DataType:
    """The dtype of a ``define_scalar(value, dtype)``: ``dtype`` if given, else the one of
    ``value``'s Python type (bool: Bool, int: Int, float or None: Double), as nvFuser."""
    if dtype is not None:
        return DataType.of(dtype)
    if value is not None and type(value) not in (bool, int, float):
        raise DefinitionError(
            f"define_scalar: value {shown(value)} must be a bool, an int or a float"
        )
    return {bool: DataType.Bool, int: DataType.Int}.get(type(value), DataType.Double)


def scalar_constant(value: Any, dtype: DataType) -> int | float | bool:
    """``value`` as a constant of ``dtype``, as the kernel will see it: a Python bool for
    Bool, an int for an integer dtype (that fits it), else a float. Refuses a value the
    dtype cannot hold exactly (1.5 for Int, 2**40 for Int32, 'a' for anything)."""
    where = f"define_scalar({shown(value)}, dtype={dtype.name})"
    if type(value) not in (bool, int, float):
        raise DefinitionError(f"{where}: the value must be a bool, an int or a float")
    if dtype is DataType.Bool:
        if not isinstance(value, bool):
            raise DefinitionError(f"{where}: a Bool scalar is True or False")
        return value
    if dtype in INT_RANGES:
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise DefinitionError(f"{where}: an {dtype.name} scalar is a whole number")
        check_fits(DefinitionError, where, "the value", int(value), dtype)
        return int(value)
    try:
        return float(value)
    except OverflowError:
        raise DefinitionError(
            f"{where}: the value does not fit a {dtype.to_hostir().value}"
        ) from None
