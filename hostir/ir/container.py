"""``HostIrContainer``: a self-contained host IR program."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hostir.errors import HostIrError
from hostir.ir.dtypes import DType
from hostir.ir.instructions import Instruction
from hostir.ir.requirements import Requirement
from hostir.ir.values import TensorValue


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalarInput:
    """A scalar input of a program, bound to the symbol ``name`` at run time."""

    name: str
    dtype: DType


@dataclass(frozen=True, slots=True, kw_only=True)
class HostIrContainer:
    """An SPMD program: inputs, a body of instructions, and outputs.

    Every rank runs the same program; rank-dependent values (mesh coordinates,
    peers) are symbolic. ``str(program)`` gives the text form. ``requires`` lists what
    the values the inputs bind must satisfy beyond what the instructions show
    (``hostir.ir.requirements``; text ``require LOW <= HIGH else "..."``).
    """

    inputs: tuple[TensorValue | ScalarInput, ...]
    outputs: tuple[TensorValue, ...]
    body: tuple[Instruction, ...]
    requires: tuple[Requirement, ...] = ()

    def __str__(self) -> str:
        return _text_form("print_program")(self)

    def to_json(self) -> str:
        """The JSON form (format ``hostir``, with its version; see
        ``hostir.text.json_format``)."""
        return _text_form("to_json")(self)

    @staticmethod
    def from_json(text: str) -> HostIrContainer:
        """The program of a JSON document written by :meth:`to_json`; raises
        ``JsonFormatError`` (a ``VerifyError``) naming what is wrong and where."""
        return _text_form("from_json")(text)


_TEXT_FORMS: dict[str, Callable[[Any], Any]] = {}
"""The printer and the JSON writer and reader, installed by :func:`register_text_forms`.

The IR does not import its text layer (``hostir.text`` imports the IR): ``hostir.text``
installs its functions here when it is imported, which ``import hostir`` (and so any
import of a ``hostir`` module) does first."""


def register_text_forms(
    *,
    print_program: Callable[[HostIrContainer], str],
    to_json: Callable[[HostIrContainer], str],
    from_json: Callable[[str], HostIrContainer],
) -> None:
    """Installs the functions behind ``str(program)``, :meth:`HostIrContainer.to_json`
    and :meth:`HostIrContainer.from_json` (``hostir.text`` calls this once)."""
    _TEXT_FORMS.update(print_program=print_program, to_json=to_json, from_json=from_json)


def _text_form(name: str) -> Callable[[Any], Any]:
    form = _TEXT_FORMS.get(name)
    if form is None:  # only if hostir.text failed to import
        raise HostIrError(f"{name}: the text layer (hostir.text) is not loaded")
    return form
