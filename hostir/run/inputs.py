"""Checking a program's tensor inputs and binding their symbolic extents."""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from hostir.errors import InputError
from hostir.ir.dtypes import DType
from hostir.ir.scalars import Scalar, Symbol, evaluate_scalar, print_scalar, symbols_of
from hostir.ir.sharding import part_extents
from hostir.ir.values import TensorValue

Env = dict[str, int | float | bool]


def dtensor_class() -> type | None:
    """DTensor's class if ``torch.distributed.tensor`` was imported, else None: no DTensor
    can exist before that, and importing it costs about a second (it imports sympy)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def bind_input_tensor(value: TensorValue, given: Any, scalars: Env) -> torch.Tensor:
    """Checks ``given`` against ``value``'s type and binds unbound extent symbols.

    ``given`` is this rank's local shard; a global extent that is a lone
    unbound symbol is bound to the local size times the dim's shard factor.
    Raises InputError naming the tensor and dim when something does not fit.
    """
    if not isinstance(given, torch.Tensor):
        raise InputError(f"input {value.name} must be a torch.Tensor, got {type(given).__name__}")
    dtensor = dtensor_class()
    if dtensor is not None and isinstance(given, dtensor):
        # A DTensor is a torch.Tensor of its global shape whose ops run as DTensor's own:
        # taken as a shard it would compute a wrong result or fail on an extent.
        raise InputError(
            f"input {value.name} is a DTensor (placements {tuple(given.placements)} on"
            f" {given.device_mesh!r}); a program takes this rank's local shard as a plain"
            " tensor: pass dt.to_local() where the placements match the input's sharding,"
            " or run the fusion with frontend's execute_with_dtensors"
        )
    if given.dtype != value.dtype.to_torch():
        raise InputError(
            f"input {value.name} must have dtype {value.dtype.value},"
            f" got {DType.from_torch(given.dtype).value if _known(given.dtype) else given.dtype}"
        )
    if given.ndim != value.ndim:
        raise InputError(
            f"input {value.name} must have {value.ndim} dims"
            f" (global shape [{', '.join(print_scalar(e) for e in value.shape)}]), got {given.ndim}"
        )
    for dim in range(value.ndim):
        _bind_extent(value, dim, given.shape[dim], scalars)
    return given


def _known(dtype: torch.dtype) -> bool:
    try:
        DType.from_torch(dtype)
    except Exception:  # noqa: BLE001 - any failure means "not a dtype we name"
        return False
    return True


def _bind_extent(value: TensorValue, dim: int, local: int, scalars: Env) -> None:
    factor = value.sharding.shard_factor(dim) if value.sharding is not None else 1
    extent: Scalar = value.shape[dim]
    if isinstance(extent, Symbol) and extent.name not in scalars:
        scalars[extent.name] = local * factor
    unbound = symbols_of(extent) - scalars.keys()
    if unbound:
        raise InputError(f"input {value.name} dim {dim}: extent {print_scalar(extent)} is unbound")
    global_extent = int(evaluate_scalar(extent, scalars))
    if global_extent % factor != 0:
        raise InputError(
            f"input {value.name} dim {dim}: extent {global_extent} is not divisible by"
            f" the shard factor {factor}"
        )
    if local * factor != global_extent:
        raise InputError(
            f"input {value.name} dim {dim}: expected a local extent of {global_extent // factor}"
            f" (global {print_scalar(extent)} = {global_extent}, sharded {factor} ways),"
            f" got {local}"
        )
    _check_parts(value, dim, global_extent, scalars)


def _check_parts(value: TensorValue, dim: int, global_extent: int, scalars: Env) -> None:
    if value.sharding is None:
        return
    parts = value.sharding.dims[dim]
    extents = part_extents(parts, value.sharding.mesh, scalars)
    if math.prod(extents) != global_extent:
        raise InputError(
            f"input {value.name} dim {dim}: extent {global_extent} does not split evenly into"
            f" parts of sizes {extents}"
        )
