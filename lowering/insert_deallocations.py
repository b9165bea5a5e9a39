"""``insert_deallocations``: free each intermediate right after its last use.

A communication reads its source until its ``wait``, so the source's last
use is the wait, not the instruction that posted it.
"""

from __future__ import annotations

import dataclasses

from hostir import Deallocate, HostIrContainer, TensorValue, Wait
from hostir.instructions import defined_values, used_values


def insert_deallocations(program: HostIrContainer) -> HostIrContainer:
    """Adds ``deallocate T`` after the last top-level use of every tensor the body
    defines that is not a program output."""
    keep = {v.name for v in program.outputs} | {v.name for v in program.inputs}
    last_use: dict[str, int] = {}
    defined: dict[str, TensorValue] = {}
    pending: dict[str, list[str]] = {}  # request -> tensors its communication reads
    for index, instruction in enumerate(program.body):
        for value in defined_values(instruction):
            if isinstance(value, TensorValue):
                defined[value.name] = value
                last_use.setdefault(value.name, index)
        reads = [v.name for v in used_values(instruction) if isinstance(v, TensorValue)]
        for name in reads:
            last_use[name] = index
        request = getattr(instruction, "request", None)
        if isinstance(instruction, Wait):
            for name in pending.pop(instruction.request.name, []):
                last_use[name] = index
        elif request is not None:
            pending[request.name] = reads
    body = []
    for index, instruction in enumerate(program.body):
        body.append(instruction)
        for name, value in defined.items():
            if name not in keep and last_use[name] == index:
                body.append(Deallocate(tensor=value))
    return dataclasses.replace(program, body=tuple(body))
