"""The collective timeout: how long a rank waits for its peers before it fails.

Every collective, and the agreement before a program's first run, fails with a
:class:`~hostir.errors.CommunicationError` once it has waited this long, instead
of hanging. The value comes from, first to last: ``execute(..., timeout=)`` /
``HostIrEvaluator.run(..., timeout=)``, the ``HOSTIR_TIMEOUT`` environment
variable (seconds), and :data:`DEFAULT_TIMEOUT_S`; it is at most
:data:`MAX_TIMEOUT_S`.
"""

from __future__ import annotations

import datetime

from hostir.settings import checked_seconds, seconds_setting

ENVIRONMENT_VARIABLE = "HOSTIR_TIMEOUT"
"""Seconds a collective may wait for its peers (a positive number)."""

DEFAULT_TIMEOUT_S = 300.0
"""Five minutes: long enough for a peer busy with a large compute step on a loaded
machine, short enough that a stuck job fails within a coffee break. Torch's own
defaults are 10 (NCCL) and 30 (gloo) minutes."""

MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""One week: a wait longer than that is a hang by any measure. Larger values overflowed
``datetime.timedelta`` (``1e14`` s) or the backends' millisecond counts."""


def collective_timeout(seconds: float | None = None) -> datetime.timedelta:
    """The timeout to use: ``seconds`` if given, else ``HOSTIR_TIMEOUT``, else the default.

    Raises SettingError for a value that is not a positive, finite number of seconds up
    to MAX_TIMEOUT_S.
    """
    if seconds is not None:
        return datetime.timedelta(seconds=checked_seconds(seconds, "timeout", MAX_TIMEOUT_S))
    value = seconds_setting(ENVIRONMENT_VARIABLE, MAX_TIMEOUT_S)
    return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S if value is None else value)
