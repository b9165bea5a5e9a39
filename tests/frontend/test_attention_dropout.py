"""Attention with dropout (``sdpfa_fwd`` / ``sdpfa_bwd`` with ``dropout_p``,
``hostir.run.attention_dropout``): the mask as documented (a ``torch.Generator`` seeded
from the philox seed and offset over the global ``[B, H, L, S]`` weights), the output and
gradients against torch autograd with that mask, heads sharded over 2 and 4 ranks, and
the refusals at definition."""

from __future__ import annotations

import math
import re

import pytest
import torch

from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    OperandError,
    ParallelType,
    shard_tensor,
)
from hostir import HostIrError, parse
from hostir.run.creation import generator_seed
from tests.multidevice_simulated import every_ranks

P = 0.25
SHAPE_Q, SHAPE_KV = (2, 4, 6, 8), (2, 4, 5, 8)


def _documented_mask(seed: int, offset: int, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The keep mask as docs/ops.md writes it, independently of the implementation."""
    generator = torch.Generator().manual_seed(generator_seed(seed, offset))
    return torch.rand(shape, generator=generator) >= p


def _reference(q, k, v, grad, keep, p, is_causal):
    """torch autograd through the math attention with ``keep`` applied (Float)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, -math.inf)
    out = (torch.softmax(scores, -1) * keep / (1 - p)) @ v
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


def _fusion(p):
    """sdpfa_fwd with dropout (causal) and its sdpfa_bwd from the forward's philox tensors."""
    with FusionDefinition() as fd:
        q = fd.define_tensor(SHAPE_Q)
        k, v = fd.define_tensor(SHAPE_KV), fd.define_tensor(SHAPE_KV)
        grad = fd.define_tensor(SHAPE_Q)
        dropout_p = fd.define_scalar(p, dtype=DataType.Double)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(q, k, v, dropout_p=dropout_p, is_causal=True)
        grads = fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, dropout_p, True, seed, offset, None)
        for tv in (out, *grads, seed, offset):
            fd.add_output(tv)
    return fd, (q, k, v, grad), (out, *grads, seed, offset)


def _data():
    generator = torch.Generator().manual_seed(21)
    shapes = (SHAPE_Q, SHAPE_KV, SHAPE_KV, SHAPE_Q)
    return [torch.randn(shape, generator=generator) for shape in shapes]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="runs dropout on CUDA: needs a CUDA GPU"
            ),
        ),
    ],
)
def test_forward_and_backward_use_the_documented_mask(device: str) -> None:
    """The output and the three gradients equal torch autograd's with the documented mask
    of the returned seed and offset (the same mask on CUDA: it is drawn on the CPU); the
    keep rate is about 1 - p; the seed comes from torch's default generator (reproducible
    after manual_seed) and differs between runs."""
    fd, _, _ = _fusion(P)
    data = _data()
    torch.manual_seed(3)
    results = fd.execute([t.to(device) for t in data])
    assert results[0].device.type == device
    out, grad_q, grad_k, grad_v, seed, offset = (t.cpu() for t in results)
    # torch 2.7's form: the state (seed, offset) uint64 [2], the unused offset uint64 [].
    assert seed.dtype == offset.dtype == torch.uint64 and seed.shape == (2,) and offset.dim() == 0
    state = seed.to(torch.int64).tolist()
    assert state[1] == 0 and int(offset.to(torch.int64)) == 0 and state[0] != 0
    keep = _documented_mask(*state, (*SHAPE_Q[:-1], SHAPE_KV[-2]), P)
    assert abs(keep.float().mean().item() - (1 - P)) < 0.08  # 240 weights
    for got, want in zip(
        (out, grad_q, grad_k, grad_v), _reference(*data, keep, P, True), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    on_device = [t.to(device) for t in data]
    torch.manual_seed(3)
    again = fd.execute(on_device)
    assert torch.equal(again[4].cpu(), seed) and torch.equal(again[0].cpu(), out)
    assert not torch.equal(fd.execute(on_device)[4].cpu(), seed)  # the generator moved on


@pytest.mark.world_sizes(2, 4)
def test_heads_sharded_use_their_slice_of_the_mask(multidevice_test) -> None:
    """Heads split over the ranks: each rank's output and gradients are the slice of the
    single-device result for the same seed (a rank's mask is the slice of the global one),
    nothing is communicated, and the ranks drew the same seed."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    data = _data()
    fd, inputs, outputs = _fusion(P)
    for tv in (*inputs, *outputs[:4]):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    for tv in outputs[4:]:
        tv.set_device_mesh(mesh)
    torch.manual_seed(5)  # every rank's default generator in one state: one seed
    results = fd.execute([shard_tensor(t, tv, rank) for t, tv in zip(data, inputs, strict=True)])
    state = results[4].to(torch.int64)
    keep = _documented_mask(*state.tolist(), (*SHAPE_Q[:-1], SHAPE_KV[-2]), P)
    for got, want, tv in zip(
        results[:4], _reference(*data, keep, P, True), outputs[:4], strict=True
    ):
        torch.testing.assert_close(got, shard_tensor(want, tv, rank), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(s, state) for s in every_ranks(state))
    text = str(fd.host_ir())
    assert not any(c in text for c in ("Allgather", "Allreduce", "AllToAll")), text


def _qkv(fd):
    return [fd.define_tensor((1, 2, 4, 8)) for _ in range(3)]


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda fd: fd.ops.sdpfa_fwd(*_qkv(fd), dropout_p=1.0), "dropout_p = 1.0 is out of range"),
        (lambda fd: fd.ops.sdpfa_fwd(*_qkv(fd), dropout_p=-0.1), "dropout_p = -0.1 is out of"),
        (
            lambda fd: fd.ops.sdpfa_fwd(
                *_qkv(fd), dropout_p=fd.define_scalar(dtype=DataType.Double)
            ),
            "dropout_p s0 is a fusion input",
        ),
        (
            lambda fd: fd.ops.sdpfa_bwd(
                *_qkv(fd)[:1],
                *_qkv(fd),
                fd.define_tensor((1, 2, 4, 8)),
                fd.define_tensor((1, 2, 4)),
                0.1,
                False,
                fd.define_tensor((), dtype=DataType.Int),
                fd.define_tensor((), dtype=DataType.Int),
                None,
            ),
            "philox_seed T8 is Int []; with dropout it must be sdpfa_fwd's, torch 2.7's form:"
            " a UInt64 [2] tensor",
        ),
        (
            lambda fd: fd.ops.sdpfa_bwd(
                *_qkv(fd)[:1],
                *_qkv(fd),
                fd.define_tensor((1, 2, 4, 8)),
                fd.define_tensor((1, 2, 4)),
                0.1,
                False,
                fd.define_tensor((2,), dtype=DataType.UInt64),
                fd.define_tensor((2,), dtype=DataType.UInt64),
                None,
            ),
            "philox_offset T9 is UInt64 [2]; with dropout it must be sdpfa_fwd's, torch 2.7's"
            " form: a UInt64 [] tensor",
        ),
    ],
)
def test_dropout_refusals_at_definition(build, fragment: str) -> None:
    """A probability out of [0, 1), a non-constant one, and (with dropout) philox tensors
    other than sdpfa_fwd's are OperandErrors when the op is defined."""
    with pytest.raises(OperandError) as caught, FusionDefinition() as fd:
        build(fd)
    assert fragment in str(caught.value), str(caught.value)


def test_no_dropout_keeps_the_flash_kernel_and_zero_philox() -> None:
    """dropout_p 0 is no dropout: the instruction has no dropout fields, the philox
    tensors are 0 and the output is torch's flash kernel's (bit-equal)."""
    with FusionDefinition() as fd:
        q, k, v = _qkv(fd)
        out, _, seed, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=fd.define_scalar(0.0))
        fd.add_output(out)
        fd.add_output(seed)
    data = [torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    result, seed_value = fd.execute(data)
    assert "dropout" not in str(fd.host_ir()).replace("dropout=false", "")
    assert seed_value.dtype == torch.uint64 and seed_value.shape == (2,)
    assert seed_value.to(torch.int64).tolist() == [0, 0]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*data, 0.0, False)[0]
    assert torch.equal(result, flash)


def test_the_dropout_instructions_print_and_parse_back() -> None:
    """The lowered program names the dropout and the philox tensors it reads, and its text
    parses back to the same program."""
    fd, _, _ = _fusion(P)
    text = str(fd.host_ir())
    assert "sdpfa_philox(result=philox_seed, dropout=true)" in text, text
    # One instruction defines the output and the logsumexp (dropout does not change it).
    assert text.count("= sdpfa_fwd(") == 1, text
    assert "is_causal=true, dropout_p=0.25, philox_seed=T4" in text, text
    assert str(parse(text)) == text


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("dropout_p=1.5, philox_seed=S, philox_offset=S", "in (0, 1)"),
        ("dropout_p=0.5, philox_seed=T0, philox_offset=S", "philox_seed must"),
        ("dropout_p=0.5", "philox_seed must be a uint64 [2] tensor (torch 2.7's form)"),
        ("dropout_p=0.5, philox_seed=U, philox_offset=U", "philox_offset must be a uint64 []"),
        ("philox_seed=S, philox_offset=S", "read only with dropout_p"),
    ],
)
def test_the_verifier_checks_the_dropout_fields(line: str, fragment: str) -> None:
    """Hand-written host IR with a probability out of range, or wrong or missing philox
    tensors, is refused by the verifier."""
    text = f"""%HostIrContainer {{
  input S : int64[]
  input U : uint64[2]
  input T0 : float32[1, 2, 4, 8]
  T1 : float32[1, 2, 4, 8], T2 : float32[1, 2, 4] = sdpfa_fwd(T0, T0, T0, {line})
  output T1
}}
"""
    with pytest.raises(HostIrError, match=re.escape(fragment)):
        parse(text)


def test_a_stream_split_head_with_dropout_is_refused_by_name() -> None:
    """A stream chunk would not know where its weights lie in the global mask: a
    stream-parallel head axis (allowed without dropout) is refused when lowered."""
    with FusionDefinition() as fd:
        q, k, v = _qkv(fd)
        out, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, dropout_p=0.5)
        fd.add_output(out)
    q.outer_split(1, 2)
    q.axis(1).parallelize(ParallelType.stream)
    expected = "attention with dropout takes its mask by the global index of each weight, so"
    with pytest.raises(HostIrError, match=expected):
        fd.host_ir()
