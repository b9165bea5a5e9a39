"""``insert_deallocations``: free each intermediate right after its last use."""

from __future__ import annotations

import dataclasses

from hostir import Deallocate, HostIrContainer
from hostir.instructions import defined_values, used_values


def insert_deallocations(program: HostIrContainer) -> HostIrContainer:
    """Adds ``deallocate T`` after the last top-level use of every tensor the body
    defines that is not a program output."""
    keep = {v.name for v in program.outputs} | {v.name for v in program.inputs}
    last_use: dict[str, int] = {}
    defined: dict[str, object] = {}
    for index, instruction in enumerate(program.body):
        for value in defined_values(instruction):
            defined[value.name] = value
            last_use.setdefault(value.name, index)
        for value in used_values(instruction):
            last_use[value.name] = index
    body = []
    for index, instruction in enumerate(program.body):
        body.append(instruction)
        for name, value in defined.items():
            if name not in keep and last_use[name] == index:
                body.append(Deallocate(tensor=value))
    return dataclasses.replace(program, body=tuple(body))
