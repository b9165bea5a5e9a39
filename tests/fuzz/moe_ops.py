"""The fuzzer's generators for issue 35's MoE ops: ``scatter``, ``scatter_add``,
``index_add`` and ``bincount`` (``hostir/ir/scatter_ops.py``).

About one case in five gets one of them after its chain of ops: :data:`MOE_SHARE` of
the cases that are not ragged and have none of issue 25's ops (``new_ops``), decided by
a random stream of its own, ``hostir-fuzz-moe``. While it is drawn the builder's
generator *is* that stream, so every case that gets none is the case it always was
(its draws, names and schedule unchanged: the suite's pinned seeds keep their cases); a
case that gets one has it scheduled with its other tensors.

Index inputs are drawn in ``[0, extent)`` with repeats (often more entries than the
extent): ``scatter_add`` and ``index_add`` sum repeats (in index order on the CPU, as
the reference) and ``bincount`` counts them. ``scatter`` writes a scalar, or a tensor
through an index of one entry along its dim (of several values for one position, which
one torch writes is unspecified). Their index inputs may draw bad data like the others'
(``new_ops.draw_bad_index``): every rank must refuse it by name.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from tests.fuzz.tensors import Axis, Tensor

if TYPE_CHECKING:
    from tests.fuzz.generate import Builder

MOE_SHARE = 0.4
"""How often a case gets one of the MoE ops (drawn from its own stream)."""
KINDS = {"scatter": 1, "scatter_add": 1.5, "index_add": 1.5, "bincount": 1.5}
"""The ops and their weights."""
INDEX_DTYPES = (torch.int64, torch.int32)
MAX_ELEMENTS = 512
"""The most elements of an index or src input."""


def add_moe_op(b: Builder, moe: random.Random) -> Tensor | None:
    """Now and then (:data:`MOE_SHARE`, drawn from ``moe`` alone) one MoE op, drawn with
    ``moe`` as the builder's generator; None where none is drawn or the pool lacks its
    operand."""
    if moe.random() >= MOE_SHARE or b.ragged or "new_op" in b.features:
        return None
    saved = b.rng
    b.rng = moe
    try:
        kind = moe.choices(list(KINDS), list(KINDS.values()))[0]
        made = _bincount(b) if kind == "bincount" else _write(b, kind)
        if made is not None:
            b.features.update({"moe_op", f"op:{kind}"})
        return made
    finally:
        b.rng = saved


def _numel(shape: list[int]) -> int:
    n = 1
    for e in shape:
        n *= e
    return n


def _write(b: Builder, kind: str) -> Tensor | None:
    """``scatter``, ``scatter_add`` or ``index_add`` into a float32 pool tensor along one
    dim, with new index (and src) inputs; off that dim the index has the tensor's extents
    (computed locally) or, for ``scatter_add`` now and then, half of them (computed whole)."""
    t = b.pick(lambda t: bool(t.data) and t.dtype == torch.float32 and len(t.data) <= 3)
    if t is None:
        return None
    dim = b.rng.randrange(len(t.data))
    extent = t.shape[dim]
    count = b.rng.choice((1, 2, 3, 4, 8, 16))
    dtype = b.rng.choice(INDEX_DTYPES)
    if kind == "index_add":
        shape = list(t.shape)
        shape[dim] = count
        if _numel(shape) > MAX_ELEMENTS:
            return None
        index = b.add_input([count], dtype=dtype, high=extent)
        src = b.add_input(shape)
        fusion = f"fd.ops.index_add({t.name}, {index.name}, {src.name}, {dim})"
        reference = f"torch.index_add({t.name}, {dim}, {index.name}.long(), {src.name})"
        return _add(b, t, fusion, reference, (t.name, index.name, src.name))
    if kind == "scatter":  # one entry along dim half the time: a tensor src may go there
        count = 1 if b.rng.random() < 0.5 else count
    shape = [count if d == dim else n for d, n in enumerate(t.shape)]
    if kind == "scatter_add":
        shape = [n // 2 if d != dim and n % 2 == 0 and b.rng.random() < 0.2 else n
                 for d, n in enumerate(shape)]  # fmt: skip
    if _numel(shape) > MAX_ELEMENTS:
        return None
    index = b.add_input(shape, dtype=dtype, high=extent)
    if kind == "scatter_add":
        src = b.add_input(shape)
        fusion = f"fd.ops.scatter_add({t.name}, {index.name}, {src.name}, {dim})"
        reference = f"torch.scatter_add({t.name}, {dim}, {index.name}.long(), {src.name})"
        return _add(b, t, fusion, reference, (t.name, index.name, src.name))
    # scatter: a scalar (repeats write the same value), or a tensor through an index of
    # one entry along dim (each position written at most once: no repeat to be unspecified)
    if shape[dim] > 1 or b.rng.random() < 0.4:
        value = b.rng.choice((-1.5, 2.0))
        fusion = f"fd.ops.scatter({t.name}, {index.name}, {value!r}, {dim})"
        reference = f"torch.scatter({t.name}, {dim}, {index.name}.long(), {value!r})"
        return _add(b, t, fusion, reference, (t.name, index.name))
    src = b.add_input(shape)
    fusion = f"fd.ops.scatter({t.name}, {index.name}, {src.name}, {dim})"
    reference = f"torch.scatter({t.name}, {dim}, {index.name}.long(), {src.name})"
    return _add(b, t, fusion, reference, (t.name, index.name, src.name))


def _add(b: Builder, t: Tensor, fusion: str, reference: str, uses: tuple[str, ...]) -> Tensor:
    out = Tensor(b.fresh(), [Axis(a.extent, a.symbolic) for a in t.data], t.dtype, t.positive)
    return b.add_op(out, fusion, reference, uses)


def _bincount(b: Builder) -> Tensor | None:
    """``bincount`` of a new 1-d index input (its dim a reduction axis of the result,
    sharded or not by the schedule): an output no later op reads."""
    length = b.rng.choice((2, 4, 8, 16))
    count = b.rng.choice((4, 8, 16, 32))
    values = b.add_input([count], dtype=b.rng.choice(INDEX_DTYPES), high=length)
    axes = [Axis(length), Axis(count, values.data[0].symbolic, reduction=True)]
    out = Tensor(b.fresh(), axes, torch.int64)
    b.reduced.append((values.name, 0))
    fusion = f"fd.ops.bincount({values.name}, {length})"
    reference = f"torch.bincount({values.name}.long(), minlength={length})"
    b.add_op(out, fusion, reference, (values.name,))
    b.pool.remove(out.name)  # integer counts: an output no later op reads
    b.outputs.append(out.name)
    return out
