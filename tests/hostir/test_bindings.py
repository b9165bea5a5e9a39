"""hostir.run.bindings: a binding is reused only for inputs of the same signature, so a
run with other inputs is bound and checked in full, and one that fails is never kept."""

from __future__ import annotations

import pytest
import torch

from hostir import HostIrEvaluator, InputError, parse
from hostir.run import bindings

SCALED = (
    "%HostIrContainer {\n  input s : float64\n  input T0 : float32[i0, 4]\n"
    "  T1 : float32[i0, 4] = mul(T0, s)\n  T2 : float32[i0, 4] = relu(T1)\n  output T2\n}\n"
)


def test_a_new_scalar_value_or_shape_is_bound_again():
    evaluator = HostIrEvaluator(parse(SCALED))
    generator = torch.Generator().manual_seed(3)
    for rows, scale in ((3, 2.0), (3, 2.0), (3, -1.5), (5, -1.5), (3, 2.0)):
        x = torch.randn(rows, 4, generator=generator)
        (out,) = evaluator.run([scale, x])
        torch.testing.assert_close(out, torch.relu(x * scale))


def test_inputs_unlike_a_kept_binding_are_checked_in_full():
    evaluator = HostIrEvaluator(parse(SCALED))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    evaluator.run([1.0, x])  # kept
    with pytest.raises(InputError, match="T0 must have dtype float32, got float64"):
        evaluator.run([1.0, x.double()])
    with pytest.raises(InputError, match="T0 dim 1: expected a local extent of 4"):
        evaluator.run([1.0, torch.randn(3, 5)])
    with pytest.raises(InputError, match="input s is a float64 scalar, got Tensor"):
        evaluator.run([x, x])
    (out,) = evaluator.run([1.0, x])  # the kept binding still serves its own signature
    torch.testing.assert_close(out, torch.relu(x))


def test_the_number_of_kept_signatures_is_bounded(monkeypatch):
    monkeypatch.setattr(bindings, "MAX_SIGNATURES", 2)
    evaluator = HostIrEvaluator(parse(SCALED))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    for scale in (1.0, 2.0, 3.0, 4.0, float("nan")):
        (out,) = evaluator.run([scale, x])
        torch.testing.assert_close(out, torch.relu(x * scale), equal_nan=True)
    assert len(evaluator._bindings._by_signature) == 2
