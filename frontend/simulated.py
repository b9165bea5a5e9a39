"""``FusionDefinition.execute_simulated``: a fusion run as every rank of a simulated world.

The world (hostir.comm.simulate) runs one thread per rank in this process; each calls
the definition's ordinary ``execute`` with its own shards, so the run is the one a
real rank makes (the agreement, binding, compiled program, collectives), and the
definition is lowered once for all of them. What comes back is every rank's outputs,
the bytes measured between ranks, and each failed rank's error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from frontend.errors import FrontendError
from frontend.sharding import shard_tensor
from hostir.comm.simulate import SimulatedRun, simulate
from hostir.errors import HostIrError

RankInputs = Sequence[Any] | Callable[[int], Sequence[Any]]
"""The unsharded inputs (each rank takes its shard of each tensor, as ``shard_tensor``
cuts it by the fusion's schedule), or a function giving rank ``r``'s own inputs."""


def _input_layouts(fd: Any, tvs: list) -> list:
    """How each input is laid out: the lowered program's input values (their shardings
    found once, not once per rank), or the fusion's inputs where it does not lower (each
    rank then raises its own error, as ``execute`` does)."""
    try:
        return list(fd.host_ir().inputs)
    except HostIrError:
        return tvs


def execute_simulated(fd: Any, inputs: RankInputs, world_size: int, **options: Any) -> SimulatedRun:
    """Runs ``fd`` on ``world_size`` simulated ranks (see the module docstring); ``options``
    as ``execute`` takes them. ``results[r]`` of the answer is rank ``r``'s outputs."""
    if callable(inputs):
        inputs_of = inputs
    else:
        tvs = fd.fusion.inputs()
        if len(inputs) != len(tvs):
            raise FrontendError(
                f"execute_simulated: the fusion takes {len(tvs)} inputs, got {len(inputs)}"
            )
        whole = list(inputs)
        layouts = _input_layouts(fd, tvs)

        def inputs_of(rank: int) -> list[Any]:
            return [
                shard_tensor(t, layout, rank) if isinstance(t, torch.Tensor) else t
                for t, layout in zip(whole, layouts, strict=True)
            ]

    return simulate(lambda rank: fd.execute(list(inputs_of(rank)), **options), world_size)
