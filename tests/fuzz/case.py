"""A fuzz case as data: a fusion, its schedule and its torch reference, rendered to code.

A :class:`Case` is plain frozen data (picklable), made by ``tests/fuzz/generate.py``
from a seed and a world size. ``render(case)`` turns it into a self-contained Python
module defining ``define()`` (the FusionDefinition and its schedule; returns the
definition and its input tensors) and ``reference(*full_inputs)`` (the same math in
torch on unsharded tensors). The runner executes exactly that text, so the text is
also the reproduction printed for a failing case, and ``shrink`` candidates are cases
with statements, outputs or schedule blocks removed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class InputSpec:
    """A fusion input: its name, concrete global shape, which dims are symbolic (-1)."""

    name: str
    shape: tuple[int, ...]
    symbolic: tuple[bool, ...]
    positive: bool = False
    """Data in [1, 2) instead of a standard normal (a safe divisor)."""
    dtype: str = "float32"
    """The torch dtype's name: ``float32``, or ``int64`` / ``int32`` for an index input."""
    high: int = 0
    """An index input's bound: its data is drawn in ``[0, high)`` (0 for a float input)."""
    bad: int | None = None
    """Bad index data (``tests/fuzz/new_ops.py``, :func:`draw_bad_index`): every element of
    the index input is this value, ``high`` or more or negative; the run must refuse it.
    For a scalar input (``value``), the bad value passed instead of ``value``
    (``tests/fuzz/scalar_extents.py``)."""
    value: int | None = None
    """A scalar input's value (an Int scalar sizing a tensor): ``shape`` is ``()``."""
    data: tuple[int, ...] = ()
    """An integer input's elements, flat, chosen by the case (run-time counts,
    ``tests/fuzz/exchange.py``) instead of drawn in ``[0, high)``."""
    bad_data: tuple[int, ...] = ()
    """Bad elements passed instead of ``data`` (counts the run must refuse)."""

    def define(self) -> str:
        """The fusion line defining this input (``fd.define_tensor``; -1 for symbolic;
        ``fd.define_scalar`` for a scalar input)."""
        if self.value is not None:
            return f"{self.name} = fd.define_scalar(DataType.Int)"
        shape = [-1 if sym else n for n, sym in zip(self.shape, self.symbolic, strict=True)]
        dtype = INDEX_DTYPES.get(self.dtype)
        return f"{self.name} = fd.define_tensor({tuple(shape)!r}" + (
            f", dtype=DataType.{dtype})" if dtype else ")"
        )


INDEX_DTYPES = {"int64": "Int", "int32": "Int32"}
"""The frontend's DataType of an index input's dtype (float inputs need none)."""


@dataclass(frozen=True)
class Statement:
    """One op: the line in the fusion, the matching torch line, the names it reads."""

    name: str
    fusion: str
    reference: str
    uses: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """A random fusion and schedule for ``world_size`` ranks, re-creatable from the seed."""

    seed: int
    world_size: int
    inputs: tuple[InputSpec, ...]
    statements: tuple[Statement, ...]
    outputs: tuple[str, ...]
    meshes: tuple[tuple[str, str], ...]
    """(variable, DeviceMesh expression) pairs."""
    schedules: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]
    """Per scheduled tensor, in definition order: its steps (set_device_mesh first), each
    a few lines (a split and a parallelize, say)."""
    features: tuple[str, ...] = ()
    low_precision: bool = False
    """Whether an output is cast to float16/bfloat16 (looser tolerance)."""
    members: tuple[int, ...] = ()
    """A ragged exchange's mesh, its devices in member order (``tests/fuzz/exchange.py``):
    an output whose reference is a list of pieces, one per member, is compared on each
    rank with its member's piece."""


PRELUDE = '''\
import torch

from frontend import DataType, DeviceMesh, FusionDefinition, ParallelType


def _broadcast_in_dim(t, shape, broadcast_dims):
    """torch's equivalent of fd.ops.broadcast_in_dim (-1 keeps the mapped extent)."""
    view = [1] * len(shape)
    for i, dim in enumerate(broadcast_dims):
        view[dim] = t.shape[i]
    sizes = [t.shape[broadcast_dims.index(j)] if s == -1 else s for j, s in enumerate(shape)]
    return t.reshape(view).expand(sizes)


def _prod(t, dims, keepdim):
    """torch's equivalent of fd.ops.prod over several dims (torch.prod takes one)."""
    for dim in sorted(dims, reverse=True):
        t = torch.prod(t, dim, keepdim=keepdim)
    return t


def _exchange(x, counts):
    """torch's equivalent of fd.ops.ragged_all_to_all of x [D, m, ...] by counts [D, D]: a
    list of what each member q receives, [1, r_q, ...]: from each sender p in order, its
    counts[p][q] rows after those it sends the members before q."""
    received = []
    for q in range(x.shape[0]):
        pieces = [x[p, int(counts[p, :q].sum()) :][: int(counts[p, q])] for p in range(x.shape[0])]
        received.append(torch.cat(pieces)[None])
    return received


def _exchange_back(received, counts, rows):
    """The transposed exchange of ``received`` (a list of [1, r_q, ...]): [D, rows, ...],
    each sender's rows back where they were."""
    d = len(received)
    out = received[0].new_zeros(d, rows, *received[0].shape[2:])
    for q in range(d):
        at = 0
        for p in range(d):
            n, start = int(counts[p, q]), int(counts[p, :q].sum())
            out[p, start : start + n] = received[q][0, at : at + n]
            at += n
    return out


def _sdpa_logsumexp(q, k, is_causal, scale):
    """The logsumexp over the keys of fd.ops.sdpfa_fwd's scaled, causally masked scores."""
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(scores, dim=-1)
'''


def render(case: Case) -> str:
    """The case as a Python module: ``define()``, ``reference(...)`` and ``INPUTS``."""
    lines = [PRELUDE, "", f"# seed {case.seed}, world size {case.world_size}", "def define():"]
    lines.append("    with FusionDefinition() as fd:")
    lines += [f"        {spec.define()}" for spec in case.inputs]
    lines += [f"        {s.fusion}" for s in case.statements]
    lines += [f"        fd.add_output({name})" for name in case.outputs]
    schedule = [line for _, steps in case.schedules for step in steps for line in step]
    used = {name for name, _ in case.meshes if any(f"({name})" in line for line in schedule)}
    lines += [f"    {name} = {expr}" for name, expr in case.meshes if name in used]
    lines += [f"    {line}" for line in schedule]
    lines.append(f"    return fd, [{', '.join(s.name for s in case.inputs)}]")
    lines += ["", "", f"def reference({', '.join(s.name for s in case.inputs)}):"]
    lines += [f"    {s.reference}" for s in case.statements]
    lines.append(f"    return [{', '.join(case.outputs)}]")
    inputs = ", ".join(f"({s.shape!r}, {s.positive})" for s in case.inputs)
    lines += ["", "", f"INPUTS = [{inputs}]  # (global shape, positive data)", ""]
    return "\n".join(lines)


def load(case: Case) -> dict:
    """The namespace of the rendered case (``define``, ``reference``, ``INPUTS``)."""
    namespace: dict = {"__name__": f"fuzz_case_{case.seed}"}
    exec(compile(render(case), f"<fuzz case {case.seed}>", "exec"), namespace)
    return namespace


def make_inputs(case: Case, bad: bool = True) -> list[torch.Tensor]:
    """The full (unsharded) random inputs: the same on every rank for one seed.

    Standard normal data is non-zero almost surely and varies, so a missing or
    misplaced piece shows; ``positive`` inputs (divisors) are in [1, 2); index inputs
    (``high``) are integers in ``[0, high)``, in range on every rank, except an input
    drawn bad (``InputSpec.bad``), all of whose elements hold that value (``bad=False``:
    the data drawn for it in range, for the reference). A scalar input is its ``value``
    (or its bad one), an input with ``data`` holds it (or its ``bad_data``).
    """
    generator = torch.Generator().manual_seed(case.seed)
    full: list = []
    for spec in case.inputs:
        if spec.value is not None:  # no draw: the tensors after it get the data they had
            full.append(spec.bad if bad and spec.bad is not None else spec.value)
        elif spec.data:
            data = spec.bad_data if bad and spec.bad_data else spec.data
            full.append(torch.tensor(data, dtype=getattr(torch, spec.dtype)).reshape(spec.shape))
        elif spec.high:
            dtype = getattr(torch, spec.dtype)
            drawn = torch.randint(0, spec.high, spec.shape, generator=generator, dtype=dtype)
            # drawn anyway: the inputs after it get the data they always had
            full.append(drawn.fill_(spec.bad) if bad and spec.bad is not None else drawn)
        elif spec.positive:
            full.append(1 + torch.rand(spec.shape, generator=generator))
        else:
            full.append(torch.randn(spec.shape, generator=generator))
    return full


# ---------------------------------------------------------------------------
# Shrinking: smaller cases that may keep a failure


def prune(case: Case) -> Case:
    """``case`` without statements, inputs and schedules that no output depends on."""
    live = set(case.outputs)
    kept = []
    for statement in reversed(case.statements):
        if statement.name in live:
            kept.append(statement)
            live.update(statement.uses)
    statements = tuple(reversed(kept))
    inputs = tuple(s for s in case.inputs if s.name in live)
    defined = {s.name for s in statements} | {s.name for s in inputs}
    schedules = tuple((name, block) for name, block in case.schedules if name in defined)
    return dataclasses.replace(case, statements=statements, inputs=inputs, schedules=schedules)


def shrink_candidates(case: Case) -> list[Case]:
    """Cases one step smaller than ``case``: one output fewer, an earlier tensor as the only
    output, one schedule block fewer, or one block without its last step (later steps index
    loop axes the earlier ones made)."""
    smaller = []
    if len(case.outputs) > 1:
        for name in case.outputs:
            outputs = tuple(o for o in case.outputs if o != name)
            smaller.append(prune(dataclasses.replace(case, outputs=outputs)))
    for statement in case.statements:
        if (statement.name,) != case.outputs:
            smaller.append(prune(dataclasses.replace(case, outputs=(statement.name,))))
    for index, (name, steps) in enumerate(case.schedules):
        rest = case.schedules[:index], case.schedules[index + 1 :]
        smaller.append(dataclasses.replace(case, schedules=rest[0] + rest[1]))
        if len(steps) > 1:
            trimmed = ((name, steps[:-1]),)
            smaller.append(dataclasses.replace(case, schedules=rest[0] + trimmed + rest[1]))
    return smaller
