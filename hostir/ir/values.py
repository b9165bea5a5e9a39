"""Values of the host IR: tensors, streams, requests and host values (scalars live in
``scalars``).

Values are immutable and compared by structure: two ``TensorValue`` objects
with the same name, type and sharding are the same value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hostir.ir.dtypes import DType
from hostir.ir.scalars import Scalar, evaluate_scalar, symbols_of
from hostir.ir.sharding import Sharding, local_extent


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorValue:
    """A tensor: element type, global (unsharded) shape and how it is spread.

    ``shape`` holds global extents, possibly symbolic. ``sharding`` is None for
    a tensor that is not placed on a mesh: every rank holds and computes it
    whole. At run time the value is bound to the local shard.
    """

    name: str
    dtype: DType
    shape: tuple[Scalar, ...]
    sharding: Sharding | None = None

    @property
    def ndim(self) -> int:
        """Number of logical dims."""
        return len(self.shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamValue:
    """A stream: with ``index``, stream ``index`` of the evaluator's pool (printed
    ``stream(i)``); without, the stream bound to ``name`` by ``get_current_stream``."""

    name: str = "stream"
    index: Scalar | None = None


def local_shape(value: TensorValue, env: Mapping[str, int | float | bool]) -> list[int]:
    """The shape of one device's shard of ``value``, its extents evaluated in ``env``."""
    if value.sharding is None:
        return [int(evaluate_scalar(extent, env)) for extent in value.shape]
    mesh = value.sharding.mesh
    return [local_extent(parts, mesh, env) for parts in value.sharding.dims]


def value_symbols(value: TensorValue) -> set[str]:
    """The symbols ``value``'s extents read: its shape's and its sharding parts'."""
    names = set().union(*(symbols_of(extent) for extent in value.shape))
    if value.sharding is not None:
        for parts in value.sharding.dims:
            for part in parts:
                names |= symbols_of(part.extent)
    return names


Value = TensorValue | StreamValue


@dataclass(frozen=True, slots=True, kw_only=True)
class HostValue:
    """An integer tensor's values copied to the host by ``to_host`` (a device-to-host sync):
    counts that size a later exchange (``RaggedAllToAll``) and the extents it binds."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestValue:
    """The pending completion of an asynchronous communication; ``wait`` consumes it."""

    name: str


NAMED_VALUES = (TensorValue, RequestValue, HostValue)
"""The values a run binds by name (``RunContext.tensors``): tensors, requests, host values."""
