"""Ops of several results (``topk``, ``sdpfa_fwd``, ``sdpfa_bwd``): one instruction defines
every result, so the kernel runs once by construction (the profiler's ``aten::`` events,
at 1, 2 and 4 ranks); it prints, parses, serializes and draws as one line; each result is
checked at run time and a replay unpacks them; lowering decides the op's layout once, keeps
it whole when one result is used, and runs it chunk by chunk in a stream loop. An op of
several results never writes into preallocated tensors: the verifier refuses it by name."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import (
    EvaluationError,
    HostIrContainer,
    HostIrEvaluator,
    ParseError,
    VerifyError,
    parse,
    to_dot,
)
from hostir.ir.opdecl import op_named
from hostir.run.implementations import IMPLEMENTATIONS, Implementation

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
    """One sdpfa_fwd instruction (output, logsumexp) makes one flash forward call, one
    sdpfa_bwd instruction (three gradients) one backward call, with torch's results, on the
    first call and on the prepared one (a replay) alike."""
    if interpreted:
        monkeypatch.setenv("HOSTIR_INTERPRET", "1")
    fd, _ = _attention_training_step()
    text = str(fd.host_ir())
    assert text.count("= sdpfa_fwd(") == 1 and text.count("= sdpfa_bwd(") == 1, text
    assert re.search(r"T4 : float32\[2, 3, 5, 8\], T5 : float32\[2, 3, 5\] = sdpfa_fwd", text)
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
    for _ in range(2):  # the first call, then the prepared one
        (values_out, indices_out), calls = _aten_calls(lambda: fd.execute([data]))
        assert calls["aten::topk"] == 1, calls
        want = torch.topk(data, 3, dim=1)
        assert torch.equal(values_out.sort(1).values, want.values.sort(1).values)
        assert torch.equal(torch.gather(data, 1, indices_out), values_out)


@pytest.mark.world_sizes(1, 2, 4)
def test_heads_sharded_attention_runs_once_per_rank(multidevice_test) -> None:
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
    assert "Allgather" not in str(fd.host_ir())  # heads compute where they are
    for got, want in zip(results, _attention_reference(*data), strict=True):
        # every result keeps the heads sharded (dim 1 of each), as its inputs
        torch.testing.assert_close(got, want.chunk(d, dim=1)[rank], rtol=1e-4, atol=1e-5)


def test_dropout_gives_output_and_logsumexp_from_one_computation() -> None:
    """With dropout the forward runs the math path once for both results: one logsumexp
    of the scores (which dropout does not change), no flash call beside it."""
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor((1, 2, 4, 8)) for _ in range(3))
        out, lse, _, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=0.25, is_causal=True)
        fd.add_output(out)
        fd.add_output(lse)
    data = [torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    (_, logsumexp), calls = _aten_calls(lambda: fd.execute(data))
    _, one = _aten_calls(lambda: torch.logsumexp(data[0], -1))  # events of one call
    assert calls["aten::logsumexp"] == one["aten::logsumexp"] and calls[FLASH] == 0, calls
    assert calls["aten::softmax"] == 1 and calls["aten::bmm"] == 2, calls  # q k^T, then v
    scores = data[0] @ data[1].transpose(-2, -1) / math.sqrt(8)
    scores = scores.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(logsumexp, torch.logsumexp(scores, -1))


TOPK = """%HostIrContainer {
  input T0 : float32[4, 9]
  T1 : float32[4, 3], T2 : int64[4, 3] = topk(T0, k=3, dim=1, largest=false, sorted=true)
  output T1
  output T2
}
"""


def test_one_line_in_text_json_and_dot() -> None:
    """The instruction prints as one line defining both results, parses back, round-trips
    through JSON, and draws as one node writing both."""
    program = parse(TOPK)
    assert str(program) == TOPK
    assert HostIrContainer.from_json(program.to_json()) == program
    source = to_dot(program).source
    assert source.count("topk(") == 1 and "T1" in source and "T2" in source


def test_a_replay_unpacks_the_results_and_each_result_is_checked(monkeypatch) -> None:
    """The replay calls topk's torch call once and unpacks its tuple; the handler checks
    each result's local shape, naming the one that is wrong."""
    program = parse(TOPK)
    evaluator = HostIrEvaluator(program)
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(34))
    for _ in range(2):
        values, indices = evaluator.run([x])
        want = torch.topk(x, 3, dim=1, largest=False, sorted=True)
        assert torch.equal(values, want.values) and torch.equal(indices, want.indices)
    assert re.search(r"v_T1, v_T2 = F0\(v_T0, 3\)", evaluator.replay_program(0).source)

    def prepare(instruction):
        return lambda src, k: (src[:, :3], torch.zeros(4, 2, dtype=torch.int64))

    broken = Implementation(decl=op_named("topk"), prepare=prepare, fresh=True)
    monkeypatch.setitem(IMPLEMENTATIONS, "topk", broken)
    with pytest.raises(EvaluationError, match=r"but T2 is declared with local shape \[4, 3\]"):
        HostIrEvaluator(parse(TOPK)).run([x])


def test_writing_several_results_into_existing_tensors_is_refused_by_name() -> None:
    """``out=[T1, T2]`` reads back, and the verifier refuses it, naming the results; a
    single ``out=`` name for two results is a parse error."""
    text = TOPK.replace(
        "  T1 : float32[4, 3], T2 : int64[4, 3] = topk(T0, k=3, dim=1, largest=false,"
        " sorted=true)\n",
        "  allocate T1 : float32[4, 3]\n  allocate T2 : int64[4, 3]\n"
        "  topk(T0, k=3, dim=1, largest=false, sorted=true, out=[T1, T2])\n",
    )
    with pytest.raises(VerifyError, match=r"topk: defines 2 results \(values, indices\); an op"):
        parse(text)
    with pytest.raises(ParseError, match=r"topk has 2 results: write out=\[values, indices\]"):
        parse(text.replace("out=[T1, T2]", "out=T1"))


def test_an_unused_result_is_defined_and_freed_at_once() -> None:
    """Only the values are used: the instruction still defines both (one kernel call), and
    the indices are freed right after it."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((4, 9))
        fd.add_output(fd.ops.topk(x, 3, dim=1, sorted=True)[0])
    text = str(fd.host_ir())
    assert "T1 : float32[4, 3], T2 : int64[4, 3] = topk(" in text
    assert "sorted=true)\n  deallocate T2\n" in text, text
    data = torch.randn(4, 9)
    (values,) = fd.execute([data])
    assert torch.equal(values, torch.topk(data, 3, dim=1).values)


@pytest.mark.world_sizes(1, 2, 4)
def test_the_layout_is_decided_once_for_both_results(multidevice_test) -> None:
    """Rows sharded, topk along the columns: both results are computed where the rows
    are, with no communication. The topk dim sharded: one Allgather before the one
    instruction. The indices asked for replicated, the values sharded: the op runs once
    sharded, and a set gathers the indices after it."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    data = torch.randn(2 * d, 12, generator=torch.Generator().manual_seed(35))
    want = torch.topk(data, 3, dim=1, sorted=True)
    for sharded, replicated, gathers in ((0, False, 0), (1, False, 1), (0, True, 1)):
        with FusionDefinition() as fd:
            x = fd.define_tensor((2 * d, 12))
            values, indices = fd.ops.topk(x, 3, dim=1, sorted=True)
            fd.add_output(values)
            fd.add_output(indices)
        x.set_device_mesh(mesh)
        x.outer_split(sharded, d)
        x.axis(sharded).parallelize(ParallelType.mesh_x)
        if replicated:
            indices.set_device_mesh(mesh)
        text = str(fd.host_ir())
        assert text.count("topk(") == 1, text
        # at d = 1 the gather is over a one-device team: a local copy, no Allgather
        assert text.count("Allgather") == (gathers if d > 1 else 0), text
        got_values, got_indices = fd.execute([shard_tensor(data, x, rank)])
        rows = want.values.chunk(d)[rank] if sharded == 0 else want.values
        torch.testing.assert_close(got_values, rows)
        rows = want.indices if replicated or sharded == 1 else want.indices.chunk(d)[rank]
        assert torch.equal(got_indices, rows)


def test_a_stream_loop_runs_the_op_once_per_chunk() -> None:
    """The rows split into two stream chunks: each iteration runs topk once on its chunk,
    and copies each result (used after the loop) into its buffer's chunk."""
    with FusionDefinition() as fd:
        x = fd.define_tensor((8, 6))
        values, indices = fd.ops.topk(x, 2, dim=1, sorted=True)
        fd.add_output(values)
        fd.add_output(indices)
    values.outer_split(0, 2)
    values.axis(0).parallelize(ParallelType.stream)
    text = str(fd.host_ir())
    assert text.count("topk(") == 1 and text.count("for j") == 2, text
    assert "set(T1_c_2, out=T1_c)" in text and "set(T2_c_2, out=T2_c)" in text, text
    assert text.count("set(") == 2, text  # the indices are chunked as the values
    data = torch.randn(8, 6, generator=torch.Generator().manual_seed(36))
    got_values, got_indices = fd.execute([data])
    want = torch.topk(data, 2, dim=1, sorted=True)
    assert torch.equal(got_values, want.values) and torch.equal(got_indices, want.indices)
