"""The fast line reader (hostir.text.line_reader) builds exactly lark's tree, or leaves the text
to lark: on the test programs, on the broken programs of the parser and verifier tests,
and on random edits of them."""

from __future__ import annotations

import pathlib
import random

import lark
import pytest

from hostir import ParseError, parse
from hostir.text import parser as parser_module
from hostir.text.line_reader import read_tree
from tests.hostir.test_parser import BROKEN
from tests.hostir.test_verify import FAULTS

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"
PROGRAMS = {path.name: path.read_text() for path in sorted(DATA.glob("*.hir"))}
PROGRAMS |= {f"broken: {name}": case[0] for name, case in BROKEN.items()}
PROGRAMS |= {f"fault: {name}": case[0] for name, case in FAULTS.items()}
PROGRAMS["every_instruction.hir with CR LF"] = PROGRAMS["every_instruction.hir"].replace(
    "\n", "\r\n"
)


def _lark_tree(text: str) -> lark.Tree | None:
    try:
        return parser_module._GRAMMAR.parse(text)
    except lark.UnexpectedInput:
        return None


def _built(tree: lark.Tree) -> tuple | None:
    """The program the builder makes of ``tree`` with its statement and declaration
    positions (None if it refuses the tree)."""
    builder = parser_module._Builder()
    try:
        program = builder.program(tree)
    except ParseError:
        return None
    return program, builder.positions, builder.declarations, builder.end


def _check_agrees(text: str) -> bool:
    """Where the reader gives a tree, lark gives the same one, and the builder the same
    program and positions from both. Returns whether the reader gave a tree."""
    mine = read_tree(text)
    if mine is None:
        return False
    theirs = _lark_tree(text)
    assert theirs is not None, f"the reader accepts text lark refuses: {text!r}"
    assert mine == theirs, f"the trees differ for {text!r}"
    assert _built(mine) == _built(theirs), f"the builder differs for {text!r}"
    return True


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_reader_builds_lark_s_tree(name):
    """Every test program lark reads is read by the reader into lark's tree."""
    text = PROGRAMS[name]
    assert _check_agrees(text) == (_lark_tree(text) is not None)


_EDITS = [" ", "\t", "\n", "\r", "\r\n", "//", "// note\n", "{", "}", "[", "]", "(", ")", ","]
_EDITS += [":", "=", "@", "-", "+", "*", "%", "1", "1.5", "1e3", "1.e", "x", "for", "in", "partial"]
_EDITS += ["input", "\u00e9", "\u0663", "\x0b", ".", "e", "__", "%HostIrContainer", "coord(M0, x)"]
_EDITS += [" // note", "T\u00e9"]


def _edit(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        choice = rng.random()
        if choice < 0.4:
            text = text[:at] + rng.choice(_EDITS) + text[at:]
        elif choice < 0.75:
            text = text[:at] + text[at + rng.randint(1, 4) :]
        else:
            lines = text.split("\n")
            line = rng.randrange(len(lines))
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(["  ", "  // c", lines[line]]))
            text = "\n".join(lines)
    return text


def test_edited_programs_read_as_lark_reads_them():
    """Random edits (characters inserted and deleted, lines added): whatever the reader
    accepts, lark accepts as the same tree, and the builder reads the same program with
    the same positions."""
    rng = random.Random(0)
    texts = list(PROGRAMS.values())
    accepted = sum(_check_agrees(_edit(rng.choice(texts), rng)) for _ in range(400))
    assert accepted > 40  # the edits leave enough programs readable to compare


_HEAD = "%HostIrContainer {\n  input T0 : float32[4]\n"


@pytest.mark.parametrize(
    "line",
    [
        "  T\u00e9 : float32[4] = relu(T0)",  # names are ASCII
        "  T1 : float32[\u0663] = relu(T0)",  # so are digits
        "  T1 : float32[4] = relu(T0) // a comment after a statement",
        "  T1 : float32[4]\r = relu(T0)",  # a carriage return not before a line break
        "  T1 : float32[4] =\x0b relu(T0)",
        "  wait(T0)",  # a keyword where a call's name would be
        "  T1 : float32[1e] = relu(T0)",
        "  T1 : float32[4] = relu(T0) }",
        "  for i in range(0, 2) { }",
    ],
)
def test_text_lark_refuses_is_left_to_lark(line):
    """Lines that look almost right: the reader is unsure, and lark refuses them."""
    text = _HEAD + line + "\n  output T0\n}\n"
    assert read_tree(text) is None and _lark_tree(text) is None


def test_printed_programs_do_not_need_lark(monkeypatch):
    """A printed program is read without lark (lark's Python LALR parser took 40 s for
    10^5 instructions); lark answers only where the reader is unsure."""

    class NoLark:
        def parse(self, text):
            raise AssertionError("lark was asked")

    text = PROGRAMS["every_instruction.hir"]
    monkeypatch.setattr(parser_module, "_GRAMMAR", NoLark())
    assert str(parse(text)) == text
    with pytest.raises(AssertionError, match="lark was asked"):
        parse(text.replace("%HostIrContainer", "\n%HostIrContainer"))  # valid, but unusual
