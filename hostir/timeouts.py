"""The collective timeout: how long a rank waits for its peers before it fails.

Every collective, and the agreement before a program's first run, fails with a
:class:`~hostir.errors.CommunicationError` once it has waited this long, instead
of hanging. The value comes from, first to last: ``execute(..., timeout=)`` /
``HostIrEvaluator.run(..., timeout=)``, the ``HOSTIR_TIMEOUT`` environment
variable (seconds), and :data:`DEFAULT_TIMEOUT_S`.
"""

from __future__ import annotations

import datetime
import math
import os

from hostir.errors import SettingError

ENVIRONMENT_VARIABLE = "HOSTIR_TIMEOUT"
"""Seconds a collective may wait for its peers (a positive number)."""

DEFAULT_TIMEOUT_S = 300.0
"""Five minutes: long enough for a peer busy with a large compute step on a loaded
machine, short enough that a stuck job fails within a coffee break. Torch's own
defaults are 10 (NCCL) and 30 (gloo) minutes."""


def collective_timeout(seconds: float | None = None) -> datetime.timedelta:
    """The timeout to use: ``seconds`` if given, else ``HOSTIR_TIMEOUT``, else the default.

    Raises SettingError for a value that is not a positive, finite number.
    """
    if seconds is not None:
        return datetime.timedelta(seconds=_checked(seconds, "timeout"))
    text = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not text:
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        value = float(text)
    except ValueError:
        raise SettingError(
            f"{ENVIRONMENT_VARIABLE}={text!r}: expected a positive number of seconds"
        ) from None
    return datetime.timedelta(seconds=_checked(value, ENVIRONMENT_VARIABLE))


def _checked(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingError(f"{name}: expected a positive number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise SettingError(f"{name}: expected a positive number of seconds, got {value!r}")
    return float(value)
