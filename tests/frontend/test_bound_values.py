"""Run-time values checked as constants are: each rule an op applies to its constant
extents (a variance's correction against the count, slice bounds, pad widths, topk's k,
gather's index extents) is applied to the values the inputs bind when the extents are
symbolic, with the same words: a definition with constant extents is refused by an
OperandError, the same definition with symbolic extents by an ExtentError at execute
whose message reads the same once each ``expression = value`` is read as its value and
the symbols' origins are left off. Values that keep the rule run and match torch."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from frontend import DataType, FusionDefinition, OperandError
from hostir import ExtentError, RequirementError

Build = Callable  # (fd, *tensor views) -> outputs


def _cases() -> dict[str, tuple]:
    """name -> (build, bad shapes, good shapes, torch reference on the good inputs); each
    input is Float but a gather's index (the second input of "gather")."""
    return {
        # Before: a negative variance (torch: inf).
        "var_correction": (
            lambda fd, a: [fd.ops.var(a, [1], correction=5)],
            [(3, 4)],
            [(3, 6)],
            lambda x: [x.var(1, correction=5)],
        ),
        "var_mean_correction": (
            lambda fd, a: list(fd.ops.var_mean(a, [0, 1], correction=9)),
            [(2, 4)],
            [(2, 5)],
            lambda x: list(torch.var_mean(x, [0, 1], correction=9)),
        ),
        # Before: the slice handler's EvaluationError, once the program ran up to it.
        "slice_negative_start": (
            lambda fd, a, b: [fd.ops.slice(a, [0, a.size(1) - b.size(0)], [a.size(0), a.size(1)])],
            [(2, 4), (5,)],
            [(2, 4), (3,)],
            lambda x, y: [x[:, 1:]],
        ),
        "slice_end_before_start": (
            lambda fd, a, b: [fd.ops.slice(a, [0, b.size(0)], [a.size(0), a.size(1)])],
            [(2, 4), (5,)],
            [(2, 4), (1,)],
            lambda x, y: [x[:, 1:]],
        ),
        "slice_end_past_the_extent": (
            lambda fd, a, b: [fd.ops.slice(a, [0, 0], [a.size(0), b.size(0)], None, True)],
            [(2, 4), (5,)],
            [(2, 4), (3,)],
            lambda x, y: [x[:, :3]],
        ),
        # Before: torch's F.pad cut a column off, silently.
        "pad_negative_width": (
            lambda fd, a, b: [fd.ops.pad(a, [a.size(1) - b.size(0), 1])],
            [(2, 4), (5,)],
            [(2, 4), (2,)],
            lambda x, y: [F.pad(x, [2, 1])],
        ),
        # Before: an ExtentError naming the negative extent the pad made, not the width.
        "pad_width_past_the_extent": (
            lambda fd, a, b: [fd.ops.pad(a, [1, a.size(1) - b.size(0)])],
            [(2, 4), (9,)],
            [(2, 4), (4,)],
            lambda x, y: [F.pad(x, [1, 0])],
        ),
        # Before: torch's errors, wrapped in an EvaluationError once the program ran.
        "topk_k_larger_than_the_dim": (
            lambda fd, a, b: [fd.ops.topk(a, b.size(0), dim=1, sorted=True)[0]],
            [(2, 4), (5,)],
            [(2, 4), (3,)],
            lambda x, y: [torch.topk(x, 3, dim=1, sorted=True).values],
        ),
        "gather_index_larger": (
            lambda fd, a, i: [fd.ops.gather(a, i, 0)],
            [(4, 2), (3, 3)],
            [(4, 2), (3, 2)],
            lambda x, i: [torch.gather(x, 0, i)],
        ),
    }


CASES = _cases()


def _inputs(name: str, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(len(name))
    tensors = [torch.randn(shape, generator=generator) for shape in shapes]
    if name.startswith("gather"):
        tensors[1] = torch.randint(0, shapes[0][0], shapes[1], generator=generator)
    return tensors


def _defined(name: str, shapes: list[tuple[int, ...]]) -> FusionDefinition:
    """Case ``name`` defined on inputs of ``shapes`` (-1 for a symbolic extent)."""
    build = CASES[name][0]
    with FusionDefinition() as fd:
        index = name.startswith("gather")
        tvs = [
            fd.define_tensor(shape, dtype=DataType.Int if index and i == 1 else DataType.Float)
            for i, shape in enumerate(shapes)
        ]
        for out in build(fd, *tvs):
            fd.add_output(out)
    return fd


def _read_as_constants(message: str) -> str:
    """An ExtentError's message as the constant case writes it: each ``i1 - i2 = -1`` read as
    ``-1``, and the closing ``; i1 = 4 (from input T0 dim 1)`` list left off."""
    message = re.sub(r"(; \w+ = -?\d+ \(from input \w+ dim \d+\))+$", "", message)
    return re.sub(r"\w+(?: [-+*] \w+)* = (-?\d+)", r"\1", message)


@pytest.mark.parametrize("name", CASES)
def test_a_bound_value_is_checked_as_the_constant_is(name):
    """The constant case's OperandError at definition; the same words at execute with
    symbolic extents (an ExtentError before anything runs); both are RequirementErrors (one
    class to catch for the rule, whenever it is broken); good values match torch."""
    _, bad, good, reference = CASES[name]
    with pytest.raises(OperandError) as constant:
        _defined(name, bad)
    fd = _defined(name, [(-1,) * len(shape) for shape in bad])
    with pytest.raises(ExtentError) as bound:
        fd.execute(_inputs(name, bad))
    assert _read_as_constants(str(bound.value)) == str(constant.value)
    assert isinstance(constant.value, RequirementError)
    assert isinstance(bound.value, RequirementError)
    inputs = _inputs(name, good)
    for out, want in zip(fd.execute(inputs), reference(*inputs), strict=True):
        torch.testing.assert_close(out, want)
