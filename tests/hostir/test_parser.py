"""The host IR parser: hand-written programs run, and broken text is refused at line:col."""

from __future__ import annotations

import pathlib

import pytest
import torch

from hostir import HostIrEvaluator, ParseError, RaceChecker, parse

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
