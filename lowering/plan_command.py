"""``hostir plan``: show a redistribution plan and its cost (the CLI's door into lowering).

``hostir plan --mesh 2x2 --shape 8x8 --from S0S0 --to RR`` prints
``Plan.explain()`` for resharding a tensor of that shape between the two
distributions (notation: one placement per mesh dim, outer first — ``S<d>``,
``R``, ``P``; see ``lowering.distribution.parse_notation``). SPEC section 2 lets
the command line reach into lowering; ``hostir/cli.py`` imports this module by
name so the ``hostir`` package itself never imports ``lowering``.
"""

from __future__ import annotations

import math

from hostir import Const, DType, Mesh, TensorValue
from lowering.distribution import parse_notation
from lowering.errors import ReshardingError
from lowering.plan_resharding import plan_resharding


def _sizes(text: str, what: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ReshardingError(f"{what} {text!r}: expected sizes like 2x2 or 8x8") from None
    if not sizes or any(size < 1 for size in sizes):
        raise ReshardingError(f"{what} {text!r}: sizes must be positive")
    return sizes


def plan_text(mesh: str, shape: str, source: str, target: str, dtype: str = "float32") -> str:
    """The explanation of the plan from ``source`` to ``target`` (see module docstring)."""
    mesh_shape = _sizes(mesh, "--mesh")
    extents = _sizes(shape, "--shape")
    device_mesh = Mesh(devices=tuple(range(math.prod(mesh_shape))), shape=mesh_shape)
    try:
        element = DType(dtype)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise ReshardingError(f"--dtype {dtype!r}: expected one of {known}") from None
    values = []
    for name, notation in (("src", source), ("dst", target)):
        distribution = parse_notation(notation, device_mesh, ndim=len(extents))
        sharding = distribution.to_sharding(extents)
        for dim, extent in enumerate(extents):
            if extent % distribution.shard_factor(dim):
                raise ReshardingError(
                    f"{notation}: dim {dim} of extent {extent} does not split evenly over"
                    f" {distribution.shard_factor(dim)} devices"
                )
        values.append(
            TensorValue(
                name=name,
                dtype=element,
                shape=tuple(Const(value=e) for e in extents),
                sharding=sharding,
            )
        )
    return plan_resharding(*values).explain()
