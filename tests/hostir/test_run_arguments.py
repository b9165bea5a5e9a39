"""``HostIrEvaluator``'s arguments and ``run``'s: each wrong one is named (SettingError,
VerifyError for the program, InputError for the inputs), never a TypeError or a torch
RuntimeError from inside the run; a rank refusing its inputs tells its peers.
"""

from __future__ import annotations

import pytest
import torch

from hostir import HostIrEvaluator
from hostir.errors import InputError, PeerFailureError, SettingError, VerifyError
from tests.fault_catalog import full_inputs, local_inputs, row_parallel


@pytest.fixture(scope="module")
def program():
    """The row-parallel linear on one device: inputs x [i0, 8] and w [8, 8]."""
    fd, _, _ = full_inputs(row_parallel, 1)
    return fd.host_ir()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"device": "banana"}, "device='banana': expected a device name like 'cpu'"),
        ({"device": 3}, "device: expected a torch.device or a name"),
        ({"streams": 33}, "streams: expected a positive integer, got 33 (at most 32)"),
        ({"pipeline": "yes"}, "pipeline: expected True, False or None, got 'yes'"),
        ({"listeners": None}, "listeners: expected a list of hostir.Listener, got NoneType"),
        ({"listeners": [object()]}, "listeners[0] (object) has no before, after, finish"),
        ({"communicator": "world"}, "communicator: expected a hostir.Communicator"),
    ],
    ids=lambda value: None if isinstance(value, dict) else value.split(":")[0][:16],
)
def test_a_bad_evaluator_option_is_named(program, options, message):
    with pytest.raises(SettingError) as info:
        HostIrEvaluator(program, **options)
    assert message in str(info.value)


def test_a_cuda_device_this_machine_lacks_is_named(program):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(SettingError, match=f"this machine has {count} CUDA device"):
        HostIrEvaluator(program, device=f"cuda:{count}")


@pytest.mark.parametrize("given", [None, "text", 42])
def test_a_program_that_is_not_a_program_is_named(given):
    with pytest.raises(VerifyError, match="program must be a HostIrContainer"):
        HostIrEvaluator(given)


@pytest.mark.parametrize(
    "inputs",
    [None, 42, "ab", {"x": 1}, torch.randn(6, 8), iter([])],
    ids=["None", "int", "str", "dict", "tensor", "iterator"],
)
def test_inputs_that_are_not_a_list_are_named(program, inputs):
    """A tensor would have been iterated into rows, a dict into keys."""
    with pytest.raises(InputError, match=r"^run: inputs must be a list or tuple .* got"):
        HostIrEvaluator(program).run(inputs)


def test_a_huge_timeout_is_named_and_the_evaluator_still_runs(program):
    """``timeout=1e308`` overflowed datetime.timedelta (OverflowError)."""
    evaluator = HostIrEvaluator(program)
    x, w = torch.randn(6, 8), torch.randn(8, 8)
    with pytest.raises(SettingError, match="^timeout: expected a positive number of seconds"):
        evaluator.run([x, w], timeout=1e308)
    (out,) = evaluator.run((x, w))
    torch.testing.assert_close(out, x @ w.T)


@pytest.mark.world_sizes(2)
def test_a_rank_passing_none_for_its_inputs_stops_its_peers_by_name(multidevice_test):
    """Rank 1 passes None instead of its inputs: it raises InputError, and rank 0 hears of it
    through the agreement (PeerFailureError naming rank 1: a wait for it would end in a
    CommunicationError after the timeout). Both then run good inputs and match torch."""
    rank = multidevice_test.rank
    fd, tvs, full = full_inputs(row_parallel, multidevice_test.size)
    evaluator = HostIrEvaluator(fd.host_ir())
    if rank == 1:
        with pytest.raises(InputError, match="inputs must be a list or tuple"):
            evaluator.run(None)
    else:
        with pytest.raises(PeerFailureError, match="rank 1: InputError: run: inputs must be"):
            evaluator.run(local_inputs(tvs, full, rank))
    (out,) = evaluator.run(local_inputs(tvs, full, rank))
    torch.testing.assert_close(out, full[0] @ full[1].T, rtol=1e-5, atol=1e-5)
