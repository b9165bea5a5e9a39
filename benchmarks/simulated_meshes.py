"""The README's MLP on 1-d, 2-d and 3-d meshes of any size, run as a simulated world.

``relu(x @ w1.T + b1) @ w2.T + b2`` (examples/tensor_parallel_mlp.py's math) scheduled on a
mesh whose shape is a parameter, so the same program runs at 8, 64, 512 or 1,024 simulated
ranks with sizes that give every rank at least one row of each sharded tensor:

- 1-d ``(tp,)``: the example's own ``define`` (column-parallel ``w1``/``b1``, row-parallel
  ``w2``; one Allreduce over the mesh).
- 2-d ``(dp, tp)``: data parallel x tensor parallel; the tokens of ``x`` are sharded over
  ``mesh_y`` (dp), ``w1``/``b1``/``w2`` over ``mesh_x`` (tp) as in 1-d: one Allreduce per
  ``mesh_x`` team (a mesh row).
- 3-d ``(dp, tp2, tp)``: data parallel x 2-d tensor parallel; the tokens over ``mesh_z``,
  the hidden features of ``x`` and ``w1`` over ``mesh_y`` (so ``x @ w1.T`` is a partial sum
  over ``mesh_y``: an Allreduce there before the bias and relu) and the FFN features over
  ``mesh_x`` (the second Allreduce, over ``mesh_x``).

:func:`run_mlp` runs one through ``fd.execute_simulated`` and checks every rank's output
against the single-device reference (the rows of its ``dp`` coordinate); the benchmark
(benchmarks/simulated_world.py) and tests/frontend/test_simulated_meshes.py use it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass

import torch

from frontend import DeviceMesh, FusionDefinition, ParallelType
from hostir.errors import HostIrError

_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)  # the README's MLP is examples/tensor_parallel_mlp.py

import tensor_parallel_mlp  # noqa: E402 - found through the path set just above

HIDDEN = tensor_parallel_mlp.HIDDEN
"""The model width (16): also the most ``mesh_y`` devices a 3-d mesh can share it over."""


class MeshShapeError(HostIrError):
    """A mesh shape the MLP cannot be scheduled on (not 1 to 3 dims of positive sizes, or
    more devices on the hidden features than there are features)."""


def sizes(shape: tuple[int, ...]) -> tuple[int, int]:
    """(tokens, FFN features) for ``shape``: every rank holds at least one token row (two,
    so the data-parallel shards are not single rows) and one FFN feature."""
    dp = shape[0] if len(shape) > 1 else 1
    return max(8, 2 * dp), max(tensor_parallel_mlp.FFN, shape[-1])


def _split(tv, dim: int, parallel_type: ParallelType, devices: int) -> None:
    tv.outer_split(dim, devices)
    tv.axis(dim).parallelize(parallel_type)


def define(shape: tuple[int, ...]) -> tuple[FusionDefinition, DeviceMesh]:
    """The MLP scheduled on a mesh of ``shape`` (see the module docstring); (fusion, mesh)."""
    if not 1 <= len(shape) <= 3 or any(not isinstance(s, int) or s < 1 for s in shape):
        raise MeshShapeError(f"mesh shape {shape!r}: expected 1 to 3 positive sizes")
    if len(shape) == 1:
        fd, _ = tensor_parallel_mlp.define(shape[0])
        return fd, DeviceMesh(torch.arange(shape[0]))
    if len(shape) == 3 and shape[1] > HIDDEN:
        raise MeshShapeError(
            f"mesh shape {shape!r}: mesh_y shares the {HIDDEN} hidden features of x and w1,"
            f" so it has at most {HIDDEN} devices, not {shape[1]}"
        )
    mesh = DeviceMesh(torch.arange(math.prod(shape)).reshape(shape))
    _, features = sizes(shape)
    fd, (x, w1, b1, w2, b2) = tensor_parallel_mlp.unscheduled(features)
    for tv in (x, w1, b1, w2, b2):
        tv.set_device_mesh(mesh)  # b2 stays replicated
    dp_axis = ParallelType.mesh_y if len(shape) == 2 else ParallelType.mesh_z
    _split(x, 0, dp_axis, shape[0])
    if len(shape) == 3:
        # the hidden features before the FFN ones: w1's axis 1 is still its features axis
        _split(x, 2, ParallelType.mesh_y, shape[1])
        _split(w1, 1, ParallelType.mesh_y, shape[1])
    for tv, dim in ((w1, 0), (b1, 0), (w2, 1)):
        _split(tv, dim, ParallelType.mesh_x, shape[-1])
    return fd, mesh


@dataclass
class MlpRun:
    """One simulated run of the MLP: the mesh shape, the seconds of set-up (defining,
    scheduling, cutting the inputs is inside the run), of the run itself
    (``fd.execute_simulated``: lowering, every rank's evaluator and collectives), the ranks
    whose output differs from the reference, and the run (traffic in ``run.links``)."""

    shape: tuple[int, ...]
    define_s: float
    run_s: float
    wrong_ranks: list[int]
    run: object

    @property
    def world_size(self) -> int:
        """The number of simulated ranks."""
        return math.prod(self.shape)


def inputs(shape: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    """Random full inputs (x, w1, b1, w2, b2) for the MLP on ``shape``."""
    tokens, features = sizes(shape)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(tokens, HIDDEN), (features, HIDDEN), (features,), (HIDDEN, features), (HIDDEN,)]
    return [torch.randn(s, generator=generator) for s in shapes]


def reference(full: list[torch.Tensor]) -> torch.Tensor:
    """The single-device result."""
    x, w1, b1, w2, b2 = full
    return torch.relu(x @ w1.T + b1) @ w2.T + b2


def run_mlp(shape: tuple[int, ...], seed: int = 0) -> MlpRun:
    """Defines the MLP on ``shape`` and runs it as ``prod(shape)`` simulated ranks; every
    rank's output is compared with its rows of the single-device reference."""
    start = time.perf_counter()
    fd, mesh = define(shape)
    full = inputs(shape, seed)
    expected = reference(full)
    defined = time.perf_counter()
    run = fd.execute_simulated(full, world_size=mesh.size)
    ran = time.perf_counter()
    run.raise_first()
    dp = shape[0] if len(shape) > 1 else 1
    rows = expected.tensor_split(dp)  # the data-parallel coordinate is mesh dim 0
    wrong = []
    for rank in range(mesh.size):
        (got,) = run.results[rank]
        want = rows[int(mesh.coordinates(rank)[0])] if dp > 1 else expected
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            wrong.append(rank)
    return MlpRun(shape, defined - start, ran - defined, wrong, run)
