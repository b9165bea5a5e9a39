"""Random fusions for the differential fuzzer: ``generate(seed, world_size) -> Case``.

A case is a chain or DAG of 1 to 6 ops (``add sub mul div relu cast set``, one of the
one-operand pointwise ops of :data:`UNARY_POINTWISE` where ``neg`` is drawn, a reduction
over some dims with ``keepdim`` either way (``sum``, ``max``, ``min``, ``mean``, or the
variance of ``var_mean``), ``linear`` with or without bias,
``matmul``, ``broadcast_in_dim``, ``permute``; about one case in three that is not
ragged ends in a ``reshape`` splitting or merging dims its schedule may shard,
:data:`RESHAPE_SHARE`) on small float32 inputs whose extents
let splits divide (some dims symbolic), and a random schedule of its tensors on a 1-,
2- or 3-d mesh of the world's ranks (``tests/fuzz/schedule.py``). The same seed and
world size always give the same case, in any process.

About one case in two (``new_ops.EXTRA_SHARE``, drawn from a stream of its own, so that
the other cases stay as they were) also gets one op (sometimes two) of issue 25's
families at a random place in its chain (``tests/fuzz/new_ops.py``): ``slice``, ``pad``,
``cat``, ``squeeze`` / ``expand`` / ``broadcast``, a comparison feeding ``where``,
``pow``, ``cumsum``, ``topk`` (values; an input's indices too), ``prod``,
``index_select`` / ``take_along_axis`` / ``gather`` and ``embedding_fwd`` with Int or
Int32 index inputs drawn in range, ``triu`` / ``iota`` / ``full`` in an expression (a
causal mask ``where(triu(full(...)) > 0, t, 0)``), and ``sdpfa_fwd`` (output and
logsumexp of tiny ``[N, H, L, E]`` inputs). Such a case's tensors are numbered as the
frontend numbers them (its ops make helper tensors), by defining the fusion once. About
half of those with an index input then get bad index data in it (``new_ops.draw_bad_index``,
again from a stream of its own), which the run must refuse with an ``IndexDataError``.

About one case in five (``moe_ops.MOE_SHARE``, again from a stream of its own) gets one
of issue 35's MoE ops after its chain: ``scatter``, ``scatter_add``, ``index_add`` or
``bincount``, with index inputs drawn in range (``tests/fuzz/moe_ops.py``).

Issue 35's extents, each from a stream of its own: three in ten of the cases that are not
ragged and draw none of the ops above (about one case in sixteen) get an op whose shape
reads Int scalar inputs (``reshape``, ``full``, ``broadcast_in_dim``, ``iota``; sometimes
a value it cannot run with, refused by name: ``tests/fuzz/scalar_extents.py``), and about
one case in ten is an *exchange* case instead: rows sent by ``ragged_all_to_all`` over
run-time counts and back (``tests/fuzz/exchange.py``).

About one case in five (:data:`RAGGED_SHARE`, drawn apart so that the other cases stay
as they were) is *ragged*: its fresh extents come from :data:`RAGGED_EXTENTS`, most of
its dims are symbolic, and its schedule may split a symbolic dim by mesh axes and stream
chunks that do not divide its value, e.g. ``i0 = 8`` rows over 8 devices (one per device)
in 2 stream chunks. The frontend cannot see that at definition; such a case must run
right or be refused by name once ``i0`` is known: a ``ScheduleError`` or ``MeshError``
(the frontend, sharding or executing) or an ``ExtentError`` (hostir, binding the inputs).
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field

import torch

from hostir import HostIrError
from tests.fuzz import exchange, moe_ops, new_ops, scalar_extents
from tests.fuzz.case import Case, InputSpec, Statement
from tests.fuzz.schedule import schedule_case
from tests.fuzz.tensors import Axis, Tensor

FRONTEND_DTYPE = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.int64: "Int",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
}
EXTENTS = (8, 8, 8, 16, 4, 2)
RAGGED_SHARE = 0.2
RAGGED_EXTENTS = (2, 4, 8, 8, 3, 6, 12)
"""A mesh axis's size (one index per device when split over it) or a value that few splits
divide (3 or 6 rows in 2 or 4 stream chunks)."""
RESHAPE_SHARE = 0.3
"""How often a case that is not ragged ends in a reshape that splits or merges dims of its
last tensor (drawn apart, so that the other cases stay as they were)."""
RAGGED_SYMBOLIC = 0.6
"""How often an input dim of a ragged case is symbolic (else 0.15)."""
MAX_ELEMENTS = 1024
MAX_INPUTS = 5
SCALARS = (2.0, 0.5, -1.5, 3.0)
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
FD_OPS = {"div": "truediv"}
"""The fd.ops name of a kind: torch's ``/`` is nvFuser's truediv (its div truncates ints)."""


@dataclass
class Builder:
    """Accumulates inputs, statements and facts the scheduler needs."""

    rng: random.Random
    tensors: dict[str, Tensor] = field(default_factory=dict)
    inputs: list[InputSpec] = field(default_factory=list)
    statements: list[Statement] = field(default_factory=list)
    pool: list[str] = field(default_factory=list)
    """Tensors later ops may read (not the terminal low-precision casts)."""
    outputs: list[str] = field(default_factory=list)
    features: set[str] = field(default_factory=set)
    reduced: list[tuple[str, int]] = field(default_factory=list)
    """(operand, data dim) pairs that an op reduces: sharding one makes partial sums."""
    gathers: list[tuple[str, str]] = field(default_factory=list)
    """(source, set output) pairs to schedule as a stream all-gather."""
    low_precision: bool = False
    ragged: bool = False
    """Fresh extents from RAGGED_EXTENTS, schedules that may not divide symbolic dims."""
    reductions: random.Random | None = None
    """Draws which reduction ``op_sum`` makes (apart from ``rng``: the other draws stay)."""
    pointwise: random.Random | None = None
    """Draws which one-operand pointwise op stands where ``op_unary`` draws ``neg`` (apart
    from ``rng``, so every other draw of a seed stays)."""

    def fresh(self) -> str:
        return f"t{len(self.tensors)}"

    def add_input(
        self,
        shape: list[int],
        positive: bool = False,
        dtype: torch.dtype = torch.float32,
        high: int = 0,
    ) -> Tensor:
        """A new input of global ``shape``, some dims drawn symbolic; an index input
        (``high`` > 0, an integer ``dtype``) holds data in ``[0, high)`` and is kept out
        of the pool (later ops would compute with indices)."""
        name = self.fresh()
        share = RAGGED_SYMBOLIC if self.ragged else 0.15
        symbolic = tuple(n > 1 and self.rng.random() < share for n in shape)
        self.features.update({"symbolic"} if any(symbolic) else set())
        axes = [Axis(n, sym) for n, sym in zip(shape, symbolic, strict=True)]
        tensor = Tensor(name, axes, dtype, positive=positive, is_input=True)
        self.tensors[name] = tensor
        spec = InputSpec(name, tuple(shape), symbolic, positive)
        if high:
            spec = dataclasses.replace(spec, dtype=str(dtype).removeprefix("torch."), high=high)
        self.inputs.append(spec)
        if not high:
            self.pool.append(name)
        return tensor

    def add_op(self, tensor: Tensor, fusion: str, reference: str, uses: tuple[str, ...]) -> Tensor:
        self.tensors[tensor.name] = tensor
        line = f"{tensor.name} = "
        self.statements.append(Statement(tensor.name, line + fusion, line + reference, uses))
        self.pool.append(tensor.name)
        return tensor

    def pick(self, ok=lambda t: True) -> Tensor | None:
        """A fitting tensor of the pool: half the time the newest (chains), else any."""
        candidates = [self.tensors[n] for n in self.pool if ok(self.tensors[n])]
        if not candidates:
            return None
        return candidates[-1] if self.rng.random() < 0.5 else self.rng.choice(candidates)

    def can_add_input(self) -> bool:
        return len(self.inputs) < MAX_INPUTS

    def extent(self) -> int:
        """A fresh extent (a dim no other tensor ties it to)."""
        return self.rng.choice(RAGGED_EXTENTS if self.ragged else EXTENTS)


def _numel(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n


def _promote(a: torch.dtype, b: torch.dtype | float, op: str) -> torch.dtype:
    if isinstance(b, float) and not a.is_floating_point:
        return torch.float64  # nvFuser: a Double scalar lifts an integer tensor to Double
    lhs = torch.ones(1, dtype=a)
    rhs = b if isinstance(b, float) else torch.ones(1, dtype=b)
    return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.true_divide}[op](
        lhs, rhs
    ).dtype


# ---------------------------------------------------------------------------
# Ops: each returns the new tensor, or None when the pool has no fitting operand.


def op_unary(b: Builder) -> Tensor | None:
    t = b.pick()
    kind = b.rng.choice(["neg", "relu", "set", "set", "cast"])
    if kind == "cast":
        return op_cast(b, t)
    if kind == "neg" and b.pointwise is not None:
        # Integer operands: the ops whose torch call takes them (nvFuser computes exp or
        # gelu of an integer in Float, torch's gelu refuses one).
        floating = t.dtype.is_floating_point
        kind = b.pointwise.choice(sorted(UNARY_POINTWISE) if floating else ["abs", "neg", "relu"])
    out = Tensor(b.fresh(), [Axis(a.extent, a.symbolic) for a in t.data], t.dtype)
    out.positive = t.positive and kind == "set"
    b.features.add(f"op:{kind}")
    if kind == "set" and b.rng.random() < 0.35:
        b.gathers.append((t.name, out.name))
    if kind == "set":
        return b.add_op(out, f"fd.ops.set({t.name})", f"{t.name}.clone()", (t.name,))
    fusion, reference = UNARY_POINTWISE[kind]
    return b.add_op(out, fusion.format(t.name), reference.format(t.name), (t.name,))


UNARY_POINTWISE = {
    "neg": ("fd.ops.neg({})", "torch.neg({})"),
    "relu": ("fd.ops.relu({})", "torch.relu({})"),
    "abs": ("fd.ops.abs({})", "torch.abs({})"),
    "exp": ("fd.ops.exp({})", "torch.exp({})"),
    "tanh": ("fd.ops.tanh({})", "torch.tanh({})"),
    "sigmoid": ("fd.ops.sigmoid({})", "torch.sigmoid({})"),
    "silu": ("fd.ops.silu({})", "torch.nn.functional.silu({})"),
    "gelu": ("fd.ops.gelu({})", "torch.nn.functional.gelu({})"),
    "tanh_gelu": (
        "fd.ops.gelu({}, approximate='tanh')",
        "torch.nn.functional.gelu({}, approximate='tanh')",
    ),
}
"""The one-operand pointwise ops the fuzzer draws (defined for every float input): the
fusion's call and the torch reference, each with the operand's name in ``{}``."""


def op_cast(b: Builder, t: Tensor) -> Tensor:
    choices = [torch.float64] if t.dtype != torch.float64 else [torch.float32]
    if t.is_input:
        choices.append(torch.int64)  # exact: no arithmetic happened before the cast
    if b.rng.random() < 0.15:
        choices = [torch.float16, torch.bfloat16]
    dtype = b.rng.choice(choices)
    out = Tensor(b.fresh(), [Axis(a.extent, a.symbolic) for a in t.data], dtype)
    out.positive = t.positive and dtype.is_floating_point
    b.features.add("op:cast")
    fusion = f"fd.ops.cast({t.name}, DataType.{FRONTEND_DTYPE[dtype]})"
    tensor = b.add_op(out, fusion, f"{t.name}.to({dtype})", (t.name,))
    if dtype in (torch.float16, torch.bfloat16):  # terminal: an output, read by nothing
        b.pool.remove(out.name)
        b.outputs.append(out.name)
        b.low_precision = True
    return tensor


def op_binary(b: Builder) -> Tensor | None:
    symbol = b.rng.choice(list(BINARY.values()))
    kind = next(k for k, v in BINARY.items() if v == symbol)
    lhs = b.pick()
    roll = b.rng.random()
    if roll < 0.2:
        return _binary_scalar(b, kind, symbol, lhs)
    if roll < 0.55:
        rhs = b.pick(lambda t: t.shape == lhs.shape and (kind != "div" or t.positive))
    else:
        rhs = None
    if rhs is None:
        if not b.can_add_input():
            return _binary_scalar(b, kind, symbol, lhs)
        rhs = b.add_input(_operand_shape(b, lhs.shape), positive=kind == "div")
    dtype = _promote(lhs.dtype, rhs.dtype, symbol)
    ndim = max(len(lhs.shape), len(rhs.shape))
    axes = []
    for position in range(ndim):
        mapped = [
            t.data[position - ndim + len(t.shape)]
            for t in (lhs, rhs)
            if position - ndim + len(t.shape) >= 0
        ]
        real = [a for a in mapped if not (a.extent == 1 and not a.symbolic)]
        extent = max(a.extent for a in mapped)
        axes.append(Axis(extent, bool(real) and all(a.symbolic for a in real)))
    out = Tensor(b.fresh(), axes, dtype)
    out.positive = lhs.positive and rhs.positive and kind != "sub"
    b.features.add(f"op:{kind}")
    uses = (lhs.name, rhs.name)
    fusion = f"fd.ops.{FD_OPS.get(kind, kind)}({lhs.name}, {rhs.name})"
    return b.add_op(out, fusion, f"{lhs.name} {symbol} {rhs.name}", uses)


def _binary_scalar(b: Builder, kind: str, symbol: str, t: Tensor) -> Tensor:
    value = b.rng.choice(SCALARS)
    dtype = _promote(t.dtype, value, symbol)
    out = Tensor(b.fresh(), [Axis(a.extent, a.symbolic) for a in t.data], dtype)
    b.features.update({f"op:{kind}", "scalar_operand"})
    name = FD_OPS.get(kind, kind)
    # torch computes an int tensor with a float in float32, nvFuser in Double.
    ref = t.name if t.dtype.is_floating_point else f"{t.name}.double()"
    if kind != "div" and b.rng.random() < 0.3:  # the scalar on the left
        out.positive = False
        return b.add_op(
            out, f"fd.ops.{name}({value!r}, {t.name})", f"{value!r} {symbol} {ref}", (t.name,)
        )
    out.positive = t.positive and value > 0 and kind in ("mul", "div", "add")
    return b.add_op(
        out, f"fd.ops.{name}({t.name}, {value!r})", f"{ref} {symbol} {value!r}", (t.name,)
    )


def _operand_shape(b: Builder, shape: tuple[int, ...]) -> list[int]:
    """A shape that broadcasts against ``shape``: itself, a suffix, or with some 1s."""
    roll = b.rng.random()
    if roll < 0.25 and len(shape) > 1:
        return list(shape[b.rng.randrange(1, len(shape)) :])
    if roll < 0.45:
        b.features.add("broadcast_operand")
        return [1 if b.rng.random() < 0.4 else n for n in shape]
    return list(shape)


REDUCTION_KINDS = {"sum": 4, "max": 1, "min": 1, "mean": 1, "var_mean": 1}
"""The reductions ``op_sum`` draws (from ``Builder.reductions``), with their weights."""
FLOAT_ONLY = ("mean", "var_mean")
"""Kinds torch refuses on integer tensors: such an operand gets a ``sum`` instead."""


def op_sum(b: Builder) -> Tensor | None:
    """A reduction (``sum``, ``max``, ``min``, ``mean`` or ``var_mean``'s variance) over some
    dims. Its operand, dims and keepdim come from the case's generator as for ``sum``
    always did; its kind from ``b.reductions``, so that cases drawing a sum stay as they
    were."""
    t = b.pick(lambda t: len(t.shape) >= 1)
    if t is None:
        return None
    ndim = len(t.shape)
    count = 1 if ndim == 1 or b.rng.random() < 0.7 else b.rng.randrange(1, ndim + 1)
    dims = sorted(b.rng.sample(range(ndim), count))
    keepdim = b.rng.random() < 0.4
    kind = "sum"
    if b.reductions is not None:
        kind = b.reductions.choices(list(REDUCTION_KINDS), list(REDUCTION_KINDS.values()))[0]
    if kind in FLOAT_ONLY and not t.dtype.is_floating_point:
        kind = "sum"
    dtype = torch.sum(torch.ones(1, dtype=t.dtype)).dtype if kind == "sum" else t.dtype
    composite = kind in FLOAT_ONLY  # its result is a div's: no reduction axes
    if keepdim:  # reduce then broadcast_in_dim: the result has no reduction axis
        axes = [Axis(1) if i in dims else Axis(a.extent, a.symbolic) for i, a in enumerate(t.data)]
        b.features.add("keepdim")
    elif composite:
        axes = [Axis(a.extent, a.symbolic) for i, a in enumerate(t.data) if i not in dims]
    else:
        axes = [Axis(a.extent, a.symbolic, reduction=i in dims) for i, a in enumerate(t.data)]
    b.reduced += [(t.name, d) for d in dims]
    b.features.add(f"op:{kind}")
    positive = t.positive if kind != "var_mean" else False
    out = Tensor(b.fresh(), axes, dtype, positive=positive)
    torch_call = {"max": "amax", "min": "amin"}.get(kind, kind)
    arguments = f"{t.name}, {dims}"
    if kind == "var_mean":
        # No correction that leaves nothing to divide by (one element reduced): NaN.
        reduced = _numel([t.shape[d] for d in dims])
        arguments += f", correction={b.reductions.choice((0, 1)) if reduced > 1 else 0}"
    call = f"({arguments}, keepdim={keepdim})" + ("[0]" if kind == "var_mean" else "")
    return b.add_op(out, f"fd.ops.{kind}{call}", f"torch.{torch_call}{call}", (t.name,))


def op_linear(b: Builder) -> Tensor | None:
    x = b.pick(lambda t: len(t.shape) >= 1 and t.dtype == torch.float32)
    if x is None:
        return None
    k = x.data[-1]
    n = b.extent()
    weight = b.pick(
        lambda t: len(t.shape) == 2 and t.shape[1] == k.extent and t.dtype == torch.float32
    )
    if weight is None or b.rng.random() < 0.7:
        if not b.can_add_input() or _numel(x.shape[:-1]) * n > MAX_ELEMENTS:
            return None
        weight = b.add_input([n, k.extent])
    n = weight.shape[0]
    if _numel(x.shape[:-1]) * n > MAX_ELEMENTS:
        return None
    bias = None
    if b.rng.random() < 0.5 and b.can_add_input():
        bias = b.add_input([n])
    axes = [Axis(a.extent, a.symbolic) for a in x.data[:-1]]
    axes += [Axis(n, weight.data[0].symbolic), Axis(k.extent, k.symbolic, reduction=True)]
    b.reduced += [(x.name, len(x.shape) - 1), (weight.name, 1)]
    b.features.add("op:linear_bias" if bias else "op:linear")
    out = Tensor(b.fresh(), axes, torch.float32)
    args = [x.name, weight.name] + ([bias.name] if bias else [])
    return b.add_op(
        out,
        f"fd.ops.linear({', '.join(args)})",
        f"torch.nn.functional.linear({', '.join(args)})",
        tuple(args),
    )


def op_matmul(b: Builder) -> Tensor | None:
    a = b.pick(lambda t: len(t.shape) >= 2 and t.dtype == torch.float32)
    if a is None or not b.can_add_input():
        return None
    *batch, m, k = a.data
    n = b.extent()
    roll = b.rng.random()
    rhs_batch = []
    if roll < 0.3 and batch:
        rhs_batch = [x.extent for x in batch[b.rng.randrange(len(batch)) :]]
    elif roll < 0.4 and not batch:
        rhs_batch = [b.rng.choice((2, 4))]
    nbatch = max(len(batch), len(rhs_batch))
    if _numel(([x.extent for x in batch] + rhs_batch)[-nbatch:]) * m.extent * n > MAX_ELEMENTS:
        return None
    rhs = b.add_input([*rhs_batch, k.extent, n])
    out_batch = []
    for position in range(nbatch):
        ia, ib = position - nbatch + len(batch), position - nbatch + len(rhs_batch)
        source = batch[ia] if ia >= 0 else rhs.data[ib]
        out_batch.append(Axis(source.extent, source.symbolic))
    axes = out_batch + [Axis(m.extent, m.symbolic), Axis(n, rhs.data[-1].symbolic)]
    axes.append(Axis(k.extent, k.symbolic, reduction=True))
    b.reduced += [(a.name, len(a.shape) - 1), (rhs.name, len(rhs.shape) - 2)]
    b.features.add("op:matmul")
    out = Tensor(b.fresh(), axes, torch.float32)
    return b.add_op(
        out,
        f"fd.ops.matmul({a.name}, {rhs.name})",
        f"torch.matmul({a.name}, {rhs.name})",
        (a.name, rhs.name),
    )


def op_broadcast_in_dim(b: Builder) -> Tensor | None:
    t = b.pick(lambda t: len(t.shape) <= 3)
    if t is None:
        return None
    ndim = len(t.shape)
    new_dim = b.rng.randrange(ndim + 1)
    new_size = b.rng.choice((1, 2, 4))
    if _numel(t.shape) * new_size > MAX_ELEMENTS:
        new_size = 1
    broadcast_dims = [i if i < new_dim else i + 1 for i in range(ndim)]
    shape, axes = [], []
    for j in range(ndim + 1):
        if j == new_dim:
            shape.append(new_size)
            axes.append(Axis(new_size))
            continue
        axis = t.data[broadcast_dims.index(j)]
        if axis.extent == 1 and not axis.symbolic and b.rng.random() < 0.5:
            shape.append(b.rng.choice((2, 4)))  # expand a size-1 dim
            axes.append(Axis(shape[-1]))
            b.features.add("expand")
        elif b.rng.random() < 0.2:
            shape.append(axis.extent)
            axes.append(Axis(axis.extent))
        else:
            shape.append(-1)
            axes.append(Axis(axis.extent, axis.symbolic))
    b.features.add("op:broadcast_in_dim")
    out = Tensor(b.fresh(), axes, t.dtype, positive=t.positive)
    args = f"{t.name}, {shape}, {broadcast_dims}"
    return b.add_op(
        out, f"fd.ops.broadcast_in_dim({args})", f"_broadcast_in_dim({args})", (t.name,)
    )


def op_permute(b: Builder) -> Tensor | None:
    t = b.pick(lambda t: len(t.shape) >= 2)
    if t is None:
        return None
    dims = list(range(len(t.shape)))
    while dims == sorted(dims):
        b.rng.shuffle(dims)
    b.features.add("op:permute")
    out = Tensor(b.fresh(), [Axis(t.data[d].extent, t.data[d].symbolic) for d in dims], t.dtype)
    out.positive = t.positive
    return b.add_op(
        out, f"fd.ops.permute({t.name}, {dims})", f"{t.name}.permute({dims})", (t.name,)
    )


def op_reshape(b: Builder, rng: random.Random) -> Tensor | None:
    """A reshape of the newest tensor that splits a dim (``n -> (a, n / a)``) or merges two
    adjacent ones, both of constant extent; other dims are kept (a symbolic one written as
    its size, ``t.size(i)``). The schedule may shard the dims it splits or merges."""
    t = b.tensors[b.pool[-1]] if b.pool else None
    if t is None or not t.shape:
        return None
    data = t.data
    splits = [
        (d, a)
        for d, axis in enumerate(data)
        for a in (2, 4)
        if not axis.symbolic and axis.extent > a and axis.extent % a == 0
    ]
    merges = [d for d in range(len(data) - 1) if not data[d].symbolic and not data[d + 1].symbolic]
    if not splits and not merges:
        return None
    kept = [Axis(a.extent, a.symbolic) for a in data]
    if merges and (not splits or rng.random() < 0.5):
        d = rng.choice(merges)
        axes = kept[:d] + [Axis(data[d].extent * data[d + 1].extent)] + kept[d + 2 :]
        sources = list(range(d)) + [None] + list(range(d + 2, len(data)))
        b.features.add("reshape_merge")
    else:
        d, a = rng.choice(splits)
        axes = kept[:d] + [Axis(a), Axis(data[d].extent // a)] + kept[d + 1 :]
        sources = list(range(d)) + [None, None] + list(range(d + 1, len(data)))
        b.features.add("reshape_split")
    shape = [
        f"{t.name}.size({i})" if i is not None and data[i].symbolic else str(axis.extent)
        for axis, i in zip(axes, sources, strict=True)
    ]
    b.features.add("op:reshape")
    out = Tensor(b.fresh(), axes, t.dtype, positive=t.positive)
    reference = f"{t.name}.reshape([{', '.join(str(axis.extent) for axis in axes)}])"
    fusion = f"fd.ops.reshape({t.name}, [{', '.join(shape)}])"
    return b.add_op(out, fusion, reference, (t.name,))


OPS = (
    (op_unary, 3),
    (op_binary, 4),
    (op_sum, 2),
    (op_linear, 2),
    (op_matmul, 1.5),
    (op_broadcast_in_dim, 1),
    (op_permute, 1),
)


def _first_inputs(b: Builder) -> None:
    for _ in range(1 if b.rng.random() < 0.6 else 2):
        ndim = b.rng.choice((1, 2, 2, 2, 3, 3))
        shape = [b.extent() for _ in range(ndim)]
        while _numel(shape) > MAX_ELEMENTS // 2:
            shape[shape.index(max(shape))] //= 2
        b.add_input(shape)


def generate(seed: int, world_size: int) -> Case:
    """The case of ``seed`` for a world of ``world_size`` ranks (4 or 8; any >= 1 works)."""
    if exchange.draws_exchange(seed, world_size):  # its own stream: the others stay
        return renumber(exchange.exchange_case(seed, world_size))
    rng = random.Random(f"hostir-fuzz:{seed}:{world_size}")
    ragged = random.Random(f"hostir-fuzz-ragged:{seed}:{world_size}").random() < RAGGED_SHARE
    reductions = random.Random(f"hostir-fuzz-reduction:{seed}:{world_size}")
    pointwise = random.Random(f"hostir-fuzz-pointwise:{seed}:{world_size}")
    b = Builder(rng, ragged=ragged, reductions=reductions, pointwise=pointwise)
    if ragged:
        b.features.add("ragged")
    _first_inputs(b)
    count = rng.randint(1, 6)
    ops, weights = zip(*OPS, strict=True)
    attempts = 0
    # The ops of issue 25's families go where `extra` places them, drawn from `extra`
    # alone (tests/fuzz/new_ops.py): a case that gets none is the case it always was.
    # `made_extra` counts the calls that made one; a call making two statements (topk's
    # values and indices, say) leaves the chain one op of its own fewer.
    extra = random.Random(f"hostir-fuzz-extra:{seed}:{world_size}")
    places, made_extra = new_ops.extra_positions(extra, count), 0
    while len(b.statements) - made_extra < count and attempts < 50:
        attempts += 1
        while places and places[0] <= len(b.statements) - made_extra:
            places.pop(0)
            made_extra += new_ops.add_extra_op(b, extra) is not None
        rng.choices(ops, weights)[0](b)
    for _ in places:
        made_extra += new_ops.add_extra_op(b, extra) is not None
    # Issue 35's MoE ops (tests/fuzz/moe_ops.py), after the chain, drawn from a stream of
    # their own: a case that gets none is the case it always was.
    moe_ops.add_moe_op(b, random.Random(f"hostir-fuzz-moe:{seed}:{world_size}"))
    # Scalar inputs as extents (tests/fuzz/scalar_extents.py), likewise.
    scalar_extents.add_scalar_extent(b, random.Random(f"hostir-fuzz-scalar:{seed}:{world_size}"))
    reshaping = random.Random(f"hostir-fuzz-reshape:{seed}:{world_size}")
    if not ragged and reshaping.random() < RESHAPE_SHARE:
        op_reshape(b, reshaping)
    outputs = [b.statements[-1].name] if b.pool[-1] == b.statements[-1].name else []
    for statement in b.statements[:-1]:
        if rng.random() < 0.2 and statement.name in b.pool:
            outputs.append(statement.name)
    outputs += [name for name in b.outputs if name not in outputs]
    if not outputs:
        outputs = [b.statements[-1].name]
    used = {name for statement in b.statements for name in statement.uses}
    case = Case(
        seed=seed,
        world_size=world_size,
        inputs=tuple(spec for spec in b.inputs if spec.name in used),
        statements=tuple(b.statements),
        outputs=tuple(outputs),
        meshes=(),
        schedules=(),
        low_precision=b.low_precision,
    )
    case = renumber(schedule_case(case, b, rng))
    # Bad index data (tests/fuzz/new_ops.py), from a stream of its own: a case that gets
    # none is the case it always was.
    return new_ops.draw_bad_index(case, random.Random(f"hostir-fuzz-bad-index:{seed}:{world_size}"))


def _tensors_made(fusion: str) -> tuple[int, int]:
    """(which of them the statement names, how many tensors) the frontend makes for one
    statement: one per op, a ``keepdim`` reduction a broadcast more, ``mean`` a sum and a
    div, ``var_mean`` seven (sum, div, broadcast, sub, mul, sum, div; the variance last)
    and two broadcasts more with ``keepdim`` (the variance's first)."""
    keepdim = "keepdim=True" in fusion
    if "fd.ops.var_mean(" in fusion:
        return (7, 9) if keepdim else (6, 7)
    if "fd.ops.mean(" in fusion:
        return (2, 3) if keepdim else (1, 2)
    return (1, 2) if keepdim else (0, 1)


def renumber(case: Case) -> Case:
    """``case`` with tensor variables named as the frontend names them (``t3`` is ``T3``):
    inputs first, then ops, each taking the numbers of the tensors it makes
    (:func:`_tensors_made`)."""
    tensors = [spec for spec in case.inputs if spec.value is None]  # scalars take no number
    names = {spec.name: f"t{i}" for i, spec in enumerate(tensors)}
    number = len(tensors)
    for statement in case.statements:
        named, made = _tensors_made(statement.fusion)
        names[statement.name] = f"t{number + named}"
        number += made
    if {"new_op", "scalar_extent", "exchange"} & set(case.features):  # as the frontend names them
        try:
            names = _frontend_names(case)
        except HostIrError:  # the frontend refuses the fusion: so will the run, by name
            pass

    def rename(text: str) -> str:
        return re.sub(r"\bt(\d+)\b", lambda m: names[m.group(0)], text)

    return dataclasses.replace(
        case,
        inputs=tuple(dataclasses.replace(s, name=rename(s.name)) for s in case.inputs),
        statements=tuple(
            Statement(
                rename(s.name), rename(s.fusion), rename(s.reference), tuple(map(rename, s.uses))
            )
            for s in case.statements
        ),
        outputs=tuple(map(rename, case.outputs)),
        schedules=tuple(
            (rename(name), tuple(tuple(map(rename, step)) for step in steps))
            for name, steps in case.schedules
        ),
    )


def _frontend_names(case: Case) -> dict[str, str]:
    """Each tensor variable of ``case`` mapped to ``tN``, ``TN`` being the name the frontend
    gives the tensor when the fusion is defined (its ops make helper tensors between)."""
    from frontend import DataType, FusionDefinition

    namespace: dict = {"DataType": DataType, "torch": torch}
    with FusionDefinition() as fd:
        namespace["fd"] = fd
        for line in [spec.define() for spec in case.inputs] + [s.fusion for s in case.statements]:
            exec(line, namespace)
        fd.add_output(namespace[case.statements[-1].name])
    names = [spec.name for spec in case.inputs if spec.value is None]
    names += [s.name for s in case.statements]
    return {name: "t" + namespace[name].name.removeprefix("T") for name in names}
