"""Each declared op's torch implementation, registered under its declaration
(``hostir.ir.opdecl``) with :func:`implements`.

An implementation is, per instruction, the torch call that computes the op's result from
its operands (the instruction's ``INS`` fields, in order), made once when the instruction
is prepared: the evaluator's handler calls it and checks the result's local shape; a
compiled replay calls it directly (``hostir.run.replay``). The call of an op with several
results returns them all, in ``OUTS`` order, from one kernel call; each is checked. An op
whose result is written into a preallocated ``out`` (a stream chunk of a tensor, say)
writes it there in place where its implementation gives a write (``into``: torch's
``out=`` forms), else gets the result copied there (:func:`write_call`); an op of several
results is never preallocated (the verifier refuses it by name). A handler of the
evaluator's own form
(``handler=``) serves ops whose call needs the run's context.

Every declared op must have an implementation: ``hostir.run`` checks it when it is
imported (:func:`check_complete`), naming the ops without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hostir.errors import EvaluationError
from hostir.ir.opdecl import OpDecl, declared_ops, op_decl, op_named
from hostir.run.handler_common import checked_result, checked_results

if TYPE_CHECKING:
    from hostir.run.context import RunContext

TorchCall = Callable[..., torch.Tensor]
Handler = Callable[["RunContext", Any, dict[str, Any]], list]
WriteCall = Callable[..., torch.Tensor]
"""``write(out, *ins)``: an op's result written into the existing tensor ``out`` from its
``INS`` values in order; returns ``out``."""


@dataclass(frozen=True)
class Implementation:
    """How the runtime computes one declared op."""

    decl: OpDecl
    prepare: Callable[[Any], TorchCall] | None = None
    """The torch call of an instruction of the op, taking its ``INS`` values in order."""
    into: Callable[[Any], WriteCall | None] | None = None
    """``into(instruction)``: the write of an instruction's result into its preallocated
    ``out`` in place, made once (torch's ``out=`` forms), or None where it has none for
    this instruction (then, and without ``into``, the call's result is copied there)."""
    handler: Handler | None = None
    """A handler of the evaluator's form, for an op whose call needs the run's context."""
    fresh: bool = False
    """The call's result is a new tensor, never a view of an operand."""


IMPLEMENTATIONS: dict[str, Implementation] = {}
"""Every declared op's implementation, by the op's name."""


def implements(
    *names: str,
    into: Callable[[Any], WriteCall | None] | None = None,
    handler: bool = False,
    fresh: bool = False,
) -> Callable[[Callable], Callable]:
    """Registers the decorated function as the implementation of the declared ops
    ``names``: ``prepare(instruction)`` returning the torch call on its ``INS`` values
    (with ``into(instruction)`` making the write into a preallocated ``out``, and
    ``fresh`` if the result is never a view), or with ``handler=True`` a handler
    ``(context, instruction, operands) -> list of OUTS values``. A name that no op
    declares is a TypeError, and so is a second implementation of an op (one registered
    by another function): an op has one meaning, never one replaced by import order.
    The same function registered again (its module run again) replaces its own."""

    def register(function: Callable) -> Callable:
        for name in names:
            decl = op_named(name)
            if decl is None:
                raise TypeError(f"implements({name!r}): no op {name!r} is declared")
            earlier = IMPLEMENTATIONS.get(name)
            if earlier is not None and _where(earlier) != _where_function(function):
                raise TypeError(
                    f"implements({name!r}): op {name!r} is already implemented by"
                    f" {_where(earlier)}, not {_where_function(function)}"
                )
            IMPLEMENTATIONS[name] = Implementation(
                decl=decl,
                prepare=None if handler else function,
                into=into,
                handler=function if handler else None,
                fresh=fresh,
            )
        return function

    return register


def _where_function(function: Callable) -> str:
    """``module.qualname`` of an implementation's function."""
    return f"{function.__module__}.{function.__qualname__}"


def _where(implementation: Implementation) -> str:
    """Where ``implementation``'s function is defined."""
    return _where_function(implementation.prepare or implementation.handler)


def implementation_of(instruction: Any) -> Implementation | None:
    """The implementation of ``instruction``'s declared op; None if its op is not
    declared (a communication, a loop, ...: the evaluator's own table handles it)."""
    decl = op_decl(instruction)
    if decl is None:
        return None
    found = IMPLEMENTATIONS.get(decl.name)
    if found is None or found.decl is not decl:
        raise TypeError(f"op {decl.name!r} is declared but has no implementation (implements)")
    return found


def implemented(instruction: Any) -> bool:
    """Whether ``instruction``'s op is declared and has its implementation."""
    decl = op_decl(instruction)
    found = IMPLEMENTATIONS.get(decl.name) if decl is not None else None
    return found is not None and found.decl is decl


def plain_call(instruction: Any) -> tuple[TorchCall, tuple[str, ...]] | None:
    """The torch call of a declared op's instruction that defines a fresh ``out``, and the
    operand fields it takes in order; None if its op is not declared, its ``out`` is
    preallocated, or its implementation is a handler."""
    implementation = implementation_of(instruction)
    if implementation is None or implementation.prepare is None or instruction.preallocated:
        return None
    return implementation.prepare(instruction), type(instruction).INS


def handler_for(instruction: Any, class_handler: Handler | None) -> Handler | None:
    """The handler running ``instruction``: its declared op's implementation, made for
    this instruction (its call prepared once), else ``class_handler`` (the evaluator's
    handler for its class: a communication, a loop, ``allocate``, ...)."""
    implementation = implementation_of(instruction)
    if implementation is None:
        return class_handler
    if implementation.handler is not None:
        return implementation.handler
    fields = type(instruction).INS
    if instruction.preallocated:
        if len(type(instruction).OUTS) > 1:
            raise EvaluationError(
                f"{implementation.decl.name} defines several results; it cannot write into"
                " preallocated tensors (the verifier refuses it)"
            )
        write = write_call(instruction)[0]

        def handle_into(context: RunContext, instruction: Any, operands: dict) -> list:
            result = write(operands["out"], *[operands.get(name) for name in fields])
            return [checked_result(context, instruction, result)]

        return _named(handle_into, implementation.prepare)
    call = implementation.prepare(instruction)

    if len(type(instruction).OUTS) > 1:

        def handle_several(context: RunContext, instruction: Any, operands: dict) -> list:
            results = call(*[operands.get(name) for name in fields])
            return checked_results(context, instruction, results)

        return _named(handle_several, implementation.prepare)

    def handle(context: RunContext, instruction: Any, operands: dict) -> list:
        result = call(*[operands.get(name) for name in fields])
        return [checked_result(context, instruction, result)]

    return _named(handle, implementation.prepare)


def write_call(instruction: Any) -> tuple[WriteCall, tuple[str, ...]] | None:
    """The write of a declared op's instruction into its preallocated ``out``,
    ``write(out, *ins)``, and the operand fields it takes after ``out``; None if its op is
    not declared, its ``out`` is not preallocated, or its implementation is a handler.

    The write is the implementation's in-place one (``into``) where it gives one; it
    computes the result and copies it where the op has no in-place form, and where ``out``
    and a tensor operand are views of one storage (told by the storage, so disjoint chunks
    of one buffer too): torch's ``out=`` forms refuse or misread an operand they
    overwrite, and a copy reads the operands first, as the instruction means."""
    implementation = implementation_of(instruction)
    if implementation is None or implementation.prepare is None or not instruction.preallocated:
        return None
    copy = _copy_into(implementation.prepare(instruction))
    write = implementation.into(instruction) if implementation.into is not None else None
    if write is None:
        return copy, type(instruction).INS

    def write_apart(out: torch.Tensor, *ins: Any) -> torch.Tensor:
        storage = out.untyped_storage().data_ptr()
        for value in ins:
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == storage:
                return copy(out, *ins)
        return write(out, *ins)

    return write_apart, type(instruction).INS


def _copy_into(call: TorchCall) -> WriteCall:
    """Writes ``call``'s result into ``out`` (a copy)."""

    def copy_into(out: torch.Tensor, *ins: Any) -> torch.Tensor:
        return out.copy_(call(*ins))

    return copy_into


def _named(handler: Handler, prepare: Callable) -> Handler:
    """``handler`` under its implementation's module and name: the CUDA-graph check asks
    where a handler comes from (``hostir.run.cuda_graph_checks``)."""
    handler.__module__ = prepare.__module__
    handler.__qualname__ = handler.__name__ = f"{prepare.__name__}_handler"
    return handler


def check_complete() -> None:
    """ImportError naming every declared op without an implementation."""
    missing = [d.name for d in declared_ops() if d.name not in IMPLEMENTATIONS]
    if missing:
        raise ImportError(
            f"declared ops without an implementation: {', '.join(missing)} (register one"
            " with hostir.run.implementations.implements)"
        )
