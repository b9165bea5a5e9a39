"""The fuzzer's scalar inputs as extents (issue 35; docs/frontend_api.md, "Scalar inputs as
extents"): Int scalar inputs that size a tensor, bound when the fusion executes.

Three in ten of the cases that are not ragged and have none of issue 25's or 35's other
ops (:data:`SCALAR_SHARE`, decided by a random stream of its own, ``hostir-fuzz-scalar``;
about one case in sixteen) get one op after its chain whose shape reads scalar inputs
``s0`` (``s1``):

- ``reshape(t, [s0, -1])`` or ``reshape(t, [s0, s1])`` of a pool tensor;
- ``add(full([s0, n], v), t)`` of a pool tensor ``t [n]``, or ``t [e0, n]`` (``s0`` tied
  to ``e0`` by the broadcast);
- ``broadcast_in_dim(t, [..., s0, ...], dims)``: a new dim of ``s0``;
- ``mul(t, cast(iota(s0, start, step)))``: ``s0`` tied to the extent of ``t``'s last dim.

While it is drawn the builder's generator *is* that stream, so every case that gets none
is the case it always was. The values are the case's (zero extents included), the same
on every rank; the schedule treats the dims they size as symbolic (its splits divide the
value). In :data:`BAD_SHARE` of them a value is one the program cannot run with (feature
``bad_scalar``): a negative extent (``ExtentError``), a ``-1`` that does not divide, a
product that does not match the element count, or an extent a broadcast ties to another
that differs from it (``BoundRequirementError``); every rank
must refuse it by name before anything runs (``tests/fuzz/run.py``), and a case that ran
is wrong. The reference computes with the valid values.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from tests.fuzz.case import InputSpec
from tests.fuzz.tensors import Axis, Tensor

if TYPE_CHECKING:
    from tests.fuzz.generate import Builder

SCALAR_SHARE = 0.3
"""How often an eligible case gets a scalar-extent op (drawn from its own stream)."""
BAD_SHARE = 0.3
"""How often a case that gets one passes a value the program cannot run with."""
KINDS = {"reshape_rows": 1, "reshape_grid": 1, "full": 1, "broadcast_in_dim": 1, "iota": 1}
SIZES = (0, 1, 2, 3, 4, 8)
"""The values a new dim's scalar extent takes (0: an empty tensor)."""
MAX_ELEMENTS = 1024


def add_scalar_extent(b: Builder, stream: random.Random) -> Tensor | None:
    """Now and then (:data:`SCALAR_SHARE`, drawn from ``stream`` alone) one op whose shape
    reads scalar inputs, drawn with ``stream`` as the builder's generator; None where none
    is drawn or the pool lacks its operand."""
    if stream.random() >= SCALAR_SHARE or b.ragged or {"new_op", "moe_op"} & b.features:
        return None
    saved = b.rng
    b.rng = stream
    try:
        kind = stream.choices(list(KINDS), list(KINDS.values()))[0]
        made = MAKERS[kind](b, stream.random() < BAD_SHARE)
        if made is not None:
            b.features.update({"scalar_extent", f"scalar:{kind}"})
        return made
    finally:
        b.rng = saved


def _scalar(b: Builder, value: int, bad: int | None = None) -> str:
    """A new Int scalar input ``s<n>`` passing ``value`` (``bad`` instead, where drawn)."""
    name = f"s{sum(spec.value is not None for spec in b.inputs)}"
    b.inputs.append(InputSpec(name, (), (), value=value, bad=bad))
    if bad is not None:
        b.features.add("bad_scalar")
    return name


def _numel(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n


def _negative(b: Builder, value: int) -> int:
    """A negative extent (``-value``, or -1 for 0)."""
    return -value if value > 0 else -b.rng.choice((1, 2))


def _reshape_rows(b: Builder, bad: bool) -> Tensor | None:
    """``reshape(t, [s0, -1])``: ``s0`` divides t's element count; bad: it does not, or
    it is negative."""
    t = b.pick(lambda t: len(t.shape) >= 1 and _numel(t.shape) > 1)
    if t is None:
        return None
    n = _numel(t.shape)
    value = b.rng.choice([d for d in (1, 2, 4, 8, n) if n % d == 0])
    wrong = None
    if bad:
        misses = [v for v in (3, 5, 6, 7, n + 1, 2 * n + 1) if n % v != 0 and v > 0]
        wrong = b.rng.choice(misses) if b.rng.random() < 0.6 else _negative(b, value)
    s0 = _scalar(b, value, wrong)
    axes = [Axis(value, True), Axis(n // value, True)]
    out = Tensor(b.fresh(), axes, t.dtype, positive=t.positive)
    fusion = f"fd.ops.reshape({t.name}, [{s0}, -1])"
    return b.add_op(out, fusion, f"{t.name}.reshape({s0}, -1)", (t.name, s0))


def _reshape_grid(b: Builder, bad: bool) -> Tensor | None:
    """``reshape(t, [s0, s1])`` with ``s0 * s1`` t's element count; bad: a product off by
    ``s0``, or both negative (their product matches)."""
    t = b.pick(lambda t: len(t.shape) >= 1 and _numel(t.shape) > 1)
    if t is None:
        return None
    n = _numel(t.shape)
    rows = b.rng.choice([d for d in (1, 2, 4, 8, n) if n % d == 0])
    values = (rows, n // rows)
    wrong: tuple = (None, None)
    if bad:
        wrong = (-rows, -(n // rows)) if b.rng.random() < 0.4 else (None, n // rows + 1)
    s0, s1 = (_scalar(b, v, w) for v, w in zip(values, wrong, strict=True))
    out = Tensor(b.fresh(), [Axis(values[0], True), Axis(values[1], True)], t.dtype)
    out.positive = t.positive
    fusion = f"fd.ops.reshape({t.name}, [{s0}, {s1}])"
    return b.add_op(out, fusion, f"{t.name}.reshape({s0}, {s1})", (t.name, s0, s1))


def _full(b: Builder, bad: bool) -> Tensor | None:
    """``add(full([s0, n], v), t)`` of a float tensor ``t``: ``[n]`` (``s0`` any size), or
    ``[e0, n]`` (``s0`` tied to ``e0``); bad: ``s0`` < 0, or not ``e0``."""
    t = b.pick(lambda t: len(t.shape) in (1, 2) and t.dtype.is_floating_point)
    if t is None or (len(t.shape) == 2 and t.shape[0] == 1):  # a dim of 1 would broadcast
        return None
    tied = len(t.shape) == 2
    value = t.shape[0] if tied else b.rng.choice(SIZES)
    n = t.data[-1]
    if value * n.extent > MAX_ELEMENTS:
        return None
    wrong = None
    if bad:
        off = b.rng.choice((1, -1)) if value > 2 else 1
        mismatch = tied and b.rng.random() < 0.6 and not _broadcast(b, t, 0)
        wrong = value + off if mismatch else _negative(b, value)
    s0 = _scalar(b, value, wrong)
    fill = b.rng.choice((2.0, -0.5))
    size = f"{t.name}.size({len(t.shape) - 1})" if n.symbolic else str(n.extent)
    out = Tensor(b.fresh(), [Axis(value, True), Axis(n.extent, n.symbolic)], t.dtype)
    fusion = f"fd.ops.add(fd.ops.full([{s0}, {size}], {fill!r}, DataType.Float), {t.name})"
    reference = f"torch.full(({s0}, {n.extent}), {fill!r}) + {t.name}"
    return b.add_op(out, fusion, reference, (t.name, s0))


def _broadcast_in_dim(b: Builder, bad: bool) -> Tensor | None:
    """``broadcast_in_dim`` of a pool tensor to a new dim of ``s0``; bad: ``s0`` < 0."""
    t = b.pick(lambda t: len(t.shape) <= 3)
    if t is None:
        return None
    value = b.rng.choice(SIZES)
    if _numel(t.shape) * value > MAX_ELEMENTS:
        return None
    s0 = _scalar(b, value, _negative(b, value) if bad else None)
    new_dim = b.rng.randrange(len(t.shape) + 1)
    dims = [i if i < new_dim else i + 1 for i in range(len(t.shape))]
    axes = [Axis(a.extent, a.symbolic) for a in t.data]
    axes.insert(new_dim, Axis(value, True))
    shape = ["-1"] * len(t.shape)
    shape.insert(new_dim, s0)
    out = Tensor(b.fresh(), axes, t.dtype, positive=t.positive)
    args = f"{t.name}, [{', '.join(shape)}], {dims}"
    return b.add_op(
        out, f"fd.ops.broadcast_in_dim({args})", f"_broadcast_in_dim({args})", (t.name, s0)
    )


def _iota(b: Builder, bad: bool) -> Tensor | None:
    """``mul(t, cast(iota(s0, start, step), Float))``, ``s0`` the extent of the float
    tensor ``t``'s last dim (tied to it); bad: ``s0`` < 0, or not that extent."""
    # a last dim of 1 would broadcast against s0 instead of tying it
    t = b.pick(lambda t: len(t.shape) >= 1 and t.shape[-1] > 1 and t.dtype == torch.float32)
    if t is None:
        return None
    value = t.shape[-1]
    wrong = None
    if bad:  # (draws in the order they always had)
        if b.rng.random() < 0.6 and not _broadcast(b, t, len(t.shape) - 1):
            wrong = value + b.rng.choice((1, -1))
        else:
            wrong = _negative(b, value)
    s0 = _scalar(b, value, wrong)
    start, step = b.rng.choice((0, 1, -2)), b.rng.choice((1, 2, -1))
    axes = [Axis(a.extent, a.symbolic) for a in t.data]
    axes[-1].symbolic = True  # tied to s0
    out = Tensor(b.fresh(), axes, t.dtype)
    iota = f"fd.ops.iota({s0}, {start}, {step}, DataType.Int)"
    fusion = f"fd.ops.mul({t.name}, fd.ops.cast({iota}, DataType.Float))"
    reference = f"{t.name} * (torch.arange({s0}) * {step} + {start}).float()"
    return b.add_op(out, fusion, reference, (t.name, s0))


def _broadcast(b: Builder, t: Tensor, dim: int) -> bool:
    """Whether data dim ``dim`` of ``t`` is a broadcast in the frontend (a new dim of
    ``broadcast_in_dim``, expanded to its extent): it ties no extent, the other operand's
    is taken whatever its value (fuzz seed 8601628 at 8 ranks: ``t7 [4] * iota(s0)`` ran
    with ``s0 = 5`` drawn as a mismatch). The fusion so far is defined to ask."""
    from frontend import DataType, FusionDefinition

    namespace: dict = {"DataType": DataType, "torch": torch}
    with FusionDefinition() as fd:
        namespace["fd"] = fd
        for line in [spec.define() for spec in b.inputs] + [s.fusion for s in b.statements]:
            exec(line, namespace)
        fd.add_output(namespace[t.name])  # a fusion needs one
    return namespace[t.name].shape_domain()[dim].is_broadcast()


MAKERS = {
    "reshape_rows": _reshape_rows,
    "reshape_grid": _reshape_grid,
    "full": _full,
    "broadcast_in_dim": _broadcast_in_dim,
    "iota": _iota,
}
