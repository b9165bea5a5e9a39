"""The shape ops' instructions (``reshape``, ``slice``, ``pad``, ``cat``) and how a reshape
groups dims.

A reshape keeps the order of elements; its dims fall into *groups*: consecutive input dims
whose extents multiply to the product of consecutive output dims (``[b, s, 3e] -> [b, s, h,
3e/h]`` is ``b -> b``, ``s -> s``, ``3e -> (h, 3e/h)``). :func:`reshape_groups` finds them
from the (possibly symbolic) extents; the frontend maps the dims of one-to-one groups, and
the lowering decides from them whether a sharded dim stays contiguous on each rank
(``lowering.shape_ops``). ``slice`` and ``pad`` act on one dim each and ``cat`` joins two
tensors: an op on several dims, or of more tensors, is a chain of them (docs/ops.md,
"Shape ops").
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from hostir.errors import HostIrError
from hostir.ir.catalog import Kind, declare
from hostir.ir.extents import Normal, normal_form
from hostir.ir.scalars import Scalar, print_scalar
from hostir.ir.values import TensorValue


class ReshapeError(HostIrError):
    """A reshape whose extents do not match (names both shapes)."""


@declare(kind=Kind.COMPUTE, keyword="reshape", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Reshape:
    """``out = src.reshape(out's local shape)``: the same elements in the same order. On
    sharded tensors each rank reshapes its own shard; the lowering keeps a sharded dim only
    where the shard stays one contiguous block of the output (``lowering.shape_ops``)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src",)
    out: TensorValue
    src: TensorValue
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="slice", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Slice:
    """``out = src.narrow(dim, start, stop - start)``: elements ``start <= i < stop`` of
    ``dim`` (already normalized: ``0 <= start <= stop <= extent``); ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "start", "stop")
    out: TensorValue
    src: TensorValue
    dim: int
    start: Scalar
    stop: Scalar
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="pad", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class Pad:
    """``out``: ``src`` with ``left`` elements before and ``right`` after along ``dim``, all
    ``value`` (``torch.nn.functional.pad``); ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "left", "right", "value")
    out: TensorValue
    src: TensorValue
    dim: int
    left: Scalar
    right: Scalar
    value: TensorValue | Scalar  # a scalar (written as an operand: a float is allowed)
    preallocated: bool = False


@declare(kind=Kind.COMPUTE, keyword="cat", positional=("lhs", "rhs"))
@dataclass(frozen=True, slots=True, kw_only=True)
class Cat:
    """``out = torch.cat([lhs, rhs], dim)``; ``dim`` is not sharded."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("lhs", "rhs")
    out: TensorValue
    lhs: TensorValue
    rhs: TensorValue
    dim: int
    preallocated: bool = False


# ----- reshape groups ---------------------------------------------------------------------

Group = tuple[tuple[int, ...], tuple[int, ...]]
"""(input dims, output dims) of one group, each consecutive; either may be empty (a dim of
extent 1 alone)."""

_ONE: Normal = (Fraction(1), ())


def divides(a: Normal, b: Normal) -> Normal | None:
    """``b / a`` if it is a whole product (an int coefficient, ``a``'s atoms among ``b``'s),
    else None."""
    atoms = list(b[1])
    for atom in a[1]:
        if atom not in atoms:
            return None
        atoms.remove(atom)
    coefficient = b[0] / a[0] if a[0] else None
    if coefficient is None or coefficient.denominator != 1:
        return None
    return coefficient, tuple(atoms)


def _times(a: Normal, b: Normal) -> Normal:
    return a[0] * b[0], tuple(sorted(a[1] + b[1], key=repr))


def reshape_groups(source: tuple[Scalar, ...], target: tuple[Scalar, ...]) -> list[Group]:
    """The groups of a reshape from extents ``source`` to ``target`` (see the module
    docstring): dims of extent 1 stand alone (a 1 on both sides is one group), otherwise
    dims are added to the side whose product is smaller (constants) or divides the other's
    (symbolic), until both products are equal. Raises ReshapeError if the products differ,
    or cannot be matched symbolically (``[i0, i1] -> [i2]``). A tensor with a dim of
    constant extent 0 is one group."""
    ins = [normal_form(e) for e in source]
    outs = [normal_form(e) for e in target]
    if any(x[0] == 0 and not x[1] for x in ins + outs):
        return [(tuple(range(len(ins))), tuple(range(len(outs))))]
    groups: list[Group] = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        if i < len(ins) and j < len(outs) and ins[i] == _ONE and outs[j] == _ONE:
            groups.append(((i,), (j,)))
            i, j = i + 1, j + 1
            continue
        if i < len(ins) and ins[i] == _ONE:
            groups.append(((i,), ()))
            i += 1
            continue
        if j < len(outs) and outs[j] == _ONE:
            groups.append(((), (j,)))
            j += 1
            continue
        if i == len(ins) or j == len(outs):
            raise ReshapeError(_mismatch(source, target))
        group_in, group_out = [i], [j]
        have_in, have_out = ins[i], outs[j]
        i, j = i + 1, j + 1
        while have_in != have_out:
            grow_in = _smaller(have_in, have_out)
            if grow_in is None:
                raise ReshapeError(_mismatch(source, target))
            if grow_in and i < len(ins):
                have_in = _times(have_in, ins[i])
                group_in.append(i)
                i += 1
            elif not grow_in and j < len(outs):
                have_out = _times(have_out, outs[j])
                group_out.append(j)
                j += 1
            else:
                raise ReshapeError(_mismatch(source, target))
        groups.append((tuple(group_in), tuple(group_out)))
    return groups


def _smaller(a: Normal, b: Normal) -> bool | None:
    """Whether ``a`` is the smaller product (True), ``b`` is (False), or neither can be
    told (None)."""
    if not a[1] and not b[1]:
        return a[0] < b[0]
    if divides(a, b) is not None:
        return True
    if divides(b, a) is not None:
        return False
    return None


def _mismatch(source: tuple[Scalar, ...], target: tuple[Scalar, ...]) -> str:
    shown_source = "[" + ", ".join(print_scalar(e) for e in source) + "]"
    shown_target = "[" + ", ".join(print_scalar(e) for e in target) + "]"
    return (
        f"from {shown_source} to {shown_target}: the extents do not match (their"
        " products differ, or cannot be matched dim by dim from the symbols)"
    )
