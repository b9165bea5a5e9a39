"""Reading a call's arguments into an instruction: the parser's half of ``hostir.text.syntax``.

The mirror of ``printer.print_instruction`` for calls: ``kw(positional...,
key=value...)`` with its assignment targets becomes the instruction the keyword
names in the catalog, each argument read by its field's kind. The functions
receive the parser's builder (names, scalars, meshes, errors with ``line:col``).
"""

from __future__ import annotations

from typing import Any

import lark

from hostir.ir.catalog import by_keyword
from hostir.ir.communications import Wait
from hostir.ir.fields import FieldKind, field_kinds
from hostir.ir.instructions import Allocate, Deallocate, ForLoop, Instruction
from hostir.ir.scalars import MAX_INT_DIGITS, Symbol
from hostir.ir.sharding import ReduceOp
from hostir.ir.team import Team
from hostir.ir.values import HostValue, RequestValue, StreamValue, TensorValue
from hostir.text.syntax import parse_call
from hostir.text.text_values import check_name

Builder = Any  # hostir.text.parser._Builder; typed loosely to keep the modules acyclic

STATEMENTS = {Allocate: "allocate T : type", Deallocate: "deallocate T", Wait: "wait R"}
STATEMENTS[ForLoop] = "for i in range(a, b) { ... }"
"""The statements of the language, which are not calls (how to write each)."""


def kind_of(value: Any) -> str:
    """'a tensor', 'a request', ... for error messages."""
    if isinstance(value, TensorValue):
        return "a tensor"
    if isinstance(value, RequestValue):
        return "a request"
    if isinstance(value, StreamValue):
        return "a stream"
    if isinstance(value, HostValue):
        return "a host value"
    return "a scalar"


def reduce_op(b: Builder, node: Any) -> ReduceOp:
    """A ReduceOp from its name token (or a ``name`` tree)."""
    return _enum(b, ReduceOp, node)


def parse_instruction(
    b: Builder, name: lark.Token, positional: list, keywords: dict, targets: list
) -> Instruction:
    """The instruction the call ``name(...)`` with ``targets`` reads as."""
    found = by_keyword(str(name))
    if found is None:
        raise b.fail(name, f"unknown instruction {name}")
    declaration, fixed = found
    if declaration.cls in STATEMENTS:
        form = STATEMENTS[declaration.cls]
        raise b.fail(name, f"{name} is a statement, not a call: write {form}")
    return parse_call(
        declaration.cls,
        fixed,
        lambda kind, enum_class, node: _READERS[kind](b, node, enum_class),
        name,
        positional,
        keywords,
        targets,
        lambda call, outs, given, preallocated: _results(
            b, declaration.cls, call, outs, given, keywords, preallocated
        ),
        b.fail,
    )


def _results(
    b: Builder,
    cls: type,
    name: lark.Token,
    outs: list[str],
    targets: list,
    keywords: dict,
    preallocated: bool,
) -> dict[str, Any]:
    """The values the call defines, from its targets in ``OUTS`` order (``out`` from
    ``out=`` when preallocated)."""
    kinds = field_kinds(cls)
    values: dict[str, Any] = {}
    if preallocated:
        written = [field for field in outs if kinds[field][0] is FieldKind.TENSOR]
        node = keywords["out"]
        nodes = [node] if len(written) == 1 else _written_list(b, name, node, written)
        for field, given in zip(written, nodes, strict=True):
            values[field] = b.tensor(given)
        values["preallocated"] = True
        outs = [field for field in outs if field not in written]
    if len(targets) != len(outs):
        raise b.fail(name, f"{name} defines {len(outs)} value(s) here, got {len(targets)}")
    for field, target in zip(outs, targets, strict=True):
        kind = kinds[field][0]
        if kind is FieldKind.TENSOR:
            if getattr(target, "data", None) != "tensor_declaration":
                raise b.fail(target, f"{name}: declare its output like T1 : float32[4] @M0")
            values[field] = b.declaration(target)
            b.define(target.children[0], values[field])
            continue
        if getattr(target, "data", None) != "plain_target":
            raise b.fail(target, f"{name}: name its {field} with a plain name, like R0")
        token = target.children[0]
        if kind is FieldKind.SCALAR:  # a symbol the instruction binds (a run-time extent)
            check_name(token, "a symbol")
        values[field] = _DEFINED[kind](name=str(token))
        b.define(token, values[field])
    return values


_DEFINED = {
    FieldKind.REQUEST: RequestValue,
    FieldKind.STREAM: StreamValue,
    FieldKind.HOST: HostValue,
    FieldKind.SCALAR: Symbol,
}
"""The value a plain target names, by the kind of the field it defines."""


def _written_list(b: Builder, name: lark.Token, node: Any, written: list[str]) -> list:
    """The tensors ``out=[T5, T6]`` names, one per tensor result in ``written``."""
    if not (isinstance(node, lark.Tree) and node.data == "list"):
        raise b.fail(node, f"{name} has {len(written)} results: write out=[{', '.join(written)}]")
    items = [child for child in node.children if child is not None]
    if len(items) != len(written):
        raise b.fail(node, f"{name} writes {len(written)} tensors, got {len(items)}")
    return items


# ----- reading one value --------------------------------------------------------------


def _name_token(b: Builder, node: Any, what: str) -> lark.Token:
    if isinstance(node, lark.Tree) and node.data == "name":
        return node.children[0]
    raise b.fail(node, f"expected {what}")


def integer(b: Builder, token: lark.Token) -> int:
    """The int an INT token writes; a ParseError past ``MAX_INT_DIGITS`` digits (Python's
    limit for reading an int from text)."""
    if len(token) > MAX_INT_DIGITS:
        raise b.fail(token, f"an int has at most {MAX_INT_DIGITS} digits, got {len(token)}")
    return int(token)


def _int(b: Builder, node: Any, enum_class: Any = None) -> int:
    if isinstance(node, lark.Tree) and node.data == "int":
        return integer(b, node.children[0])
    raise b.fail(node, "expected an integer")


def _ints(b: Builder, node: Any, enum_class: Any = None) -> tuple[int, ...]:
    if isinstance(node, lark.Tree) and node.data == "list":
        return tuple(_int(b, item) for item in node.children if item is not None)
    raise b.fail(node, "expected a list of integers like [0, 1]")


def _bool(b: Builder, node: Any, enum_class: Any = None) -> bool:
    token = _name_token(b, node, "true or false")
    if str(token) not in ("true", "false"):
        raise b.fail(token, f"expected true or false, got {token}")
    return str(token) == "true"


def _team(b: Builder, node: Any, enum_class: Any = None) -> Team:
    if not (isinstance(node, lark.Tree) and node.data == "apply"):
        raise b.fail(node, "expected a team like M0(x) or M0(y, x)")
    mesh_token, *axes = node.children
    mesh = b.mesh(mesh_token)
    return Team(mesh=mesh, axes=tuple(b.mesh_axis(a, mesh) for a in axes if a is not None))


def _operand(b: Builder, node: Any, enum_class: Any = None) -> Any:
    """A tensor if ``node`` names one, else a scalar expression."""
    if isinstance(node, lark.Tree) and node.data == "name":
        value = b.values.get(str(node.children[0]))
        if isinstance(value, TensorValue):
            return value
    return b.scalar(node)


def _stream(b: Builder, node: Any, enum_class: Any = None) -> StreamValue:
    if isinstance(node, lark.Tree) and node.data == "apply" and str(node.children[0]) == "stream":
        return StreamValue(index=b.scalar(node.children[1]))
    token = _name_token(b, node, "a stream: a name or stream(i)")
    value = b.lookup(token)
    if not isinstance(value, StreamValue):
        raise b.fail(token, f"{token} is {kind_of(value)}, expected a stream")
    return value


def _host(b: Builder, node: Any, enum_class: Any = None) -> HostValue:
    token = _name_token(b, node, "a host value (defined by to_host)")
    value = b.lookup(token)
    if not isinstance(value, HostValue):
        raise b.fail(token, f"{token} is {kind_of(value)}, expected a host value (to_host)")
    return value


def _enum(b: Builder, enum_class: Any, node: Any) -> Any:
    token = node.children[0] if isinstance(node, lark.Tree) else node
    try:
        return enum_class(str(token))
    except ValueError:
        known = ", ".join(member.value for member in enum_class)
        what = "reduction" if enum_class is ReduceOp else enum_class.__name__
        raise b.fail(token, f"unknown {what} {token}; expected one of {known}") from None


def _unreadable(b: Builder, node: Any, enum_class: Any = None) -> Any:
    raise b.fail(node, "this argument cannot be written in text")


_READERS = {
    FieldKind.TENSOR: lambda b, node, _: b.tensor(node),
    FieldKind.OPERAND: _operand,
    FieldKind.SCALAR: lambda b, node, _: b.scalar(node),
    FieldKind.INT: _int,
    FieldKind.BOOL: _bool,
    FieldKind.INTS: _ints,
    FieldKind.TEAM: _team,
    FieldKind.STREAM: _stream,
    FieldKind.ENUM: lambda b, node, enum_class: _enum(b, enum_class, node),
    FieldKind.REQUEST: _unreadable,
    FieldKind.HOST: _host,
    FieldKind.OTHER: _unreadable,
}
"""How each kind of field is read from an argument."""
