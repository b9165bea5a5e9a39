"""Pointwise ops on constant scalars alone, and ``broadcast_in_dim`` with sizes as the
extents of new dims (nvFuser's layer_norm: ``broadcast_in_dim(w, shape=x.shape(),
broadcast_dims=[-1])``), unsharded and sharded over 1, 2 and 4 ranks."""

from __future__ import annotations

import pytest
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from hostir import HostIrError
from hostir.ir.ops import POINTWISE_OPS

COLLECTIVES = ("Allgather", "Allreduce", "AllToAll", "ReduceScatter", "SendRecv")


def _operands(name: str, generator: torch.Generator) -> list:
    """Random Python values for op ``name``: positive floats (every op defined), a bool
    condition for where."""
    values = [round(float(torch.rand(1, generator=generator)) * 1.5 + 0.5, 6) for _ in range(3)]
    arity = POINTWISE_OPS[name].arity
    return [True, *values[:2]] if name == "where" else values[:arity]


def test_every_op_on_constants_folds_to_what_the_tensor_op_computes() -> None:
    """Each declared op on Double constants alone gives a Double constant equal to the op
    on float64 tensors of those values run by the fusion (the runtime's torch call)."""
    generator = torch.Generator().manual_seed(11)
    cases = {name: _operands(name, generator) for name in POINTWISE_OPS}
    with FusionDefinition() as fd:
        constants, tensor_ops, inputs = {}, [], []
        for name, values in cases.items():
            scalars = [fd.define_scalar(v) for v in values]
            constants[name] = getattr(fd.ops, name)(*scalars)
            dtypes = [DataType.Bool if isinstance(v, bool) else DataType.Double for v in values]
            tvs = [fd.define_tensor([1], dtype=d) for d in dtypes]
            pairs = zip(values, dtypes, strict=True)
            inputs += [torch.tensor([v], dtype=d.to_torch()) for v, d in pairs]
            tensor_ops.append(getattr(fd.ops, name)(*tvs))
            fd.add_output(tensor_ops[-1])
    results = fd.execute(inputs)
    for (name, constant), result in zip(constants.items(), results, strict=True):
        expected = DataType.Bool if POINTWISE_OPS[name].rule.value == "compare" else DataType.Double
        assert constant.dtype is expected, (name, constant.dtype)
        assert constant.value == result.item(), (name, constant.value, result.item())


@pytest.mark.parametrize(
    ("name", "operands", "dtype"),
    [
        ("reciprocal", [(4.0, DataType.Double)], DataType.Double),  # a float keeps its dtype
        ("reciprocal", [3], DataType.Float),  # float_op_config: an Int computes in Float
        ("exp", [(0.5, DataType.Half)], DataType.Half),  # optionalCast keeps a Half scalar
        ("neg", [(1.5, DataType.BFloat16)], DataType.BFloat16),
        ("abs", [(-3, DataType.Int32)], DataType.Int32),
        ("add", [(1.5, DataType.Half), (2.5, DataType.Half)], DataType.Float),  # binary: Float
        ("mul", [(1.5, DataType.Float), 2.0], DataType.Double),
        ("add", [(2, DataType.Int32), 3], DataType.Int),
        ("sub", [True, 2], DataType.Int),
        ("div", [-7, 2], DataType.Int),  # C++'s division truncates
        ("truediv", [7, 2], DataType.Float),
        ("pow", [3, 4], DataType.Int),
        ("lt", [2, 2.5], DataType.Bool),
        ("eq", [(1.5, DataType.Half), 1.5], DataType.Bool),
        ("where", [False, 2, 3.5], DataType.Double),
        ("where", [True, (1.5, DataType.Half), (2.5, DataType.Half)], DataType.Half),
        ("silu", [(0.5, DataType.Float)], DataType.Float),
    ],
    ids=str,
)
def test_scalar_dtype_rule(name: str, operands: list, dtype: DataType) -> None:
    """nvFuser's dtype for each op on scalar Vals (csrc/ops/arith.cpp), and the value the
    torch reference gives in that dtype."""
    with FusionDefinition() as fd:
        scalars = [fd.define_scalar(*o) if isinstance(o, tuple) else o for o in operands]
        result = getattr(fd.ops, name)(*scalars)
        fd.add_output(fd.define_tensor([1]))
    values = [o[0] if isinstance(o, tuple) else o for o in operands]
    assert result.dtype is dtype
    if name == "where":
        expected = values[1] if values[0] else values[2]
    elif name == "div":
        expected = int(values[0] / values[1])
    else:
        ref = getattr(torch, {"truediv": "true_divide", "silu": "sigmoid"}.get(name, name))
        tensors = [torch.tensor(v, dtype=torch.float64) for v in values]
        expected = ref(*tensors).item() * (values[0] if name == "silu" else 1)
    assert result.value == pytest.approx(expected, rel=1e-2), (result.value, expected)


def test_reciprocal_of_a_constant_in_a_tensor_op() -> None:
    """nvFuser's transformer backward: ``mul(t, reciprocal(define_scalar(float(e))))``."""
    torch.manual_seed(12)
    with FusionDefinition() as fd:
        t = fd.define_tensor([-1, 8])
        inverse = fd.ops.reciprocal(fd.define_scalar(8.0, dtype=DataType.Double))
        fd.add_output(fd.ops.mul(t, inverse))
    data = torch.randn(3, 8)
    assert (inverse.dtype, inverse.value) == (DataType.Double, 0.125)
    torch.testing.assert_close(fd.execute([data])[0], data * 0.125)


def _layer_norm_affine(fd: FusionDefinition, x, w, mask):
    """nvFuser's alphafold3 pattern: weights broadcast to ``x.shape()`` by
    ``broadcast_dims=[-1]``, a mask expanded by sizes to ``[b, n, 2]`` and used with the
    ``[b, n, 4]`` product: an expanded dim broadcasts whatever its extent, as in nvFuser.
    The weight broadcast the same way again (``shifted``) is left to sharding propagation."""
    shape = fd.ops.shape(x)
    wide = fd.ops.broadcast_in_dim(w, shape=shape, broadcast_dims=[-1])
    shifted = fd.ops.broadcast_in_dim(w, shape=shape, broadcast_dims=[-1])
    masked = fd.ops.broadcast_in_dim(mask, shape=[x.size(0), x.size(1), 2], broadcast_dims=[0, 1])
    product = fd.ops.add(fd.ops.mul(x, wide), shifted)
    return wide, fd.ops.where(masked, product, 0.0)


def test_sizes_as_extents_of_new_dims() -> None:
    """The new dims take the sizes' symbolic extents, bound with the inputs."""
    generator = torch.Generator().manual_seed(13)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 4])
        w = fd.define_tensor([4])
        mask = fd.define_tensor([-1, -1], dtype=DataType.Bool)
        wide, out = _layer_norm_affine(fd, x, w, mask)
        fd.add_output(wide)
        fd.add_output(out)
    text = str(fd.host_ir())
    assert "float32[i0, i1, 4] = broadcast_in_dim(T1, broadcast_dims=[2])" in text, text
    assert "bool[i0, i1, 1] = slice(T5, dim=2, start=0, stop=1)" in text, text
    data = torch.randn(3, 5, 4, generator=generator)
    weight = torch.randn(4, generator=generator)
    keep = torch.rand(3, 5, generator=generator) > 0.5
    got_wide, got = fd.execute([data, weight, keep])
    torch.testing.assert_close(got_wide, weight.expand(3, 5, 4))
    torch.testing.assert_close(got, torch.where(keep[..., None], data * weight + weight, 0.0))
    with pytest.raises(HostIrError, match="broadcast_in_dim defining T5 failed.*must match"):
        fd.execute([data, weight, torch.rand(3, 6, generator=generator) > 0.5])


@pytest.mark.world_sizes(1, 2, 4)
def test_sizes_as_extents_sharded(multidevice_test) -> None:
    """Sharded on the batch dim: the expanded weight by its own schedule, the expanded
    mask and the result by propagation, on the dim a size made; no communication."""
    d, rank = multidevice_test.size, multidevice_test.rank
    mesh = DeviceMesh(torch.arange(d))
    generator = torch.Generator().manual_seed(14)
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, -1, 4])
        w = fd.define_tensor([4])
        mask = fd.define_tensor([-1, -1], dtype=DataType.Bool)
        wide, out = _layer_norm_affine(fd, x, w, mask)
        fd.add_output(wide)
        fd.add_output(out)
    for tv in (x, w, mask, wide):
        tv.set_device_mesh(mesh)
    for tv in (x, mask, wide):
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    data = torch.randn(2 * d, 3, 4, generator=generator)
    weight = torch.randn(4, generator=generator)
    keep = torch.rand(2 * d, 3, generator=generator) > 0.5
    got_wide, got = fd.execute(
        [shard_tensor(data, x, rank), weight, shard_tensor(keep, mask, rank)]
    )
    torch.testing.assert_close(got_wide, shard_tensor(weight.expand(2 * d, 3, 4), wide, rank))
    want = torch.where(keep[..., None], data * weight + weight, 0.0)
    lowered = fd.host_ir()
    torch.testing.assert_close(got, shard_tensor(want, lowered.outputs[1], rank))
    assert got.shape[0] == 2, got.shape  # the propagated sharding of the batch dim
    text = str(lowered)
    assert not any(name in text for name in COLLECTIVES), text
