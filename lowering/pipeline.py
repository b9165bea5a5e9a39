"""The lowering pipeline: a scheduled fusion to a host IR program, one pass a line."""

from __future__ import annotations

from frontend.fusion import Fusion
from hostir import HostIrContainer
from hostir.check.collector import collector_paused
from hostir.check.verify import verify_program
from lowering.check_resharding import check_resharding
from lowering.check_symbols import check_symbols
from lowering.dead_ops import drop_dead_ops
from lowering.decompose_resharding import decompose_resharding
from lowering.emit_host_ir import emit_host_ir
from lowering.insert_deallocations import insert_deallocations
from lowering.made_tensors import made_tensors_explained
from lowering.propagate_sharding import propagate_sharding
from lowering.snapshot import snapshot_fusion


def lower_fusion(fusion: Fusion) -> HostIrContainer:
    """Lowers ``fusion`` to host IR; deterministic, no torch.distributed, no globals.

    Python's cycle collector is paused meanwhile (hostir.check.collector): the passes and the
    planner build many small frozen objects and no cycles, and the collector's scans of
    them took 43% of lowering a 1000-op fusion (319 ms with it, 181 ms without) and
    20-35% of planning the slowest 4096-device reshardings (benchmarks/plan_scale.py)."""
    with collector_paused():
        return _lower(fusion)


def _lower(fusion: Fusion) -> HostIrContainer:
    frozen = snapshot_fusion(fusion)  # copy the scheduled fusion into immutable data
    frozen = propagate_sharding(frozen)  # meshes and parallelization for unscheduled tensors
    frozen = drop_dead_ops(frozen)  # only what the outputs depend on is computed
    frozen = decompose_resharding(frozen)  # resharding only in set ops; partial sums explicit
    with made_tensors_explained(frozen):  # a message naming T73 says what T73 is for
        frozen = check_resharding(frozen)  # every other op now runs on local shards
        program = emit_host_ir(frozen)  # compute instructions, and planned collectives for sets
    program = check_symbols(program)  # every rank that needs a symbolic extent can bind it
    program = insert_deallocations(program)  # free intermediates after their last use
    verify_program(program)  # the result is well formed
    return program
