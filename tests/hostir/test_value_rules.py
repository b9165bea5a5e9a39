"""The ops' rules on bound values (hostir.ir.requirements, hostir.check.value_rules): a program's
``require`` lines and the rules its instructions show (slice bounds, pad widths) are read
from text and JSON, refused by the verifier where constants break them, and checked when
the inputs bind their symbols, before anything runs, on every rank."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch

import hostir
from hostir import ExtentError, HostIrContainer, HostIrEvaluator, ParseError, VerifyError
from hostir.errors import PeerFailureError
from hostir.ir.requirements import Requirement

TEXT = (pathlib.Path(__file__).resolve().parent.parent / "data" / "value_rules.hir").read_text()
"""Slice and pad with symbolic bounds, and a ``require`` line: T0 [i0, i1], T1 [i2]."""

REQUIRE = TEXT.splitlines()[3]


def _data(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + 7))


def test_a_requirement_reads_back_from_text_and_json():
    """``require LOW <= HIGH else "..."`` prints as it parsed and round-trips through JSON;
    a program without one writes no ``requires`` key (documents read as before)."""
    program = hostir.parse(TEXT)
    assert program.requires == (
        Requirement(
            low=hostir.Const(value=2),
            high=hostir.Symbol(name="i1"),
            message="var of T0: correction {low} is larger than the {high} elements each"
            " result reduces over dims [1]",
        ),
    )
    assert str(program) == TEXT
    assert HostIrContainer.from_json(program.to_json()) == program
    plain = hostir.parse(TEXT.replace(REQUIRE + "\n", ""))
    assert "requires" not in json.loads(plain.to_json())["program"]
    assert HostIrContainer.from_json(plain.to_json()) == plain


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('require 2 <= i7 else "x"', "4:16: scalar i7 is not defined here"),
        ('require rank <= i1 else "x"', "rank is not bound by the program's inputs"),
        ('require 1.5 <= i1 else "x"', "4:3: .*expected an integer, got the constant 1.5"),
        ('require 3 <= 2 else "c {low} > {high}"', "4:3: c 3 > 2"),
    ],
    ids=["unknown_symbol", "rank", "float", "constants_break_it"],
)
def test_the_parser_refuses_a_requirement_by_line_and_col(line, message):
    with pytest.raises(ParseError, match=message):
        hostir.parse(TEXT.replace(REQUIRE, "  " + line))


def test_the_verifier_refuses_requirements_and_broken_constant_bounds():
    """A requirement over a symbol no input binds, or with a message the text cannot
    write, built in Python; a slice whose constant bounds break its rule, in the words the
    frontend uses (before: verified, then an EvaluationError from the handler)."""
    program = hostir.parse(TEXT)
    bad = [
        Requirement(low=hostir.Const(value=0), high=hostir.Symbol(name="i9"), message="m"),
        Requirement(low=hostir.Const(value=0), high=hostir.Symbol(name="i1"), message='a "b"'),
    ]
    for requirement, fragment in zip(bad, ["i9 is not bound", "double quotes"], strict=True):
        broken = dataclasses.replace(program, requires=(requirement,))
        with pytest.raises(VerifyError, match=fragment):
            HostIrEvaluator(broken)
    text = TEXT.replace("start=i2, stop=i1", "start=5, stop=5").replace("i1 - i2]", "0]")
    with pytest.raises(VerifyError, match=r"5:3: slice of T0 dim 1: end 5 is past the extent 4;"):
        hostir.parse(text.replace("float32[i0, i1]", "float32[i0, 4]").replace(REQUIRE, ""))


def test_bound_values_are_checked_when_the_inputs_bind_them():
    """Values that keep the rules run and match torch; values that break one are refused by
    name before anything runs (an ExtentError, not the handler's EvaluationError, and not
    a slice that torch would cut short or a pad with a negative width)."""
    evaluator = HostIrEvaluator(hostir.parse(TEXT))
    x, y = _data(2, 5), _data(3)
    sliced, padded = evaluator.run([x, y])
    torch.testing.assert_close(sliced, x[:, 3:5], rtol=0, atol=0)
    torch.testing.assert_close(padded, torch.nn.functional.pad(x, [3, 1], value=0.5))
    refusals = {
        (2, 5, 6): r"^slice of T0 dim 1: end i1 = 5 is before start i2 = 6; i1 = 5 \(from input"
        r" T0 dim 1\); i2 = 6 \(from input T1 dim 0\)$",
        (2, 1, 0): r"^var of T0: correction 2 is larger than the i1 = 1 elements each result"
        r" reduces over dims \[1\]; i1 = 1 \(from input T0 dim 1\)$",
    }
    for (rows, columns, length), message in refusals.items():
        with pytest.raises(ExtentError, match=message):
            evaluator.run([_data(rows, columns), _data(length)])


RANK_ZERO_ONLY = """%HostIrContainer {
  mesh M0 = [1] : [1]
  input T0 : float32[i0, i1] @M0
  require 5 <= i1 else "var of T0: correction {low} is larger than the {high} elements"
  T1 : float32[i0] @M0 = sum(T0, dims=[1], keepdim=false)
  output T1
}
"""


@pytest.mark.world_sizes(2)
def test_a_rule_broken_on_one_rank_reaches_its_peer(multidevice_test):
    """Only rank 0 holds T0, so only it binds i1 and checks the rule: it raises the
    ExtentError, and rank 1 hears of it through the agreement (PeerFailureError naming rank
    0 and the rule), before anything runs; with a count that keeps it, both run."""
    rank = multidevice_test.rank
    evaluator = HostIrEvaluator(hostir.parse(RANK_ZERO_ONLY))
    message = "var of T0: correction 5 is larger than the i1 = 3 elements"
    if rank == 0:
        with pytest.raises(ExtentError, match=message):
            evaluator.run([_data(4, 3)])
    else:
        with pytest.raises(PeerFailureError, match=rf"rank 0: BoundRequirementError: {message}"):
            evaluator.run([_data(4, 3)])
    x = _data(4, 6)
    (out,) = evaluator.run([x])
    if rank == 0:
        torch.testing.assert_close(out, x.sum(1))
    else:
        assert out is None
