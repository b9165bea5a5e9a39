"""Reductions of Half and BFloat16 operands (docs/ops.md, "Reductions"): ``var_mean``
computed in Float with Float results, exactly nvFuser's ``var_mean(cast(x, Float))``; the
other reductions' dtypes; a bf16 layernorm and sums over a reduced dim sharded over 1, 2
and 4 ranks against single-device torch (Float statistics at float32 tolerance, bf16
results within bf16 tolerance) with only Allreduces of row statistics."""

from __future__ import annotations

import re

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize("dtype", [BF16, F16], ids=str)
def test_var_mean_of_reduced_precision_is_nvfusers_upcast_program(dtype: torch.dtype) -> None:
    """``var_mean`` of Half / BFloat16 gives Float results, bit for bit those of the program
    nvFuser asks for ("please upcast to float"): ``var_mean(cast(x, Float))``; both agree
    with torch computing in float32."""
    x = (torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(11)) * 2 + 3).to(dtype)
    with FusionDefinition() as fd:
        a = fd.define_tensor(tuple(x.shape), dtype=dtype)
        direct = fd.ops.var_mean(a, [2], correction=0, keepdim=True)
        upcast = fd.ops.var_mean(fd.ops.cast(a, DataType.Float), [2], correction=0, keepdim=True)
        over_two = fd.ops.var_mean(a, [0, 2])
        for out in (*direct, *upcast, *over_two):
            fd.add_output(out)
    outs = fd.execute([x])
    assert [out.dtype for out in outs] == [F32] * 6
    torch.testing.assert_close(outs[:2], outs[2:4], rtol=0, atol=0)
    wide = x.float()
    torch.testing.assert_close(outs[:2], list(torch.var_mean(wide, 2, correction=0, keepdim=True)))
    torch.testing.assert_close(outs[4:], list(torch.var_mean(wide, (0, 2))))


def test_float32_var_mean_program_is_unchanged() -> None:
    """A Float operand gets no cast: the program is the two passes on it."""
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 8))
        for out in fd.ops.var_mean(a, [1]):
            fd.add_output(out)
    text = str(fd.host_ir())
    assert "= cast(" not in text and "T1 : float32[4] = sum(T0, dims=[1]" in text, text


def _shard(tvs, mesh: DeviceMesh, dim: int, d: int) -> None:
    """Each of ``tvs`` on ``mesh``, its logical axis ``dim`` split over mesh_x."""
    for tv in tvs:
        tv.set_device_mesh(mesh)
        tv.outer_split(dim, d)
        tv.axis(dim).parallelize(ParallelType.mesh_x)


@pytest.mark.world_sizes(1, 2, 4)
def test_bf16_layernorm_and_sums_over_a_sharded_dim(multidevice_test) -> None:
    """A bf16 layernorm from ``var_mean`` of the bf16 input (statistics in Float, the output
    cast back to bf16, as nvFuser's transformer tests write it), ``mean`` and ``sum``
    (bf16, and Float with ``dtype``) over the reduced dim sharded over the ranks: against
    torch on one device, in Float at float32 tolerance, bf16 within bf16 tolerance. Each
    reduction is one Allreduce of its row statistic, in its result's dtype; nothing is
    gathered."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(12)
    x = (torch.randn(4, 8 * d, generator=generator) * 2 + 1).to(BF16)
    weight, bias = (torch.randn(8 * d, generator=generator).to(BF16) for _ in range(2))
    with FusionDefinition() as fd:
        a = fd.define_tensor((4, 8 * d), dtype=DataType.BFloat16)
        w = fd.define_tensor((8 * d,), dtype=DataType.BFloat16)
        b = fd.define_tensor((8 * d,), dtype=DataType.BFloat16)
        var, mean = fd.ops.var_mean(a, [1], correction=0, keepdim=True)
        normed = fd.ops.mul(fd.ops.sub(a, mean), fd.ops.rsqrt(fd.ops.add(var, 1e-5)))
        shape = [4, 8 * d]
        scaled = fd.ops.mul(normed, fd.ops.broadcast_in_dim(w, shape, [1]))
        layernorm = fd.ops.cast(fd.ops.add(scaled, fd.ops.broadcast_in_dim(b, shape, [1])), BF16)
        outs = [layernorm, fd.ops.mean(a, [1]), fd.ops.sum(a, [1])]
        outs.append(fd.ops.sum(a, [1], dtype=DataType.Float))
        for out in outs:
            fd.add_output(out)
    _shard([a, layernorm], mesh, 1, d)
    _shard([w, b], mesh, 0, d)
    results = fd.execute([shard_tensor(t, tv, rank) for t, tv in ((x, a), (weight, w), (bias, b))])
    wide = x.float()
    norm = torch.nn.functional.layer_norm(wide, (8 * d,), weight.float(), bias.float(), eps=1e-5)
    assert [r.dtype for r in results] == [BF16, F32, BF16, F32]
    torch.testing.assert_close(results[0], shard_tensor(norm.to(BF16), layernorm, rank))
    torch.testing.assert_close(results[1], wide.mean(1))
    torch.testing.assert_close(results[2], x.sum(1))  # partial sums rounded to bf16
    torch.testing.assert_close(results[3], wide.sum(1))
    collectives = [line.strip() for line in str(fd.host_ir()).splitlines() if " = Allr" in line]
    if d > 1:
        everything = str(fd.host_ir())
        assert not re.search(r"= (Allgather|Broadcast|SendRecv)", everything), everything
        # var_mean's two passes and mean's sum in Float, the bf16 sum, the Float sum
        dtypes = sorted(re.search(r": (\w+)\[4\]", c).group(1) for c in collectives)
        assert dtypes == ["bfloat16"] + ["float32"] * 4, collectives
