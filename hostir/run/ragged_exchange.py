"""Run-time extents: ``to_host`` and ``RaggedAllToAll``'s handlers.

``to_host`` copies an integer tensor to the host (on a GPU ``Tensor.cpu`` waits for the
stream that computed it: the program's one device-to-host sync per read). A
``RaggedAllToAll`` reads the counts matrix, checks it whole, binds the rows it receives
to its ``received`` symbol and posts one ``all_to_all_v`` of flat buffers.

Why the whole matrix on every member: each member checks every count, not only its own
row and column, so a negative count, or a row that does not add up to what its member
sends, is found by every member of the group before any of them posts the exchange, and
every member raises the same :class:`~hostir.errors.RunTimeExtentError` (a check of its
own row alone would leave the peers waiting in the exchange for a member that gave up).
Where a member's rows read a run-time extent (the way back sends what the way out
received), only that member knows them; its own check still runs, and a failure there
reaches the peers as the failure it posts (``hostir.comm``), at their timeout.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hostir.errors import EvaluationError, RunTimeExtentError
from hostir.ir.communications import RaggedAllToAll
from hostir.ir.host_reads import ToHost
from hostir.ir.program_info import run_time_symbols
from hostir.ir.scalars import RANK, MeshCoordinate, leaves
from hostir.ir.values import TensorValue, value_symbols
from hostir.run.context import RunContext
from hostir.run.handler_common import Request, need
from hostir.run.implementations import implements


def run_to_host(context: RunContext, instruction: ToHost, operands: dict) -> list:
    """``out``: ``src``'s values, an int64 tensor on the host (a copy, never a view)."""
    src = need(operands["src"], instruction, "src", context)
    return [src.detach().to("cpu", torch.int64, copy=True)]


def run_ragged_all_to_all(context: RunContext, instruction: RaggedAllToAll, operands: dict) -> list:
    """Checks the counts, binds ``received``, posts the exchange (module docstring)."""
    group = instruction.team.group_of(context.rank)
    me = group.index(context.rank)
    sends = _sends(instruction, operands["counts"], len(group))
    _check_counts(context, instruction, sends, me)
    received = sum(row[me] for row in sends)
    context.scalars[instruction.received.name] = received
    src = need(operands["src"], instruction, "src", context)
    shape = context.local_shape(instruction.out)
    out = torch.empty(shape, dtype=instruction.out.dtype.to_torch(), device=context.device)
    row = math.prod(shape[instruction.axis + 1 :])  # the dims before axis hold one element
    in_splits = [count * row for count in sends[me]]
    out_splits = [sends[p][me] * row for p in range(len(group))]
    work = context.communicator.all_to_all_v(
        out.view(-1), src.contiguous().view(-1), out_splits, in_splits, group
    )
    return [received, out, Request(work)]


def _sends(instruction: RaggedAllToAll, counts: torch.Tensor, size: int) -> list[list[int]]:
    """``sends[p][q]``: rows member p sends member q (the counts, transposed on the way
    back)."""
    if tuple(counts.shape) != (size, size):
        raise RunTimeExtentError(
            f"RaggedAllToAll defining {instruction.out.name}: counts {instruction.counts.name}"
            f" has shape {list(counts.shape)}; expected [{size}, {size}], a count per sender"
            f" and receiver of the team's group of {size}"
        )
    matrix = counts.t() if instruction.transpose else counts
    return matrix.tolist()


def _check_counts(
    context: RunContext, instruction: RaggedAllToAll, sends: list[list[int]], me: int
) -> None:
    """Every count >= 0; each sender's row adds up to its ``src`` rows and each receiver's
    column to its ``out`` rows, for every member whose rows this rank can know."""
    name, counts = instruction.out.name, instruction.counts.name
    where = f"RaggedAllToAll defining {name} on rank {context.rank}"
    way = "column" if instruction.transpose else "row"
    for p, row in enumerate(sends):
        for q, count in enumerate(row):
            if count < 0:
                raise RunTimeExtentError(
                    f"{where}: counts {counts} says member {p} sends {count} rows to member"
                    f" {q}; expected a count >= 0 ({way} {p} of {counts})"
                )
    size = len(sends)
    src_rows = _rows_of(context, instruction.src, instruction)
    for p in range(size) if src_rows.shared else (me,):
        sent = sum(sends[p])
        if sent != src_rows.value:
            raise RunTimeExtentError(
                f"{where}: counts {counts} has member {p} send {sent} rows in all"
                f" ({sends[p]}), but {instruction.src.name} holds {src_rows.value} rows on"
                f" each member{'' if src_rows.shared else f' (on member {p})'}; expected"
                " the counts to add up to the rows sent"
            )
    if instruction.out.shape[instruction.axis] == instruction.received:
        return  # the buffer is sized by what arrives
    out_rows = _rows_of(context, instruction.out, instruction)
    for q in range(size) if out_rows.shared else (me,):
        arriving = sum(sends[p][q] for p in range(size))
        if arriving != out_rows.value:
            raise RunTimeExtentError(
                f"{where}: counts {counts} sends member {q} {arriving} rows in all, but"
                f" {name} holds {out_rows.value} rows on member {q}; expected the counts to"
                f" fill {name}"
            )


class _Rows:
    """A tensor's local rows here, and whether every member has as many (extents that
    read no rank, coordinate or run-time extent)."""

    def __init__(self, value: int, shared: bool) -> None:
        self.value, self.shared = value, shared


def _rows_of(context: RunContext, value: TensorValue, instruction: RaggedAllToAll) -> _Rows:
    rows = context.local_shape(value)[instruction.axis]
    local = value_symbols(value) & (run_time_symbols(context.program) | {RANK})
    coordinates = value.sharding is not None and any(
        isinstance(leaf, MeshCoordinate) for extent in value.shape for leaf in leaves(extent)
    )
    return _Rows(rows, not local and not coordinates)


@implements("ragged_all_to_all", handler=True)
def run_ragged_exchange(context: RunContext, instruction: Any, operands: dict) -> list:
    """The frontend's form never runs: lowering emits ``to_host`` and ``RaggedAllToAll``
    for it (the verifier refuses it first; a program built around the verifier gets this)."""
    raise EvaluationError(
        f"ragged_all_to_all defining {instruction.out.name} cannot run: it is the frontend's"
        " form of an exchange by run-time counts, lowered to to_host and RaggedAllToAll"
    )
