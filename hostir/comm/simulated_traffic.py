"""Measured against counted: each program run of a simulated world (counted by run:
``simulate(..., by_run=True)``) against ``hostir traffic``'s static count of its program.

:func:`compare_traffic` takes every run that every rank starting it finished, counts its
program statically (hostir.analysis.traffic, with the extents the run bound) and compares
the two rank-by-rank matrices of bytes exactly. Runs whose static count cannot be exact
are set apart with the reason: a RaggedAllToAll's counts are known only at run time (the
static count assumes uniform routing), and a count the static walk refuses (symbols it
cannot bind, a loop too long to walk) says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hostir.analysis.traffic import count_traffic
from hostir.errors import HostIrError
from hostir.ir.communications import RaggedAllToAll
from hostir.ir.program_info import walk_instructions


@dataclass
class TrafficComparison:
    """How many runs matched their static count, which did not (a message each), and
    which were not compared (a reason each)."""

    matched: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def compare_traffic(world: object) -> TrafficComparison:
    """Compares every whole run of ``world`` (a SimulatedWorld counting by run) with its
    static count (see the module docstring)."""
    result = TrafficComparison()
    for key, context in world.run_contexts.items():  # type: ignore[attr-defined]
        started, finished = world.run_ranks[key]  # type: ignore[attr-defined]
        name = f"program {key[0][:12]} run {key[2]} after agreement {key[1]}"
        if finished < started:
            result.skipped.append(f"{name}: {started - finished} ranks did not finish it")
            continue
        program = context.program
        if any(isinstance(i, RaggedAllToAll) for i in walk_instructions(program.body)):
            result.skipped.append(f"{name}: a RaggedAllToAll's counts are known at run time")
            continue
        bindings = world.run_bindings.get(key, {})  # type: ignore[attr-defined]
        try:
            static = count_traffic(program, world.world_size, bindings).links  # type: ignore[attr-defined]
        except HostIrError as error:
            result.skipped.append(f"{name}: no static count ({error})")
            continue
        measured = world.run_links.get(key)  # type: ignore[attr-defined]
        if measured is None:
            measured = torch.zeros_like(static)
        measured = measured.clone()
        measured.fill_diagonal_(0)
        if torch.equal(measured, static):
            result.matched.append(name)
            continue
        source, destination = divmod(int((measured - static).abs().argmax()), static.shape[0])
        result.mismatched.append(
            f"{name}: rank {source} -> rank {destination} moved"
            f" {int(measured[source, destination])} B, the static count says"
            f" {int(static[source, destination])} B (received in all: measured"
            f" {int(measured.sum())} B, counted {int(static.sum())} B)\n{program}"
        )
    return result
