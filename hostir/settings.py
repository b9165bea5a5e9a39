"""Settings read from the environment: one reader per kind of value, so every
setting is checked and named alike in its error (``HOSTIR_TIMEOUT`` has its own in
``hostir.timeouts``: seconds, a float)."""

from __future__ import annotations

import os

from hostir.errors import SettingError


def count_setting(variable: str, default: int, minimum: int) -> int:
    """The whole number in environment variable ``variable`` (``default`` when unset or
    empty); SettingError naming the variable and its text unless it is one, at least
    ``minimum``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < minimum:
        expected = "a positive integer" if minimum == 1 else f"a whole number >= {minimum}"
        raise SettingError(f"{variable}={text!r}: expected {expected}")
    return int(text)
