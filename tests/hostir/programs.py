"""Small helpers to build host IR programs by hand in tests."""

from __future__ import annotations

from hostir import Const, DType, Mesh, MeshAxis, Sharding, ShardPart, Symbol, TensorValue


def c(value: int) -> Const:
    """A constant scalar."""
    return Const(value=value)


def tensor(
    name: str, *shape: int | str, dtype: DType = DType.FLOAT32, sharding=None
) -> TensorValue:
    """A tensor value; string extents become symbols."""
    extents = tuple(Symbol(name=e) if isinstance(e, str) else c(e) for e in shape)
    return TensorValue(name=name, dtype=dtype, shape=extents, sharding=sharding)


def block_sharded(devices: list[int], ndim: int, dim: int, local: int) -> Sharding:
    """A 1-d mesh sharding ``dim`` in blocks of ``local`` over ``mesh_x``."""
    mesh = Mesh(devices=tuple(devices), shape=(len(devices),))
    dims = []
    for d in range(ndim):
        if d == dim:
            dims.append(
                (
                    ShardPart(axis=MeshAxis.X, extent=c(len(devices))),
                    ShardPart(axis=None, extent=c(local)),
                )
            )
        else:
            dims.append((ShardPart(axis=None, extent=c(local)),))
    return Sharding(mesh=mesh, dims=tuple(dims))
