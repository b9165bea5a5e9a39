"""``execute`` prepares once per input signature: a second call with inputs like the
first builds no evaluator, verifies nothing, binds and checks no input extents again and
(on several ranks) does not agree again; inputs of a new signature are prepared once
more. Counted, not timed: timings are for benchmarks/host_overhead.py."""

from __future__ import annotations

import collections
import contextlib
from unittest import mock

import pytest
import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import HostIrEvaluator
from hostir.check import verify
from hostir.check.extent_checks import ExtentChecks
from hostir.run import agreements, bindings


def _row_parallel(d: int) -> tuple[FusionDefinition, list]:
    """``x @ w.T`` with the contracted dim sharded over ``d`` ranks: one Allreduce."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, 4 * d))
        w = fd.define_tensor((6, 4 * d))
        fd.add_output(fd.ops.linear(x, w))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    return fd, [x, w]


@contextlib.contextmanager
def _counting() -> collections.Counter:
    """Counts evaluators built, programs verified (any verifier walk: the evaluator's,
    the parser's, the lowering's), input tensors bound, extent checks and agreements."""
    counts: collections.Counter = collections.Counter()

    def counted(name, original):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        return wrapper

    patches = [
        mock.patch.object(
            HostIrEvaluator, "__init__", counted("evaluator", HostIrEvaluator.__init__)
        ),
        mock.patch.object(verify._Walk, "__init__", counted("verify", verify._Walk.__init__)),
        mock.patch.object(ExtentChecks, "check", counted("extent checks", ExtentChecks.check)),
        mock.patch.object(
            bindings, "bind_input_tensor", counted("bound input", bindings.bind_input_tensor)
        ),
        mock.patch.object(agreements, "agree", counted("agreement", agreements.agree)),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield counts


@pytest.mark.real_ranks(
    reason="patches hostir to count calls (process-wide: ranks would count each other's)"
)
@pytest.mark.world_sizes(1, 2)
def test_repeated_executes_of_one_signature_prepare_nothing(multidevice_test) -> None:
    d, rank = multidevice_test.size, multidevice_test.rank
    fd, tvs = _row_parallel(d)
    generator = torch.Generator().manual_seed(7)
    with _counting() as counts:
        for tokens in (5, 3):  # two signatures
            before = None
            for call in range(4):
                x = torch.randn(tokens, 4 * d, generator=generator)
                w = torch.randn(6, 4 * d, generator=generator)
                (out,) = fd.execute([shard_tensor(x, tvs[0], rank), shard_tensor(w, tvs[1], rank)])
                torch.testing.assert_close(out, x @ w.T)  # new data every call, right result
                if call == 0:
                    before = dict(counts)
                else:
                    assert dict(counts) == before, f"call {call} of {tokens} tokens prepared again"
            assert before["bound input"] >= 2 and before["extent checks"] >= 1, before
    assert counts["evaluator"] == 2 and counts["verify"] >= 2, counts  # one per signature
    assert counts["agreement"] == (2 if d > 1 else 0), counts
