"""Ops of several results computed once per run (hostir.run.shared_results): the sibling
instructions of ``sdpfa_fwd``, ``sdpfa_bwd`` and ``topk`` that keep different results
share one kernel call (the profiler's ``aten::`` events), give torch's results, keep
nothing after the last sibling, and never share across operands that changed."""

from __future__ import annotations

import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import parse
from hostir.run.shared_results import shared

FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


@pytest.fixture(autouse=True)
def _one_run_per_call(monkeypatch):
    """The suite's HOSTIR_CHECK_COMPILED runs every call a second time (the other way):
    off here, so that the profiler counts one run's calls."""
    monkeypatch.setenv("HOSTIR_CHECK_COMPILED", "0")


def _aten_calls(run) -> tuple[list, Counter]:
    """``run()``'s result and how often each aten op ran under it."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        result = run()
    return result, Counter(event.name for event in profile.events())


def _attention_training_step():
    """sdpfa_fwd (output and logsumexp used) and sdpfa_bwd (three gradients used)."""
    with FusionDefinition() as fd:
        q, k, v, grad = (fd.define_tensor((2, 3, 5, 8)) for _ in range(4))
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)
        grads = fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, 0.0, True, seed, offset, None)
        for tv in (out, lse, *grads):
            fd.add_output(tv)
    return fd, (q, k, v, grad)


def _attention_reference(q, k, v, grad):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(grad)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).detach()
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    return out.detach(), torch.logsumexp(scores, -1), q.grad, k.grad, v.grad


@pytest.mark.parametrize("interpreted", [False, True], ids=["compiled", "interpreted"])
def test_attention_forward_and_backward_run_once_each(monkeypatch, interpreted: bool) -> None:
    """Two sdpfa_fwd instructions (output, logsumexp) make one flash forward call, three
    sdpfa_bwd instructions one backward call, with torch's results, on the first call
    and on the prepared one alike."""
    if interpreted:
        monkeypatch.setenv("HOSTIR_INTERPRET", "1")
    fd, _ = _attention_training_step()
    text = str(fd.host_ir())
    assert text.count("= sdpfa_fwd(") == 2 and text.count("= sdpfa_bwd(") == 3, text
    generator = torch.Generator().manual_seed(31)
    data = [torch.randn(2, 3, 5, 8, generator=generator) for _ in range(4)]
    for _ in range(2):  # the first call, then the prepared one
        results, calls = _aten_calls(lambda: fd.execute(data))
        assert calls[FLASH] == 1 and calls[FLASH + "_backward"] == 1, calls
        for got, want in zip(results, _attention_reference(*data), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_topk_values_and_indices_run_once() -> None:
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 9))
        values, indices = fd.ops.topk(x, 3, dim=1)
        fd.add_output(values)
        fd.add_output(indices)
    data = torch.randn(4, 9, generator=torch.Generator().manual_seed(32))
    (values_out, indices_out), calls = _aten_calls(lambda: fd.execute([data]))
    assert calls["aten::topk"] == 1, calls
    want = torch.topk(data, 3, dim=1)
    assert torch.equal(values_out.sort(1).values, want.values.sort(1).values)
    assert torch.equal(torch.gather(data, 1, indices_out), values_out)


@pytest.mark.world_sizes(1, 2, 4)
def test_heads_sharded_attention_shares_per_rank(multidevice_test) -> None:
    """Heads sharded over the ranks: each rank computes its heads' forward and backward
    once, and its shards are torch's."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        tvs = [fd.define_tensor((2, 2 * d, 5, 8)) for _ in range(4)]
        out, lse, seed, offset = fd.ops.sdpfa_fwd(*tvs[:3], is_causal=True)
        grads = fd.ops.sdpfa_bwd(tvs[3], *tvs[:3], out, lse, 0.0, True, seed, offset, None)
        for tv in (out, lse, *grads):
            fd.add_output(tv)
    for tv in tvs:
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    generator = torch.Generator().manual_seed(33)
    data = [torch.randn(2, 2 * d, 5, 8, generator=generator) for _ in range(4)]
    local = [shard_tensor(t, tv, rank) for t, tv in zip(data, tvs, strict=True)]
    results, calls = _aten_calls(lambda: fd.execute(local))
    assert calls[FLASH] == 1 and calls[FLASH + "_backward"] == 1, calls
    for got, want in zip(results, _attention_reference(*data), strict=True):
        # every result keeps the heads sharded (dim 1 of each), as its inputs
        torch.testing.assert_close(got, want.chunk(d, dim=1)[rank], rtol=1e-4, atol=1e-5)


class _Runner:
    def __init__(self, count: int) -> None:
        self.count = count

    def siblings(self, instruction) -> int:
        return self.count


def _context(count: int) -> SimpleNamespace:
    return SimpleNamespace(runner=_Runner(count), shared_results={}, current_stream="main")


def _instruction():
    """``T1 = topk(T0, k=3, dim=1)``, parsed."""
    (topk,) = parse(
        "%HostIrContainer {\n  input T0 : float32[4, 9]\n"
        "  T1 : float32[4, 3] = topk(T0, k=3, dim=1, largest=true, sorted=false,"
        " result=values)\n  output T1\n}\n"
    ).body
    return topk


def test_the_last_sibling_takes_the_entry_and_a_changed_operand_computes_again() -> None:
    context, instruction = _context(3), _instruction()
    x = torch.randn(4, 9)
    made = []

    def compute():
        made.append(1)
        return (x.clone(),)

    first = shared(context, instruction, {"src": x}, compute)
    assert len(context.shared_results) == 1
    assert shared(context, instruction, {"src": x}, compute) is first
    assert shared(context, instruction, {"src": x}, compute) is first
    assert context.shared_results == {} and len(made) == 1  # the third sibling took it
    shared(context, instruction, {"src": x}, compute)
    x.add_(1)  # written in place: its version moves on
    shared(context, instruction, {"src": x}, compute)
    shared(context, instruction, {"src": x.clone()}, compute)  # another tensor
    assert len(made) == 4
    context.current_stream = "stream 1"  # made on another stream: not ordered here
    shared(context, instruction, {"src": x}, compute)
    assert len(made) == 5
    alone = _context(1)
    shared(alone, instruction, {"src": x}, compute)
    assert alone.shared_results == {} and len(made) == 6  # one instruction keeps nothing
