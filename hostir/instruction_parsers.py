"""One parser per instruction keyword: call arguments to an instruction.

The mirror of ``printer.print_instruction``: a call ``kw(positional..., key=value...)``
with its assignment targets becomes the instruction of keyword ``kw``. Each
function receives the parser's builder (names, scalars, meshes, errors with
``line:col``), the keyword token, the positional and keyword argument trees,
and the targets on the left of ``=``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lark

from hostir.communications import COLLECTIVES, LocalShard
from hostir.instructions import (
    Binary,
    BinaryOpKind,
    BroadcastInDim,
    Cast,
    Instruction,
    Linear,
    Matmul,
    Permute,
    Set,
    ShardByStream,
    Sum,
    Unary,
    UnaryOpKind,
)
from hostir.mesh import MeshAxis
from hostir.sharding import ReduceOp
from hostir.streams import GetCurrentStream, SetCurrentStream, Synchronize
from hostir.team import Team
from hostir.values import RequestValue, StreamValue, TensorValue

Builder = Any  # hostir.parser._Builder; typed loosely to keep the modules acyclic


def kind_of(value: Any) -> str:
    """'a tensor', 'a request', ... for error messages."""
    if isinstance(value, TensorValue):
        return "a tensor"
    if isinstance(value, RequestValue):
        return "a request"
    if isinstance(value, StreamValue):
        return "a stream"
    return "a scalar"


def reduce_op(b: Builder, node: Any) -> ReduceOp:
    """A ReduceOp from its name token (or a ``name`` tree)."""
    token = node.children[0] if isinstance(node, lark.Tree) else node
    try:
        return ReduceOp(str(token))
    except ValueError:
        known = ", ".join(op.value for op in ReduceOp)
        raise b.fail(token, f"unknown reduction {token}; expected one of {known}") from None


def _name_token(b: Builder, node: Any, what: str) -> lark.Token:
    if isinstance(node, lark.Tree) and node.data == "name":
        return node.children[0]
    raise b.fail(node, f"expected {what}")


def _int(b: Builder, node: Any) -> int:
    if isinstance(node, lark.Tree) and node.data == "int":
        return int(node.children[0])
    raise b.fail(node, "expected an integer")


def _ints(b: Builder, node: Any) -> tuple[int, ...]:
    if isinstance(node, lark.Tree) and node.data == "list":
        return tuple(_int(b, item) for item in node.children if item is not None)
    raise b.fail(node, "expected a list of integers like [0, 1]")


def _bool(b: Builder, node: Any) -> bool:
    token = _name_token(b, node, "true or false")
    if str(token) not in ("true", "false"):
        raise b.fail(token, f"expected true or false, got {token}")
    return str(token) == "true"


def _team(b: Builder, node: Any) -> Team:
    if not (isinstance(node, lark.Tree) and node.data == "apply"):
        raise b.fail(node, "expected a team like M0(x) or M0(y, x)")
    mesh_token, *axes = node.children
    mesh = b.mesh(mesh_token)
    return Team(mesh=mesh, axes=tuple(b.mesh_axis(a, mesh) for a in axes if a is not None))


def _operand(b: Builder, node: Any) -> Any:
    """A tensor if ``node`` names one, else a scalar expression."""
    if isinstance(node, lark.Tree) and node.data == "name":
        value = b.values.get(str(node.children[0]))
        if isinstance(value, TensorValue):
            return value
    return b.scalar(node)


_FIELD_PARSERS: dict[str, Callable[[Builder, Any], Any]] = {
    "src": lambda b, n: b.tensor(n),
    "input": lambda b, n: b.tensor(n),
    "weight": lambda b, n: b.tensor(n),
    "bias": lambda b, n: b.tensor(n),
    "lhs": _operand,
    "rhs": _operand,
    "dims": _ints,
    "broadcast_dims": _ints,
    "keepdim": _bool,
    "axis": _int,
    "split_axis": _int,
    "concat_axis": _int,
    "index": lambda b, n: b.scalar(n),
    "inner": lambda b, n: b.scalar(n),
    "root": lambda b, n: b.scalar(n),
    "sender": lambda b, n: b.scalar(n),
    "receiver": lambda b, n: b.scalar(n),
    "send_peer": lambda b, n: b.scalar(n),
    "recv_peer": lambda b, n: b.scalar(n),
    "team": _team,
    "op": reduce_op,
    "mesh_axis": lambda b, n: MeshAxis(str(_name_token(b, n, "a mesh axis x, y or z"))),
}
"""How each instruction field is read from an argument."""


def _fields(
    b: Builder, name: lark.Token, cls: type, positional: list, keywords: dict, order: tuple
) -> dict[str, Any]:
    """Field values from positional arguments (in ``order``) and ``key=value`` ones."""
    if len(positional) != len(order):
        raise b.fail(
            name,
            f"{name} takes {len(order)} positional operand(s) ({', '.join(order)}),"
            f" got {len(positional)}",
        )
    fields = {f: _FIELD_PARSERS[f](b, node) for f, node in zip(order, positional, strict=True)}
    allowed = set(cls.__dataclass_fields__) - {"out", "request", "preallocated", "op"} - set(order)
    if cls in (Unary, Binary):
        allowed -= {"op"}
    elif "op" in cls.__dataclass_fields__:
        allowed.add("op")
    for key, node in keywords.items():
        if key == "out":
            continue
        if key not in allowed:
            raise b.fail(node, f"{name} has no argument {key}; it takes {sorted(allowed)}")
        fields[key] = _FIELD_PARSERS[key](b, node)
    return fields


def _outputs(
    b: Builder, name: lark.Token, keywords: dict, targets: list, request: bool
) -> dict[str, Any]:
    """``out`` (declared on the left, or ``out=`` an existing tensor) and the request."""
    fields: dict[str, Any] = {}
    expected = (0 if "out" in keywords else 1) + (1 if request else 0)
    if len(targets) != expected:
        raise b.fail(name, f"{name} defines {expected} value(s) here, got {len(targets)}")
    if "out" in keywords:
        fields["out"], fields["preallocated"] = b.tensor(keywords["out"]), True
    else:
        declaration = targets[0]
        if getattr(declaration, "data", None) != "tensor_declaration":
            raise b.fail(declaration, f"{name}: declare its output like T1 : float32[4] @M0")
        fields["out"] = b.declaration(declaration)
        b.define(declaration.children[0], fields["out"])
    if request:
        token = targets[-1]
        if getattr(token, "data", None) != "plain_target":
            raise b.fail(token, f"{name}: name its request after the output, like R0")
        fields["request"] = RequestValue(name=str(token.children[0]))
        b.define(token.children[0], fields["request"])
    return fields


def _compute(cls: type, order: tuple, **fixed: Any) -> Callable[..., Instruction]:
    def parse(b: Builder, name: lark.Token, positional: list, keywords: dict, targets: list):
        fields = _fields(b, name, cls, positional, keywords, order)
        return cls(**fixed, **fields, **_outputs(b, name, keywords, targets, request=False))

    return parse


def _communication(cls: type) -> Callable[..., Instruction]:
    def parse(b: Builder, name: lark.Token, positional: list, keywords: dict, targets: list):
        fields = _fields(b, name, cls, positional, keywords, ("src",))
        return cls(**fields, **_outputs(b, name, keywords, targets, request=True))

    return parse


def _stream_argument(b: Builder, node: Any) -> StreamValue:
    if isinstance(node, lark.Tree) and node.data == "apply" and str(node.children[0]) == "stream":
        return StreamValue(index=b.scalar(node.children[1]))
    token = _name_token(b, node, "a stream: a name or stream(i)")
    value = b.lookup(token)
    if not isinstance(value, StreamValue):
        raise b.fail(token, f"{token} is {kind_of(value)}, expected a stream")
    return value


def _get_current_stream(b: Builder, name, positional, keywords, targets) -> Instruction:
    if positional or keywords or len(targets) != 1 or targets[0].data != "plain_target":
        raise b.fail(name, "write it as: main = get_current_stream()")
    stream = StreamValue(name=str(targets[0].children[0]))
    b.define(targets[0].children[0], stream)
    return GetCurrentStream(out=stream)


def _stream_use(cls: type) -> Callable[..., Instruction]:
    def parse(b: Builder, name: lark.Token, positional: list, keywords: dict, targets: list):
        if len(positional) != 1 or keywords or targets:
            raise b.fail(name, f"write it as: {name}(main) or {name}(stream(i))")
        return cls(stream=_stream_argument(b, positional[0]))

    return parse


INSTRUCTION_PARSERS: dict[str, Callable[..., Instruction]] = {
    "set": _compute(Set, ("src",)),
    **{op.value: _compute(Unary, ("src",), op=op) for op in UnaryOpKind},
    **{op.value: _compute(Binary, ("lhs", "rhs"), op=op) for op in BinaryOpKind},
    "cast": _compute(Cast, ("src",)),
    "sum": _compute(Sum, ("src",)),
    "linear": _compute(Linear, ("input", "weight")),
    "matmul": _compute(Matmul, ("lhs", "rhs")),
    "broadcast_in_dim": _compute(BroadcastInDim, ("src",)),
    "permute": _compute(Permute, ("src",)),
    "shard_by_stream": _compute(ShardByStream, ("src",)),
    "local_shard": _compute(LocalShard, ("src",)),
    "get_current_stream": _get_current_stream,
    "set_current_stream": _stream_use(SetCurrentStream),
    "synchronize": _stream_use(Synchronize),
}
"""The parser of every call keyword (statements like ``wait`` are parsed in parser.py)."""

INSTRUCTION_PARSERS.update({cls.__name__: _communication(cls) for cls in COLLECTIVES})
