"""``parse``: host IR text back to a ``HostIrContainer``.

The lark grammar (``hostir.lark``) gives the shape of each line; this module
gives it meaning, mirroring ``hostir/text/printer.py``: ``parse_statement`` per
line, ``parse_instruction`` per call through a table keyed by the keyword.
Every error is a :class:`ParseError` with the ``line:col`` of the offending
token. ``print(parse(text)) == text`` for printed programs, and
``parse(str(p)) == p``.

What the text may hold is bounded, so that no input meets Python's recursion
limit: loops nest at most ``MAX_LOOP_DEPTH`` (32) deep and a scalar expression at
most ``MAX_SCALAR_DEPTH`` (100) operators deep (``hostir.check.verify``,
``hostir.ir.scalars``), an int has at most ``MAX_INT_DIGITS`` (4300) digits and a
float is finite unless written ``inf`` or ``nan``; an extent is a whole number
>= 0. Text past a limit is refused by name at its ``line:col``.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import lark

from hostir.check.collector import collector_paused
from hostir.check.verify import MAX_LOOP_DEPTH, verify
from hostir.errors import ParseError, VerifyError
from hostir.ir.communications import Wait
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import DType
from hostir.ir.extents import extent_problem
from hostir.ir.instructions import Allocate, Deallocate, ForLoop, Instruction
from hostir.ir.mesh import Mesh, MeshAxis
from hostir.ir.requirements import Requirement, input_symbol_types, requirement_problem
from hostir.ir.scalars import (
    MAX_SCALAR_DEPTH,
    RANK,
    RESERVED,
    BinaryExpr,
    Const,
    MeshCoordinate,
    Scalar,
    ScalarOp,
    Symbol,
    leaves,
)
from hostir.ir.sharding import PartialAxis, Sharding, ShardPart
from hostir.ir.values import RequestValue, TensorValue
from hostir.text.instruction_parsers import integer, kind_of, parse_instruction, reduce_op
from hostir.text.line_reader import read_tree
from hostir.text.text_values import (
    CONSTANTS,
    check_name,
    fail,
    read_dtype,
    read_float,
    read_mesh,
    where,
)

_GRAMMAR = lark.Lark(
    resources.files("hostir.text").joinpath("hostir.lark").read_text(),
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
    """The program ``text`` describes, verified (``hostir.check.verify``); raises ParseError with
    ``line:col`` for text that does not parse, VerifyError with ``line:col`` (of the
    offending instruction) for a program that is not well formed. ``verify_program=False``
    reads text that need not be well formed (for tools that inspect it)."""
    if not isinstance(text, str):
        raise ParseError(
            f"expected host IR text (a str), got {type(text).__name__}"
            + ("; decode bytes first" if isinstance(text, bytes | bytearray) else ""),
            1,
            1,
        )
    with collector_paused():
        builder, program = _build(text)
    if not verify_program:
        return program
    try:
        verify(program)
    except VerifyError as error:
        line, col = builder.position_of(error)
        raise VerifyError(
            error.message, path=error.path, field=error.field, line=line, col=col
        ) from None
    return program


def _build(text: str) -> tuple[_Builder, HostIrContainer]:
    """The program of ``text`` and the builder that read it (with its positions). The fast
    line reader reads most text; where it is unsure, or the builder refuses what it read,
    lark reads the text again, so every answer, and every error's ``line:col``, is the
    one lark's tree gives."""
    tree = read_tree(text)
    if tree is not None:
        builder = _Builder()
        try:
            return builder, builder.program(tree)
        except ParseError:
            pass  # lark's tree carries every position the message needs
    try:
        tree = _GRAMMAR.parse(text)
    except lark.UnexpectedInput as error:
        raise _syntax_error(error, text) from None
    builder = _Builder()
    return builder, builder.program(tree)


def _syntax_error(error: lark.UnexpectedInput, text: str) -> ParseError:
    line, col = error.line, error.column
    if isinstance(error, lark.UnexpectedToken):
        found = repr(error.token.value) if error.token.type != "$END" else "end of the text"
        expected = ", ".join(sorted(error.expected)[:6])
        return ParseError(f"unexpected {found}; expected one of {expected}", line, col)
    if isinstance(error, lark.UnexpectedCharacters):
        return ParseError(f"unexpected character {text[error.pos_in_stream]!r}", line, col)
    return ParseError("unexpected end of the text", line, col)


class _Builder:
    """Turns a parse tree into a program, checking names and kinds as it goes."""

    def __init__(self) -> None:
        self.meshes: dict[str, Mesh] = {}
        self.values: dict[str, Any] = {}  # name -> tensor, request, stream or scalar input
        self.extents: set[str] = set()
        self.loop_indices: list[str] = []
        self.inputs: list[TensorValue | ScalarInput] = []
        self.outputs: list[TensorValue] = []
        self.requires: list[Requirement] = []
        self.positions: dict[tuple[int, ...], tuple[int, int]] = {}  # instruction path -> line, col
        self.path: tuple[int, ...] = ()  # of the statement being read
        # ("inputs", k) or ("outputs", k) -> line, col of that declaration
        self.declarations: dict[tuple[str, int], tuple[int, int]] = {}
        self.end = (1, 1)  # where the outputs are declared (for problems with no place)

    def position_of(self, error: VerifyError) -> tuple[int, int]:
        """The ``line, col`` of the statement a verifier error points at: its instruction,
        its input or output declaration, else the outputs."""
        if error.field is not None:
            return self.declarations.get(error.field, self.end)
        return self.positions.get(error.path, self.end) if error.path else self.end

    # ----- program and statements -----
    def program(self, tree: lark.Tree) -> HostIrContainer:
        _, statements = tree.children
        body = self.statements(statements)
        return HostIrContainer(
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            body=tuple(body),
            requires=tuple(self.requires),
        )

    def statements(self, tree: lark.Tree) -> list[Instruction]:
        body = []
        prefix = self.path
        for statement in tree.children:
            self.path = (*prefix, len(body))
            instruction = self.statement(statement)
            if instruction is not None:
                self.positions[self.path] = where(statement)
                body.append(instruction)
        self.path = prefix
        return body

    def statement(self, tree: lark.Tree) -> Instruction | None:
        handler = getattr(self, f"stmt_{tree.data}")
        return handler(tree)

    def stmt_mesh_decl(self, tree: lark.Tree) -> None:
        name, nested, strides, offset = tree.children
        if name in self.meshes:
            raise fail(name, f"mesh {name} is declared twice")
        try:
            self.meshes[str(name)] = read_mesh(nested, strides, offset)
        except ParseError:
            raise
        except Exception as error:  # noqa: BLE001 - MeshError and shape errors alike
            raise fail(name, f"mesh {name}: {error}") from None

    def stmt_input_decl(self, tree: lark.Tree) -> None:
        value = self.declaration(tree.children[0])
        self.define(tree.children[0].children[0], value)
        self.declarations["inputs", len(self.inputs)] = where(tree)
        self.inputs.append(value)

    def stmt_require_decl(self, tree: lark.Tree) -> None:
        low, high, message = tree.children
        if self.loop_indices:
            raise fail(tree, "require belongs at the top of the program, not in a loop body")
        requirement = Requirement(
            low=self.scalar(low), high=self.scalar(high), message=str(message)[1:-1]
        )
        problem = requirement_problem(requirement, input_symbol_types(self.inputs))
        if problem is not None:
            raise fail(tree, problem)
        self.requires.append(requirement)

    def stmt_output_decl(self, tree: lark.Tree) -> None:
        (name,) = tree.children
        if not self.outputs:
            self.end = where(tree)
        self.declarations["outputs", len(self.outputs)] = where(tree)
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
            raise fail(
                name, f"wait {name}: {name} is {kind_of(value)}, not a communication request"
            )
        return Wait(request=value)

    def stmt_for_loop(self, tree: lark.Tree) -> Instruction:
        name, start, stop, body = tree.children
        if str(name) in self.loop_indices:
            raise fail(name, f"loop index {name} is already used by an enclosing loop")
        if len(self.loop_indices) >= MAX_LOOP_DEPTH:
            raise fail(name, f"loops nest deeper than {MAX_LOOP_DEPTH}")
        check_name(name, "a loop index")
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
        return fail(node, message)

    # ----- names -----
    def define(self, token: lark.Token, value: Any) -> None:
        if str(token) in self.values:
            raise fail(token, f"{token} is defined twice")
        self.values[str(token)] = value

    def lookup(self, token: lark.Token) -> Any:
        if str(token) not in self.values:
            raise fail(token, f"{token} is not defined")
        return self.values[str(token)]

    def tensor(self, node: Any) -> TensorValue:
        if not (isinstance(node, str) or getattr(node, "data", None) == "name"):
            raise fail(node, "expected a tensor name")
        token = node if isinstance(node, str) else node.children[0]
        value = self.lookup(token)
        if not isinstance(value, TensorValue):
            raise fail(token, f"{token} is {kind_of(value)}, expected a tensor")
        return value

    # ----- types -----
    def declaration(self, tree: lark.Tree) -> TensorValue | ScalarInput:
        if tree.data == "scalar_declaration":
            name, dtype = tree.children
            check_name(name, "a scalar")
            return ScalarInput(name=str(name), dtype=read_dtype(dtype))
        name, tensor_type = tree.children
        dtype_token, shape_tree, sharding_tree = tensor_type.children
        extents = [e for e in shape_tree.children if e is not None]
        shape = tuple(self.extent(e, f"{name} dim {d}") for d, e in enumerate(extents))
        sharding = self.sharding(sharding_tree, shape, name) if sharding_tree is not None else None
        return TensorValue(
            name=str(name), dtype=read_dtype(dtype_token), shape=shape, sharding=sharding
        )

    def sharding(self, tree: lark.Tree, shape: tuple[Scalar, ...], name: str) -> Sharding:
        mesh_name, dims_tree, partial_tree = tree.children
        mesh = self.mesh(mesh_name)
        dims = [(ShardPart(axis=None, extent=extent),) for extent in shape]
        for dim_tree in dims_tree.children if dims_tree is not None else []:
            index, *parts = dim_tree.children
            dim = integer(self, index)
            if dim >= len(shape):
                raise fail(index, f"dim {index} is out of range for a {len(shape)}-d tensor")
            what = f"{name} dim {dim}'s sharding"
            dims[dim] = tuple(self.part(part, mesh, what) for part in parts)
        partial = []
        for axis_tree in partial_tree.children if partial_tree is not None else []:
            axis, op = axis_tree.children
            partial.append(PartialAxis(axis=self.mesh_axis(axis, mesh), op=reduce_op(self, op)))
        return Sharding(mesh=mesh, dims=tuple(dims), partial=tuple(partial))

    def part(self, node: Any, mesh: Mesh, what: str) -> ShardPart:
        if getattr(node, "data", None) == "name" and str(node.children[0]) in ("x", "y", "z"):
            return ShardPart(
                axis=self.mesh_axis(node.children[0], mesh),
                extent=Const(value=mesh.axis_size(MeshAxis(str(node.children[0])))),
            )
        return ShardPart(axis=None, extent=self.extent(node, what))

    def extent(self, node: Any, what: str) -> Scalar:
        """An extent (``what`` names the tensor and dim): a whole number >= 0."""
        extent = self.scalar(node, extent=True)
        if type(extent) is Const and type(extent.value) is int and extent.value >= 0:
            return extent  # the common case, without the general checks
        problem = extent_problem(extent) or self.scalar_types(extent)
        if problem is not None:
            raise fail(node, f"{what}: {problem}")
        return extent

    def mesh(self, token: lark.Token) -> Mesh:
        if str(token) not in self.meshes:
            raise fail(token, f"mesh {token} is not declared")
        return self.meshes[str(token)]

    def mesh_axis(self, token: Any, mesh: Mesh) -> MeshAxis:
        token = token.children[0] if isinstance(token, lark.Tree) else token
        try:
            axis = MeshAxis(str(token))
            axis.dim(mesh.ndim)
        except Exception:  # noqa: BLE001 - unknown name or an axis the mesh lacks
            raise fail(token, f"{token} is not an axis of mesh {mesh}") from None
        return axis

    # ----- scalars -----
    def scalar(self, node: Any, extent: bool = False, depth: int = 0) -> Scalar:
        kind = node.data if isinstance(node, lark.Tree) else None
        if depth > MAX_SCALAR_DEPTH:
            raise fail(node, f"the expression nests deeper than {MAX_SCALAR_DEPTH} operators")
        if kind == "int":
            return Const(value=integer(self, node.children[0]))
        if kind == "float":
            return Const(value=read_float(node.children[0]))
        if kind == "negative":
            inner = self.scalar(node.children[0], extent, depth + 1)
            if not isinstance(inner, Const):
                raise fail(node, "unary minus applies to numbers only")
            return Const(value=-inner.value)
        if kind == "name":
            return self.symbol(node.children[0], extent)
        if kind in _SCALAR_OPS:
            lhs, rhs = node.children
            return BinaryExpr(
                op=_SCALAR_OPS[kind],
                lhs=self.scalar(lhs, extent, depth + 1),
                rhs=self.scalar(rhs, extent, depth + 1),
            )
        if kind == "apply" and str(node.children[0]) == "coord":
            return self.coordinate(node)
        raise fail(node, "expected a scalar expression")

    def coordinate(self, node: lark.Tree) -> MeshCoordinate:
        """``coord(M0, x)``: this rank's coordinate on an axis of a mesh."""
        arguments = node.children[1:]
        if len(arguments) != 2 or any(getattr(a, "data", None) != "name" for a in arguments):
            raise fail(node, "expected coord(mesh, axis), like coord(M0, x)")
        mesh = self.mesh(arguments[0].children[0])
        return MeshCoordinate(mesh=mesh, axis=self.mesh_axis(arguments[1], mesh))

    def scalar_types(self, extent: Scalar) -> str | None:
        """The problem with a scalar input of a type other than an int in ``extent``."""
        for leaf in leaves(extent):
            value = self.values.get(getattr(leaf, "name", None))
            if isinstance(value, ScalarInput) and value.dtype not in (DType.INT64, DType.INT32):
                return f"expected an integer, got {value.name}, a {value.dtype.value} scalar"
        return None

    def symbol(self, token: lark.Token, extent: bool) -> Scalar:
        name = str(token)
        if name in RESERVED:
            return Const(value=CONSTANTS[name])
        known = name in self.loop_indices or name in self.extents or name == RANK
        value = self.values.get(name)
        if isinstance(value, ScalarInput | Symbol):  # a Symbol: a run-time extent defined above
            known = True
        if extent and not known and name not in self.values:
            self.extents.add(name)  # a symbolic extent, bound from the inputs at run time
            known = True
        if not known:
            raise fail(token, f"scalar {name} is not defined here")
        return Symbol(name=name)

    # ----- instructions -----
    def instruction(self, call: lark.Tree, targets: list) -> Instruction:
        name, *arguments = call.children
        arguments = [a for a in arguments if a is not None]
        positional = [a.children[0] for a in arguments if a.data == "positional"]
        keywords = {str(a.children[0]): a.children[1] for a in arguments if a.data == "keyword"}
        return parse_instruction(self, name, positional, keywords, targets)
