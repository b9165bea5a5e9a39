"""Fault programs and the catalog of bad inputs every rank must survive by name.

The programs are small fusions covering each kind of communication a run starts
with (an Allreduce, an Allgather, a ring of CollectivePermutes in a stream loop)
and one without any. The catalog lists bad inputs and faults on one rank or on
all, each with the error the faulty rank(s) must raise and the error the others
must raise; tests/test_faults.py runs every entry at 4 ranks and checks both,
and docs/reliability.md shows the same table (a test keeps them equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType, shard_tensor
from frontend.tensor_view import TensorView

HIDDEN, FFN = 8, 8


def row_parallel(d: int) -> tuple[FusionDefinition, list]:
    """``x @ w.T`` with the contraction sharded: partial sums and one Allreduce."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        w = fd.define_tensor((FFN, HIDDEN))
        fd.add_output(fd.ops.linear(x, w))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    return fd, [x, w]


def gather_rows(d: int) -> tuple[FusionDefinition, list]:
    """Token-sharded ``x`` made whole: one Allgather."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        whole = fd.ops.set(x)
        fd.add_output(fd.ops.relu(whole))
    x.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    whole.set_device_mesh(mesh)
    return fd, [x]


def permute_ring(d: int) -> tuple[FusionDefinition, list]:
    """A column-parallel linear fed by a swizzled stream all-gather (CollectivePermutes)."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        w = fd.define_tensor((FFN, HIDDEN))
        gathered = fd.ops.set(x)
        fd.add_output(fd.ops.linear(gathered, w))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(0, d)
        tv.axis(0).parallelize(ParallelType.mesh_x)
    gathered.set_device_mesh(mesh)
    gathered.outer_split(0, d)
    gathered.swizzle1d(0, ParallelType.mesh_x)
    gathered.axis(0).parallelize(ParallelType.stream)
    return fd, [x, w]


def local_only(d: int) -> tuple[FusionDefinition, list]:
    """Pointwise work on column shards: no collective at all."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        fd.add_output(fd.ops.neg(fd.ops.relu(x)))
    x.set_device_mesh(mesh)
    x.outer_split(1, d)
    x.axis(1).parallelize(ParallelType.mesh_x)
    return fd, [x]


def scaled(d: int) -> tuple[FusionDefinition, list]:
    """A scalar input times a row-sharded tensor, gathered: an Allgather and a scalar."""
    mesh = DeviceMesh(torch.arange(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor((-1, HIDDEN))
        s = fd.define_scalar(dtype=torch.float32)
        whole = fd.ops.set(fd.ops.mul(x, s))
        fd.add_output(whole)
    x.set_device_mesh(mesh)
    x.outer_split(0, d)
    x.axis(0).parallelize(ParallelType.mesh_x)
    whole.set_device_mesh(mesh)
    return fd, [x, s]


PROGRAMS: dict[str, tuple[Callable, Callable]] = {
    "Allreduce": (row_parallel, lambda x, w: x @ w.T),
    "Allgather": (gather_rows, lambda x: torch.relu(x)),
    "CollectivePermute": (permute_ring, lambda x, w: x @ w.T),
    "no collective": (local_only, lambda x: -torch.relu(x)),
    "scalar": (scaled, lambda x, s: x * s),
}
"""Each program's builder (world size -> definition, input views) and its torch reference."""


def full_inputs(define: Callable, d: int, rows: int = 8) -> tuple[FusionDefinition, list, list]:
    """A fresh definition, its input views and random full inputs (the same on every rank)."""
    fd, tvs = define(d)
    torch.manual_seed(0)
    full: list = []
    for tv in tvs:
        if not isinstance(tv, TensorView):
            full.append(1.5)  # a scalar input
        else:
            full.append(torch.randn(rows if not full else FFN, HIDDEN))
    return fd, tvs, full


def local_inputs(tvs: list, full: list, rank: int) -> list:
    """This rank's shards of the full inputs (scalars as they are)."""
    return [
        shard_tensor(t, tv, rank) if isinstance(t, torch.Tensor) else t
        for t, tv in zip(full, tvs, strict=True)
    ]


# -- The catalog ---------------------------------------------------------------------------

Mutation = Callable[[list], list]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One bad input or fault: what ``where`` ranks pass instead (``mutate`` their local
    inputs), and what each rank must raise: ``faulty`` on those ranks, ``others``
    elsewhere (``"-"``: the fault is on every rank). ``(Error, text)`` pairs: the error's
    class name and a fragment its message holds; ``("ok", "")`` for a valid input that
    must run and match torch on ``full(full inputs)``."""

    name: str
    program: str
    where: str  # "rank 1" or "all ranks"
    mutate: Mutation
    faulty: tuple[str, str]
    others: tuple[str, str]
    full: Mutation = list  # the full inputs a valid ("ok") input stands for

    def applies_to(self, rank: int) -> bool:
        return self.where == "all ranks" or rank == 1


def _replace(index: int, make: Callable) -> Mutation:
    def mutate(local: list) -> list:
        local = list(local)
        local[index] = make(local[index])
        return local

    return mutate


PEER = ("PeerFailureError", "rank 1 failed before communicating")
DTYPE = ("InputError", "must have dtype float32")
EXTENT = ("DisagreementError", "the ranks disagree on extent i0")

CATALOG: tuple[Fault, ...] = (
    Fault("float64 weight", "Allreduce", "rank 1", _replace(1, torch.Tensor.double), DTYPE, PEER),
    Fault(
        "float64 weight",
        "Allreduce",
        "all ranks",
        _replace(1, torch.Tensor.double),
        DTYPE,
        ("-", ""),
    ),
    Fault(
        "int64 input",
        "Allgather",
        "rank 1",
        _replace(0, torch.Tensor.long),
        ("InputError", "must have dtype float32, got int64"),
        PEER,
    ),
    Fault(
        "bool input",
        "no collective",
        "rank 1",
        _replace(0, torch.Tensor.bool),
        ("InputError", "got bool"),
        PEER,
    ),
    Fault(
        "bfloat16 input",
        "CollectivePermute",
        "rank 1",
        _replace(0, torch.Tensor.bfloat16),
        ("InputError", "got bfloat16"),
        PEER,
    ),
    Fault(
        "an extra dim",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: t.unsqueeze(0)),
        ("InputError", "must have 2 dims"),
        PEER,
    ),
    Fault(
        "a missing dim",
        "Allgather",
        "rank 1",
        _replace(0, lambda t: t[0]),
        ("InputError", "must have 2 dims"),
        PEER,
    ),
    Fault(
        "a 0-d tensor",
        "no collective",
        "rank 1",
        _replace(0, lambda t: t.sum()),
        ("InputError", "got 0"),
        PEER,
    ),
    Fault(
        "a wrong constant extent",
        "Allreduce",
        "rank 1",
        _replace(1, lambda t: t[:-1]),
        ("InputError", "expected a local extent of 8"),
        PEER,
    ),
    Fault(
        "a wrong constant extent",
        "CollectivePermute",
        "all ranks",
        _replace(1, lambda t: t[:, :-1]),
        ("InputError", "dim 1"),
        ("-", ""),
    ),
    Fault(
        "more rows (symbolic extent)",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: torch.cat([t, t[:4]])),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "fewer rows (symbolic extent)",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: t[:4]),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "more rows (symbolic extent)",
        "Allgather",
        "rank 1",
        _replace(0, lambda t: torch.cat([t, t])),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "fewer rows (symbolic extent)",
        "Allgather",
        "rank 1",
        _replace(0, lambda t: t[:1]),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "more rows (symbolic extent)",
        "CollectivePermute",
        "rank 1",
        _replace(0, lambda t: torch.cat([t, t])),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "fewer rows (symbolic extent)",
        "CollectivePermute",
        "rank 1",
        _replace(0, lambda t: t[:1]),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "more rows (symbolic extent)",
        "no collective",
        "rank 1",
        _replace(0, lambda t: torch.cat([t, t])),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "zero rows (symbolic extent)",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: t[:0]),
        EXTENT,
        EXTENT,
    ),
    Fault(
        "zero rows on every rank",
        "Allreduce",
        "all ranks",
        _replace(0, lambda t: t[:0]),
        ("ok", ""),
        ("-", ""),
        _replace(0, lambda t: t[:0]),
    ),
    Fault(
        "a non-contiguous input",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: t.t().contiguous().t()),
        ("ok", ""),
        ("ok", ""),
    ),
    Fault(
        "an input on the meta device",
        "Allreduce",
        "rank 1",
        _replace(0, lambda t: t.to("meta")),
        ("InputError", "is on cpu, but this run is on meta"),
        PEER,
    ),
    Fault(
        "one input too few",
        "Allreduce",
        "rank 1",
        lambda local: local[:1],
        ("InputError", "expected 2 inputs"),
        PEER,
    ),
    Fault(
        "one input too many",
        "Allgather",
        "rank 1",
        lambda local: [*local, local[0]],
        ("InputError", "expected 1 inputs"),
        PEER,
    ),
    Fault(
        "None for a held input",
        "Allreduce",
        "rank 1",
        _replace(1, lambda t: None),
        ("InputError", "must be a torch.Tensor, got NoneType"),
        PEER,
    ),
    Fault(
        "a list for a tensor",
        "Allgather",
        "rank 1",
        _replace(0, lambda t: t.tolist()),
        ("InputError", "must be a torch.Tensor, got list"),
        PEER,
    ),
    Fault(
        "a tensor for a scalar",
        "scalar",
        "rank 1",
        _replace(1, lambda s: torch.tensor(s)),
        ("InputError", "is a float32 scalar, got Tensor"),
        PEER,
    ),
    Fault(
        "a string for a scalar",
        "scalar",
        "rank 1",
        _replace(1, lambda s: "1.5"),
        ("InputError", "got str"),
        PEER,
    ),
)
"""Every bad input the sweep in tests/test_faults.py tries (docs/reliability.md has the table)."""


def catalog_table() -> str:
    """The catalog as the Markdown table docs/reliability.md shows (kept equal by a test)."""
    lines = [
        "| bad input | program | on | the faulty rank(s) raise | the other ranks raise |",
        "|---|---|---|---|---|",
    ]
    for fault in CATALOG:
        faulty, others = (_outcome_text(o) for o in (fault.faulty, fault.others))
        lines.append(f"| {fault.name} | {fault.program} | {fault.where} | {faulty} | {others} |")
    return "\n".join(lines) + "\n"


def _outcome_text(outcome: tuple[str, str]) -> str:
    kind, text = outcome
    if kind == "-":
        return "(every rank is faulty)"
    if kind == "ok":
        return "nothing: runs and matches torch"
    return f"`{kind}` ({text})"
