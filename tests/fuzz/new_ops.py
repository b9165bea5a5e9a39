"""The fuzzer's generators for issue 25's ops, drawn apart from the older ones.

About half the cases (:data:`EXTRA_SHARE`, decided by a random stream of their own,
``hostir-fuzz-extra``) get one op (sometimes two) from the families of :data:`FAMILIES`
at a random place in their chain: shape ops (``slice``, ``pad``, ``cat``, ``squeeze``,
``expand``, ``broadcast``), a comparison feeding ``where``, ``pow``, ``cumsum``, ``topk``
(values; indices of an input), ``prod``, indexing (``index_select``, ``take_along_axis``,
``gather`` with index inputs drawn in range), creation in an expression (``triu``, an
``iota`` added to a tensor, a ``full`` in a ``where``, a causal mask
``where(triu(full(...)) > 0, t, 0)``), ``sdpfa_fwd`` (output and
logsumexp of tiny ``[N, H, L, E]`` inputs) and ``embedding_fwd``. While such an op is
drawn, the builder's generator *is* that stream, so the draws of the case's own stream
(its other ops, inputs and schedule) are the same as before for every case that gets
none: older seeds keep their cases. Each op writes its fusion line and the torch line
of the single-device reference; its result joins the pool that later ops read (index
inputs and integer results stay out of it).

About one case in two whose index input can hold bad data (:data:`BAD_INDEX_SHARE`,
decided by a stream of its own, ``hostir-fuzz-bad-index``, once the case is made) gets
it: every element of one index input past the extent or negative
(:func:`draw_bad_index`). The run must refuse it with an ``IndexDataError`` on every
rank; the other cases stay as their seeds gave them.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING

import torch

from tests.fuzz.case import Case, prune
from tests.fuzz.tensors import Axis, Tensor

if TYPE_CHECKING:
    from tests.fuzz.generate import Builder

EXTRA_SHARE = 0.5
"""How often a case gets an op of the new families (drawn from its own stream)."""
SECOND_SHARE = 0.3
"""How often such a case gets a second one."""
FAMILIES = {
    "shape": 3,
    "where": 1.5,
    "pow": 1,
    "cumsum": 1,
    "topk": 1,
    "prod": 1,
    "indexing": 2.5,
    "creation": 2,
    "sdpfa": 1.5,
    "embedding": 1,
}
"""The new op families and their weights."""
MAX_PROD = 16
"""The most elements one ``prod`` multiplies (randn products underflow beyond)."""
INDEX_DTYPES = (torch.int64, torch.int32)
BAD_INDEX_SHARE = 0.5
"""How often a case that may hold bad index data gets it (drawn from its own stream)."""
CLEAN_RUNS = ("ragged", "subset", "multi_mesh")
"""Features of cases that get no bad index data: in them a rank may hold no index (an
empty shard, a mesh without it) and wait in a collective for the ranks that refused, until
the timeout, after which the ranks' groups are unusable."""
FLOAT_TABLES = (torch.float32, torch.float64)
"""The dtypes of the pool tensors that ``prod``, ``iota``, ``full``, the causal mask and
``embedding_fwd`` read (floats whose torch reference keeps the dtype)."""


def extra_positions(extra: random.Random, count: int) -> list[int]:
    """Where the chain of ``count`` ops gets new-family ops (after how many of its own),
    or none: drawn from ``extra`` alone."""
    if extra.random() >= EXTRA_SHARE:
        return []
    positions = [extra.randint(0, count)]
    if extra.random() < SECOND_SHARE:
        positions.append(extra.randint(0, count))
    return sorted(positions)


def add_extra_op(b: Builder, extra: random.Random) -> Tensor | None:
    """One op of a new family, drawn with ``extra`` as the builder's generator (a family
    whose operands the pool lacks gives way to another)."""
    saved = b.rng
    b.rng = extra
    try:
        for _ in range(6):
            family = extra.choices(list(FAMILIES), list(FAMILIES.values()))[0]
            made = GENERATORS[family](b)
            if made is not None:
                b.features.add("new_op")
                return made
        return None
    finally:
        b.rng = saved


def draw_bad_index(case: Case, bad: random.Random) -> Case:
    """``case``, or now and then (:data:`BAD_INDEX_SHARE`, drawn from ``bad`` alone) the
    case with bad index data: every element of one of its index inputs that an output
    depends on is one value, ``high`` to ``high + 2`` or -1 to -3 (feature ``bad_index``).
    Every rank then reads that value at the same op and must refuse it by name."""
    live = {spec.name for spec in prune(case).inputs}
    candidates = [spec for spec in case.inputs if spec.high and spec.name in live]
    if not candidates or any(feature in case.features for feature in CLEAN_RUNS):
        return case
    if bad.random() >= BAD_INDEX_SHARE:
        return case
    chosen = bad.choice(candidates)
    shift = bad.randrange(3)
    value = chosen.high + shift if bad.random() < 0.5 else -1 - shift
    inputs = tuple(
        dataclasses.replace(spec, bad=value) if spec is chosen else spec for spec in case.inputs
    )
    features = tuple(sorted({*case.features, "bad_index"}))
    return dataclasses.replace(case, inputs=inputs, features=features)


# ---------------------------------------------------------------------------
# Helpers


def _axes(source: list[Axis]) -> list[Axis]:
    """Fresh copies of ``source``'s axes (extents and symbolic flags; no reductions)."""
    return [Axis(a.extent, a.symbolic) for a in source]


def _new(b: Builder, axes: list[Axis], dtype: torch.dtype, positive: bool = False) -> Tensor:
    """A new tensor of the case (named, not yet added)."""
    return Tensor(b.fresh(), axes, dtype, positive=positive)


def _axis(extent: int, symbolic: bool = False) -> Axis:
    return Axis(extent, symbolic)


def _either(*tensors: Tensor) -> list:
    """The axes of same-shaped ``tensors`` as an op combining them makes them: symbolic
    where any operand's is (the frontend may take either extent; a symbolic one that is
    constant is only written as a size)."""
    return [
        _axis(axes[0].extent, any(a.symbolic for a in axes))
        for axes in zip(*(t.data for t in tensors), strict=True)
    ]


def _floating(t: Tensor) -> bool:
    return t.dtype.is_floating_point


def _sizes(t: Tensor) -> list[str]:
    """``t``'s extents as fusion text: constants, ``t.size(i)`` for symbolic dims."""
    return [f"{t.name}.size({i})" if a.symbolic else str(a.extent) for i, a in enumerate(t.data)]


def _index_text(ndim: int, dim: int, text: str) -> str:
    """A subscript taking ``text`` along ``dim`` and everything elsewhere."""
    return ", ".join(text if i == dim else ":" for i in range(ndim))


def _numel(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n


def _terminal(b: Builder, out: Tensor) -> None:
    """Makes ``out`` an output that no later op reads (integer results)."""
    b.pool.remove(out.name)
    b.outputs.append(out.name)


# ---------------------------------------------------------------------------
# Shape ops


def op_shape(b: Builder) -> Tensor | None:
    """``slice``, ``pad``, ``cat``, or ``squeeze`` / ``expand`` / ``broadcast``."""
    kind = b.rng.choice(["slice", "pad", "cat", "unit_dims"])
    return {"slice": op_slice, "pad": op_pad, "cat": op_cat, "unit_dims": op_unit_dims}[kind](b)


def op_slice(b: Builder) -> Tensor | None:
    """A slice of one constant dim (the others whole, a symbolic end as its size); now
    and then an end past the extent, which nvFuser clamps."""
    t = b.pick(lambda t: any(not a.symbolic and a.extent >= 2 for a in t.data))
    if t is None:
        return None
    dims = [i for i, a in enumerate(t.data) if not a.symbolic and a.extent >= 2]
    dim = b.rng.choice(dims)
    extent = t.data[dim].extent
    start = b.rng.randrange(0, extent - 1)
    stop = b.rng.randrange(start + 1, extent + 1)
    written = stop + 3 if stop == extent and b.rng.random() < 0.3 else stop
    starts = [start if i == dim else 0 for i in range(len(t.data))]
    ends = [str(written) if i == dim else size for i, size in enumerate(_sizes(t))]
    axes = _axes(t.data)
    axes[dim] = _axis(stop - start)
    b.features.add("op:slice")
    out = _new(b, axes, t.dtype, t.positive)
    fusion = f"fd.ops.slice({t.name}, {starts}, [{', '.join(ends)}])"
    reference = f"{t.name}[{_index_text(len(t.data), dim, f'{start}:{stop}')}]"
    return b.add_op(out, fusion, reference, (t.name,))


def op_pad(b: Builder) -> Tensor | None:
    """A pad of the last one or two dims (constant ones), with 0 or a value."""
    t = b.pick(lambda t: bool(t.data) and not t.data[-1].symbolic and _floating(t))
    if t is None:
        return None
    count = 2 if len(t.data) >= 2 and not t.data[-2].symbolic and b.rng.random() < 0.4 else 1
    widths = [b.rng.choice((0, 1, 2, 3)) for _ in range(2 * count)]
    if not any(widths):
        widths[0] = 1
    if _numel(t.shape) > 1024:
        return None
    axes = _axes(t.data)
    for k in range(count):
        axis = axes[-1 - k]
        axes[-1 - k] = _axis(axis.extent + widths[2 * k] + widths[2 * k + 1])
    value = b.rng.choice((None, 0.0, 1.5))
    b.features.add("op:pad")
    out = _new(b, axes, t.dtype, t.positive and value != 0.0 and value is not None)
    argument = "" if value is None else f", {value!r}"
    fusion = f"fd.ops.pad({t.name}, {widths}{argument})"
    reference = f"torch.nn.functional.pad({t.name}, {widths}, value={value or 0.0!r})"
    return b.add_op(out, fusion, reference, (t.name,))


def op_cat(b: Builder) -> Tensor | None:
    """``cat`` of a pool tensor with a new input (another extent along ``dim``), itself
    or a tensor of its shape; now and then of three tensors."""
    t = b.pick(lambda t: any(a.extent > 1 for a in t.data) and t.dtype == torch.float32)
    if t is None:
        return None
    dim = b.rng.choice([i for i, a in enumerate(t.data) if a.extent > 1])
    roll = b.rng.random()
    if roll < 0.2:
        other = t
    elif roll < 0.4:
        other = b.pick(lambda u: u.shape == t.shape and u.dtype == t.dtype) or t
    else:
        shape = list(t.shape)
        shape[dim] = b.rng.choice((2, 4, 8))  # not 1: a broadcast dim
        other = b.add_input(shape)
    parts = [t, other] + ([t] if b.rng.random() < 0.2 else [])
    axes = _axes(t.data)
    total = sum(p.data[dim].extent for p in parts)
    if _numel(t.shape) // max(1, t.data[dim].extent) * total > 2048:
        return None
    axes[dim] = _axis(total, any(p.data[dim].symbolic for p in parts))
    b.features.add("op:cat")
    out = _new(b, axes, t.dtype, all(p.positive for p in parts))
    names = ", ".join(p.name for p in parts)
    fusion = f"fd.ops.cat([{names}], {dim})"
    return b.add_op(out, fusion, f"torch.cat([{names}], {dim})", tuple(p.name for p in parts))


def op_unit_dims(b: Builder) -> Tensor | None:
    """``squeeze`` or ``expand`` of a dim of extent 1; where the tensor has none, a
    ``broadcast`` adds one first (a statement of its own), mostly then squeezed or
    expanded."""
    t = b.pick(lambda t: len(t.data) <= 3)
    if t is None:
        return None
    ones = [i for i, a in enumerate(t.data) if a.extent == 1 and not a.symbolic]
    if not ones:
        dim = b.rng.randrange(len(t.data) + 1)
        flags = [i == dim for i in range(len(t.data) + 1)]
        axes = _axes(t.data)
        axes.insert(dim, _axis(1))
        b.features.add("op:broadcast")
        out = _new(b, axes, t.dtype, t.positive)
        fusion = f"fd.ops.broadcast({t.name}, {flags})"
        t = b.add_op(out, fusion, f"{t.name}.unsqueeze({dim})", (t.name,))
        if b.rng.random() < 0.3:
            return t
        ones = [dim]
    dim = b.rng.choice(ones)
    if b.rng.random() < 0.5:
        axes = [a for i, a in enumerate(_axes(t.data)) if i != dim]
        b.features.add("op:squeeze")
        out = _new(b, axes, t.dtype, t.positive)
        fusion = f"fd.ops.squeeze({t.name}, [{dim}])"
        return b.add_op(out, fusion, f"{t.name}.squeeze({dim})", (t.name,))
    size = b.rng.choice((2, 4))
    shape = [size if i == dim else -1 for i in range(len(t.data))]
    axes = _axes(t.data)
    axes[dim] = _axis(size)
    b.features.add("op:expand")
    out = _new(b, axes, t.dtype, t.positive)
    fusion = f"fd.ops.expand({t.name}, {shape})"
    return b.add_op(out, fusion, f"{t.name}.expand({shape})", (t.name,))


# ---------------------------------------------------------------------------
# Pointwise: comparisons and where, pow

COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def op_where(b: Builder) -> Tensor | None:
    """``where(cmp(t, rhs), t, other)``: the comparison against a scalar, a tensor of
    ``t``'s shape or ``t`` itself; the other value a scalar or such a tensor."""
    t = b.pick(_floating)
    if t is None:
        return None
    kind = b.rng.choice(sorted(COMPARISONS))
    same = b.pick(lambda u: u.shape == t.shape and _floating(u) and u is not t)
    roll = b.rng.random()
    if roll < 0.4 and same is not None:
        rhs = same.name
    elif roll < 0.85:
        rhs = b.rng.choice(("0.0", "0.5", "-0.5"))
    else:
        rhs = t.name
    other = same if same is not None and b.rng.random() < 0.5 else None
    value = other.name if other is not None else b.rng.choice(("0.0", "-1.0", "2.5"))
    dtype = torch.promote_types(t.dtype, other.dtype) if other is not None else t.dtype
    b.features.update({"op:where", f"op:{kind}"})
    operands = [t] + [u for u in (same, other) if u is not None and u.name in (rhs, value)]
    condition = f"fd.ops.{kind}({t.name}, {rhs})"
    compared = f"{t.name} {COMPARISONS[kind]} {rhs}"
    uses = tuple(dict.fromkeys(n for n in (t.name, rhs) if n in b.tensors))
    if b.rng.random() < 0.3:  # the Bool tensor its own statement, scheduled as any other
        mask = _new(b, _either(*operands[: 1 + (rhs != t.name and rhs in b.tensors)]), torch.bool)
        b.add_op(mask, condition, compared, uses)
        b.pool.remove(mask.name)
        condition, compared, uses = mask.name, mask.name, (mask.name,)
    out = _new(b, _either(*operands), dtype)
    fusion = f"fd.ops.where({condition}, {t.name}, {value})"
    reference = f"torch.where({compared}, {t.name}, {value})"
    uses = tuple(dict.fromkeys(n for n in (*uses, t.name, value) if n in b.tensors))
    return b.add_op(out, fusion, reference, uses)


def op_pow(b: Builder) -> Tensor | None:
    """``pow`` of a tensor to a scalar (any real one for positive data, 2 or 3 else), a
    positive tensor to a tensor of its shape, or a scalar to a tensor."""
    t = b.pick(lambda t: _floating(t) and t.dtype != torch.float16)
    if t is None:
        return None
    roll = b.rng.random()
    b.features.add("op:pow")
    out = _new(b, _axes(t.data), t.dtype)
    if roll < 0.2:
        base = b.rng.choice((2.0, 0.5))
        out.positive = True
        return b.add_op(
            out, f"fd.ops.pow({base!r}, {t.name})", f"torch.pow({base!r}, {t.name})", (t.name,)
        )
    exponent = b.pick(lambda u: u.shape == t.shape and u.dtype == t.dtype) if t.positive else None
    if exponent is not None and roll < 0.5:
        out.axes = _either(t, exponent)
        fusion = f"fd.ops.pow({t.name}, {exponent.name})"
        reference = f"torch.pow({t.name}, {exponent.name})"
        out.positive = True
        return b.add_op(out, fusion, reference, (t.name, exponent.name))
    value = b.rng.choice((0.5, 1.5, 2.0) if t.positive else (2.0, 3.0, 2))
    out.positive = t.positive
    return b.add_op(
        out, f"fd.ops.pow({t.name}, {value!r})", f"torch.pow({t.name}, {value!r})", (t.name,)
    )


# ---------------------------------------------------------------------------
# Scans and reductions: cumsum, topk, prod


def op_cumsum(b: Builder) -> Tensor | None:
    """``cumsum`` along one dim of a floating tensor."""
    t = b.pick(lambda t: bool(t.data) and _floating(t) and t.dtype != torch.float16)
    if t is None:
        return None
    dim = b.rng.randrange(len(t.data))
    b.features.add("op:cumsum")
    out = _new(b, _axes(t.data), t.dtype, t.positive)
    return b.add_op(
        out, f"fd.ops.cumsum({t.name}, {dim})", f"torch.cumsum({t.name}, {dim})", (t.name,)
    )


def op_topk(b: Builder) -> Tensor | None:
    """``topk``'s sorted values along one dim; for an input (no ties from rounding) its
    indices too, as an output of their own."""
    t = b.pick(lambda t: bool(t.data) and _floating(t) and t.dtype != torch.float16)
    if t is None:
        return None
    dim = b.rng.randrange(len(t.data))
    k = b.rng.randint(1, t.data[dim].extent)
    largest = b.rng.random() < 0.7
    axes = _axes(t.data)
    axes[dim] = _axis(k)
    arguments = f"{t.name}, {k}, dim={dim}, largest={largest}, sorted=True"
    b.features.add("op:topk")
    out = _new(b, axes, t.dtype)
    made = b.add_op(
        out,
        f"fd.ops.topk({arguments})[0]",
        f"torch.topk({arguments}).values",
        (t.name,),
    )
    if t.is_input and b.rng.random() < 0.4:
        indices = _new(b, _axes(axes), torch.int64)
        b.add_op(
            indices, f"fd.ops.topk({arguments})[1]", f"torch.topk({arguments}).indices", (t.name,)
        )
        _terminal(b, indices)
    return made


def op_prod(b: Builder) -> Tensor | None:
    """``prod`` over some dims (at most :data:`MAX_PROD` elements), ``keepdim`` either way."""
    t = b.pick(lambda t: bool(t.data) and t.dtype in FLOAT_TABLES)
    if t is None:
        return None
    ndim = len(t.data)
    count = 1 if ndim == 1 or b.rng.random() < 0.7 else 2
    dims = sorted(b.rng.sample(range(ndim), count))
    if _numel([t.shape[d] for d in dims]) > MAX_PROD:
        dims = dims[:1]
        if t.shape[dims[0]] > MAX_PROD:
            return None
    keepdim = b.rng.random() < 0.4
    if keepdim:
        axes = [Axis(1) if i in dims else Axis(a.extent, a.symbolic) for i, a in enumerate(t.data)]
    else:
        axes = [Axis(a.extent, a.symbolic, reduction=i in dims) for i, a in enumerate(t.data)]
    b.reduced += [(t.name, d) for d in dims]
    b.features.add("op:prod")
    out = _new(b, axes, t.dtype, t.positive)
    fusion = f"fd.ops.prod({t.name}, {dims}, keepdim={keepdim})"
    return b.add_op(out, fusion, f"_prod({t.name}, {dims}, keepdim={keepdim})", (t.name,))


# ---------------------------------------------------------------------------
# Indexing: index_select, take_along_axis, gather, embedding_fwd


def op_indexing(b: Builder) -> Tensor | None:
    """``index_select``, ``take_along_axis`` or ``gather`` along one dim of a floating
    tensor, with a new Int or Int32 index input whose data is in range."""
    t = b.pick(lambda t: bool(t.data) and _floating(t) and len(t.data) <= 3)
    if t is None:
        return None
    dim = b.rng.randrange(len(t.data))
    bound = t.data[dim].extent
    dtype = b.rng.choice(INDEX_DTYPES)
    kind = b.rng.choice(["index_select", "take_along_axis", "gather"])
    count = b.rng.choice((2, 3, 4, 8))  # not 1: a broadcast dim
    if kind == "index_select":
        index = b.add_input([count], dtype=dtype, high=bound)
        axes = _axes(t.data)
        axes[dim] = _axis(count, index.data[0].symbolic)
        fusion = f"fd.ops.index_select({t.name}, {index.name}, {dim})"
        reference = f"torch.index_select({t.name}, {dim}, {index.name}.long())"
    else:
        shape = list(t.shape)
        shape[dim] = count
        if kind == "gather":  # smaller than the source off dim, now and then
            shape = [
                n // 2 if i != dim and n % 2 == 0 and n >= 4 and b.rng.random() < 0.3 else n
                for i, n in enumerate(shape)
            ]
        if _numel(shape) > 1024:
            return None
        index = b.add_input(shape, dtype=dtype, high=bound)
        axes = [
            _axis(n, index.data[i].symbolic or (n == t.shape[i] and t.data[i].symbolic))
            for i, n in enumerate(shape)
        ]
        if kind == "gather":
            fusion = f"fd.ops.gather({t.name}, {index.name}, {dim})"
            reference = f"torch.gather({t.name}, {dim}, {index.name}.long())"
        else:
            fusion = f"fd.ops.take_along_axis({t.name}, {index.name}, {dim})"
            reference = f"torch.take_along_dim({t.name}, {index.name}.long(), {dim})"
    b.features.add(f"op:{kind}")
    out = _new(b, axes, t.dtype, t.positive)
    return b.add_op(out, fusion, reference, (t.name, index.name))


def op_embedding(b: Builder) -> Tensor | None:
    """``embedding_fwd``: a 2-d floating pool tensor (or a new input) as the table,
    indices a new 1- or 2-d Int or Int32 input in range."""
    weight = b.pick(lambda t: len(t.data) == 2 and min(t.shape) > 1 and t.dtype in FLOAT_TABLES)
    if weight is None or b.rng.random() < 0.4:
        weight = b.add_input([b.rng.choice((4, 8, 16)), b.rng.choice((2, 4, 8))])
    vocabulary, width = weight.shape
    shape = [b.rng.choice((2, 3, 4, 8))] + ([b.rng.choice((2, 4))] if b.rng.random() < 0.4 else [])
    index = b.add_input(shape, dtype=b.rng.choice(INDEX_DTYPES), high=vocabulary)
    axes = _axes(index.data) + [_axis(width, weight.data[1].symbolic)]
    b.features.add("op:embedding_fwd")
    out = _new(b, axes, weight.dtype, weight.positive)
    return b.add_op(
        out,
        f"fd.ops.embedding_fwd({index.name}, {weight.name})",
        f"torch.nn.functional.embedding({index.name}, {weight.name})",
        (index.name, weight.name),
    )


# ---------------------------------------------------------------------------
# Creation in an expression: triu, iota, full


def op_creation(b: Builder) -> Tensor | None:
    """``triu`` of a tensor (a causal mask built of iotas), an ``iota`` added along the
    last dim, or ``where(t > 0, t, full(...))``."""
    kind = b.rng.choice(["triu", "mask", "iota", "full"])
    if kind == "mask":
        return _causal_mask(b)
    if kind == "triu":
        t = b.pick(lambda t: len(t.data) >= 2 and _floating(t))
        if t is None:
            return None
        diagonal = b.rng.choice((-1, 0, 0, 1, 2))
        b.features.add("op:triu")
        out = _new(b, _axes(t.data), t.dtype)
        return b.add_op(
            out,
            f"fd.ops.triu({t.name}, {diagonal})",
            f"torch.triu({t.name}, {diagonal})",
            (t.name,),
        )
    t = b.pick(lambda t: bool(t.data) and t.dtype in FLOAT_TABLES)
    if t is None:
        return None
    out = _new(b, _axes(t.data), t.dtype)
    if kind == "iota":
        length = _sizes(t)[-1]
        start, step = b.rng.choice(((0.0, 1.0), (-1.0, 0.25), (2.0, -0.5)))
        iota = f"fd.ops.iota({length}, {start!r}, {step!r}, DataType.Float)"
        arange = f"(torch.arange({t.name}.shape[-1]) * {step!r} + {start!r})"
        b.features.add("op:iota")
        return b.add_op(out, f"fd.ops.add({t.name}, {iota})", f"{t.name} + {arange}", (t.name,))
    sizes = _sizes(t)
    fill = b.rng.choice((1.5, -2.0))
    dtype = "Double" if t.dtype == torch.float64 else "Float"
    full = f"fd.ops.full([{', '.join(sizes)}], {fill!r}, DataType.{dtype})"
    b.features.add("op:full")
    return b.add_op(
        out,
        f"fd.ops.where(fd.ops.gt({t.name}, 0.0), {t.name}, {full})",
        f"torch.where({t.name} > 0.0, {t.name}, torch.full({t.name}.shape, {fill!r},"
        f" dtype={t.name}.dtype))",
        (t.name,),
    )


def _causal_mask(b: Builder) -> Tensor | None:
    """``where(gt(triu(full([r, c], 1.0), k), 0.0), t, 0.0)``: a mask made of ``full`` and
    ``triu`` (itself ``iota``s) over the last two dims of ``t``, broadcast over the others."""
    t = b.pick(lambda t: len(t.data) >= 2 and t.dtype in FLOAT_TABLES)
    if t is None:
        return None
    rows, columns = _sizes(t)[-2:]
    diagonal = b.rng.choice((0, 1, -1))
    mask = f"fd.ops.triu(fd.ops.full([{rows}, {columns}], 1.0, DataType.Float), {diagonal})"
    reference = f"torch.triu(torch.ones({t.name}.shape[-2:]), {diagonal}) > 0.0"
    b.features.update({"op:full", "op:triu", "causal_mask"})
    out = _new(b, _axes(t.data), t.dtype)
    return b.add_op(
        out,
        f"fd.ops.where(fd.ops.gt({mask}, 0.0), {t.name}, 0.0)",
        f"torch.where({reference}, {t.name}, 0.0)",
        (t.name,),
    )


# ---------------------------------------------------------------------------
# Attention


def op_sdpfa(b: Builder) -> Tensor | None:
    """``sdpfa_fwd`` of new query, key and value inputs ``[N, H, L, E]``, causal or not,
    with the default or a given scale: its output, its logsumexp, or both (each its own
    statement; the second an output of its own)."""
    batch = [b.rng.choice((2, 4))]
    heads, length, width = b.rng.choice((2, 4)), b.rng.choice((2, 4, 8)), b.rng.choice((4, 8))
    causal = b.rng.random() < 0.4
    keys = length if causal else b.rng.choice((2, 4, 8))
    query = b.add_input([*batch, heads, length, width])
    key = b.add_input([*batch, heads, keys, width])
    value = b.add_input([*batch, heads, keys, width])
    scale = b.rng.choice((None, None, 0.5))
    arguments = f"{query.name}, {key.name}, {value.name}"
    options = f"is_causal={causal}" + ("" if scale is None else f", scale={scale!r}")
    uses = (query.name, key.name, value.name)
    results = b.rng.choice(["output", "output", "logsumexp", "both"])
    b.features.add("op:sdpfa_fwd")
    made = None
    combined = _either(query, key, value)  # N, H, E (and L: causal ones have S = L)
    if results in ("output", "both"):
        out = _new(b, combined[:-2] + [_either(query, query)[-2], combined[-1]], torch.float32)
        made = b.add_op(
            out,
            f"fd.ops.sdpfa_fwd({arguments}, {options})[0]",
            f"torch.nn.functional.scaled_dot_product_attention({arguments}, {options})",
            uses,
        )
    if results in ("logsumexp", "both"):
        lse = _new(b, combined[:-2] + [_either(query, query)[-2]], torch.float32)
        b.add_op(
            lse,
            f"fd.ops.sdpfa_fwd({arguments}, {options})[1]",
            f"_sdpa_logsumexp({query.name}, {key.name}, {causal}, {scale!r})",
            uses,
        )
        if made is None:
            return lse
        _terminal(b, lse)
    return made


GENERATORS = {
    "shape": op_shape,
    "where": op_where,
    "pow": op_pow,
    "cumsum": op_cumsum,
    "topk": op_topk,
    "prod": op_prod,
    "indexing": op_indexing,
    "creation": op_creation,
    "sdpfa": op_sdpfa,
    "embedding": op_embedding,
}
"""Each family's generator: the new tensor, or None when the pool has no fitting operand."""
