"""The host IR parser: hand-written programs run, and broken text is refused at line:col."""

from __future__ import annotations

import math
import pathlib
import random
import re

import pytest
import torch

from hostir import (
    Binary,
    BinaryOpKind,
    Const,
    DType,
    HostIrContainer,
    HostIrError,
    HostIrEvaluator,
    ParseError,
    RaceChecker,
    TensorValue,
    parse,
)

DATA = pathlib.Path(__file__).resolve().parent.parent / "data"


def load(name: str):
    """The program in ``tests/data/<name>``, checked to print back to the same text."""
    text = (DATA / name).read_text()
    program = parse(text)
    assert str(program) == text
    return program


def run(program, inputs):
    """Runs ``program`` on this rank with the race checker on."""
    return HostIrEvaluator(program, listeners=[RaceChecker()]).run(inputs)


@pytest.mark.world_sizes(4)
def test_ring_allgather_written_in_host_ir(multidevice_test):
    """Three CollectivePermute steps around a ring gather every rank's rows."""
    rank = multidevice_test.rank
    torch.manual_seed(0)
    full = torch.randn(8, 3)
    (out,) = run(load("ring_allgather.hir"), [full[2 * rank : 2 * rank + 2].contiguous()])
    torch.testing.assert_close(out, full)


@pytest.mark.world_sizes(2)
def test_program_with_every_instruction_kind(multidevice_test):
    """Each output equals what its instruction means, computed with torch."""
    rank, other = multidevice_test.rank, 1 - multidevice_test.rank
    torch.manual_seed(1)
    x, w, s = torch.randn(4, 6), torch.randn(6, 4), 0.5
    outputs = run(load("every_instruction.hir"), [x[2 * rank : 2 * rank + 2].contiguous(), w, s])
    xw = x @ w
    t12 = (-torch.relu(2 * s * xw)).double().sum(1)
    t13 = t12.expand(2, 4)
    t16 = 2 * t13

    def cols(t, r):
        return t[:, 2 * r : 2 * r + 2]

    expected = [
        xw,
        t12,
        cols(t13, rank),
        cols(t16, rank),
        t16,
        cols(t16, 1),
        4 * t13 if rank == 0 else None,
        t16 if rank == 0 else None,
        cols(t16, rank),
        torch.cat([cols(t16, rank), cols(t16, rank)], 0),
        t16 if rank == 1 else None,
        cols(t16, other),
        t16[rank : rank + 1],
    ]
    assert len(outputs) == len(expected)
    for index, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        if want is None:
            assert got is None, index
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"output {index}")


HEADER = "%HostIrContainer {\n  mesh M0 = [2] : [1]\n"
BROKEN = {
    "unknown instruction": (
        HEADER + "  input T0 : float32[4] @M0\n  T1 : float32[4] @M0 = frobnicate(T0)\n}\n",
        4,
        25,
        "unknown instruction frobnicate",
    ),
    "undefined tensor": (
        HEADER + "  T1 : float32[4] @M0 = relu(T0)\n}\n",
        3,
        30,
        "T0 is not defined",
    ),
    "defined twice": (
        HEADER + "  input T0 : float32[4] @M0\n  T0 : float32[4] @M0 = relu(T0)\n}\n",
        4,
        3,
        "T0 is defined twice",
    ),
    "wait of a tensor": (
        HEADER + "  input T0 : float32[4] @M0\n  wait T0\n}\n",
        4,
        8,
        "T0 is a tensor, not a communication request",
    ),
    "loop index outside its loop": (
        HEADER
        + "  input T0 : float32[4] @M0\n  for i in range(0, 2) {\n  }\n"
        + "  T1 : float32[2] @M0 = shard_by_stream(T0, axis=0, index=i)\n}\n",
        6,
        59,
        "scalar i is not defined here",
    ),
    "unknown dtype": (HEADER + "  input T0 : float33[4] @M0\n}\n", 3, 14, "unknown dtype float33"),
    "undeclared mesh": (
        HEADER + "  input T0 : float32[4] @M9\n}\n",
        3,
        26,
        "mesh M9 is not declared",
    ),
    "missing brace": (
        HEADER + "  input T0 : float32[4] @M0\n",
        3,
        28,
        "unexpected end of the text",
    ),
    "bad character": (
        HEADER + "  input T0 : float32[4] @M0 $\n}\n",
        3,
        29,
        "unexpected character '$'",
    ),
    "axis the mesh lacks": (
        HEADER + "  input T0 : float32[4] @M0 {0: [y, 2]}\n}\n",
        3,
        34,
        "y is not an axis of mesh [2] : [1]",
    ),
    "wrong operand kind": (
        HEADER
        + "  input T0 : float32[4] @M0\n"
        + "  T1 : float32[4] @M0, R0 = Allreduce(T0, team=M0(x))\n  wait R0\n"
        + "  T2 : float32[4] @M0 = relu(R0)\n}\n",
        6,
        30,
        "R0 is a request, expected a tensor",
    ),
    "missing request": (
        HEADER
        + "  input T0 : float32[4] @M0\n  T1 : float32[4] @M0 = Allreduce(T0, team=M0(x))\n}\n",
        4,
        25,
        "Allreduce defines 2 value(s) here, got 1",
    ),
    "unknown argument": (
        HEADER + "  input T0 : float32[4] @M0\n  T1 : float32[4] @M0 = relu(T0, alpha=2)\n}\n",
        4,
        40,
        "relu has no argument alpha",
    ),
    # An extent is a whole number >= 0: these used to be truncated (7.9 -> 7) or accepted.
    "fractional extent": (
        HEADER + "  input T0 : float32[7.9, 3] @M0\n}\n",
        3,
        22,
        "T0 dim 0: an extent must be a whole number >= 0, got 7.9",
    ),
    "negative extent": (
        HEADER + "  input T0 : float32[4, -3] @M0\n}\n",
        3,
        25,
        "T0 dim 1: an extent must be a whole number >= 0, got -3",
    ),
    "negative constant extent": (
        HEADER + "  allocate T0 : float32[2 - 5]\n}\n",
        3,
        25,
        "T0 dim 0: an extent must be a whole number >= 0, got 2 - 5",
    ),
    "bool extent": (
        HEADER + "  input T0 : float32[true] @M0\n}\n",
        3,
        22,
        "T0 dim 0: an extent must be a whole number >= 0, got true",
    ),
    "infinite extent": (
        HEADER + "  input T0 : float32[inf] @M0\n}\n",
        3,
        22,
        "T0 dim 0: an extent must be a whole number >= 0, got inf",
    ),
    "fractional extent in a sharding": (
        HEADER + "  input T0 : float32[8] @M0 {0: [x, 4.0]}\n}\n",
        3,
        37,
        "T0 dim 0's sharding: an extent must be a whole number >= 0, got 4.0",
    ),
    "extent divided by zero": (
        HEADER + "  input T0 : float32[i0 // 0] @M0\n}\n",
        3,
        22,
        "T0 dim 0: division by the constant 0",
    ),
    "float scalar as an extent": (
        HEADER + "  input s0 : float64\n  input T0 : float32[s0 * 2] @M0\n}\n",
        4,
        22,
        "T0 dim 0: expected an integer, got s0, a float64 scalar",
    ),
    # Numbers the text cannot carry, and names that read as constants.
    "float beyond float64": (
        HEADER + "  input T0 : float32[4]\n  T1 : float32[4] = add(T0, 1e400)\n}\n",
        4,
        29,
        "1e400 is beyond the range of a float64; write inf for infinity",
    ),
    "int of too many digits": (
        HEADER + "  input T0 : float32[4]\n  T1 : float32[4] = add(T0, " + "7" * 4301 + ")\n}\n",
        4,
        29,
        "an int has at most 4300 digits, got 4301",
    ),
    "scalar input named like a constant": (
        HEADER + "  input nan : float64\n}\n",
        3,
        9,
        "nan cannot name a scalar: it reads as a constant",
    ),
    "loop index named like a constant": (
        HEADER + "  for inf in range(0, 2) {\n  }\n}\n",
        3,
        7,
        "inf cannot name a loop index: it reads as a constant",
    ),
    "coord without its axis": (
        HEADER + "  input T0 : float32[4]\n  T1 : float32[4] = add(T0, coord(M0))\n}\n",
        4,
        29,
        "expected coord(mesh, axis), like coord(M0, x)",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_text_is_refused_at_line_and_column(case):
    """Each broken program raises ParseError at the offending token."""
    text, line, col, message = BROKEN[case]
    with pytest.raises(ParseError) as info:
        parse(text)
    assert (info.value.line, info.value.col) == (line, col), str(info.value)
    assert message in str(info.value)
    assert str(info.value).startswith(f"{line}:{col}: ")


def test_comments_and_blank_lines_are_allowed():
    """Comment-only and blank lines between statements are ignored."""
    text = HEADER + "\n  // the input\n  input T0 : float32[4] @M0\n\n  output T0\n}\n"
    program = parse(text)
    assert [v.name for v in program.inputs] == ["T0"]


# ----- constants: every one reads back as itself ----------------------------------------

CONSTANTS = [
    math.inf,
    -math.inf,
    math.nan,
    0.1,
    1e300,
    -0.0,
    5e-324,
    2**63 - 1,
    -(2**63),
    2**64,
    2**100,
    -(2**100),
    True,
]


def _with_constant(value) -> HostIrContainer:
    """``T1 = add(T0, value)`` built in Python."""
    x = TensorValue(name="T0", dtype=DType.FLOAT32, shape=(Const(value=4),))
    out = TensorValue(name="T1", dtype=DType.FLOAT32, shape=(Const(value=4),))
    add = Binary(op=BinaryOpKind.ADD, out=out, lhs=x, rhs=Const(value=value))
    return HostIrContainer(inputs=(x,), outputs=(out,), body=(add,))


def _same_constant(a, b) -> bool:
    """Same type, and the same value bit for bit (NaN is NaN, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


@pytest.mark.parametrize("value", CONSTANTS, ids=repr)
def test_every_constant_round_trips_through_text(value):
    """``-inf`` used to print as text the parser refused ("scalar inf is not defined");
    NaN, -0.0 and ints past int64 read back as the same constant, with the same type;
    the program read back computes what torch computes."""
    program = _with_constant(value)
    text = str(program)
    again = parse(text)
    assert again == program and str(again) == text
    assert _same_constant(again.body[0].rhs.value, value)
    if isinstance(value, float):
        x = torch.randn(4)
        (out,) = HostIrEvaluator(again).run([x])
        torch.testing.assert_close(out, x + value, equal_nan=True)


def test_constants_compare_by_type_and_value():
    """1, 1.0 and true are three constants, 0.0 and -0.0 two; NaN equals NaN (see Const)."""
    assert Const(value=math.nan) == Const(value=float("nan"))
    assert hash(Const(value=math.nan)) == hash(Const(value=float("nan")))
    assert len({Const(value=1), Const(value=1.0), Const(value=True)}) == 3
    assert Const(value=0.0) != Const(value=-0.0)
    assert Const(value=2) == Const(value=2) and Const(value=0.5) == Const(value=0.5)


def test_a_fusion_with_minus_infinity_round_trips():
    """The report's reproduction: a fusion adding the constant -inf."""
    from frontend import FusionDefinition

    with FusionDefinition() as fd:
        x = fd.define_tensor((4,))
        fd.add_output(fd.ops.add(x, fd.define_scalar(float("-inf"))))
    program = fd.host_ir()
    assert parse(str(program)) == program
    x = torch.randn(4)
    torch.testing.assert_close(fd.execute([x])[0], x - math.inf)


# ----- what the text cannot hold: refused by name, never a bare exception --------------


@pytest.mark.parametrize("text", [b"%HostIrContainer {\n}\n", None, 7, ["%HostIrContainer"]])
def test_anything_but_text_is_refused(text):
    """``parse(b"...")`` used to raise a TypeError from inside lark."""
    with pytest.raises(ParseError, match=r"^1:1: expected host IR text \(a str\), got "):
        parse(text)


def _nested_loops(depth: int) -> str:
    lines = [f"{'  ' * (k + 1)}for i{k} in range(0, 1) {{" for k in range(depth)]
    lines += [f"{'  ' * (k + 1)}}}" for k in reversed(range(depth))]
    return "%HostIrContainer {\n" + "\n".join(lines) + "\n}\n"


def test_loops_nest_up_to_the_limit():
    """32 nested loops parse and verify; 33 (or 300, which used to overflow Python's
    recursion limit) are refused at the loop past the limit."""
    parse(_nested_loops(32))
    for depth in (33, 300):
        with pytest.raises(ParseError, match=r"^34:71: loops nest deeper than 32$"):
            parse(_nested_loops(depth))


def _sum_extent(terms: int) -> str:
    return HEADER + f"  input T0 : float32[{' + '.join(['i0'] * terms)}] @M0\n  output T0\n}}\n"


def test_scalar_expressions_nest_up_to_the_limit():
    """An extent ``i0 + ... + i0`` of 101 terms (100 operators) reads; 102 terms, or
    5000 (which used to raise RecursionError), and 5000 unary minuses are refused."""
    parse(_sum_extent(101))
    message = r"the expression nests deeper than 100 operators"
    for terms in (102, 5000):
        with pytest.raises(ParseError, match=r"^3:22: " + message):
            parse(_sum_extent(terms))
    minuses = HEADER + "  input T0 : float32[4]\n  T1 : float32[4] = add(T0, " + "-" * 5000
    with pytest.raises(ParseError, match=message):
        parse(minuses + "1)\n}\n")


def test_mangled_text_raises_only_host_ir_errors():
    """Random edits of the test programs (pieces inserted, characters deleted, names and
    arguments replaced) give a program or a HostIrError, never a bare exception (an int
    of 4400 digits used to raise ValueError, 1500 nested minuses RecursionError)."""
    rng = random.Random(0)
    texts = [path.read_text() for path in sorted(DATA.glob("*.hir"))]
    for _ in range(300):
        text = _mangle(rng.choice(texts), rng)
        try:
            parse(text)
        except HostIrError:
            pass


_PIECES = [" ", "\n", "\r", "//", "{", "}", "[", "]", "(", ")", ",", ":", "=", "-", "*", "%"]
_PIECES += ["1.5", "1e400", "inf", "nan", "true", "coord()", "coord(M0)", "stream()", "M0(q)"]
_PIECES += ["[1, [2]]", "axis=1.5", "root=true", "index=-1", "@M0 {5: [x]}", "partial{y: max}"]
_PIECES += ["7" * 4400, "-" * 1500 + "1", " + ".join(["i0"] * 1500)]  # used to raise ValueError
# and RecursionError


_SPAN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|\[[^\]\n]*\]|\([^()\n]*\)")


def _mangle(text: str, rng: random.Random) -> str:
    """1 to 3 edits: a piece inserted, a few characters deleted, or a name, a number, a
    list or an argument list replaced by a piece (mostly still text that parses)."""
    for _ in range(rng.randint(1, 3)):
        at, choice = rng.randrange(len(text) + 1), rng.random()
        if choice < 0.3:
            text = text[:at] + rng.choice(_PIECES) + text[at:]
        elif choice < 0.5:
            text = text[:at] + text[at + rng.randint(1, 6) :]
        else:
            start, end = rng.choice([m.span() for m in _SPAN.finditer(text)])
            text = text[:start] + rng.choice(_PIECES) + text[end:]
    return text
