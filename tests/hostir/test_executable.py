"""The one run path (hostir.run.executable): one signature notion, and the self-checks on
every entry point, a program parsed from text included.

``HostIrEvaluator.run`` and ``FusionDefinition.execute`` prepare one executable per input
signature and run it again for the signature's later calls (tests/hostir/test_replay.py,
tests/frontend/test_prepared_once.py); the self-checks (``HOSTIR_CHECK_*``, read once per
evaluator) used to run only through ``execute``: here they catch, on a program parsed from
text, what they catch there."""

from __future__ import annotations

import pytest
import torch

from hostir import EvaluationError, HostIrEvaluator, Listener, RaceError, SelfChecks, parse
from hostir.run import self_checks
from hostir.run.signature import call_key, input_kinds
from tests.hostir.test_race_checker import _one_stream_program

RELU = (
    "%HostIrContainer {\n  input T0 : float32[i0, 4]\n  T1 : float32[i0, 4] = relu(T0)\n"
    "  output T1\n}\n"
)


def test_the_exact_signature_and_the_kinds():
    """``call_key``: each tensor's class, shape, dtype and device, each scalar's type and
    text (``0.0`` and ``-0.0`` differ, ``nan`` equals ``nan``), None as it is; nothing for
    an input of another kind or inputs that are not a list or tuple. ``input_kinds``:
    shapes, dtypes and device types, and the type of anything else."""
    x = torch.zeros(2, 3)
    assert call_key([x, 2], "fixed")[0] == "fixed"
    assert call_key([x]) == call_key((torch.ones(2, 3),))
    assert call_key([x]) != call_key([x.double()]) != call_key([x.t()])
    assert call_key([x, 0.0]) != call_key([x, -0.0])
    assert call_key([x, float("nan")]) == call_key([x, float("nan")])
    assert call_key([x, 1]) != call_key([x, 1.0]) != call_key([x, True])
    assert call_key([x, None]) != call_key([x, 0])
    assert call_key([x, "2"]) is None and call_key(x) is None
    assert input_kinds([x, 2, None]) == (((2, 3), torch.float32, "cpu"), int, type(None))


def test_a_negative_zero_scalar_input_is_another_signature():
    """A run with ``s = -0.0`` after one with ``0.0`` multiplies by -0.0: the binding kept
    for ``0.0`` (bound scalars included) served both before, and the result lost its sign."""
    program = parse(
        "%HostIrContainer {\n  input s : float64\n  input T0 : float32[i0, 4]\n"
        "  T1 : float32[i0, 4] = mul(T0, s)\n  output T1\n}\n"
    )
    evaluator = HostIrEvaluator(program)
    x = torch.ones(2, 4)
    (plus,) = evaluator.run([0.0, x])
    (minus,) = evaluator.run([-0.0, x])
    assert not torch.signbit(plus).any() and torch.signbit(minus).all()
    assert len(evaluator._executables) == 2


def test_a_parsed_program_is_checked_for_races():
    """The race checker of ``HOSTIR_CHECK_RACES`` listens to a parsed program's runs as to
    ``execute``'s: a stream writing into main's buffer without a synchronize races, with
    no RaceChecker passed; with the compiled check it listens to the interpreted twin."""
    program = parse(str(_one_stream_program(synchronize=False)))
    x = torch.randn(4, 3)
    for checks in (SelfChecks(races=True), SelfChecks(races=True, compiled=True)):
        with pytest.raises(RaceError, match="race on buf and buf_0"):
            HostIrEvaluator(program, checks=checks).run([x])
    (out,) = HostIrEvaluator(program, checks=SelfChecks()).run([x])  # unchecked, it runs
    torch.testing.assert_close(out, -x)


class Tampering(Listener):
    """Adds one to every result an interpreted run binds: interpreted and compiled runs
    then differ, as a bug in either would make them."""

    def after(self, instruction, context, operands) -> None:
        for name, tensor in context.tensors.items():
            if name == instruction.out.name and isinstance(tensor, torch.Tensor):
                context.tensors[name] = tensor + 1


def test_a_parsed_program_runs_compiled_against_interpreted():
    """The compiled check of ``HOSTIR_CHECK_COMPILED`` runs a parsed program's every run
    the other way too, the first and the prepared later ones, and names the output that
    differs."""
    evaluator = HostIrEvaluator(
        parse(RELU), listeners=[Tampering()], checks=SelfChecks(compiled=True)
    )
    x = torch.randn(3, 4)
    message = "output 0 of the interpreted run differs from the same program run compiled"
    with pytest.raises(EvaluationError, match=message):
        evaluator.run([x])
    quiet = HostIrEvaluator(parse(RELU), checks=SelfChecks(compiled=True))
    for _ in range(3):  # the first run, then the prepared call with its interpreted twin
        torch.testing.assert_close(quiet.run([x])[0], torch.relu(x))


def test_a_program_is_checked_through_text_and_json_when_an_evaluator_takes_it_in(
    monkeypatch,
):
    """With ``HOSTIR_CHECK_ROUND_TRIP`` an evaluator checks the program it is given (a
    parsed one, or one built in Python) once, where ``execute`` checks what it lowers."""
    checked = []
    monkeypatch.setattr(self_checks, "check_round_trip", checked.append)
    program = parse(RELU)
    evaluator = HostIrEvaluator(program, checks=SelfChecks(round_trip=True))
    evaluator.run([torch.randn(2, 4)])
    evaluator.run([torch.randn(2, 4)])
    assert checked == [program]
    HostIrEvaluator(program, checks=SelfChecks())
    assert checked == [program]


def test_checks_are_refused_unless_they_are_self_checks():
    from hostir.errors import SettingError

    with pytest.raises(SettingError, match="checks: expected hostir.run.self_checks.SelfChecks"):
        HostIrEvaluator(parse(RELU), checks={"races": True})
