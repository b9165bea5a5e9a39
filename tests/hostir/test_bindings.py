"""hostir.run.bindings: a binding is reused only for inputs of the same signature, so a
run with other inputs is bound and checked in full, and one that fails is never kept."""

from __future__ import annotations

import pytest
import torch

from frontend import FusionDefinition
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
    assert len(evaluator._executables) == 2  # one binding each


RELU = (
    "%HostIrContainer {\n  input T0 : float32[i0, 4]\n  T1 : float32[i0, 4] = relu(T0)\n"
    "  output T1\n}\n"
)


def _relu_fusion() -> FusionDefinition:
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.relu(fd.define_tensor((-1, 4))))
    return fd


@pytest.mark.parametrize("entry", ["execute", "run"])
def test_a_prepared_call_is_not_taken_by_inputs_of_another_dtype(entry, monkeypatch):
    """An all-tensor program (it takes prepared calls: a scalar input does not) run with
    float32, then float64 of the same shape, refuses the float64 input by name through
    ``FusionDefinition.execute`` and ``HostIrEvaluator.run``. With the dtype left out of
    ``call_key`` the float64 call took the float32 call's prepared call and returned a
    float64 result. The suite's checks are off, as a user runs: the compiled check's
    interpreted twin would bind the input and refuse it, hiding the prepared call's
    fault."""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")
    monkeypatch.setenv("HOSTIR_CHECK_RACES", "0")  # the race checker listens: no prepared call
    call = _relu_fusion().execute if entry == "execute" else HostIrEvaluator(parse(RELU)).run
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(6))
    for _ in range(2):  # the second call runs the prepared call
        (out,) = call([x])
        torch.testing.assert_close(out, torch.relu(x))
    with pytest.raises(InputError, match="T0 must have dtype float32, got float64"):
        call([x.double()])
    (out,) = call([x])
    torch.testing.assert_close(out, torch.relu(x))
