"""Helpers on axis layouts shared by the sharding passes.

A *layout* is what decides whether two tensors can meet without communication:
the mesh, and for each axis the sequence of its parts as mesh axes (None for a
local part). Extents do not matter for that comparison.
"""

from __future__ import annotations

import dataclasses
import math

from hostir import Mesh, ShardPart
from hostir.scalars import floordiv
from lowering.snapshot import AxisLayout, LoweringTensor


def axis_layout(axis: AxisLayout) -> tuple:
    """The mesh axes of ``axis``'s parts in order, None for local parts."""
    return tuple(part.axis for part in axis.parts)


def tensor_layout(tensor: LoweringTensor) -> tuple:
    """The mesh and every axis layout of ``tensor`` (reduction axes included)."""
    return (tensor.mesh, tuple((axis.reduction, axis_layout(axis)) for axis in tensor.axes))


def local_parts(axis: AxisLayout) -> AxisLayout:
    """``axis`` replicated: one local part of its whole extent."""
    return dataclasses.replace(axis, parts=(ShardPart(axis=None, extent=axis.extent),))


def copy_parts(target: AxisLayout, source: AxisLayout, mesh: Mesh) -> AxisLayout:
    """``target`` laid out like ``source``; local extents are recomputed when the two
    axes' extents differ (only for block layouts: mesh axes then one local part)."""
    if not any(p.axis is not None for p in source.parts):
        return local_parts(target)
    if source.extent == target.extent:
        return dataclasses.replace(target, parts=source.parts)
    block = all(p.axis is not None for p in source.parts[:-1]) and source.parts[-1].axis is None
    if not block:
        return local_parts(target)
    factor = math.prod(mesh.axis_size(p.axis) for p in source.parts[:-1])
    local = ShardPart(axis=None, extent=floordiv(target.extent, factor))
    return dataclasses.replace(target, parts=source.parts[:-1] + (local,))


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
