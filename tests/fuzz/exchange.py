"""The fuzzer's run-time extents (issue 35; docs/run_time_extents.md): cases built around
``fd.ops.ragged_all_to_all``, whose received rows are a run-time extent ``r0``, different
on every rank.

About one case in ten (:data:`EXCHANGE_SHARE`, decided by a random stream of its own,
``hostir-fuzz-exchange``, so that every other case is the case it always was) is an
*exchange* case instead of the chain of ``generate.py``. On a 1-d mesh of every rank (in
order, or permuted: feature ``permuted``), ``D`` the world size:

- ``x [D, m, c]`` split on dim 0 (one member's rows per device), ``m`` and ``c`` small;
- counts ``[D, D]``: an Int or Int32 input holding random valid counts (each row adding up
  to ``m``, zeros likely), split on dim 0 or whole on every device; or computed on the
  device from destination ids ``[D, m]`` (a one-hot count, as examples/moe_layer.py's
  ``_count``), the rows of ``x`` sorted by destination first half of the time;
- ``ragged_all_to_all(x, counts)``: ``[D, r0, c]``; then up to three ops on the received
  rows: one-operand pointwise ops, a scalar or a ``[c]`` weight operand, the rows of a
  second tensor sent by the same counts (``extent=fd.ops.size(received, 1)``), a sum over
  ``c`` (still ragged) or over the rows (an ordinary ``[D, c]``);
- usually the way back: ``ragged_all_to_all(y, counts, transpose=True, extent=m)``, an
  ordinary ``[D, m, c]``, sometimes added to ``x``.

The reference (``case.PRELUDE``'s ``_exchange``, ``_exchange_back``) computes what each
member receives as a list of ``[1, r_q, ...]`` pieces; an output whose reference is such a
list is compared on each rank with its member's piece (``Case.members``), the others as
ordinary sharded outputs. In :data:`BAD_SHARE` of the cases with counts as an input the
counts are bad (feature ``bad_counts``): a negative count (its row still adding up to
``m``) or a row that does not add up to ``m``; every rank must raise the exchange's
``RunTimeExtentError`` (``tests/fuzz/run.py``), and a case that ran is wrong.
"""

from __future__ import annotations

import dataclasses
import random

from tests.fuzz.case import Case, InputSpec, Statement

EXCHANGE_SHARE = 0.1
"""How often a case is an exchange case (drawn from its own stream)."""
BAD_SHARE = 0.25
"""How often counts given as an input are bad."""
ROWS = (1, 2, 3, 4, 6, 8)
WIDTHS = (1, 2, 3, 4)
UNARY = {
    "neg": "torch.neg({})",
    "relu": "torch.relu({})",
    "abs": "torch.abs({})",
    "tanh": "torch.tanh({})",
    "exp": "torch.exp({})",
}


def draws_exchange(seed: int, world_size: int) -> bool:
    """Whether the case of ``seed`` is an exchange case (its own stream alone decides)."""
    return random.Random(f"hostir-fuzz-exchange:{seed}:{world_size}").random() < EXCHANGE_SHARE


def random_counts(rng: random.Random, d: int, m: int) -> list[list[int]]:
    """``[d, d]`` counts, each row adding up to ``m`` (cuts at random: zeros likely)."""
    counts = []
    for _ in range(d):
        cuts = sorted(rng.randint(0, m) for _ in range(d - 1))
        edges = [0, *cuts, m]
        counts.append([edges[i + 1] - edges[i] for i in range(d)])
    return counts


def bad_counts(rng: random.Random, counts: list[list[int]], m: int) -> list[list[int]]:
    """``counts`` broken: a negative count whose row still adds up to ``m`` (two members
    or more), or one count off by one so that its row does not."""
    bad = [list(row) for row in counts]
    d = len(bad)
    p = rng.randrange(d)
    if d > 1 and rng.random() < 0.5:
        q, other = rng.sample(range(d), 2)
        shift = bad[p][q] + rng.choice((1, 2))
        bad[p][q] -= shift
        bad[p][other] += shift
    else:
        q = rng.randrange(d)
        bad[p][q] += 1 if bad[p][q] == 0 or rng.random() < 0.5 else -1
    return bad


class _Case:
    """Accumulates an exchange case: inputs, statements, schedules, features."""

    def __init__(self, rng: random.Random, d: int) -> None:
        self.rng, self.d = rng, d
        self.inputs: list[InputSpec] = []
        self.statements: list[Statement] = []
        self.schedules: list[tuple[str, tuple]] = []
        self.features: set[str] = {"exchange", "mesh1d"}
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count - 1}"

    def add_input(self, spec: InputSpec, split: bool) -> str:
        """``spec``, placed on the mesh, its dim 0 split over it where ``split``."""
        self.inputs.append(spec)
        steps: list[tuple[str, ...]] = [(f"{spec.name}.set_device_mesh(m0)",)]
        if split:
            steps.append(
                (
                    f"{spec.name}.outer_split(0, {self.d})",
                    f"{spec.name}.axis(0).parallelize(ParallelType.mesh_x)",
                )
            )
        self.schedules.append((spec.name, tuple(steps)))
        return spec.name

    def op(self, fusion: str, reference: str, uses: tuple[str, ...]) -> str:
        name = self.fresh()
        line = f"{name} = "
        self.statements.append(Statement(name, line + fusion, line + reference, uses))
        return name


def exchange_case(seed: int, world_size: int) -> Case:
    """The exchange case of ``seed`` for ``world_size`` ranks (module docstring)."""
    rng = random.Random(f"hostir-fuzz-exchange-case:{seed}:{world_size}")
    d = world_size
    b = _Case(rng, d)
    m, c = rng.choice(ROWS), rng.choice(WIDTHS)
    members = tuple(range(d))
    if d > 1 and rng.random() < 0.4:
        members = tuple(rng.sample(range(d), d))
        b.features.add("permuted")
    x = b.add_input(InputSpec(b.fresh(), (d, m, c), (False, False, False)), split=True)
    src = x
    if rng.random() < 0.5:
        counts = _input_counts(b, m)
    else:
        counts, src = _computed_counts(b, x, m, c)
    received = b.op(
        f"fd.ops.ragged_all_to_all({src}, {counts})", f"_exchange({src}, {counts})", (src, counts)
    )
    outputs = [received] if rng.random() < 0.5 else []
    rows, ragged = received, received  # the newest [D, r0, c] tensor; the newest ragged one
    for _ in range(rng.choice((0, 1, 2, 3))):
        kind = rng.choice(("unary", "scalar", "weight", "second", "reduce"))
        if kind == "reduce":
            ragged = _reduce(b, rows, outputs)
            continue
        rows = ragged = _pointwise(b, kind, rows, received, counts, m, c)
    if rng.random() < 0.8:
        back = b.op(
            f"fd.ops.ragged_all_to_all({rows}, {counts}, transpose=True, extent={m})",
            f"_exchange_back({rows}, {counts}, {m})",
            (rows, counts),
        )
        b.features.add("exchange_back")
        if rng.random() < 0.3:
            back = b.op(f"fd.ops.add({back}, {x})", f"{back} + {x}", (back, x))
        outputs.append(back)
    elif ragged not in outputs:
        outputs.append(ragged)
    return Case(
        seed=seed,
        world_size=world_size,
        inputs=tuple(b.inputs),
        statements=tuple(b.statements),
        outputs=tuple(dict.fromkeys(outputs)),
        meshes=(("m0", f"DeviceMesh({list(members)})"),),
        schedules=tuple(b.schedules),
        features=tuple(sorted(b.features)),
        members=members,
    )


def _input_counts(b: _Case, m: int) -> str:
    """Counts as an Int or Int32 input, split on dim 0 or whole; bad now and then."""
    counts = random_counts(b.rng, b.d, m)
    dtype = b.rng.choice(("int64", "int32"))
    spec = InputSpec(b.fresh(), (b.d, b.d), (False, False), dtype=dtype)
    flat = tuple(v for row in counts for v in row)
    spec = _with_data(spec, flat)
    if b.rng.random() < BAD_SHARE:
        broken = bad_counts(b.rng, counts, m)
        spec = _with_data(spec, flat, tuple(v for row in broken for v in row))
        b.features.add("bad_counts")
    split = b.rng.random() < 0.5
    b.features.add("counts_input_split" if split else "counts_input_whole")
    return b.add_input(spec, split)


def _with_data(spec: InputSpec, data: tuple, bad: tuple = ()) -> InputSpec:
    """``spec`` holding ``data`` (and ``bad`` instead, where given)."""
    return dataclasses.replace(spec, data=data, bad_data=bad)


def _computed_counts(b: _Case, x: str, m: int, c: int) -> tuple[str, str]:
    """Counts computed from destination ids ``[D, m]`` (a one-hot count per row), and the
    rows to send: ``x``, or ``x`` sorted by destination (a stable argsort)."""
    d = b.d
    dtype = b.rng.choice(("int64", "int32"))
    spec = InputSpec(b.fresh(), (d, m), (False, False), dtype=dtype, high=d)
    ids = b.add_input(spec, split=True)
    wide = f"[{d}, {m}, {d}]"
    hits = (
        f"fd.ops.eq(fd.ops.broadcast_in_dim({ids}, {wide}, [0, 1]),"
        f" fd.ops.broadcast_in_dim(fd.ops.iota({d}, dtype=DataType.Int), {wide}, [2]))"
    )
    counts = b.op(
        f"fd.ops.sum(fd.ops.cast({hits}, DataType.Int), dims=[1])",
        f"torch.nn.functional.one_hot({ids}.long(), {d}).sum(1)",
        (ids,),
    )
    b.features.add("counts_computed")
    if b.rng.random() >= 0.5:
        return counts, x
    order = b.op(
        f"fd.ops.argsort({ids}, dim=1, stable=True)",
        f"torch.argsort({ids}, dim=1, stable=True)",
        (ids,),
    )
    picked = f"fd.ops.broadcast_in_dim({order}, [{d}, {m}, 1], [0, 1])"
    rows = b.op(
        f"fd.ops.take_along_axis({x}, {picked}, 1)",
        f"torch.take_along_dim({x}, {order}[..., None], 1)",
        (x, order),
    )
    b.features.add("sorted_by_destination")
    return counts, rows


def _pointwise(b: _Case, kind: str, rows: str, received: str, counts: str, m: int, c: int) -> str:
    """A pointwise op on the received rows ``rows [D, r0, c]`` (a list in the reference)."""
    rng = b.rng
    if kind == "unary":
        op = rng.choice(sorted(UNARY))
        b.features.add(f"exchange:{op}")
        return b.op(f"fd.ops.{op}({rows})", f"[{UNARY[op].format('v')} for v in {rows}]", (rows,))
    if kind == "scalar":
        value = rng.choice((2.0, -1.5))
        return b.op(f"fd.ops.mul({rows}, {value!r})", f"[v * {value!r} for v in {rows}]", (rows,))
    if kind == "weight":
        weight = b.add_input(InputSpec(b.fresh(), (c,), (False,)), split=False)
        b.features.add("exchange:weight")
        return b.op(
            f"fd.ops.add({rows}, {weight})", f"[v + {weight} for v in {rows}]", (rows, weight)
        )
    # a second tensor sent by the same counts, into the first one's run-time extent
    other = b.add_input(InputSpec(b.fresh(), (b.d, m, c), (False, False, False)), split=True)
    second = b.op(
        f"fd.ops.ragged_all_to_all({other}, {counts}, extent=fd.ops.size({received}, 1))",
        f"_exchange({other}, {counts})",
        (other, counts, received),
    )
    b.features.add("exchange_second")
    return b.op(
        f"fd.ops.mul({rows}, {second})",
        f"[a * b for a, b in zip({rows}, {second}, strict=True)]",
        (rows, second),
    )


def _reduce(b: _Case, rows: str, outputs: list[str]) -> str:
    """A sum of ``rows [D, r0, c]`` over ``c`` (a ragged ``[D, r0]``) or over the rows (an
    ordinary ``[D, c]``): an output; returns the newest ragged tensor."""
    if b.rng.random() < 0.5:
        out = b.op(f"fd.ops.sum({rows}, [2])", f"[torch.sum(v, [2]) for v in {rows}]", (rows,))
        b.features.add("exchange:sum_width")
        outputs.append(out)
        return out
    out = b.op(
        f"fd.ops.sum({rows}, [1])", f"torch.cat([torch.sum(v, [1]) for v in {rows}])", (rows,)
    )
    b.features.add("exchange:sum_rows")
    outputs.append(out)
    return rows
