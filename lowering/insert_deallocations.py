"""``insert_deallocations``: free each intermediate right after its last use.

A tensor defined at some level of the program (the top level or a loop body)
is freed after its last use at that level, where a loop counts as using every
tensor its body uses; a tensor defined in a loop body and not used after the
loop is freed inside the body (it lives one iteration). A communication reads
its source and writes its output until its ``wait``, so the last use of both is
the wait. A stream loop (its body sets the current stream) uses the tensors
defined outside it until the loop after it that synchronizes with every
stream: only then has main, which frees them, waited for the streams that read
them. What the body defines is allocated and freed on the body's stream, so
it is freed inside the body like any loop's intermediates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from hostir import (
    Deallocate,
    ForLoop,
    HostIrContainer,
    SetCurrentStream,
    Synchronize,
    TensorValue,
    Wait,
)
from hostir.ir.instructions import Instruction, defined_values, used_values


def insert_deallocations(program: HostIrContainer) -> HostIrContainer:
    """Adds ``deallocate T`` after the last use of every tensor the body defines that
    is not a program output (see module docstring)."""
    keep = {v.name for v in program.outputs} | {v.name for v in program.inputs}
    return dataclasses.replace(program, body=_with_deallocations(program.body, keep.__contains__))


def _uses(instruction: Instruction) -> set[str]:
    """Tensor names ``instruction`` reads, loop bodies included."""
    names = {v.name for v in used_values(instruction) if isinstance(v, TensorValue)}
    if isinstance(instruction, ForLoop):
        for inner in instruction.body:
            names |= _uses(inner)
    return names


def _defined_within(loop: ForLoop) -> set[str]:
    """Tensor names defined anywhere in ``loop``'s body, nested loops included."""
    names: set[str] = set()
    for inner in loop.body:
        names |= {v.name for v in defined_values(inner) if isinstance(v, TensorValue)}
        if isinstance(inner, ForLoop):
            names |= _defined_within(inner)
    return names


def _runs_on_streams(instruction: Instruction, kind: type) -> bool:
    """Whether ``instruction`` is a loop whose body has a ``kind`` instruction: a stream
    loop (SetCurrentStream) or the loop joining its streams (Synchronize)."""
    return isinstance(instruction, ForLoop) and any(isinstance(i, kind) for i in instruction.body)


def _last_uses(body: Sequence[Instruction]) -> tuple[dict[str, int], dict[str, TensorValue]]:
    """The index of each tensor's last use in ``body``, and the tensors ``body`` defines."""
    last_use: dict[str, int] = {}
    defined: dict[str, TensorValue] = {}
    pending: dict[str, set[str]] = {}  # request -> tensors its communication accesses
    streamed: set[str] = set()  # tensors a stream loop uses, until the streams join
    uses = [_uses(instruction) for instruction in body]
    for index, instruction in enumerate(body):
        written = {v.name for v in defined_values(instruction) if isinstance(v, TensorValue)}
        for value in defined_values(instruction):
            if isinstance(value, TensorValue):
                defined[value.name] = value
                last_use.setdefault(value.name, index)
        for name in uses[index]:
            last_use[name] = index
        if isinstance(instruction, Wait):
            for name in pending.pop(instruction.request.name, set()):
                last_use[name] = index
        elif getattr(instruction, "request", None) is not None:
            pending[instruction.request.name] = uses[index] | written
        if _runs_on_streams(instruction, SetCurrentStream):
            # What the body defines it allocates and frees on its own stream, in order;
            # only what main allocated must wait for the join.
            streamed |= uses[index] - _defined_within(instruction)
        elif _runs_on_streams(instruction, Synchronize):
            for name in streamed:
                last_use[name] = index
            streamed = set()
    return last_use, defined


def _with_deallocations(
    body: Sequence[Instruction], kept: Callable[[str], bool]
) -> tuple[Instruction, ...]:
    """``body`` with its deallocations; ``kept(name)``: the tensor outlives ``body``."""
    last_use, defined = _last_uses(body)
    freed: dict[int, list[TensorValue]] = {}
    for name, value in defined.items():
        if not kept(name):
            freed.setdefault(last_use[name], []).append(value)
    result: list[Instruction] = []
    for index, instruction in enumerate(body):
        if isinstance(instruction, ForLoop):
            inner = _with_deallocations(instruction.body, _outliving(kept, last_use, index))
            instruction = dataclasses.replace(instruction, body=inner)
        result.append(instruction)
        result.extend(Deallocate(tensor=value) for value in freed.get(index, ()))
    return tuple(result)


def _outliving(
    kept: Callable[[str], bool], last_use: dict[str, int], index: int
) -> Callable[[str], bool]:
    """What outlives the loop at ``index``: what outlives its body, or is used after it.
    (A predicate, not a set: copying the names used later for every loop would make this
    pass quadratic in the number of loops.)"""
    return lambda name: kept(name) or last_use.get(name, -1) > index
