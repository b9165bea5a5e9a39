"""``parse``: host IR text back to a ``HostIrContainer``.

The lark grammar (``hostir.lark``) gives the shape of each line; this module
gives it meaning, mirroring ``hostir/printer.py``: ``parse_statement`` per
line, ``parse_instruction`` per call through a table keyed by the keyword.
Every error is a :class:`ParseError` with the ``line:col`` of the offending
token. ``print(parse(text)) == text`` for printed programs, and
``parse(str(p)) == p``.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import lark

from hostir.communications import Wait
from hostir.container import HostIrContainer, ScalarInput
from hostir.dtypes import DType
from hostir.errors import ParseError, VerifyError
from hostir.instruction_parsers import kind_of, parse_instruction, reduce_op
from hostir.instructions import Allocate, Deallocate, ForLoop, Instruction
from hostir.mesh import Mesh, MeshAxis
from hostir.scalars import RANK, BinaryExpr, Const, MeshCoordinate, Scalar, ScalarOp, Symbol
from hostir.sharding import PartialAxis, Sharding, ShardPart
from hostir.values import RequestValue, TensorValue
from hostir.verify import verify

_GRAMMAR = lark.Lark(
    resources.files("hostir").joinpath("hostir.lark").read_text(),
    parser="lalr",
    propagate_positions=True,
    maybe_placeholders=True,
)

_SCALAR_OPS = {
    "add": ScalarOp.ADD,
    "sub": ScalarOp.SUB,
    "mul": ScalarOp.MUL,
    "floordiv": ScalarOp.FLOORDIV,
    "mod": ScalarOp.MOD,
}


def parse(text: str, *, verify_program: bool = True) -> HostIrContainer:
    """The program ``text`` describes, verified (``hostir.verify``); raises ParseError with
    ``line:col`` for text that does not parse, VerifyError with ``line:col`` (of the
    offending instruction) for a program that is not well formed. ``verify_program=False``
    reads text that need not be well formed (for tools that inspect it)."""
    try:
        tree = _GRAMMAR.parse(text)
    except lark.UnexpectedInput as error:
        raise _syntax_error(error, text) from None
    builder = _Builder()
    program = builder.program(tree)
    if not verify_program:
        return program
    try:
        verify(program)
    except VerifyError as error:
        line, col = builder.positions.get(error.path, builder.end) if error.path else builder.end
        raise VerifyError(error.message, path=error.path, line=line, col=col) from None
    return program


def _syntax_error(error: lark.UnexpectedInput, text: str) -> ParseError:
    line, col = error.line, error.column
    if isinstance(error, lark.UnexpectedToken):
        found = repr(error.token.value) if error.token.type != "$END" else "end of the text"
        expected = ", ".join(sorted(error.expected)[:6])
        return ParseError(f"unexpected {found}; expected one of {expected}", line, col)
    if isinstance(error, lark.UnexpectedCharacters):
        return ParseError(f"unexpected character {text[error.pos_in_stream]!r}", line, col)
    return ParseError("unexpected end of the text", line, col)


def _where(node: Any) -> tuple[int, int]:
    if isinstance(node, lark.Token):
        return node.line or 1, node.column or 1
    meta = getattr(node, "meta", None)
    if meta is not None and not meta.empty:
        return meta.line, meta.column
    return 1, 1


def _fail(node: Any, message: str) -> ParseError:
    return ParseError(message, *_where(node))


class _Builder:
    """Turns a parse tree into a program, checking names and kinds as it goes."""

    def __init__(self) -> None:
        self.meshes: dict[str, Mesh] = {}
        self.values: dict[str, Any] = {}  # name -> tensor, request, stream or scalar input
        self.extents: set[str] = set()
        self.loop_indices: list[str] = []
        self.inputs: list[TensorValue | ScalarInput] = []
        self.outputs: list[TensorValue] = []
        self.positions: dict[tuple[int, ...], tuple[int, int]] = {}  # instruction path -> line, col
        self.path: tuple[int, ...] = ()  # of the statement being read
        self.end = (1, 1)  # where the outputs are declared (for problems with them)

    # ----- program and statements -----
    def program(self, tree: lark.Tree) -> HostIrContainer:
        _, statements = tree.children
        body = self.statements(statements)
        return HostIrContainer(
            inputs=tuple(self.inputs), outputs=tuple(self.outputs), body=tuple(body)
        )

    def statements(self, tree: lark.Tree) -> list[Instruction]:
        body = []
        prefix = self.path
        for statement in tree.children:
            self.path = (*prefix, len(body))
            instruction = self.statement(statement)
            if instruction is not None:
                self.positions[self.path] = _where(statement)
                body.append(instruction)
        self.path = prefix
        return body

    def statement(self, tree: lark.Tree) -> Instruction | None:
        handler = getattr(self, f"stmt_{tree.data}")
        return handler(tree)

    def stmt_mesh_decl(self, tree: lark.Tree) -> None:
        name, nested, strides, offset = tree.children
        if name in self.meshes:
            raise _fail(name, f"mesh {name} is declared twice")
        try:
            self.meshes[str(name)] = _mesh(nested, strides, offset)
        except ParseError:
            raise
        except Exception as error:  # noqa: BLE001 - MeshError and shape errors alike
            raise _fail(name, f"mesh {name}: {error}") from None

    def stmt_input_decl(self, tree: lark.Tree) -> None:
        value = self.declaration(tree.children[0])
        self.define(tree.children[0].children[0], value)
        self.inputs.append(value)

    def stmt_output_decl(self, tree: lark.Tree) -> None:
        (name,) = tree.children
        if not self.outputs:
            self.end = _where(tree)
        self.outputs.append(self.tensor(name))

    def stmt_allocate(self, tree: lark.Tree) -> Instruction:
        value = self.declaration(tree.children[0])
        self.define(tree.children[0].children[0], value)
        return Allocate(out=value)

    def stmt_deallocate(self, tree: lark.Tree) -> Instruction:
        return Deallocate(tensor=self.tensor(tree.children[0]))

    def stmt_wait(self, tree: lark.Tree) -> Instruction:
        (name,) = tree.children
        value = self.lookup(name)
        if not isinstance(value, RequestValue):
            raise _fail(
                name, f"wait {name}: {name} is {kind_of(value)}, not a communication request"
            )
        return Wait(request=value)

    def stmt_for_loop(self, tree: lark.Tree) -> Instruction:
        name, start, stop, body = tree.children
        if str(name) in self.loop_indices:
            raise _fail(name, f"loop index {name} is already used by an enclosing loop")
        start_value, stop_value = self.scalar(start), self.scalar(stop)
        self.loop_indices.append(str(name))
        inner = self.statements(body)
        self.loop_indices.pop()
        return ForLoop(
            index=Symbol(name=str(name)), start=start_value, stop=stop_value, body=tuple(inner)
        )

    def stmt_call(self, tree: lark.Tree) -> Instruction:
        return self.instruction(tree, [])

    def stmt_assignment(self, tree: lark.Tree) -> Instruction:
        *targets, call = tree.children
        return self.instruction(call, targets)

    def fail(self, node: Any, message: str) -> ParseError:
        """A ParseError at ``node``'s position."""
        return _fail(node, message)

    # ----- names -----
    def define(self, token: lark.Token, value: Any) -> None:
        if str(token) in self.values:
            raise _fail(token, f"{token} is defined twice")
        self.values[str(token)] = value

    def lookup(self, token: lark.Token) -> Any:
        if str(token) not in self.values:
            raise _fail(token, f"{token} is not defined")
        return self.values[str(token)]

    def tensor(self, node: Any) -> TensorValue:
        if not (isinstance(node, lark.Token) or getattr(node, "data", None) == "name"):
            raise _fail(node, "expected a tensor name")
        token = node if isinstance(node, lark.Token) else node.children[0]
        value = self.lookup(token)
        if not isinstance(value, TensorValue):
            raise _fail(token, f"{token} is {kind_of(value)}, expected a tensor")
        return value

    # ----- types -----
    def declaration(self, tree: lark.Tree) -> TensorValue | ScalarInput:
        if tree.data == "scalar_declaration":
            name, dtype = tree.children
            return ScalarInput(name=str(name), dtype=_dtype(dtype))
        name, tensor_type = tree.children
        dtype_token, shape_tree, sharding_tree = tensor_type.children
        extents = [e for e in shape_tree.children if e is not None]
        shape = tuple(self.scalar(e, extent=True) for e in extents)
        sharding = self.sharding(sharding_tree, shape) if sharding_tree is not None else None
        return TensorValue(
            name=str(name), dtype=_dtype(dtype_token), shape=shape, sharding=sharding
        )

    def sharding(self, tree: lark.Tree, shape: tuple[Scalar, ...]) -> Sharding:
        mesh_name, dims_tree, partial_tree = tree.children
        mesh = self.mesh(mesh_name)
        dims = [(ShardPart(axis=None, extent=extent),) for extent in shape]
        for dim_tree in dims_tree.children if dims_tree is not None else []:
            index, *parts = dim_tree.children
            if int(index) >= len(shape):
                raise _fail(index, f"dim {index} is out of range for a {len(shape)}-d tensor")
            dims[int(index)] = tuple(self.part(part, mesh) for part in parts)
        partial = []
        for axis_tree in partial_tree.children if partial_tree is not None else []:
            axis, op = axis_tree.children
            partial.append(PartialAxis(axis=self.mesh_axis(axis, mesh), op=reduce_op(self, op)))
        return Sharding(mesh=mesh, dims=tuple(dims), partial=tuple(partial))

    def part(self, node: Any, mesh: Mesh) -> ShardPart:
        if getattr(node, "data", None) == "name" and str(node.children[0]) in ("x", "y", "z"):
            return ShardPart(
                axis=self.mesh_axis(node.children[0], mesh),
                extent=Const(value=mesh.axis_size(MeshAxis(str(node.children[0])))),
            )
        return ShardPart(axis=None, extent=self.scalar(node, extent=True))

    def mesh(self, token: lark.Token) -> Mesh:
        if str(token) not in self.meshes:
            raise _fail(token, f"mesh {token} is not declared")
        return self.meshes[str(token)]

    def mesh_axis(self, token: Any, mesh: Mesh) -> MeshAxis:
        token = token.children[0] if isinstance(token, lark.Tree) else token
        try:
            axis = MeshAxis(str(token))
            axis.dim(mesh.ndim)
        except Exception:  # noqa: BLE001 - unknown name or an axis the mesh lacks
            raise _fail(token, f"{token} is not an axis of mesh {mesh}") from None
        return axis

    # ----- scalars -----
    def scalar(self, node: Any, extent: bool = False) -> Scalar:
        kind = node.data if isinstance(node, lark.Tree) else None
        if kind == "int":
            return Const(value=int(node.children[0]))
        if kind == "float":
            return Const(value=float(node.children[0]))
        if kind == "negative":
            inner = self.scalar(node.children[0], extent)
            if not isinstance(inner, Const):
                raise _fail(node, "unary minus applies to numbers only")
            return Const(value=-inner.value)
        if kind == "name":
            return self.symbol(node.children[0], extent)
        if kind in _SCALAR_OPS:
            lhs, rhs = node.children
            return BinaryExpr(
                op=_SCALAR_OPS[kind], lhs=self.scalar(lhs, extent), rhs=self.scalar(rhs, extent)
            )
        if kind == "apply" and str(node.children[0]) == "coord":
            _, mesh_node, axis_node = node.children
            mesh = self.mesh(mesh_node.children[0])
            return MeshCoordinate(mesh=mesh, axis=self.mesh_axis(axis_node, mesh))
        raise _fail(node, "expected a scalar expression")

    def symbol(self, token: lark.Token, extent: bool) -> Scalar:
        name = str(token)
        if name in ("true", "false"):
            return Const(value=name == "true")
        known = name in self.loop_indices or name in self.extents or name == RANK
        value = self.values.get(name)
        if isinstance(value, ScalarInput):
            known = True
        if extent and not known and name not in self.values:
            self.extents.add(name)  # a symbolic extent, bound from the inputs at run time
            known = True
        if not known:
            raise _fail(token, f"scalar {name} is not defined here")
        return Symbol(name=name)

    # ----- instructions -----
    def instruction(self, call: lark.Tree, targets: list) -> Instruction:
        name, *arguments = call.children
        arguments = [a for a in arguments if a is not None]
        positional = [a.children[0] for a in arguments if a.data == "positional"]
        keywords = {str(a.children[0]): a.children[1] for a in arguments if a.data == "keyword"}
        return parse_instruction(self, name, positional, keywords, targets)


def _mesh(nested: lark.Tree, strides: lark.Tree | None, offset: lark.Token | None) -> Mesh:
    """``[2, 4] : [4, 1] + 8`` (a layout: shape, strides, offset) or ``[[0, 1], [3, 2]]``
    (the devices themselves)."""
    if strides is None:
        devices, shape = _nested(nested)
        return Mesh(devices=tuple(devices), shape=tuple(shape))
    shape, shape_dims = _nested(nested)
    stride_values, stride_dims = _nested(strides)
    if len(shape_dims) != 1 or len(stride_dims) != 1:
        raise _fail(nested, "a mesh layout is a flat list of sizes : a flat list of strides")
    return Mesh(shape=tuple(shape), strides=tuple(stride_values), offset=int(offset or 0))


def _nested(tree: lark.Tree) -> tuple[list[int], list[int]]:
    items = [c for c in tree.children if c is not None]
    if all(getattr(c, "data", None) == "device" for c in items):
        return [int(c.children[0]) for c in items], [len(items)]
    rows = [_nested(c) for c in items]
    if (
        any(getattr(c, "data", None) != "nested" for c in items)
        or len({tuple(shape) for _, shape in rows}) != 1
    ):
        raise _fail(tree, "a mesh is a list of devices or of equally shaped lists")
    return [d for devices, _ in rows for d in devices], [len(rows), *rows[0][1]]


def _dtype(token: lark.Token) -> DType:
    try:
        return DType(str(token))
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise _fail(token, f"unknown dtype {token}; expected one of {known}") from None
