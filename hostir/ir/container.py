"""``HostIrContainer``: a self-contained host IR program."""

from __future__ import annotations

from dataclasses import dataclass

from hostir.ir.dtypes import DType
from hostir.ir.instructions import Instruction
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
    peers) are symbolic. ``str(program)`` gives the text form.
    """

    inputs: tuple[TensorValue | ScalarInput, ...]
    outputs: tuple[TensorValue, ...]
    body: tuple[Instruction, ...]

    def __str__(self) -> str:
        from hostir.text.printer import print_program

        return print_program(self)

    def to_json(self) -> str:
        """The JSON form (format ``hostir``, with its version; see ``hostir.text.json_format``)."""
        from hostir.text.json_format import to_json

        return to_json(self)

    @staticmethod
    def from_json(text: str) -> HostIrContainer:
        """The program of a JSON document written by :meth:`to_json`; raises
        ``JsonFormatError`` (a ``VerifyError``) naming what is wrong and where."""
        from hostir.text.json_format import from_json

        return from_json(text)
