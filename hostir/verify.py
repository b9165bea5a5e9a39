"""``verify_program``: structural checks on a host IR program."""

from __future__ import annotations

from hostir.container import HostIrContainer, ScalarInput
from hostir.errors import VerifyError
from hostir.instructions import ForLoop, Instruction, defined_values, keyword, used_values


def verify_program(program: HostIrContainer) -> None:
    """Raises VerifyError if a tensor is used before definition or defined twice,
    or a loop index is reused by a nested loop."""
    defined = {v.name for v in program.inputs}
    scalars = {v.name for v in program.inputs if isinstance(v, ScalarInput)}
    _verify_body(program.body, defined, scalars, set())
    for value in program.outputs:
        if value.name not in defined:
            raise VerifyError(f"output {value.name} is never defined")


def _verify_body(
    body: tuple[Instruction, ...], defined: set[str], scalars: set[str], indices: set[str]
) -> None:
    for instruction in body:
        for value in used_values(instruction):
            if value.name not in defined:
                raise VerifyError(f"{keyword(instruction)} uses {value.name} before it is defined")
        for value in defined_values(instruction):
            if value.name in defined:
                raise VerifyError(f"{keyword(instruction)} defines {value.name} a second time")
            defined.add(value.name)
        if isinstance(instruction, ForLoop):
            name = instruction.index.name
            if name in indices:
                raise VerifyError(f"loop index {name} is already bound by an enclosing loop")
            _verify_body(instruction.body, defined, scalars, indices | {name})
