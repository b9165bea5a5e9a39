"""Multi-rank tests in a simulated world: ``HOSTIR_TEST_SIMULATE=1 pytest ...``.

With the variable set, tests/multidevice.py runs a world-size-N test (N > 1) not on a
pool of N processes but in one simulated world of N ranks in the pytest process
(hostir.comm.simulate: one thread per rank, ``default_communicator()`` answering the
thread's rank). Each rank gets its own deep copy of the test's arguments, as the pool's
workers get their own unpickled copy. A test that reaches ``torch.distributed``
itself (a real process group: ``TorchCommunicator``, ``dist.*``) is marked
``real_ranks(reason=...)`` and skipped here, by name, with its reason; so is one that
starts torch's profiler (one per process: it checks the events of a real rank's
backend). A test's ``monkeypatch`` is shared by its ranks (it is undone once, after the
test); its other arguments are copied.

Every program run a test makes is counted apart, and once the test passed its measured
traffic is compared with ``hostir traffic``'s static count of the program
(hostir.comm.simulated_traffic): a difference fails the test.
"""

from __future__ import annotations

import copy
import os
import traceback
from unittest import mock

import pytest
import torch

from hostir.comm.simulate import simulate
from hostir.comm.simulated_communicator import SimulatedCommunicator
from hostir.comm.simulated_traffic import compare_traffic
from hostir.comm.world import default_communicator
from hostir.errors import CommunicationError

SIMULATE_VARIABLE = "HOSTIR_TEST_SIMULATE"
REPORT_VARIABLE = "HOSTIR_TEST_SIMULATE_REPORT"


def simulating() -> bool:
    """Whether multi-rank tests run in a simulated world (see the module docstring)."""
    return os.environ.get(SIMULATE_VARIABLE, "") not in ("", "0")


def _left_waiting(error: BaseException) -> bool:
    """Whether ``error`` is a peer's hang report: a rank that skipped never posted what
    this one waits for (any other error still fails the test)."""
    text = str(error)
    return isinstance(error, CommunicationError) and (
        "no answer from its peers" in text or "did not reach the agreement" in text
    )


def _no_profiler(*args: object, **kwargs: object) -> None:
    """torch's profiler records one process (and crashes when threads start it at once);
    the test checks what a real run's profiler records."""
    pytest.skip("profiles a rank (torch.profiler is per process): needs real ranks")


def communicator_class() -> type:
    """The class of this rank's communicator, for a test's spy to subclass: a real rank's
    TorchCommunicator, or a simulated rank's SimulatedCommunicator."""
    return type(default_communicator())


def new_communicator(cls: type) -> object:
    """A new ``cls`` (a subclass of :func:`communicator_class`) talking for this rank, as
    ``TorchCommunicator()`` does on a real rank."""
    base = default_communicator()
    if isinstance(base, SimulatedCommunicator):
        return cls(base.world, base.rank)
    return cls()


def every_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """``[world size, *tensor.shape]``: every rank's ``tensor`` in rank order (hostir's
    allgather over the whole world, on this rank's communicator, real or simulated)."""
    communicator = default_communicator()
    world = list(range(communicator.world_size))
    communicator.prepare([world])  # every rank calls this: created once, then cached
    out = torch.empty(len(world), *tensor.shape, dtype=tensor.dtype)
    communicator.allgather(out, tensor, world).wait()
    return out


def run_simulated(item: pytest.Function, size: int) -> None:
    """Runs ``item`` as every rank of a simulated world of ``size``; fails the test with
    each failed rank's traceback, or skips it as a rank skipped it."""
    from tests.multidevice_pool import MultiDeviceTest

    marker = item.get_closest_marker("real_ranks")
    if marker is not None:
        why = marker.kwargs.get("reason", "a torch.distributed process group")
        pytest.skip(f"needs real ranks, not a simulated world: {why}")
    names = item._fixtureinfo.argnames
    kwargs = {name: item.funcargs[name] for name in names}

    def rank_main(rank: int) -> None:
        mine = {}
        for name, value in kwargs.items():
            if name == "multidevice_test":
                mine[name] = MultiDeviceTest(size, rank, size, rank, torch.device("cpu"))
            elif isinstance(value, pytest.MonkeyPatch):
                # One for all ranks: what it sets (the process's environment) is shared
                # anyway, and only the test's own one is undone after the test; a copy's
                # settings would leak into the next tests.
                mine[name] = value
            else:
                mine[name] = copy.deepcopy(value)
        item.obj(**mine)

    with mock.patch.object(torch.profiler.profile, "__init__", _no_profiler):
        run = simulate(rank_main, size, by_run=True)
    skips = [e for e in run.errors.values() if isinstance(e, pytest.skip.Exception)]
    failed = {r: e for r, e in run.errors.items() if not isinstance(e, pytest.skip.Exception)}
    if skips and all(_left_waiting(e) for e in failed.values()):
        failed = {}  # peers left waiting by the ranks that skipped: the test is a skip
    if failed:
        shown = []
        for rank in sorted(failed)[:4]:
            text = "".join(traceback.format_exception(failed[rank]))
            shown.append(f"--- rank {rank} ---\n{text}")
        more = f"\n({len(failed) - 4} more ranks failed)" if len(failed) > 4 else ""
        pytest.fail(
            f"failed in a simulated world of {size}:\n" + "\n".join(shown) + more, pytrace=False
        )
    if skips:
        raise skips[0]
    check_traffic(item.nodeid, run)


def check_traffic(nodeid: str, run: object) -> None:
    """Fails the test if a program run's measured traffic differs from its static count
    (hostir.comm.simulated_traffic); notes the comparison in ``HOSTIR_TEST_SIMULATE_REPORT``
    (a file, one line per test) if set."""
    compared = compare_traffic(run.world)
    report = os.environ.get(REPORT_VARIABLE)
    if report:
        with open(report, "a") as out:
            out.write(
                f"{nodeid}\tmatched {len(compared.matched)}\tmismatched"
                f" {len(compared.mismatched)}\tskipped {len(compared.skipped)}"
                f"\t{'; '.join(compared.skipped)}\n"
            )
    if compared.mismatched:
        pytest.fail(
            "measured traffic differs from the static count:\n" + "\n".join(compared.mismatched),
            pytrace=False,
        )
