"""The attention and MoE ops (``frontend.attention_ops``) and linear/matmul's ranks and dtype
rule against torch on random data: unsharded, sharded over 1, 2 and 4 ranks (with the
collectives each sharding needs, read off the host IR), and the refusals at definition."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from frontend import (
    DataType,
    DeviceMesh,
    FusionDefinition,
    OperandError,
    ParallelType,
    shard_tensor,
)
from hostir import HostIrError, parse
from hostir.run.attention import (
    FLASH_HEAD_DIMS,
    attention_backward,
    attention_forward,
    attention_math,
    attention_math_backward,
    cuda_flash,
)

BF16, F32 = torch.bfloat16, torch.float32
I32, INT, FLOAT = DataType.Int32, DataType.Int, DataType.Float
X = ParallelType.mesh_x
NEEDS_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="runs the CUDA attention kernels: needs a CUDA GPU"
)


def _shard(tv, mesh: DeviceMesh, dim: int) -> None:
    """``tv``'s dim ``dim`` split over the mesh's ranks (outer split, mesh_x)."""
    tv.set_device_mesh(mesh)
    tv.outer_split(dim, mesh.size)
    tv.axis(dim).parallelize(X)


def _replicate(tv, mesh: DeviceMesh) -> None:
    tv.set_device_mesh(mesh)


def _attention_reference(q, k, v, grad, is_causal: bool, scale: float | None):
    """torch's attention, its logsumexp and its gradients, in Float."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    out.backward(grad.float())
    scores = q @ k.transpose(-2, -1) * (scale or 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return out.detach(), torch.logsumexp(scores, -1).detach(), q.grad, k.grad, v.grad


def _attention_fusion(shape_q, shape_kv, dtype, is_causal, scale, outputs=("all",)):
    """sdpfa_fwd and sdpfa_bwd on inputs q, k, v, grad of the given shapes."""
    with FusionDefinition() as fd:
        dt = DataType.from_torch(dtype)
        q = fd.define_tensor(shape_q, dtype=dt)
        k, v = fd.define_tensor(shape_kv, dtype=dt), fd.define_tensor(shape_kv, dtype=dt)
        grad = fd.define_tensor(shape_q, dtype=dt)
        causal = fd.define_scalar(is_causal, dtype=DataType.Bool)
        out, lse, seed, offset = fd.ops.sdpfa_fwd(
            q, k, v, dropout_p=fd.define_scalar(0.0), is_causal=causal, scale=scale
        )
        grads = fd.ops.sdpfa_bwd(grad, q, k, v, out, lse, 0.0, causal, seed, offset, scale)
        for tv in (out, lse, *grads, seed, offset):
            fd.add_output(tv)
    return fd, (q, k, v, grad), (out, lse, *grads, seed, offset)


@pytest.mark.parametrize(
    ("dtype", "is_causal", "scale", "batch", "keys"),
    [
        (BF16, True, None, (2,), 7),
        (BF16, True, 0.5, (2,), 5),
        (BF16, False, None, (3,), 7),
        (F32, False, 0.3, (2, 3), 7),
    ],
    ids=["bf16-causal", "bf16-causal-square", "bf16-more-keys", "f32-scale-5d"],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
def test_sdpa_against_torch(dtype, is_causal, scale, batch, keys, device) -> None:
    """Output, logsumexp and gradients match torch's attention (5-d: two batch dims);
    the philox seed and offset are torch 2.7's UInt64 ``[2]`` and ``[]`` zeros. The causal
    mask is top-left aligned when there are more keys than queries (5 queries, 7 keys), as
    torch's. On CUDA,
    BFloat16 runs the flash kernels (bf16-causal-square, bf16-more-keys) and the matmul
    path where the flash kernel's causal mask would be bottom-right aligned (bf16-causal),
    Float the matmul path."""
    generator = torch.Generator().manual_seed(3)
    shape_q, shape_kv = (*batch, 2, 5, 8), (*batch, 2, keys, 8)
    q, grad = (torch.randn(shape_q, generator=generator).to(dtype) for _ in range(2))
    k, v = (torch.randn(shape_kv, generator=generator).to(dtype) for _ in range(2))
    fd, _, _ = _attention_fusion(shape_q, shape_kv, dtype, is_causal, scale)
    results = fd.execute([t.to(device) for t in (q, k, v, grad)])
    for got in results[:5]:
        assert got.device.type == device
    results = [t.cpu() for t in results]
    expected = _attention_reference(q, k, v, grad, is_causal, scale)
    tolerance = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == BF16 else {"rtol": 1e-4, "atol": 1e-5}
    for got, want, dt in zip(results[:5], expected, (dtype, F32, dtype, dtype, dtype), strict=True):
        assert got.dtype == dt
        torch.testing.assert_close(got.float(), want, **tolerance)
    seed, offset = results[5:]  # torch 2.7's form: the state [2] and an unused []
    assert seed.shape == (2,) and offset.shape == ()
    assert seed.dtype == offset.dtype == torch.uint64
    assert seed.to(torch.int64).tolist() == [0, 0] and int(offset.to(torch.int64)) == 0


def test_sdpa_unused_results_are_not_computed_and_layout_follows_the_query() -> None:
    """Only the output is used: one sdpfa_fwd, no logsumexp or philox instruction. A query
    laid out [B, S, H, E] gives an output laid out so too (nvFuser's relayout)."""
    with FusionDefinition() as fd:
        q = fd.define_tensor((1, 2, 4, 8), stride_order=[3, 1, 2, 0])
        out, _, _, _ = fd.ops.sdpfa_fwd(q, q, q)
        fd.add_output(out)
    text = str(fd.host_ir())
    assert text.count("sdpfa_fwd") == 1 and "logsumexp" not in text and "philox" not in text
    query = torch.randn(1, 4, 2, 8).transpose(1, 2)  # [B, H, S, E] viewed from [B, S, H, E]
    (result,) = fd.execute([query])
    assert result.transpose(1, 2).is_contiguous()
    torch.testing.assert_close(result, F.scaled_dot_product_attention(query, query, query))


def _build(build: Callable) -> None:
    with FusionDefinition() as fd:
        build(fd)


def _bf(fd, *shape, dtype=DataType.BFloat16):
    return fd.define_tensor(shape, dtype=dtype)


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (
            lambda fd: fd.ops.sdpfa_fwd(*[_bf(fd, 1, 2, 4, 8)] * 3, dropout_p=1.0),
            ("sdpfa_fwd", "dropout_p = 1.0 is out of range"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(
                *[_bf(fd, 1, 2, 4, 8)] * 3, dropout_p=fd.define_scalar(dtype=DataType.Double)
            ),
            ("sdpfa_fwd", "dropout_p s0 is a fusion input"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(*[_bf(fd, 1, 2, 4, 8)] * 3, is_causal=1),
            ("sdpfa_fwd", "is_causal must be a bool constant"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(*[_bf(fd, 1, 2, 4, 8)] * 3, mask=_bf(fd, 1, 2, 4, 4)),
            ("sdpfa_fwd", "mask is not supported"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(_bf(fd, 2, 4, 8), _bf(fd, 2, 4, 8), _bf(fd, 2, 4, 8)),
            ("sdpfa_fwd", "query T0 has 3 dims", "[*N, H, L, E]"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(
                _bf(fd, 1, 2, 4, 8), _bf(fd, 1, 2, 6, 8), _bf(fd, 1, 2, 6, 4)
            ),
            ("sdpfa_fwd", "T0 dim 3 has extent 8", "T2 dim 3 has extent 4"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(
                _bf(fd, 1, 2, 4, 8), _bf(fd, 1, 2, 6, 8), _bf(fd, 1, 2, 5, 8)
            ),
            ("sdpfa_fwd", "T1 dim 2 has extent 6", "T2 dim 2 has extent 5"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(*[_bf(fd, 1, 2, 4, 8, dtype=DataType.Double)] * 3),
            ("sdpfa_fwd", "query T0 is Double", "Half, BFloat16 or Float"),
        ),
        (
            lambda fd: fd.ops.sdpfa_fwd(
                _bf(fd, 1, 2, 4, 8), _bf(fd, 1, 2, 4, 8, dtype=DataType.Half), _bf(fd, 1, 2, 4, 8)
            ),
            ("sdpfa_fwd", "key T1 is Half", "query T0 is BFloat16"),
        ),
        (
            lambda fd: fd.ops.sdpfa_bwd(
                *[_bf(fd, 1, 2, 4, 8)] * 5,
                _bf(fd, 1, 2, 4, 8),
                0.0,
                True,
                _bf(fd, dtype=INT),
                _bf(fd, dtype=INT),
                None,
            ),
            ("sdpfa_bwd", "logsumexp T1 must be sdpfa_fwd's logsumexp"),
        ),
        (
            lambda fd: fd.ops.sdpfa_bwd(
                *[_bf(fd, 1, 2, 4, 8)] * 5,
                _bf(fd, 1, 2, 4, dtype=FLOAT),
                0.0,
                True,
                7,
                _bf(fd, dtype=INT),
                None,
            ),
            ("sdpfa_bwd", "philox_seed must be a TensorView, got 7"),
        ),
        (
            lambda fd: fd.ops.grouped_mm(_bf(fd, 2, 4, 8), _bf(fd, 2, 8, 3), _bf(fd, 2, dtype=I32)),
            ("grouped_mm", "3 dims", "two 3-d operands: use matmul"),
        ),
        (
            lambda fd: fd.ops.grouped_mm(_bf(fd, 4, 8), _bf(fd, 2, 8, 3), _bf(fd, 2, dtype=INT)),
            ("grouped_mm", "offsets T2 must be a 1-d Int32 tensor"),
        ),
        (
            lambda fd: fd.ops.grouped_mm(_bf(fd, 4, 8), _bf(fd, 3, 8, 3), _bf(fd, 2, dtype=I32)),
            ("grouped_mm", "T2 dim 0 has extent 2", "T1 dim 0 has extent 3"),
        ),
        (
            lambda fd: fd.ops.grouped_mm(_bf(fd, 4, 8), _bf(fd, 2, 7, 3), _bf(fd, 2, dtype=I32)),
            ("grouped_mm", "T0 dim 1 has extent 8", "T1 dim 1 has extent 7"),
        ),
        (
            lambda fd: fd.ops.grouped_mm(
                _bf(fd, 4, 8), _bf(fd, 2, 8, 3, dtype=FLOAT), _bf(fd, 2, dtype=I32)
            ),
            ("grouped_mm", "mat1 T0 is BFloat16 but mat2 T1 is Float"),
        ),
        (
            lambda fd: fd.ops.embedding_fwd(_bf(fd, 4, dtype=FLOAT), _bf(fd, 9, 3)),
            ("embedding_fwd", "input T0 is Float; expected Int or Int32"),
        ),
        (
            lambda fd: fd.ops.embedding_fwd(_bf(fd, 4, dtype=INT), _bf(fd, 9, 3), max_norm=1.0),
            ("embedding_fwd", "max_norm is not supported"),
        ),
        (
            lambda fd: fd.ops.embedding_fwd(_bf(fd, 4, dtype=INT), _bf(fd, 9, 3), padding_idx=9),
            ("embedding_fwd", "padding_idx 9 is out of range for 9 rows"),
        ),
        (
            lambda fd: fd.ops.linear(_bf(fd, 4, 8), _bf(fd, 2, 5, 8), _bf(fd, 3, 5)),
            ("linear: T2 dim 0 has extent 3 but T1 dim 0 has extent 2",),
        ),
        (
            lambda fd: fd.ops.matmul(
                _bf(fd, 4, dtype=DataType.Bool), _bf(fd, 4, dtype=DataType.Bool)
            ),
            ("matmul", "T0 is bool", "cast it first"),
        ),
    ],
)
def test_refusals_at_definition(build: Callable, fragments: tuple[str, ...]) -> None:
    """Each refusal is an OperandError when the op is defined, naming the op, the tensor
    or scalar and what was expected."""
    with pytest.raises(OperandError) as caught:
        _build(build)
    for fragment in fragments:
        assert fragment in str(caught.value), (fragment, str(caught.value))


def _groups(offsets: list[int]) -> list[tuple[int, int]]:
    return list(zip([0, *offsets[:-1]], offsets, strict=True))


def _grouped_reference(a: torch.Tensor, b: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    """grouped_mm by a loop over groups, in Float."""
    a, b = a.float(), b.float()
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(_groups(offsets))])
    if a.dim() == 3:
        return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(_groups(offsets))], dim=1)
    return torch.stack([a[:, s:e] @ b[s:e] for s, e in _groups(offsets)])


@pytest.mark.parametrize(
    ("shape1", "shape2"),
    [((10, 8), (3, 8, 4)), ((3, 5, 8), (8, 10)), ((5, 10), (10, 4))],
    ids=["rows", "columns", "contraction"],
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])
def test_grouped_mm_forms(shape1, shape2, device) -> None:
    """The three forms of grouped_mm in BFloat16 against a loop over the groups."""
    generator = torch.Generator().manual_seed(4)
    a = torch.randn(shape1, generator=generator).to(BF16)
    b = torch.randn(shape2, generator=generator).to(BF16)
    offsets = [3, 7, 10]
    with FusionDefinition() as fd:
        ta, tb = _bf(fd, *shape1), _bf(fd, *shape2)
        fd.add_output(fd.ops.grouped_mm(ta, tb, _bf(fd, 3, dtype=I32)))
    inputs = [a, b, torch.tensor(offsets, dtype=torch.int32)]
    (out,) = fd.execute([t.to(device) for t in inputs])
    assert out.dtype == BF16 and out.device.type == device
    out = out.cpu()
    torch.testing.assert_close(out.float(), _grouped_reference(a, b, offsets), rtol=2e-2, atol=5e-2)


def test_embedding_linear_and_matmul_ranks() -> None:
    """embedding_fwd with Int32 indices; linear with a [W, N, K] weight and a [W, N] or [N]
    bias; matmul with 1-d operands: all against torch, dtypes the operands' one dtype."""
    generator = torch.Generator().manual_seed(6)
    indices = torch.randint(0, 9, (2, 4), generator=generator, dtype=torch.int32)
    table, x = torch.randn(9, 3, generator=generator), torch.randn(4, 8, generator=generator)
    w, bias, bias_n = (torch.randn(s, generator=generator) for s in ((2, 5, 8), (2, 5), (5,)))
    vec = torch.randn(8, generator=generator)
    with FusionDefinition() as fd:
        ti = fd.define_tensor((2, 4), dtype=I32)
        tt, tx, tw = fd.define_tensor((9, 3)), fd.define_tensor((4, 8)), fd.define_tensor((2, 5, 8))
        tb, tbn, tv = fd.define_tensor((2, 5)), fd.define_tensor((5,)), fd.define_tensor((8,))
        outs = [
            fd.ops.embedding_fwd(ti, tt, padding_idx=0, sparse=False),
            fd.ops.linear(tx, tw, tb),
            fd.ops.linear(tx, tw, tbn),
            fd.ops.matmul(tv, tv),
            fd.ops.matmul(tx, tv),
            fd.ops.matmul(tv, fd.ops.permute(tx, [1, 0])),
        ]
        for out in outs:
            fd.add_output(out)
    results = fd.execute([indices, table, x, w, bias, bias_n, vec])
    by_weight_row = torch.einsum("ik,wnk->win", x, w)
    expected = [
        F.embedding(indices, table),
        by_weight_row + bias[:, None, :],
        by_weight_row + bias_n,
        vec @ vec,
        x @ vec,
        vec @ x.T,
    ]
    for got, want in zip(results, expected, strict=True):
        assert got.shape == want.shape and got.dtype == F32
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("op", "dtype"), [("linear", torch.float16), ("matmul", torch.int32)])
def test_contraction_dtype_is_the_operands(op: str, dtype: torch.dtype) -> None:
    """linear of Half stays Half, matmul of Int32 stays Int32 (nvFuser's rule, declared in
    hostir.ir.contraction), and the values are torch's."""
    a = torch.randint(-3, 4, (3, 4)).to(dtype)
    b = torch.randint(-3, 4, (5, 4) if op == "linear" else (4, 5)).to(dtype)
    with FusionDefinition() as fd:
        ta, tb = (
            fd.define_tensor(tuple(t.shape), dtype=DataType.from_torch(dtype)) for t in (a, b)
        )
        fd.add_output(getattr(fd.ops, op)(ta, tb))
    (out,) = fd.execute([a, b])
    expected = F.linear(a, b) if op == "linear" else a @ b
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected)


# ----- sharded ----------------------------------------------------------------------------


@pytest.mark.world_sizes(1, 2, 4)
def test_sdpa_heads_sharded(multidevice_test) -> None:
    """Heads split over the ranks: each rank computes its heads' attention and gradients,
    nothing is communicated; the philox outputs are replicated and read nothing."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(7)
    shape = (1, 4, 6, 8)
    q, k, v, grad = (torch.randn(shape, generator=generator).to(BF16) for _ in range(4))
    fd, inputs, outputs = _attention_fusion(shape, shape, BF16, True, None)
    for tv in (*inputs, *outputs[:5]):
        _shard(tv, mesh, 1)
    for tv in outputs[5:]:
        _replicate(tv, mesh)
    results = fd.execute(
        [shard_tensor(t, tv, rank) for t, tv in zip((q, k, v, grad), inputs, strict=True)]
    )
    expected = _attention_reference(q, k, v, grad, True, None)
    for got, want, tv in zip(results[:5], expected, outputs[:5], strict=True):
        torch.testing.assert_close(
            got.float(), shard_tensor(want, tv, rank), rtol=1.6e-2, atol=1e-2
        )
    text = str(fd.host_ir())
    assert not any(c in text for c in ("Allgather", "Allreduce", "AllToAll")), text


@pytest.mark.world_sizes(2, 4)
def test_sdpa_sequence_sharded_is_gathered_first(multidevice_test) -> None:
    """The query's sequence split over the ranks: gathered before the causal attention (an
    Allgather), the output sliced back to the ranks' rows; values as unsharded."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 8, 8, generator=generator) for _ in range(3))
    with FusionDefinition() as fd:
        tq, tk, tv = (fd.define_tensor((1, 2, 8, 8)) for _ in range(3))
        out, _, _, _ = fd.ops.sdpfa_fwd(tq, tk, tv, is_causal=True)
        fd.add_output(out)
    _shard(tq, mesh, 2)
    _shard(out, mesh, 2)
    for t in (tk, tv):
        _replicate(t, mesh)
    (result,) = fd.execute([shard_tensor(q, tq, rank), k, v])
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(result, shard_tensor(want, out, rank), rtol=1e-4, atol=1e-5)
    assert "Allgather" in str(fd.host_ir())


@pytest.mark.world_sizes(1, 2, 4)
def test_grouped_mm_column_and_row_parallel(multidevice_test) -> None:
    """As nvFuser's test_grouped_mlp: gate and up weights split along N (column-parallel,
    no communication), the down weight along K (row-parallel: partial sums, one
    Allreduce; none on one rank); a gate output in Float, SiLU, back to BFloat16."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(9)
    g, m, k, n, offsets = 2, 6, 8, 4 * d, [2, 6]
    x = torch.randn(m, k, generator=generator).to(BF16)
    gate_w, up_w = (torch.randn(g, k, n, generator=generator).to(BF16) for _ in range(2))
    down_w = torch.randn(g, n, k, generator=generator).to(BF16)
    with FusionDefinition() as fd:
        tx, tgate, tup, tdown = _bf(fd, m, k), _bf(fd, g, k, n), _bf(fd, g, k, n), _bf(fd, g, n, k)
        toffsets = _bf(fd, g, dtype=I32)
        gate = fd.ops.cast(fd.ops.grouped_mm(tx, tgate, toffsets), DataType.Float)
        hidden = fd.ops.cast(
            fd.ops.mul(fd.ops.silu(gate), fd.ops.grouped_mm(tx, tup, toffsets)), DataType.BFloat16
        )
        out = fd.ops.grouped_mm(hidden, tdown, toffsets)
        fd.add_output(out)
    for tv in (tx, toffsets):
        _replicate(tv, mesh)
    for tv in (tgate, tup):
        _shard(tv, mesh, 2)
    _shard(tdown, mesh, 1)
    inputs = [x, gate_w, up_w, down_w, torch.tensor(offsets, dtype=torch.int32)]
    (result,) = fd.execute(
        [
            shard_tensor(t, tv, rank)
            for t, tv in zip(inputs, (tx, tgate, tup, tdown, toffsets), strict=True)
        ]
    )
    gate_ref = _grouped_reference(x, gate_w, offsets)
    hidden_ref = (F.silu(gate_ref) * _grouped_reference(x, up_w, offsets)).to(BF16)
    want = _grouped_reference(hidden_ref, down_w, offsets)
    torch.testing.assert_close(result.float(), want, rtol=2e-2, atol=1e-1)
    text = str(fd.host_ir())
    # one Allreduce of the partial sums; none on one rank, where the sum is a local copy
    assert text.count("Allreduce") == (d > 1) and "Allgather" not in text, text


@pytest.mark.world_sizes(2, 4)
def test_grouped_rows_and_vocabulary_sharded_are_gathered(multidevice_test) -> None:
    """A sharded grouped dim (grouped_mm's rows, offsets index them globally) and a
    vocabulary-sharded embedding are gathered first (Allgathers); a sharded embedding
    dim D computes locally. Values as unsharded."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(10)
    x, w = torch.randn(4 * d, 8, generator=generator), torch.randn(2, 8, 3, generator=generator)
    offsets = [d, 4 * d]
    indices = torch.randint(0, 4 * d, (5,), generator=generator)
    table = torch.randn(4 * d, 2 * d, generator=generator)
    with FusionDefinition() as fd:
        tx, tw, to = (
            fd.define_tensor((4 * d, 8)),
            fd.define_tensor((2, 8, 3)),
            _bf(fd, 2, dtype=I32),
        )
        ti, tt = fd.define_tensor((5,), dtype=INT), fd.define_tensor((4 * d, 2 * d))
        grouped = fd.ops.grouped_mm(tx, tw, to)
        by_vocabulary, by_column = (
            fd.ops.embedding_fwd(ti, tt),
            fd.ops.embedding_fwd(ti, fd.ops.set(tt)),
        )
        for out in (grouped, by_vocabulary, by_column):
            fd.add_output(out)
    for tv in (tw, to, ti, grouped, by_vocabulary):
        _replicate(tv, mesh)
    for tv, dim in ((tx, 0), (tt, 0), (by_column, 1)):
        _shard(tv, mesh, dim)
    inputs = [
        shard_tensor(t, tv, rank)
        for t, tv in (
            (x, tx),
            (w, tw),
            (torch.tensor(offsets, dtype=torch.int32), to),
            (indices, ti),
            (table, tt),
        )
    ]
    results = fd.execute(inputs)
    torch.testing.assert_close(results[0], _grouped_reference(x, w, offsets), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(results[1], F.embedding(indices, table))
    torch.testing.assert_close(
        results[2], shard_tensor(F.embedding(indices, table), by_column, rank)
    )
    assert str(fd.host_ir()).count("Allgather") >= 2


@pytest.mark.world_sizes(1, 2, 4)
def test_linear_logical_split_weight(multidevice_test) -> None:
    """As nvFuser's test_linear_logical_split: weight [d, N, K] and bias [d, N] split on
    their leading dim, the output [d, *I, N] too; local, no communication."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(11)
    x, w, b = (torch.randn(s, generator=generator) for s in ((2, 3, 8), (d, 4, 8), (d, 4)))
    with FusionDefinition() as fd:
        tx, tw, tb = (fd.define_tensor(tuple(t.shape)) for t in (x, w, b))
        out = fd.ops.linear(tx, tw, tb)
        fd.add_output(out)
    _replicate(tx, mesh)
    for tv in (tw, tb, out):
        _shard(tv, mesh, 0)
    (result,) = fd.execute([x, shard_tensor(w, tw, rank), shard_tensor(b, tb, rank)])
    want = F.linear(x, w.reshape(-1, 8), b.reshape(-1)).reshape(2, 3, d, 4).permute(2, 0, 1, 3)
    torch.testing.assert_close(result, shard_tensor(want, out, rank))
    assert "Allgather" not in str(fd.host_ir())


@pytest.mark.world_sizes(1, 2, 4)
def test_matmul_of_vectors_with_the_contraction_sharded(multidevice_test) -> None:
    """[M, K] x [K] and [K] x [K] with K split over the ranks: partial sums, Allreduces."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(12)
    a, vec = torch.randn(3, 4 * d, generator=generator), torch.randn(4 * d, generator=generator)
    with FusionDefinition() as fd:
        ta, tv = fd.define_tensor((3, 4 * d)), fd.define_tensor((4 * d,))
        outs = [fd.ops.matmul(ta, tv), fd.ops.matmul(tv, fd.ops.set(tv))]
        for out in outs:
            fd.add_output(out)
    _shard(ta, mesh, 1)
    _shard(tv, mesh, 0)
    for out in outs:
        _replicate(out, mesh)
    results = fd.execute([shard_tensor(a, ta, rank), shard_tensor(vec, tv, rank)])
    torch.testing.assert_close(results[0], a @ vec)
    torch.testing.assert_close(results[1], vec @ vec)
    assert str(fd.host_ir()).count("Allreduce") == (2 if d > 1 else 0)


def test_a_stream_split_sequence_is_refused_by_name() -> None:
    """A stream-parallel query sequence would be attended chunk by chunk: refused when
    lowered, naming the output and the axis."""
    with FusionDefinition() as fd:
        q, k, v = (fd.define_tensor((1, 2, 8, 8)) for _ in range(3))
        out, _, _, _ = fd.ops.sdpfa_fwd(q, k, v, is_causal=True)
        fd.add_output(out)
    q.outer_split(2, 2)
    q.axis(2).parallelize(ParallelType.stream)
    # The split stops before attention, which computes the sequence whole; nothing else
    # reads q by its chunks (issue 34: the split no longer runs into the op).
    expected = r"T0 is split .* T3 = sdpfa_fwd\(...\) reads it with that dim as its axis 2"
    with pytest.raises(HostIrError, match=expected + ", and the op computes that axis whole"):
        fd.host_ir()


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (
            "T3 : bfloat16[1, 2, 4, 8], T4 : bfloat16[1, 2, 4] = sdpfa_fwd(T0, T1, T2)",
            "T4 is declared bfloat16, but the op gives float32",
        ),
        (
            "T3 : bfloat16[1, 2, 4, 8], T4 : float32[1, 2, 4] = sdpfa_fwd(T0, T1, T2, scale=s)",
            "scale s must be a constant",
        ),
        (
            "T3 : bfloat16[1, 2, 4, 8] = grouped_mm(T0, T1, T2)",
            "grouped_mm: offsets T2 must be a 1-d Int32 tensor of group ends",
        ),
    ],
)
def test_the_verifier_checks_attention_instructions(line: str, fragment: str) -> None:
    """Hand-written host IR with a wrong result dtype, a non-constant scale or a wrong
    offsets dtype is refused by the verifier, naming the value."""
    text = f"""%HostIrContainer {{
  input s : float64
  input T0 : bfloat16[1, 2, 4, 8]
  input T1 : bfloat16[1, 2, 4, 8]
  input T2 : bfloat16[1, 2, 4, 8]
  {line}
  output T3
}}
"""
    with pytest.raises(HostIrError, match=re.escape(fragment)):
        parse(text)


@pytest.mark.parametrize("is_causal", [True, False])
def test_the_matmul_attention_agrees_with_the_flash_kernel(is_causal: bool) -> None:
    """The Float path written with matmuls (CUDA Float operands, which this suite cannot
    run) gives the CPU flash kernels' output, logsumexp and gradients."""
    generator = torch.Generator().manual_seed(13)
    q, grad = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(2))
    k, v = (torch.randn(2, 3, 7, 8, generator=generator) for _ in range(2))
    out, lse = attention_math(q, k, v, is_causal, 0.4)
    flash_out, flash_lse = attention_forward(q, k, v, is_causal, 0.4)
    torch.testing.assert_close(out, flash_out)
    torch.testing.assert_close(lse, flash_lse)
    grads = attention_math_backward(grad, q, k, v, out, lse, is_causal, 0.4)
    flash_grads = attention_backward(grad, q, k, v, out, lse, is_causal, 0.4)
    for got, want in zip(grads, flash_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_cuda_takes_the_flash_kernel_only_where_it_means_the_op() -> None:
    """CUDA's flash kernel aligns a causal mask bottom-right when there are fewer queries
    than keys, and takes Half/BFloat16 head dims that are multiples of 8 up to 256: every
    other case goes to the matmul path (on a GPU, test_sdpa_against_torch[cuda-*] checks
    both paths' numbers)."""

    def flash(dtype, queries, keys, head, value_head, is_causal) -> bool:
        q = torch.empty(1, 1, queries, head, dtype=dtype)
        k = torch.empty(1, 1, keys, head, dtype=dtype)
        v = torch.empty(1, 1, keys, value_head, dtype=dtype)
        return cuda_flash(q, k, v, is_causal)

    assert flash(BF16, 5, 5, 8, 8, True) and flash(torch.float16, 5, 7, 64, 64, False)
    assert not flash(BF16, 5, 7, 8, 8, True)  # bottom-right in the kernel
    assert flash(BF16, 7, 5, 8, 8, False) and not flash(BF16, 7, 5, 8, 8, True)
    assert not flash(F32, 5, 5, 8, 8, False)
    assert not flash(BF16, 5, 5, 12, 12, False) and not flash(BF16, 5, 5, 8, 16, False)
    assert not flash(BF16, 5, 5, 2 * FLASH_HEAD_DIMS, 2 * FLASH_HEAD_DIMS, False)
