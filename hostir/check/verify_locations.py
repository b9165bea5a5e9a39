"""Where a verifier error points, in words: a :class:`~hostir.errors.VerifyError`'s
``path`` (the instruction's index in the body and in each enclosing loop body) as
``body[3] (linear defining T4)``, for programs that come from no text."""

from __future__ import annotations

from collections.abc import Sequence

from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import Instruction, defined_values, keyword
from hostir.ir.values import TensorValue

Path = tuple[int, ...]


def _describe_path(path: Path) -> str:
    """``body[3].body[1]`` (``the inputs`` for ())."""
    if not path:
        return "the inputs"
    return ".".join(f"body[{index}]" for index in path)


def instruction_at(program: HostIrContainer, path: Path) -> Instruction:
    """The instruction a verifier ``path`` names."""
    body: Sequence[Instruction] = program.body
    instruction = None
    for index in path:
        instruction = body[index]
        body = getattr(instruction, "body", ())
    return instruction


def describe_location(
    program: HostIrContainer, path: Path | None, field: tuple[str, int] | None = None
) -> str:
    """``body[3] (linear defining T4)``, or ``inputs[1] (T0)`` for a declaration ``field``:
    where a verifier error points, in words."""
    if field is not None:
        kind, index = field
        return f"{kind}[{index}] ({getattr(program, kind)[index].name})"
    if path is None:
        return "the program"
    if not path:
        return "the inputs"
    instruction = instruction_at(program, path)
    defined = [v.name for v in defined_values(instruction) if isinstance(v, TensorValue)]
    what = keyword(instruction) + (f" defining {', '.join(defined)}" if defined else "")
    return f"{_describe_path(path)} ({what})"
