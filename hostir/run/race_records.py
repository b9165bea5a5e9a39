"""What the race checker (:mod:`hostir.run.race_checker`) keeps: vector clocks, byte regions
and their overlap, and the records of accesses, buffers and posted communications.

- A *vector clock* (:data:`Clock`) maps a stream id to the last tick of that
  stream an access is ordered after.
- A tensor's *region* is the bytes it spans in its storage with their layout, so
  that aliases conflict exactly when their elements overlap: strided views of a
  common layout are compared element-exactly, anything else by byte span.
- An *access* is one read, write or free of a region, stamped with its stream and
  tick; a *buffer* is what is known of one live storage; a *posted* communication
  keeps its virtual stream and accesses until it is waited on.

These are the checker's internals; the ordering rules and the checks themselves are
:class:`~hostir.run.race_checker.RaceChecker`'s.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from hostir.ir.instructions import Deallocate, Instruction, defined_values, keyword

Clock = dict[Any, int]
"""A vector clock: stream id -> the last tick of that stream this one is ordered after."""


# -- Byte regions -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Region:
    """The bytes of a tensor in its storage: the span ``[start, end)`` and its layout as
    ``(stride, size)`` pairs in bytes, largest stride first (dims of size one and
    broadcast dims dropped; the bytes of one element as a last ``(1, itemsize)`` dim)."""

    start: int
    end: int
    dims: tuple[tuple[int, int], ...]
    dense: bool  # the elements fill the span exactly


def _region(tensor: torch.Tensor) -> _Region:
    """The region of ``tensor``'s bytes in its storage."""
    itemsize = tensor.element_size()
    start = tensor.storage_offset() * itemsize
    dims = sorted(
        (
            (stride * itemsize, size)
            for size, stride in zip(tensor.shape, tensor.stride(), strict=True)
            if size > 1 and stride != 0
        ),
        reverse=True,
    )
    if itemsize > 1:
        dims.append((1, itemsize))
    end = start + 1 + sum((size - 1) * stride for stride, size in dims)
    expected, dense = 1, True
    for stride, size in reversed(dims):
        if stride != expected:
            dense = False
            break
        expected *= size
    return _Region(start, end, tuple(dims), dense)


def _digit_boxes(a: _Region, b: _Region) -> tuple[list, list] | None:
    """Both regions as boxes of digits in one mixed-radix basis (their strides), or None
    when the strides do not nest or a region wraps around a digit. Two elements are
    the same byte iff their digits are equal, so boxes decide overlap exactly."""
    strides = sorted({stride for stride, _ in a.dims + b.dims} | {1}, reverse=True)
    if any(outer % inner for outer, inner in zip(strides, strides[1:], strict=False)):
        return None
    boxes = []
    for region in (a, b):
        dims = _refined(region.dims, strides)
        sizes = dict(dims)
        if len(sizes) != len(dims):
            return None  # two dims with one stride: the region overlaps itself
        digits, rest = [], region.start
        for position, stride in enumerate(strides):
            digit, rest = divmod(rest, stride)
            size = sizes.get(stride, 1)
            if position and digit + size > strides[position - 1] // stride:
                return None
            digits.append((digit, digit + size))
        boxes.append(digits)
    return boxes[0], boxes[1]


def _refined(dims: tuple[tuple[int, int], ...], strides: list[int]) -> list[tuple[int, int]]:
    """``dims`` with each dim that spans a larger basis stride split at it, where it
    divides: ``(4, 4)`` (four elements 4 bytes apart) in a basis with stride 8 is
    ``(8, 2), (4, 2)``. A reshaped view of a chunk has such a finer dim beside the
    chunk's own (fuzz seed 800879: a false race between two chunks of one buffer). A dim
    that does not divide stays whole, and the boxes below then give up (unsure)."""
    refined = []
    for stride, size in dims:
        for larger in sorted(s for s in strides if s > stride):
            ratio = larger // stride
            if stride * size <= larger or size % ratio:
                break
            refined.append((stride, ratio))
            stride, size = larger, size // ratio
        refined.append((stride, size))
    return refined


def _overlap(a: _Region, b: _Region) -> bool:
    """Whether two regions of one storage share a byte (True when unsure)."""
    if a.end <= b.start or b.end <= a.start:
        return False
    if a.dense and b.dense:
        return True
    boxes = _digit_boxes(a, b)
    if boxes is None:
        return True
    return all(
        lo_a < hi_b and lo_b < hi_a for (lo_a, hi_a), (lo_b, hi_b) in zip(*boxes, strict=True)
    )


def _contains(a: _Region, b: _Region) -> bool:
    """Whether every byte of ``b`` is a byte of ``a`` (False when unsure)."""
    if a.dense and a.start <= b.start and b.end <= a.end:
        return True
    boxes = _digit_boxes(a, b)
    return boxes is not None and all(
        lo_a <= lo_b and hi_b <= hi_a for (lo_a, hi_a), (lo_b, hi_b) in zip(*boxes, strict=True)
    )


# -- Records --------------------------------------------------------------------


@dataclass(slots=True)
class _Access:
    """One read or write of a region, stamped with its stream and that stream's tick."""

    stream: Any
    tick: int
    write: bool
    region: _Region
    tensor: str
    verb: str  # "read", "written" or "freed"
    instruction: Instruction | str
    loops: tuple[tuple[str, Any], ...]
    on: str  # the stream's name in messages

    def describe(self) -> str:
        """``neg into out_i (i=1) on stream(1)``."""
        if isinstance(self.instruction, str):
            text = self.instruction
        else:
            text = _describe(self.instruction)
        if self.loops:
            text += " (" + ", ".join(f"{name}={value}" for name, value in self.loops) + ")"
        return f"{text} on {self.on}"


def _describe(instruction: Instruction) -> str:
    """``linear defining T4``, ``neg into out_i``, ``Allreduce defining T2, R0``."""
    if isinstance(instruction, Deallocate):
        return f"deallocate {instruction.tensor.name}"
    text = keyword(instruction)
    names = [value.name for value in defined_values(instruction)]
    if names:
        text += " defining " + ", ".join(names)
    if getattr(instruction, "preallocated", False):
        text += f" into {instruction.out.name}"
    return text


def _message(old: _Access, new: _Access, rank: int) -> str:
    """The :class:`~hostir.errors.RaceError` message of two unordered conflicting accesses."""
    if old.tensor == new.tensor:
        names = old.tensor
    else:
        names = f"{old.tensor} and {new.tensor} (overlapping views of one buffer)"
    return (
        f"race on {names}: {old.verb} by {old.describe()} and {new.verb} by"
        f" {new.describe()} with no synchronize or wait between them (rank {rank})"
    )


class _Buffer:
    """What the checker knows of one live storage: the accesses that may still conflict
    with a later one, and the tensor names last bound to a view of it."""

    __slots__ = ("ref", "accesses", "names")

    def __init__(self, ref: weakref.ref) -> None:
        self.ref = ref
        self.accesses: list[_Access] = []
        self.names: set[str] = set()


@dataclass(slots=True)
class _Posted:
    """A posted communication: its virtual stream, its clock, its accesses until waited."""

    stream: Any
    clock: Clock
    accesses: list[_Access] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Stamp:
    """Who accesses: the stream id, its name, its tick, its clock, the loop indices."""

    stream: Any
    label: str
    tick: int
    clock: Clock
    loops: tuple[tuple[str, Any], ...]
    rank: int
