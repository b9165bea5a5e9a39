"""How a reshape groups dims: consecutive input dims whose extents multiply to the product
of consecutive output dims (``[b, s, 3e] -> [b, s, h, 3e/h]`` is ``b -> b``, ``s -> s``,
``3e -> (h, 3e/h)``), found from the (possibly symbolic) extents. The reshape's
declaration (``hostir.ir.shape_ops``) maps the dims of one-to-one groups, and the lowering
decides from them whether a sharded dim stays contiguous on each rank
(``lowering.shape_ops``). Where the symbols cannot compare two products (a scalar input
bound at execute: ``[i0] -> [2, s0]``), the rest of both shapes is one group, and the
reshape requires equal element counts of the values the inputs bind."""

from __future__ import annotations

from fractions import Fraction
from functools import reduce

from hostir.errors import HostIrError
from hostir.ir.extents import Normal, differ, divides, normal_form, times
from hostir.ir.scalars import Scalar, print_scalar


class ReshapeError(HostIrError):
    """A reshape whose extents do not match (names both shapes)."""


Group = tuple[tuple[int, ...], tuple[int, ...]]
"""(input dims, output dims) of one group, each consecutive; either may be empty (a dim of
extent 1 alone)."""

ONE: Normal = (Fraction(1), ())
"""The normal form of extent 1."""


def reshape_groups(source: tuple[Scalar, ...], target: tuple[Scalar, ...]) -> list[Group]:
    """The groups of a reshape from extents ``source`` to ``target`` (see the module
    docstring): dims of extent 1 stand alone (a 1 on both sides is one group), otherwise
    dims are added to the side whose product is smaller (constants) or divides the other's
    (symbolic), until both products are equal; where the symbols cannot tell which is
    smaller (``[i0, i1] -> [i2]``, ``[i0] -> [2, s0]`` with a scalar input ``s0``), the rest
    of both shapes is one group, its equal counts the reshape's requirement. Raises
    ReshapeError if the products certainly differ. A tensor with a dim of constant extent
    0 is one group."""
    ins = [normal_form(e) for e in source]
    outs = [normal_form(e) for e in target]
    if any(x[0] == 0 and not x[1] for x in ins + outs):
        return [(tuple(range(len(ins))), tuple(range(len(outs))))]
    groups: list[Group] = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        if i < len(ins) and j < len(outs) and ins[i] == ONE and outs[j] == ONE:
            groups.append(((i,), (j,)))
            i, j = i + 1, j + 1
            continue
        if i < len(ins) and ins[i] == ONE:
            groups.append(((i,), ()))
            i += 1
            continue
        if j < len(outs) and outs[j] == ONE:
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
            if grow_in is None:  # symbols known only at run (``[i0] -> [s0, s1]``)
                return groups + [_unmatched(ins, outs, group_in, group_out, source, target)]
            if grow_in and i < len(ins):
                have_in = times(have_in, ins[i])
                group_in.append(i)
                i += 1
            elif not grow_in and j < len(outs):
                have_out = times(have_out, outs[j])
                group_out.append(j)
                j += 1
            else:
                raise ReshapeError(_mismatch(source, target))
        groups.append((tuple(group_in), tuple(group_out)))
    return groups


def _unmatched(
    ins: list[Normal],
    outs: list[Normal],
    group_in: list[int],
    group_out: list[int],
    source: tuple[Scalar, ...],
    target: tuple[Scalar, ...],
) -> Group:
    """The rest of a reshape as one group, from the group whose products the symbols
    cannot compare: equal element counts are then the reshape's requirement, checked when
    the inputs bind the symbols (the reshape's declaration's requirements); refused now where the
    totals certainly differ (``[i0] -> [2 * i0]``)."""
    rest_in = list(range(group_in[0], len(ins)))
    rest_out = list(range(group_out[0], len(outs)))
    total_in = reduce(times, [ins[i] for i in rest_in], ONE)
    total_out = reduce(times, [outs[j] for j in rest_out], ONE)
    if differ(total_in, total_out):
        raise ReshapeError(_mismatch(source, target))
    return tuple(rest_in), tuple(rest_out)


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
