"""``check_resharding``: after decomposition, every compute op must run locally.

An expression runs locally when each tensor input is on the output's mesh and
every pair of mapped axes is split over the same mesh axes in the same
positions, and no input is partial. ``decompose_resharding`` moves all other
cases into ``set`` ops; this pass checks that it did, and raises a
ReshardingError naming the expression, the tensors and both shardings if not.
"""

from __future__ import annotations

from hostir import Set
from hostir.ir.instructions import keyword
from hostir.ir.mesh_names import MeshNames
from hostir.text.printer import print_sharding
from lowering.errors import ReshardingError
from lowering.shape_ops import is_kept_block
from lowering.snapshot import LoweringFusion, LoweringOp, LoweringTensor


def _describe(tensor: LoweringTensor) -> str:
    value = tensor.value()
    if value.sharding is None:
        return f"{tensor.name} (no mesh)"
    return f"{tensor.name} {print_sharding(value.sharding, MeshNames())} on {value.sharding.mesh}"


def _fail(op: LoweringOp, producer: LoweringTensor, consumer: LoweringTensor, why: str) -> None:
    raise ReshardingError(
        f"{op.output} = {keyword(op.instruction)}({', '.join(op.inputs)}):"
        f" {why}. Producer {_describe(producer)}, consumer {_describe(consumer)}."
        " The resharding decomposition left a compute op that needs communication"
    )


def check_op(op: LoweringOp, tensors: dict[str, LoweringTensor]) -> None:
    """Raises ReshardingError if ``op`` cannot run on local shards."""
    out = tensors[op.output]
    for name, pairs in op.axis_maps:
        producer = tensors[name]
        if producer.mesh != out.mesh:
            _fail(op, producer, out, f"{name} and {op.output} live on different meshes")
        if producer.value().sharding is not None and producer.value().sharding.partial:
            _fail(op, producer, out, f"{name} holds partial sums that need a reduction")
        mapped_inputs = {i for _, i in pairs}
        for o, i in pairs:
            if producer.axes[i].layout() != out.axes[o].layout() and not is_kept_block(
                op, name, (o, i), tensors
            ):
                _fail(
                    op,
                    producer,
                    out,
                    f"axis {i} of {name} and axis {o} of {op.output} are"
                    " split over different mesh axes",
                )
        for index, axis in enumerate(producer.axes):
            if index not in mapped_inputs and axis.mesh_axes():
                _fail(
                    op,
                    producer,
                    out,
                    f"axis {index} of {name} is sharded but has no counterpart in {op.output}",
                )


def check_resharding(fusion: LoweringFusion) -> LoweringFusion:
    """Returns ``fusion`` unchanged if every expression runs locally; raises otherwise."""
    tensors = {t.name: t for t in fusion.tensors}
    for op in fusion.ops:
        if not isinstance(op.instruction, Set):  # sets are lowered to communication
            check_op(op, tensors)
    return fusion
