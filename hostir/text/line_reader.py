"""A fast reader of host IR text into the parse tree lark builds from ``hostir.lark``.

lark's LALR parser, written in Python, spends some 10 µs a line on its lexer, its
parser state machine and the positions of every node: 10^5 instructions took 40 s.
This reader uses what the grammar guarantees: one statement per line, comments
only on lines of their own, ``{`` ending a ``for`` line and ``}`` alone on a line.
It splits the text into lines, each line into tokens with one regular expression,
and reads each line by recursive descent into the *same* ``lark.Tree`` that lark
builds (the same rule names, children and ``None`` placeholders; tokens are plain
strings, and only statements carry their position), so the parser's builder reads
either tree. ``tests/hostir/test_line_reader.py`` checks the two trees equal on
every program of the test data and on many variations of them.

It reads only what it is sure of: anything else (a syntax error, an unusual but
valid layout such as comments before the header, an expression nested more than
``MAX_DEPTH`` deep) makes :func:`read_tree` return None, and the parser then asks
lark, whose answer (a tree, or a ``ParseError`` at ``line:col``) is exact. A rule
added to ``hostir.lark`` needs its mirror here (a statement keyword in ``_KEYWORDS``):
until then, text using it is read by lark, and the test above fails on a program
that uses it.
"""

from __future__ import annotations

import re
import string

from lark import Tree
from lark.tree import Meta

from hostir.ir.scalars import MAX_SCALAR_DEPTH

MAX_DEPTH = MAX_SCALAR_DEPTH + 2
"""The deepest expression read here; the builder refuses deeper ones (through lark)."""

_TOKEN = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|[0-9]+"  # FLOAT, INT
    r"|[A-Za-z_][A-Za-z0-9_]*|//|[^ \t]"  # NAME, floordiv, any other character alone
)
_HEADER = re.compile(r"[ \t]*%HostIrContainer[ \t]*\{[ \t]*")
_INDENT = " \t"
_NAME_START = frozenset(string.ascii_letters + "_")
_KEYWORDS = frozenset(
    {"mesh", "input", "output", "require", "allocate", "deallocate", "wait", "for"}
)
_STRING = re.compile(r'"[^"\\\r\n]*"')
"""``hostir.lark``'s STRING: a require's message, read whole (the only quoted token)."""
_PRODUCT = {"*": "mul", "//": "floordiv", "%": "mod"}
_SUM = {"+": "add", "-": "sub"}


class _Unsure(Exception):
    """The reader is not sure of this text: lark reads it instead."""


def read_tree(text: str) -> Tree | None:
    """The tree ``hostir.lark`` gives ``text`` (``start`` with the header token and the
    statements), or None where lark must decide."""
    lines = text.split("\n")
    header = lines[0][:-1] if len(lines) > 1 and lines[0].endswith("\r") else lines[0]
    if not _HEADER.fullmatch(header):
        return None
    try:
        statements, end = _read_body(lines, 1, 0)
    except _Unsure:
        return None
    for line in lines[end + 1 :]:  # after the closing brace: blank or comment lines only
        stripped = line.lstrip(_INDENT)
        if stripped and not stripped.startswith("//"):
            return None
    return Tree("start", ["%HostIrContainer", statements])


def _read_body(lines: list[str], first: int, depth: int) -> tuple[Tree, int]:
    """The ``statements`` from line ``first`` to its closing ``}``, and that line's index."""
    body: list[Tree] = []
    number = first
    while number < len(lines):
        line = lines[number]
        if number + 1 < len(lines) and line.endswith("\r"):
            line = line[:-1]  # the \r of a \r\n line break
        stripped = line.lstrip(_INDENT)
        if not stripped or stripped.startswith("//"):
            number += 1
            continue
        if stripped.rstrip(_INDENT) == "}":
            return Tree("statements", body), number
        statement, number = _read_statement(lines, number, line, depth)
        body.append(statement)
    raise _Unsure("no closing brace")


def _read_statement(lines: list[str], number: int, line: str, depth: int) -> tuple[Tree, int]:
    """The statement on line ``number`` (a loop: with its body), and the next line."""
    reader = _Line(_tokens(line))
    tree = reader.statement()
    meta = Meta()  # where lark's propagate_positions puts the statement: its first token
    meta.line, meta.column = number + 1, len(line) - len(line.lstrip(_INDENT)) + 1
    meta.empty = False
    tree._meta = meta
    if tree.data == "for_loop":
        if depth >= MAX_DEPTH:
            raise _Unsure("loops nested deeper than the reader goes")
        body, number = _read_body(lines, number + 1, depth + 1)
        tree.children.append(body)
    return tree, number + 1


def _tokens(line: str) -> list[str]:
    """The tokens of ``line``; a quoted string (a require's message, which ends its line)
    is one token, and ``<=`` (a require's only comparison) one too."""
    head, quote, rest = line.partition('"')
    tokens = _TOKEN.findall(head)
    if "<" in head:
        if head.count("<") != head.count("<="):
            raise _Unsure("a < that is not <=")  # lark refuses it, naming its line:col
        tokens = ["<=" if t == "<" else t for t in _TOKEN.findall(head.replace("<=", " < "))]
    if quote:
        string = quote + rest.rstrip(_INDENT)
        if not _STRING.fullmatch(string):
            raise _Unsure("a string")
        tokens.append(string)
    return tokens


class _Line:
    """Recursive descent over the tokens of one line, mirroring ``hostir.lark``'s rules."""

    def __init__(self, tokens: list[str]) -> None:
        self.count = len(tokens)
        self.tokens = [*tokens, "", ""]  # peek(1) past the end reads ""
        self.at = 0

    # ----- tokens -----
    def peek(self, ahead: int = 0) -> str:
        return self.tokens[self.at + ahead]

    def take(self) -> str:
        token = self.tokens[self.at]
        if not token:
            raise _Unsure("end of the line")
        self.at += 1
        return token

    def expect(self, token: str) -> None:
        if self.take() != token:
            raise _Unsure(token)

    def name(self) -> str:
        token = self.take()
        if not _is_name(token):
            raise _Unsure("a name")
        return token

    def int_token(self) -> str:
        token = self.take()
        if not token.isdigit() or not token.isascii():
            raise _Unsure("an integer")
        return token

    def end(self) -> None:
        if self.at != self.count:
            raise _Unsure("the end of the line")

    # ----- statements -----
    def statement(self) -> Tree:
        first = self.peek()
        if first in _KEYWORDS:
            self.at += 1
            tree = getattr(self, f"stmt_{first}")()
        else:
            tree = self.assignment_or_call()
        if tree.data != "for_loop":
            self.end()
        return tree

    def stmt_mesh(self) -> Tree:
        name = self.name()
        self.expect("=")
        shape, strides, offset = self.nested(), None, None
        if self.peek() == ":":
            self.at += 1
            strides = self.nested()
            if self.peek() == "+":
                self.at += 1
                offset = self.int_token()
        return Tree("mesh_decl", [name, shape, strides, offset])

    def nested(self, depth: int = 0) -> Tree:
        if depth > 8:
            raise _Unsure("a mesh nested too deep")
        items = self.separated("[", "]", lambda: self.nested_item(depth))
        return Tree("nested", items or [None])

    def nested_item(self, depth: int) -> Tree:
        if self.peek() == "[":
            return self.nested(depth + 1)
        return Tree("device", [self.int_token()])

    def stmt_input(self) -> Tree:
        return Tree("input_decl", [self.declaration()])

    def stmt_require(self) -> Tree:
        low = self.expr()
        self.expect("<=")
        high = self.expr()
        self.expect("else")
        message = self.take()
        if not message.startswith('"'):
            raise _Unsure("a string")
        return Tree("require_decl", [low, high, message])

    def stmt_output(self) -> Tree:
        return Tree("output_decl", [self.name()])

    def stmt_allocate(self) -> Tree:
        return Tree("allocate", [self.declaration()])

    def stmt_deallocate(self) -> Tree:
        return Tree("deallocate", [self.name()])

    def stmt_wait(self) -> Tree:
        return Tree("wait", [self.name()])

    def stmt_for(self) -> Tree:
        index = self.name()
        for token in ("in", "range", "("):
            self.expect(token)
        start = self.expr()
        self.expect(",")
        stop = self.expr()
        self.expect(")")
        self.expect("{")
        self.end()
        return Tree("for_loop", [index, start, stop])  # the body is appended by the caller

    def assignment_or_call(self) -> Tree:
        if self.peek(1) == "(":
            return self.call()
        targets = [self.target()]
        while self.peek() == ",":
            self.at += 1
            targets.append(self.target())
        self.expect("=")
        return Tree("assignment", [*targets, self.call()])

    def target(self) -> Tree:
        if self.peek(1) == ":":
            return self.declaration()
        return Tree("plain_target", [self.name()])

    def call(self) -> Tree:
        name = self.name()
        arguments = self.separated("(", ")", self.argument)
        return Tree("call", [name, *arguments] if arguments else [name, None])

    def argument(self) -> Tree:
        if self.peek(1) == "=" and _is_name(self.peek()):
            name = self.take()
            self.at += 1
            return Tree("keyword", [name, self.expr()])
        return Tree("positional", [self.expr()])

    # ----- types -----
    def declaration(self) -> Tree:
        name = self.name()
        self.expect(":")
        type_name = self.name()
        if self.peek() != "[":
            return Tree("scalar_declaration", [name, type_name])
        shape = Tree("shape", self.separated("[", "]", self.expr) or [None])
        sharding = self.sharding() if self.peek() == "@" else None
        return Tree("tensor_declaration", [name, Tree("tensor_type", [type_name, shape, sharding])])

    def sharding(self) -> Tree:
        self.at += 1
        mesh = self.name()
        dims = partial = None
        if self.peek() == "{":
            dims = Tree("sharded_dims", self.separated("{", "}", self.sharded_dim, empty=False))
        if self.peek() == "partial":
            self.at += 1
            partial = Tree("partial", self.separated("{", "}", self.partial_axis, empty=False))
        return Tree("sharding", [mesh, dims, partial])

    def sharded_dim(self) -> Tree:
        index = self.int_token()
        self.expect(":")
        return Tree("sharded_dim", [index, *self.separated("[", "]", self.expr, empty=False)])

    def partial_axis(self) -> Tree:
        axis = self.name()
        self.expect(":")
        return Tree("partial_axis", [axis, self.name()])

    def separated(self, open_: str, close: str, item, empty: bool = True) -> list:
        """``open_ [item ("," item)*] close``: the items (none only when ``empty``)."""
        self.expect(open_)
        items = []
        if self.peek() == close and empty:
            self.at += 1
            return items
        while True:
            items.append(item())
            token = self.take()
            if token == close:
                return items
            if token != ",":
                raise _Unsure(f"',' or {close!r}")

    # ----- expressions -----
    def expr(self, depth: int = 0) -> Tree:
        """``sum``: products joined by + and -, left to right."""
        if depth > MAX_DEPTH:
            raise _Unsure("an expression nested too deep")
        tree = self.product(depth)
        while self.tokens[self.at] in _SUM:
            tree = Tree(_SUM[self.take()], [tree, self.product(depth)])
        return tree

    def product(self, depth: int) -> Tree:
        tree = self.unary(depth)
        while self.tokens[self.at] in _PRODUCT:
            tree = Tree(_PRODUCT[self.take()], [tree, self.unary(depth)])
        return tree

    def unary(self, depth: int) -> Tree:
        if self.tokens[self.at] == "-":
            self.at += 1
            if depth > MAX_DEPTH:
                raise _Unsure("an expression nested too deep")
            return Tree("negative", [self.unary(depth + 1)])
        return self.atom(depth)

    def atom(self, depth: int) -> Tree:
        token = self.take()
        if token[0].isdigit():
            if not token.isascii():
                raise _Unsure("a number")
            return Tree("int" if token.isdigit() else "float", [token])
        if token[0] in _NAME_START:
            if self.tokens[self.at] != "(":
                return Tree("name", [token])
            arguments = self.separated("(", ")", lambda: self.expr(depth + 1))
            return Tree("apply", [token, *arguments] if arguments else [token, None])
        if token == "[":
            self.at -= 1
            items = self.separated("[", "]", lambda: self.expr(depth + 1))
            return Tree("list", items or [None])
        if token == "(":
            tree = self.expr(depth + 1)
            self.expect(")")
            return tree
        raise _Unsure("an expression")


def _is_name(token: str) -> bool:
    return token[:1] in _NAME_START
