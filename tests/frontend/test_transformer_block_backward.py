"""examples/tensor_parallel_block_backward.py's backward of the transformer block, run in
the warm multi-rank pools after the forward that saves what it reads: every rank's
gradients against torch autograd of the single-device reference on random data (another
seed than the example's), float32 and bf16, each gradient sharded as its weight, and the
backward's collectives counted in the host IR.

The example's ``main`` runs on 4 pool ranks in tests/test_example_ranks.py and under every
``hostir`` command in tests/test_examples.py.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

import hostir
from frontend import DataType

# The example imports the forward as a script does (its folder on sys.path), so this test
# does the same, and takes the forward's names through it: one copy of each module.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from tensor_parallel_block_backward import (  # noqa: E402
    INPUTS,
    SAVED,
    define,
    run_both,
    tolerance,
)


def _collectives(program: hostir.HostIrContainer) -> list[hostir.Instruction]:
    """The program's collectives, in order (the backward has no loops)."""
    return [i for i in program.body if isinstance(i, tuple(hostir.COLLECTIVES))]


def _sharded_dims(value: hostir.TensorValue) -> list[int]:
    """The dims of ``value`` split over a mesh axis."""
    return [i for i, parts in enumerate(value.sharding.dims) if any(p.axis for p in parts)]


@pytest.mark.world_sizes(2, 4)  # one rank: the example's main() under plain python
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_backward_matches_autograd_with_two_allreduces(multidevice_test, dtype) -> None:
    """Each rank's 13 gradients (``x`` and every weight and bias) equal its shards of
    autograd's through the torch reference: float32 to 1e-5, bf16 to the example's bf16
    tolerance. Column-parallel weights' and biases' gradients are sharded on dim 0 and the
    row-parallel weights' on dim 1, as the weights are; the rest are replicated and none is
    left partial. At more than one rank the backward's only collectives are 2 Allreduces
    of ``[B, S, E]`` (the QKV and MLP0 input gradients, partial over their sharded
    features). (At one rank, where a one-device team's reductions are local copies and
    none is issued, the example's main() checks it under plain python.)"""
    d, rank = multidevice_test.size, multidevice_test.rank
    grads, expected, backward = run_both(d, rank, dtype, seed=1)
    program = backward.host_ir()
    for (name, _, dim), got, want, out in zip(
        INPUTS, grads, expected, program.outputs, strict=True
    ):
        assert got.dtype == dtype, name
        torch.testing.assert_close(got, want, **tolerance(want), msg=lambda m, n=name: f"{n}: {m}")
        sharded = [] if dim is None else [dim]
        assert _sharded_dims(out) == sharded and not out.sharding.partial, (name, out)
    collectives = _collectives(program)
    kinds = [type(c).__name__ for c in collectives]
    assert kinds == ["Allreduce", "Allreduce"], program
    assert str(program).count("[2, 16, 32] @M0, R") == 2, program


def test_saved_outputs_follow_saved_and_the_plain_forward_has_one() -> None:
    """``define(d, saved=True)`` outputs the block's output and then :data:`SAVED`, each of
    its shape, dtype and sharding (lowered for 2 ranks, not run); ``define(d)`` only the
    block's output, with the same 2 Allreduces."""
    plain = define(2)[0].host_ir(world_size=2)
    assert len(plain.outputs) == 1
    program = define(2, torch.bfloat16, saved=True)[0].host_ir(world_size=2)
    assert len(program.outputs) == 1 + len(SAVED)
    for (name, shape, dim, dtype), out in zip(SAVED, program.outputs[1:], strict=True):
        want = DataType.BFloat16 if dtype is None else dtype
        assert out.dtype == want.to_hostir(), (name, out)
        assert tuple(e.value for e in out.shape) == shape, (name, out)
        assert _sharded_dims(out) == ([] if dim is None else [dim]), (name, out)
    assert [type(c).__name__ for c in _collectives(plain)] == ["Allreduce", "Allreduce"]
    assert [type(c).__name__ for c in _collectives(program)] == ["Allreduce", "Allreduce"]
