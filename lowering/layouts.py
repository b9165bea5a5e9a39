"""Helpers on axis layouts shared by the sharding passes.

A *layout* is what decides whether two tensors can meet without communication:
the mesh, and for each axis the sequence of its parts as mesh axes (None for a
local part). Extents do not matter for that comparison.
"""

from __future__ import annotations

import dataclasses
import math

from hostir import Const, Mesh, ShardPart
from hostir.ir.scalars import floordiv
from lowering.snapshot import AxisLayout, LoweringTensor


def tensor_layout(tensor: LoweringTensor) -> tuple:
    """The mesh and every axis layout of ``tensor`` (reduction axes included)."""
    return (tensor.mesh, tuple((axis.reduction, axis.layout()) for axis in tensor.axes))


def local_parts(axis: AxisLayout) -> AxisLayout:
    """``axis`` replicated: one local part of its whole extent."""
    return dataclasses.replace(axis, parts=(ShardPart(axis=None, extent=axis.extent),))


def copy_parts(target: AxisLayout, source: AxisLayout, mesh: Mesh) -> AxisLayout:
    """``target`` laid out like ``source``; local extents are recomputed when the two
    axes' extents differ (only for block layouts: mesh axes then one local part, or
    mesh axes alone, one index per device, which needs no local extent)."""
    if not any(p.axis is not None for p in source.parts):
        return local_parts(target)
    if source.extent == target.extent or all(p.axis is not None for p in source.parts):
        return dataclasses.replace(target, parts=source.parts)
    block = all(p.axis is not None for p in source.parts[:-1]) and source.parts[-1].axis is None
    if not block:
        return local_parts(target)
    factor = math.prod(mesh.axis_size(p.axis) for p in source.parts[:-1])
    local = ShardPart(axis=None, extent=floordiv(target.extent, factor))
    return dataclasses.replace(target, parts=source.parts[:-1] + (local,))


def copy_layout(target: AxisLayout, source: AxisLayout, mesh: Mesh) -> AxisLayout:
    """``target`` laid out exactly like ``source``, for an op that must read or write it in
    that layout: unlike ``copy_parts``, a layout that is not in blocks is kept too. Mapped
    axes have equal extents at run time, however they are written, so the parts are
    copied and only the local part that depends on the extent (the symbolic one, from a
    split of a symbolic extent) is recomputed from ``target``'s extent."""
    copied = copy_parts(target, source, mesh)
    if copied.layout() == source.layout():
        return copied
    parts = list(source.parts)
    symbolic = [
        i for i, p in enumerate(parts) if p.axis is None and not isinstance(p.extent, Const)
    ]
    if len(symbolic) > 1:
        return copied  # not from splits: they leave one symbolic part
    if symbolic:
        (index,) = symbolic
        rest = [p for i, p in enumerate(parts) if i != index]
        factor = math.prod(mesh.axis_size(p.axis) if p.axis else p.extent.value for p in rest)
        parts[index] = ShardPart(axis=None, extent=floordiv(target.extent, factor))
    return dataclasses.replace(target, parts=tuple(parts))


def without_mesh_axes(axis: AxisLayout, drop: set, mesh: Mesh) -> AxisLayout:
    """``axis`` with the parts on mesh axes in ``drop`` made local (block layouts keep
    their shape: the dropped mesh part merges into the local part after it)."""
    if not any(p.axis in drop for p in axis.parts):
        return axis
    kept = [p for p in axis.parts if p.axis is not None and p.axis not in drop]
    if not kept:
        return local_parts(axis)
    factor = math.prod(mesh.axis_size(p.axis) for p in kept)
    local = ShardPart(axis=None, extent=floordiv(axis.extent, factor))
    return dataclasses.replace(axis, parts=tuple(kept) + (local,))
