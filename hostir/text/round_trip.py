"""Round-trip checks: a program printed and parsed back (and through JSON) is the same.

With ``HOSTIR_CHECK_ROUND_TRIP=1`` (the test suite sets it) ``FusionDefinition``
checks every program it lowers this way and runs the *parsed* copy, so every
test that executes a fusion also checks that the text form is complete; and an
evaluator checks every program it is given (hostir.run.self_checks).
"""

from __future__ import annotations

import difflib

from hostir.errors import VerifyError
from hostir.ir.container import HostIrContainer
from hostir.settings import flag_setting
from hostir.text import json_format
from hostir.text.parser import parse

ENVIRONMENT_VARIABLE = "HOSTIR_CHECK_ROUND_TRIP"


def round_trip_checking_enabled() -> bool:
    """Whether ``HOSTIR_CHECK_ROUND_TRIP`` is ``1`` (``0`` or unset: no; SettingError for
    any other value)."""
    return flag_setting(ENVIRONMENT_VARIABLE)


def check_round_trip(program: HostIrContainer) -> HostIrContainer:
    """The program re-read from its text form; raises VerifyError if text or structure differ,
    or if the program read back from its JSON form differs from it."""
    text = str(program)
    parsed = parse(text)
    again = str(parsed)
    if again != text:
        diff = "\n".join(difflib.unified_diff(text.splitlines(), again.splitlines(), lineterm=""))
        raise VerifyError(f"the printed program does not print the same after parsing:\n{diff}")
    if parsed != program:
        raise VerifyError(f"parsing the printed program gives a different program:\n{text}")
    _check_json_round_trip(program)
    return parsed


def _check_json_round_trip(program: HostIrContainer) -> None:
    """Raises VerifyError unless ``from_json(to_json(program)) == program``."""
    # The same document without to_json's indent: whitespace is all that differs, and
    # without an indent Python's json writes it with its C encoder (with one, in pure
    # Python: most of this check's time). The indented form is written only for a diff.
    compact = json_format.JsonDocument(program=program).to_json(allow_nan=False)
    decoded = json_format.from_json(compact)
    if decoded != program:
        document, again = json_format.to_json(program), json_format.to_json(decoded)
        lines = difflib.unified_diff(document.splitlines(), again.splitlines(), lineterm="")
        diff = "\n".join(lines) or "(the JSON texts agree; the programs differ in a way JSON hides)"
        raise VerifyError(
            f"the program read back from its JSON form differs from the program:\n{diff}"
            f"\nprogram:\n{program}"
        )
