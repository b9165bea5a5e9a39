"""The verifier's check that a tensor's sharding fits its shape: as many dims, a mesh
axis part of the axis's size, and each sharded dim's parts multiplying to its extent."""

from __future__ import annotations

from hostir.check.verify_locations import Path
from hostir.errors import VerifyError
from hostir.ir.extents import Normal, differ, normal_form, times
from hostir.ir.scalars import Const, print_scalar
from hostir.ir.sharding import Sharding
from hostir.ir.values import TensorValue


def _check_sharding(value: TensorValue, path: Path) -> None:
    """Each sharded dim's parts multiply to its extent (where both are known)."""
    sharding: Sharding | None = value.sharding
    if sharding is None:
        return
    if len(sharding.dims) != len(value.shape):
        raise VerifyError(
            f"{value.name}: its sharding has {len(sharding.dims)} dims, its shape"
            f" {len(value.shape)}",
            path=path,
        )
    mesh = sharding.mesh
    for dim, (parts, extent) in enumerate(zip(sharding.dims, value.shape, strict=True)):
        if len(parts) == 1 and parts[0].axis is None and parts[0].extent == extent:
            continue  # a replicated dim: one local part, the whole extent
        total: Normal = normal_form(Const(value=1))
        for part in parts:
            size = Const(value=mesh.axis_size(part.axis)) if part.axis is not None else part.extent
            if part.axis is not None and part.extent != size:
                raise VerifyError(
                    f"{value.name} dim {dim}: its part on mesh axis {part.axis.value} has extent"
                    f" {print_scalar(part.extent)}, not the axis's size {size.value}",
                    path=path,
                )
            total = times(total, normal_form(size))
        if differ(total, normal_form(extent)):
            shown = ", ".join(
                p.axis.value if p.axis is not None else print_scalar(p.extent) for p in parts
            )
            raise VerifyError(
                f"{value.name} dim {dim}: the parts [{shown}] do not make up its extent"
                f" {print_scalar(extent)} on mesh {mesh}",
                path=path,
            )
