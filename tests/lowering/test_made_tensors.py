"""A refusal naming a tensor the lowering made says what the tensor is for
(lowering/made_tensors.py): the user never wrote ``T67`` and could not find it."""

from __future__ import annotations

import pytest

from frontend import DeviceMesh, FusionDefinition, ParallelType
from lowering import LoweringError
from lowering.dead_ops import drop_dead_ops
from lowering.decompose_resharding import decompose_resharding
from lowering.made_tensors import explain, made_tensors_explained
from lowering.propagate_sharding import propagate_sharding
from lowering.snapshot import snapshot_fusion


def _row_parallel_with_bias(d: int) -> FusionDefinition:
    """``linear(x, w, b)`` with the contraction over mesh_x: the lowering makes the partial
    sums (reduced by an Allreduce) and the reduced sum before the bias."""
    mesh = DeviceMesh(list(range(d)))
    with FusionDefinition() as fd:
        x, w, b = fd.define_tensor((4, 8)), fd.define_tensor((2, 8)), fd.define_tensor((2,))
        fd.add_output(fd.ops.linear(x, w, b))
    for tv in (x, w):
        tv.set_device_mesh(mesh)
        tv.outer_split(1, d)
        tv.axis(1).parallelize(ParallelType.mesh_x)
    b.set_device_mesh(mesh)
    return fd


def test_a_message_naming_a_made_tensor_says_what_it_is_for() -> None:
    fused = decompose_resharding(
        drop_dead_ops(propagate_sharding(snapshot_fusion(_row_parallel_with_bias(2)._fusion)))
    )
    made = {t.name: t.made_for for t in fused.tensors if t.made_for}
    assert set(made.values()) == {
        "the partial results of T3, before their reduction",
        "T3 reduced, before its bias",
    }, made
    (partial,) = [name for name, why in made.items() if why.startswith("the partial")]
    message = f"{partial}_c is refused; T3 and T0 are the user's"
    assert explain(message, fused) == (
        f"{message} ({partial} is made by the lowering: the partial results of T3, before"
        " their reduction)"
    )
    assert explain("T3 and T0 only", fused) == "T3 and T0 only"
    with pytest.raises(LoweringError, match=rf"\({partial} is made by the lowering: the part"):
        with made_tensors_explained(fused):
            raise LoweringError(f"{partial} cannot be chunked")
