"""Running a fuzz case on every rank against the single-device reference.

Every rank renders and builds the case, shards the full random inputs
(``shard_tensor``; the same seed on all ranks), runs ``fd.execute``, and compares
each output shard with the shard of the torch reference computed from the full
tensors. The ranks then exchange their results (``all_gather_object``), so every
rank reaches the same verdict:

- ``ok``: every rank's outputs match (dtype, shape, values within a tolerance for
  float32 and summation order); partial outputs match once combined over their partial
  mesh axes with their op (summed for a sum, the maximum for a ``max``, ...).
- ``refused``: every rank raised the same named refusal (a ``FrontendError``,
  ``LoweringError`` or ``MeshError``: a schedule the project does not support)
  while building, lowering or validating, or the same ``ExtentError`` when
  ``fd.execute`` bound the inputs' extents (a split that does not divide the
  value a symbol is bound to), before running anything. A lowering consistency
  check that fails (``check_resharding``) is a crash, not a refusal. A refusal
  that only some ranks can see (a split of an input only the ranks of its mesh
  bind) is one too when every other rank raises a ``PeerFailureError`` carrying
  that refusal's message, as the agreement makes them. Ranks that refuse for
  different reasons raise, each with its own error class, the agreement's one
  account of all the refusals, and that is one refusal too; ranks that refuse
  differently otherwise are a crash. Inputs are sharded (``shard_tensor``, which
  refuses a split that does not divide too) on every rank before any executes,
  and a rank's refusal there is every rank's, as a user's script would stop
  every rank before it runs. A case that drew bad index data (feature ``bad_index``,
  ``tests/fuzz/new_ops.py``) is refused when every rank raises the same
  ``IndexDataError`` (or a refusal before that): every element of the index is bad, so
  every rank meets it at the same op.
- ``wrong``: some rank's numbers, shape or dtype differ, or a rank holds an output
  it should not (or lacks one it should hold), or bad index data was not refused.
- ``crash``: any other exception (``EvaluationError``s included: a program that
  lowered must run; an ``IndexDataError`` for index data drawn in range), or ranks
  that disagree on the outcome. Aborts and hangs are caught by whoever drives the
  ranks (the pytest pool or ``scripts/fuzz.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from frontend import FrontendError, shard_tensor
from hostir import Deallocate, ExtentError, ForLoop, IndexDataError, MeshError, TensorValue
from hostir.comm.simulated_communicator import SimulatedCommunicator
from hostir.comm.world import default_communicator
from hostir.errors import PeerFailureError
from hostir.ir.instructions import defined_values
from hostir.ir.sharding import ReduceOp, Sharding
from lowering import LoweringError
from tests.fuzz.case import Case, load, make_inputs

OK, REFUSED, WRONG, CRASH = "ok", "refused", "wrong", "crash"
STATUSES = (OK, REFUSED, WRONG, CRASH)
PEER_REFUSED = "peer refused"
"""A rank's PeerFailureError: another rank refused before communicating (not a status
of a case: combine() turns it into ``refused`` when it carries that refusal)."""
REFUSALS = (FrontendError, LoweringError, MeshError, ExtentError)
INTERNAL = ("The resharding decomposition left",)
"""Messages of lowering's own consistency checks: a bug in an earlier pass, not a refusal."""


@dataclass(frozen=True)
class RankResult:
    """What one rank saw: its status, a message, and its partial-sum outputs."""

    status: str
    message: str = ""
    partial: tuple[tuple[int, torch.Tensor], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """The verdict on one case, the same on every rank."""

    seed: int
    world_size: int
    status: str
    message: str = ""
    program: str = ""
    features: tuple[str, ...] = ()


def tolerance(case: Case, dtype: torch.dtype) -> float:
    """Relative tolerance, taken against the largest magnitude of the whole output."""
    if not dtype.is_floating_point:
        return 0.0
    return 2e-2 if case.low_precision else 1e-4


# ---------------------------------------------------------------------------
# One rank


@dataclass
class Made:
    """What every rank of a case builds alike: the case's code, its inputs, the
    reference's outputs, and the definition (or the error defining it raised)."""

    namespace: dict
    full: list
    expected: Any
    definition: tuple | None
    error: Exception | None


def make_case(case: Case) -> Made | RankResult:
    """``case`` built once (a simulated world's ranks share it: scripts/fuzz.py
    --simulate), or the generator's crash."""
    try:
        namespace = load(case)
        full = make_inputs(case)
        expected = namespace["reference"](*make_inputs(case, bad=False))
    except Exception:  # the fuzzer's own fault, but never to be hidden
        return RankResult(CRASH, "generator: " + traceback.format_exc())
    try:
        return Made(namespace, full, expected, namespace["define"](), None)
    except Exception as error:
        return Made(namespace, full, expected, None, error)


def run_on_rank(
    case: Case, rank: int, world_size: int = 1, made: Made | RankResult | None = None
) -> tuple[RankResult, Any]:
    """Runs ``case`` as ``rank``; returns the result and the program (if lowered).
    ``made``: the case built once for every rank (else built here)."""
    made = make_case(case) if made is None else made
    if isinstance(made, RankResult):
        return made, None
    full, expected = made.full, made.expected
    fd = None
    try:
        if made.error is not None:
            raise made.error
        fd, tvs = made.definition
        local = _shard_inputs(fd, tvs, full, rank)
    except Exception as error:
        local, prepared = None, _refusal(error)
    else:
        prepared = RankResult(OK)
    prepared = _first_failure(prepared, world_size)
    if prepared.status != OK:
        return prepared, _program_unless_refused(prepared, fd)
    try:
        outputs = fd.execute(local)
    except Exception as error:
        refused = _refusal(error, case)
        return refused, _program_unless_refused(refused, fd)
    program = fd.host_ir()
    if "bad_index" in case.features:
        return RankResult(WRONG, f"bad index data was not refused: {_bad_index(case)}"), program
    bad = [s for s in case.inputs if s.bad_data or (s.value is not None and s.bad is not None)]
    if bad:  # a scalar extent or counts the program cannot run with, and it ran
        return RankResult(WRONG, f"bad {bad[0].name} was not refused: {bad[0]}"), program
    unfreed = never_freed(program)
    if unfreed:
        return RankResult(CRASH, f"never deallocated (a leak): {', '.join(unfreed)}"), program
    try:
        return compare_outputs(case, fd, outputs, expected, rank), program
    except Exception:
        return RankResult(CRASH, "comparing: " + traceback.format_exc()), program


def _refusal(error: Exception, case: Case | None = None) -> RankResult:
    """A rank's result for ``error``: a refusal, a peer's refusal, or a crash (an
    IndexDataError is a refusal in a ``case`` that drew bad index data only)."""
    message = f"{type(error).__name__}: {error}"
    if isinstance(error, IndexDataError) and case is not None and "bad_index" in case.features:
        return RankResult(REFUSED, message)
    if isinstance(error, ExtentError) and case is not None and _valid_extents(case):
        # a scalar extent or run-time counts the case drew valid, refused
        trace = "".join(traceback.format_exception(error))
        return RankResult(CRASH, f"valid extents refused: {trace}")
    if isinstance(error, REFUSALS):
        status = CRASH if any(marker in message for marker in INTERNAL) else REFUSED
        return RankResult(status, message)
    if isinstance(error, PeerFailureError):
        return RankResult(PEER_REFUSED, message)
    return RankResult(CRASH, "".join(traceback.format_exception(error)))


def _valid_extents(case: Case) -> bool:
    """Whether ``case`` passes scalar extents or run-time counts (``tests/fuzz/
    scalar_extents.py``, ``exchange.py``) all drawn valid: no ExtentError may refuse them
    (its splits divide; such a case is never ragged)."""
    drawn = {"scalar_extent", "exchange"} & set(case.features)
    return bool(drawn) and not {"bad_scalar", "bad_counts"} & set(case.features)


def _bad_index(case: Case) -> str:
    """``T3 holds 7 (expected 0 <= index < 6)``: the case's bad index input."""
    spec = next(spec for spec in case.inputs if spec.bad is not None)
    return f"{spec.name} holds {spec.bad} (expected 0 <= index < {spec.high})"


def _first_failure(result: RankResult, world_size: int) -> RankResult:
    """The first rank's failure to build and shard the case, on every rank (each rank
    shards its own inputs: only some may refuse), or ``result`` if none failed."""
    if world_size == 1:
        return result
    results = gather_results(result, world_size)
    for rank, seen in enumerate(results):
        if seen.status != OK:
            return (
                seen
                if seen.status == REFUSED
                else RankResult(CRASH, f"rank {rank}: {seen.message}")
            )
    return result


def never_freed(program) -> list[str]:
    """The intermediates of ``program`` (defined by it, neither input nor output) that no
    ``deallocate`` frees: each is a leak, once per loop iteration if it is in a loop."""
    defined: list[str] = []
    freed: set[str] = set()

    def walk(body) -> None:
        for instruction in body:
            if isinstance(instruction, Deallocate):
                freed.add(instruction.tensor.name)
            defined.extend(
                v.name for v in defined_values(instruction) if isinstance(v, TensorValue)
            )
            if isinstance(instruction, ForLoop):
                walk(instruction.body)

    walk(program.body)
    kept = {v.name for v in (*program.inputs, *program.outputs)}
    return [name for name in dict.fromkeys(defined) if name not in kept and name not in freed]


def _program_unless_refused(result: RankResult, fd) -> Any:
    """The program to show with a wrong or crashed result; None for a refusal, which shows
    none (a program that failed to lower is not lowered again on every rank)."""
    return None if result.status == REFUSED else _program(fd)


def _program(fd) -> Any:
    """The program ``fd`` last lowered, or a fresh lowering (unchecked), or None."""
    last = getattr(fd, "_last_program", None)  # (schedule version, program) or None
    program = last[1] if last is not None else None
    if program is None and fd is not None:
        from lowering import lower_fusion

        try:
            program = lower_fusion(fd.fusion)
        except Exception:
            return None
    return program


def _shard_inputs(fd, tvs, full: list[torch.Tensor], rank: int) -> list:
    """Each input's local shard: by its own schedule, or (unscheduled) by the program's."""
    program = None
    local = []
    for index, (tv, tensor) in enumerate(zip(tvs, full, strict=True)):
        if not isinstance(tensor, torch.Tensor):  # a scalar input: the same on every rank
            local.append(tensor)
            continue
        if tv.device_mesh is not None:
            local.append(shard_tensor(tensor, tv, rank))
            continue
        program = program or fd.host_ir()
        local.append(shard_tensor(tensor, program.inputs[index], rank))
    return local


def compare_outputs(case: Case, fd, outputs, expected, rank: int) -> RankResult:
    """This rank's verdict on its outputs; partial-sum outputs are returned for summing."""
    program = fd.host_ir()
    if len(outputs) != len(expected):
        return RankResult(WRONG, f"{len(outputs)} outputs, expected {len(expected)}")
    partial = []
    for index, (out, value, ref) in enumerate(zip(outputs, program.outputs, expected, strict=True)):
        where = f"output {index} ({value.name}) on rank {rank}"
        if isinstance(ref, list):  # received by a ragged exchange: one piece per member
            problem = _ragged_mismatch(case, out, ref, rank)
            if problem is not None:
                return RankResult(WRONG, f"{where}: {problem}")
            continue
        piece = shard_tensor(ref, value, rank)
        if piece is None or out is None:
            if (piece is None) != (out is None):
                held = "holds" if out is not None else "lacks"
                return RankResult(WRONG, f"{where} {held} a tensor, against its mesh")
            continue
        tv = fd.fusion.outputs()[index]
        if tv.mesh_set_by_user:
            by_schedule = shard_tensor(ref, tv, rank)
            if not _identical(by_schedule, piece):
                return RankResult(WRONG, f"{where}: the program changed the user's sharding")
        problem = _mismatch(case, out, piece, ref)
        if value.sharding is not None and value.sharding.partial:
            if problem is None or problem.startswith("values"):
                partial.append((index, out.detach().cpu()))
                continue
        if problem is not None:
            return RankResult(WRONG, f"{where}: {problem}")
    return RankResult(OK, partial=tuple(partial))


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same elements, a NaN matching a NaN (torch.equal's
    NaN differs from itself: fuzz seed 8500850 at 4 ranks, a prod overflowing to inf and
    inf - inf, was judged resharded by the program)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _ragged_mismatch(case: Case, out, pieces: list[torch.Tensor], rank: int) -> str | None:
    """Why ``out`` is not the piece of this rank's member (a rank outside the exchange's
    mesh holds none), or None; the tolerance is taken against every member's piece."""
    if rank not in case.members:
        return None if out is None else "holds a tensor, outside the exchange's mesh"
    if out is None:
        return "lacks its member's piece"
    whole = torch.cat([p.flatten() for p in pieces])
    return _mismatch(case, out, pieces[case.members.index(rank)], whole)


def _mismatch(case: Case, out: torch.Tensor, piece: torch.Tensor, ref: torch.Tensor) -> str | None:
    """Why ``out`` is not ``piece`` (a shard of ``ref``), or None if it is."""
    if out.dtype != piece.dtype:
        return f"dtype {out.dtype}, expected {piece.dtype}"
    if tuple(out.shape) != tuple(piece.shape):
        return f"shape {tuple(out.shape)}, expected {tuple(piece.shape)}"
    return _values_differ(case, out.detach().cpu(), piece, ref)


def _values_differ(case: Case, out: torch.Tensor, piece: torch.Tensor, ref: torch.Tensor):
    rtol = tolerance(case, piece.dtype)
    if rtol == 0.0:
        if torch.equal(out, piece):
            return None
        return f"values differ (exact dtype), e.g. {_first_difference(out, piece)}"
    finite = ref[ref.isfinite()]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    difference = _difference(out, piece)
    # a finite value where the reference overflowed is allowed nothing
    allowed = rtol * scale + rtol * piece.double().abs().nan_to_num(nan=0.0, posinf=0.0)
    if difference.numel() == 0 or bool(((difference == 0) | (difference <= allowed)).all()):
        return None
    return (
        f"values differ: max |diff| {float(difference.max()):.3g} (allowed {rtol:g} x"
        f" {scale:.3g}), e.g. {_first_difference(out, piece)}"
    )


def _difference(out: torch.Tensor, piece: torch.Tensor) -> torch.Tensor:
    """``|out - piece|`` elementwise, 0 where both are the same or both not finite (an
    overflow: whether ``inf * x + inf * y`` is inf or NaN depends on the order of the sum,
    which the sharding changes: fuzz seed 8500850 at 4 ranks), inf where only one is NaN."""
    out, piece = out.double(), piece.double()
    same = (out == piece) | (~out.isfinite() & ~piece.isfinite())
    return torch.where(same, 0.0, (out - piece).abs().nan_to_num(nan=float("inf")))


def _first_difference(out: torch.Tensor, piece: torch.Tensor) -> str:
    diff = _difference(out, piece)
    index = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
    return f"at {index}: got {out[index].item():.6g}, expected {piece[index].item():.6g}"


# ---------------------------------------------------------------------------
# All ranks


def run_case(
    case: Case, rank: int, world_size: int, made: Made | RankResult | None = None
) -> Outcome:
    """Runs ``case`` on this rank and agrees with the others on the outcome (``made``:
    the case built once for every rank, see :func:`run_on_rank`)."""
    result, program = run_on_rank(case, rank, world_size, made)
    results = [result] if world_size == 1 else gather_results(result, world_size)
    status, message = combine(results)
    if status == OK:
        try:
            problem = check_partials(case, results, program)
        except Exception:
            problem = "checking partial sums: " + traceback.format_exc()
        if problem is not None:
            status, message = WRONG, problem
    keep = str(program) if status in (WRONG, CRASH) and program is not None else ""
    return Outcome(case.seed, case.world_size, status, message, keep, case.features)


def gather_results(result: Any, world_size: int) -> list[Any]:
    """Every rank's ``result``, in rank order: through the simulated world where this
    thread is one of its ranks (scripts/fuzz.py --simulate), else torch.distributed."""
    communicator = default_communicator()
    if isinstance(communicator, SimulatedCommunicator):
        return communicator.exchange_objects(result)
    results: list[Any] = [None] * world_size
    dist.all_gather_object(results, result)
    return results


def combine(results: list[RankResult]) -> tuple[str, str]:
    """The case's status and message from every rank's result (order: crash, disagreement,
    refused, wrong, ok)."""
    for rank, result in enumerate(results):
        if result.status == CRASH:
            return CRASH, f"rank {rank}: {result.message}"
    # Compared without the error's class: ranks that refused for different reasons raise
    # their own classes with the agreement's one account of all the refusals.
    refusals = {_text(same_on_every_rank(r.message)) for r in results if r.status == REFUSED}
    peers = [r for r in results if r.status == PEER_REFUSED]
    carried = len(refusals) == 1 and all(
        same_on_every_rank(r.message).find(next(iter(refusals))[:300]) >= 0 for r in peers
    )
    if refusals and (
        len(refusals) > 1
        or not carried
        or any(r.status not in (REFUSED, PEER_REFUSED) for r in results)
    ):
        seen = "; ".join(f"rank {i}: {r.status} {r.message[:200]}" for i, r in enumerate(results))
        return CRASH, f"ranks disagree: {seen}"
    if refusals:
        return REFUSED, next(r.message for r in results if r.status == REFUSED)
    if peers:  # every rank blames another: nobody refused by name
        return CRASH, f"ranks disagree: only peer failures: {peers[0].message[:300]}"
    for result in results:
        if result.status == WRONG:
            return WRONG, result.message
    return OK, ""


def _text(message: str) -> str:
    """A rank's ``Class: text`` message without the class."""
    return message.partition(": ")[2]


def check_partials(case: Case, results: list[RankResult], program) -> str | None:
    """Checks outputs holding partial sums: summed over the ranks that differ only in
    the partial mesh axes, each must equal the reference's shard."""
    if not any(r.partial for r in results):
        return None
    expected = load(case)["reference"](*make_inputs(case))
    pieces = {(rank, i): t for rank, r in enumerate(results) for i, t in r.partial}
    for index, value in enumerate(program.outputs):
        if value.sharding is None or not value.sharding.partial:
            continue
        problem = _check_partial_output(case, value, pieces, index, expected[index])
        if problem is not None:
            return f"output {index} ({value.name}, partial): {problem}"
    return None


_COMBINE = {
    ReduceOp.SUM: torch.add,
    ReduceOp.PROD: torch.mul,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.MIN: torch.minimum,
}
"""How the partial results of an output combine, by the op its partial axes name."""
_COMBINED = {
    ReduceOp.SUM: "summed",
    ReduceOp.PROD: "multiplied",
    ReduceOp.MAX: "max",
    ReduceOp.MIN: "min",
}


def _check_partial_output(case, value, pieces, index: int, ref: torch.Tensor):
    sharding = value.sharding
    mesh = sharding.mesh
    summed = dataclasses.replace(value, sharding=Sharding(mesh=mesh, dims=sharding.dims))
    partial_dims = {p.axis.dim(mesh.ndim) for p in sharding.partial}
    for rank in mesh.devices:
        coords = mesh.coordinates(rank)
        group = [
            d
            for d in mesh.devices
            if all(
                c == e
                for k, (c, e) in enumerate(zip(coords, mesh.coordinates(d), strict=True))
                if k not in partial_dims
            )
        ]
        missing = [d for d in group if (d, index) not in pieces]
        if missing:
            return f"ranks {missing} returned no partial sum"
        (op,) = {p.op for p in sharding.partial}  # one reduction makes a tensor partial
        total = functools.reduce(_COMBINE[op], [pieces[(d, index)].double() for d in group])
        piece = shard_tensor(ref, summed, rank)
        problem = _mismatch(case, total.to(ref.dtype), piece, ref)
        if problem is not None:
            return f"{_COMBINED[op]} over ranks {group}: {problem}"
    return None


# ---------------------------------------------------------------------------
# Messages and reports


def same_on_every_rank(message: str) -> str:
    """``message`` without the process-wide axis numbers (``iS12{8}`` -> ``iS#{8}``) and
    the rank that raised it (a RunTimeExtentError's ``defining T2 on rank 3``: every member
    checks the whole counts matrix and names itself)."""
    message = re.sub(r"\b on rank \d+\b", " on rank #", message)
    return re.sub(r"\b([irb](?:S|stream|mesh_[xyz]))\d+\{", r"\1#{", message)


def message_shape(message: str) -> str:
    """A refusal's message with names, numbers and layouts elided, for grouping."""
    text = same_on_every_rank(message.splitlines()[0] if message else "")
    text = re.sub(r"\bT\d+(_\w+)?", "T#", text)
    text = re.sub(r"\bM\d+ = \[[^:]*?\](?=[,)])", "M# = [..]", text)
    text = re.sub(r"partial\{[^}]*\}", "partial{..}", text)
    text = re.sub(r"\{[^{}]*\}", "{..}", text)
    text = re.sub(r"\bi\d+\b", "i#", text)
    text = re.sub(r"\d+", "#", text)
    text = re.sub(r"\[[#, \[\]]*\]", "[..]", text)
    return text


def group_refusals(outcomes: Iterable[Outcome]) -> list[tuple[str, int, list[int]]]:
    """(message shape, count, seeds) for the refused outcomes, most frequent first."""
    seeds: dict[str, list[int]] = {}
    for outcome in outcomes:
        if outcome.status == REFUSED:
            seeds.setdefault(message_shape(outcome.message), []).append(outcome.seed)
    return sorted(((m, len(s), s) for m, s in seeds.items()), key=lambda x: (-x[1], x[0]))


def summary_table(outcomes: list[Outcome]) -> str:
    """Counts per status: all cases, then per feature (mesh dims, ops, schedule kinds)."""
    rows: dict[str, Counter] = {"all": Counter()}
    for outcome in outcomes:
        rows["all"][outcome.status] += 1
        for feature in outcome.features:
            rows.setdefault(feature, Counter())[outcome.status] += 1
    width = max(len(k) for k in rows) + 2
    lines = [f"{'feature':<{width}}" + "".join(f"{s:>9}" for s in STATUSES)]
    order = (
        ["all"]
        + sorted(k for k in rows if k.startswith("mesh"))
        + sorted(k for k in rows if k != "all" and not k.startswith("mesh"))
    )
    for key in order:
        lines.append(f"{key:<{width}}" + "".join(f"{rows[key][s]:>9}" for s in STATUSES))
    return "\n".join(lines)


def refusal_report(outcomes: list[Outcome]) -> str:
    """The refused outcomes grouped by message shape, with a few seeds each."""
    lines = []
    for shape, count, seeds in group_refusals(outcomes):
        more = ", ..." if len(seeds) > 5 else ""
        lines.append(f"{count:5}  {shape}  (seeds {', '.join(map(str, seeds[:5]))}{more})")
    return "\n".join(lines) or "(none)"
