"""``check_symbols``: every rank that needs a symbolic extent can bind it.

A rank binds the symbolic extents (``i0``) of the input shards it is given: those of
inputs without a mesh, and of inputs whose mesh holds it. A rank outside an input's
mesh passes None and learns nothing from it. So a tensor that a subset of ranks sends
to others (a one-device input broadcast to a mesh, a pipeline stage's output) cannot
have an extent only the senders know: the receivers could not size their buffers.
The evaluator does not exchange extents; this pass refuses such a program with a
LoweringError naming the tensor, the symbol and the ranks that lack it.
"""

from __future__ import annotations

from hostir import HostIrContainer, RaggedAllToAll, Symbol, TensorValue
from hostir.ir.instructions import defined_values
from hostir.ir.program_info import walk_instructions
from hostir.ir.scalars import symbols_of
from lowering.errors import LoweringError

EVERY_RANK = None


def check_symbols(program: HostIrContainer) -> HostIrContainer:
    """Returns ``program`` unchanged; raises LoweringError if a value on some ranks has a
    symbolic extent that no input binds on all of them."""
    binders = _binders(program)
    for instruction in walk_instructions(program.body):
        for value in defined_values(instruction):
            if isinstance(value, TensorValue):
                _check_value(value, binders)
    return program


def _binders(program: HostIrContainer) -> dict[str, tuple[set[int] | None, str]]:
    """For each symbol: the ranks that bind it (None: every rank) and an input naming it."""
    binders: dict[str, tuple[set[int] | None, str]] = {}
    for instruction in walk_instructions(program.body):
        if isinstance(instruction, RaggedAllToAll):  # a run-time extent: its team binds it
            where = f"the RaggedAllToAll defining {instruction.out.name}"
            binders[instruction.received.name] = (set(instruction.team.mesh.devices), where)
    for value in program.inputs:
        if not isinstance(value, TensorValue):
            continue
        ranks = set(value.sharding.mesh.devices) if value.sharding is not None else EVERY_RANK
        for extent in value.shape:
            if not isinstance(extent, Symbol):
                continue
            known, first = binders.get(extent.name, (set(), f"input {value.name}"))
            if ranks is EVERY_RANK or known is EVERY_RANK:
                binders[extent.name] = (EVERY_RANK, first)
            else:
                binders[extent.name] = (known | ranks, first)
    return binders


def _check_value(value: TensorValue, binders: dict) -> None:
    symbols = set().union(*(symbols_of(extent) for extent in value.shape))
    for name in sorted(symbols & binders.keys()):
        known, source = binders[name]
        if known is EVERY_RANK:
            continue
        needed = set(value.sharding.mesh.devices) if value.sharding is not None else None
        lacking = sorted(needed - known) if needed is not None else None
        if lacking == []:
            continue
        where = f"ranks {lacking}" if lacking is not None else "every rank"
        raise LoweringError(
            f"{value.name} has the symbolic extent {name}, which only ranks {sorted(known)}"
            f" learn (from {source}), but {where} of its mesh need it; declare that"
            f" dim of {source} with a constant extent, or place {source} on a mesh that"
            " holds those ranks"
        )
