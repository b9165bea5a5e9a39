"""``decompose_resharding``: make every compute op local; resharding becomes ``set`` ops.

For each op, the *compute layout* is where the op runs on local shards: a
one-input op's input's (a ``set`` after it), a multi-input op's output's (a
``set`` before each differently sharded input), with a sharded reduction axis
computing partial sums that a ``set`` reduces (a linear's bias added after).
docs/communication.md ("From a fusion to collectives") says it in full. New
tensors are named ``T<n>`` after the fusion's own.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

from hostir import Binary, BinaryOpKind, Cast, Const, DType, Set, TensorValue
from hostir.ir.instructions import Instruction
from hostir.ir.opdecl import op_decl
from hostir.ir.ops import POINTWISE_OPS, promote, tensor_operand
from hostir.ir.scalars import print_scalar
from lowering.emitter import bind_values
from lowering.errors import LoweringError
from lowering.layouts import copy_layout, local_parts, tensor_layout, without_mesh_axes
from lowering.op_layouts import computed_whole, reads_no_tensor, refuse_streamed_whole_axes
from lowering.result_groups import chunked_alike, compute_from_inputs, stream_splits
from lowering.shape_ops import compute_layout, keep_blocks, with_layout_pairs
from lowering.snapshot import AxisLayout, LoweringFusion, LoweringOp, LoweringTensor, op_units
from lowering.stream_checks import layout_text
from lowering.stream_splits import chunk_blocks


class _Builder:
    """Collects the new op list and hands out fresh tensor names."""

    def __init__(self, fusion: LoweringFusion) -> None:
        self.tensors = {t.name: t for t in fusion.tensors}
        self.order = [t.name for t in fusion.tensors]
        first = 1 + max((int(n[1:]) for n in self.order if n[1:].isdigit()), default=-1)
        self.numbers: Iterator[int] = itertools.count(first)
        self.ops: list[LoweringOp] = []
        self.read = {name for op in fusion.ops for name in op.inputs} | set(fusion.outputs)
        """The tensors an op reads or the fusion outputs."""
        self.copies: dict[tuple, str] = {}
        """Whole copies made by :meth:`moved`, by (source, layout, mesh, dtype)."""

    def new_tensor(self, like: LoweringTensor, **changes: object) -> LoweringTensor:
        tensor = dataclasses.replace(like, name=f"T{next(self.numbers)}", **changes)
        self.tensors[tensor.name] = tensor
        self.order.append(tensor.name)
        return tensor

    def moved(self, src: LoweringTensor, wanted: LoweringTensor, consumer: str) -> LoweringTensor:
        """``src`` laid out as ``wanted`` for the op defining ``consumer``: a new tensor and
        the ``set`` that makes it, or the one an earlier op had made of ``src`` in that
        layout, so that a tensor two ops read alike is moved once (a gradient read by a
        linear's input- and weight-gradient matmuls was gathered twice). Only copies made
        whole are shared: a stream loop's chunked copy lives in its loop."""
        parts = tuple((axis.reduction, axis.parts) for axis in wanted.axes)  # extents too
        key = (src.name, parts, wanted.mesh, wanted.dtype)
        whole = all(axis.stream is None for axis in wanted.axes)
        if whole and key in self.copies:
            return self.tensors[self.copies[key]]
        moved = self.new_tensor(
            wanted, made_for=f"{src.name} laid out for the op defining {consumer}"
        )
        self.add_set(src, moved)
        if whole:
            self.copies[key] = moved.name
        return moved

    def add_set(self, src: LoweringTensor, dst: LoweringTensor) -> None:
        self.add_elementwise(Set(out=dst.value(), src=src.value()), src, dst)

    def add_elementwise(
        self, instruction: Instruction, src: LoweringTensor, dst: LoweringTensor
    ) -> None:
        """Appends ``instruction`` from ``src`` to ``dst``, their dims mapped one to one."""
        pairs = tuple((i, i) for i, axis in enumerate(dst.axes) if not axis.reduction)
        self.ops.append(
            LoweringOp(
                instruction=instruction,
                output=dst.name,
                inputs=(src.name,),
                axis_maps=((src.name, pairs),),
            )
        )


def decompose_resharding(fusion: LoweringFusion) -> LoweringFusion:
    """Returns ``fusion`` where only ``set`` ops change shardings (see module docstring)."""
    builder = _Builder(fusion)
    for ops in op_units(fusion.ops):
        if len(ops) > 1:
            _decompose_group(ops, builder)  # an op of several results
        elif isinstance(ops[0].instruction, Set):
            builder.ops.append(ops[0])  # a user's set is a resharding point already
        else:
            _decompose(ops[0], builder)
    return dataclasses.replace(
        fusion,
        tensors=tuple(builder.tensors[name] for name in builder.order),
        ops=tuple(builder.ops),
    )


def _decompose(op: LoweringOp, builder: _Builder) -> None:
    tensors = builder.tensors
    out = tensors[op.output]
    refuse_streamed_whole_axes(op, out.axes)  # lowering.op_layouts
    if out.mesh is None:  # propagation left no tensor on a mesh: a single-device fusion
        builder.ops.append(op)
        return
    if reads_no_tensor(op.instruction):  # its inputs give it a mesh only: nothing to move
        builder.ops.append(_rewrite(op, op.instruction, {}, out, tensors))
        return
    op = with_layout_pairs(op, tensors)  # a reshape keeps a sharded dim's blocks
    compute = _compute_tensor(op, tensors, out)
    compute = compute_layout(op, compute, tensors)  # a shape op's changed dims whole
    compute = _blocked_streams(compute, out)
    bias = _bias_after_reduction(op, compute)
    _refuse_sharded_repeats(op, tensors, compute)
    renames: dict[str, str] = {}
    for name, pairs in op.axis_maps:
        if bias is not None and name == bias:
            continue
        wanted = keep_blocks(op, name, _wanted_input(tensors[name], pairs, compute), tensors)
        if tensor_layout(wanted) != tensor_layout(tensors[name]):
            renames[name] = builder.moved(tensors[name], wanted, out.name).name
    result = out
    if tensor_layout(compute) != tensor_layout(out):
        result = builder.new_tensor(compute, made_for=_computed_for(out, compute))
    elif bias is not None:
        # The output keeps the partial sums: a bias added on every rank would be summed
        # once per rank of the partial axes (the fuzzer's seed 72 dropped it instead).
        raise LoweringError(
            f"{out.name} = linear(..., bias={bias}) holds partial sums over mesh axes"
            f" {sorted({m.value for a in compute.axes if a.reduction for m in a.mesh_axes()})}"
            " (its contraction is sharded),"
            f" so the bias cannot be added once; shard {out.name} without partial sums"
            " (the lowering then reduces before adding the bias) or add the bias after"
            " reducing"
        )
    instruction = op.instruction
    if bias is not None:
        instruction = dataclasses.replace(instruction, bias=None)
    builder.ops.append(_rewrite(op, instruction, renames, result, tensors))
    if result is out:
        return
    if bias is None:
        builder.add_set(result, out)
        return
    reduced = builder.new_tensor(out, made_for=f"{out.name} reduced, before its bias")
    builder.add_set(result, reduced)
    bias_dtype = op.instruction.bias.dtype
    added = _add_dtype(out.dtype, bias_dtype)
    if added is out.dtype:
        _decompose(_bias_add(op, reduced, out, bias, bias_dtype), builder)
        return
    # Half/BFloat16 add in Float (nvFuser's promotion, hostir.ir.ops); the linear's result
    # keeps its own dtype, as torch's linear with a bias: add in Float, then cast back.
    summed = builder.new_tensor(
        out, dtype=added, made_for=f"{out.name} plus its bias, in {added.value}"
    )
    _decompose(_bias_add(op, reduced, summed, bias, bias_dtype), builder)
    builder.add_elementwise(Cast(out=out.value(), src=summed.value()), summed, out)


def _decompose_group(ops: list[LoweringOp], builder: _Builder) -> None:
    """The results of one op of several (``ops``, one per result), as
    ``lowering.result_groups`` lays them out: the compute layout decided once, from the
    first result, as :func:`_decompose` decides a one-result op's; the inputs moved into
    the layout it reads them in; each other result computed where those inputs put it;
    all chunked alike (one instruction defines them all). A result whose compute layout is
    not its own gets a ``set`` after the op (one nothing reads takes the compute layout
    instead)."""
    tensors = builder.tensors
    outs = [tensors[op.output] for op in ops]
    for op, out in zip(ops, outs, strict=True):
        refuse_streamed_whole_axes(op, out.axes)  # lowering.op_layouts
    renames: dict[str, str] = {}
    computes = outs  # a single-device fusion: computed where the results are
    if outs[0].mesh is not None:
        computes = _group_compute(ops, builder, renames)
    computes = chunked_alike(ops, computes)
    results = [_group_result(c, out, builder) for c, out in zip(computes, outs, strict=True)]
    first = ops[0]
    values = {name: tensors[renames.get(name, name)].value() for name in first.inputs}
    values |= {op.output: result.value() for op, result in zip(ops, results, strict=True)}
    bound = bind_values(first.instruction, values)
    for op, result in zip(ops, results, strict=True):
        builder.ops.append(_rewrite(op, bound, renames, result, tensors, bound=True))
    for result, out in zip(results, outs, strict=True):
        if result.name != out.name:
            builder.add_set(result, out)


def _group_compute(
    ops: list[LoweringOp], builder: _Builder, renames: dict[str, str]
) -> list[LoweringTensor]:
    """The results of an op of several as it computes them (see :func:`_decompose_group`),
    its inputs moved where it reads them (their new names in ``renames``)."""
    tensors = builder.tensors
    first = ops[0]
    compute = _compute_tensor(first, tensors, tensors[first.output])
    _refuse_sharded_repeats(first, tensors, compute)
    maps = dict(first.axis_maps)
    wanted = {
        name: _wanted_input(tensors[name], maps.get(name, ()), compute)
        for op in ops
        for name, _ in op.axis_maps
    }
    for name, laid_out in wanted.items():
        if tensor_layout(laid_out) != tensor_layout(tensors[name]):
            renames[name] = builder.moved(tensors[name], laid_out, first.output).name
    others = [compute_from_inputs(op, tensors[op.output], wanted, compute.mesh) for op in ops[1:]]
    return [compute, *others]


def _group_result(
    compute: LoweringTensor, out: LoweringTensor, builder: _Builder
) -> LoweringTensor:
    """The tensor a result of an op of several is computed into: ``out`` if it is laid out
    and chunked as ``compute``; ``out`` taking ``compute``'s layout if nothing reads it (it
    is freed right after the op), or its chunking if it has none of its own (a stream loop
    writes it chunk by chunk, whole after the loop as before); else a new tensor, which a
    ``set`` copies into ``out``."""
    same_layout = tensor_layout(compute) == tensor_layout(out)
    if same_layout and stream_splits(compute) == stream_splits(out):
        return out
    unchunked = all(axis.stream is None for axis in out.axes)
    if out.name not in builder.read or (same_layout and unchunked):
        builder.tensors[out.name] = dataclasses.replace(compute, name=out.name)
        return builder.tensors[out.name]
    return builder.new_tensor(compute, made_for=_computed_for(out, compute))


def _add_dtype(lhs: DType, rhs: DType) -> DType:
    """The dtype of ``add`` on tensors of these dtypes (the declared rule)."""
    operands = (tensor_operand(lhs, 1, "lhs"), tensor_operand(rhs, 1, "rhs"))
    return promote(POINTWISE_OPS["add"], operands).result


def _compute_tensor(
    op: LoweringOp, tensors: dict[str, LoweringTensor], out: LoweringTensor
) -> LoweringTensor:
    """The output as the op computes it on local shards (see module docstring)."""
    maps = dict(op.axis_maps)
    if len(op.axis_maps) == 1:
        ((name, pairs),) = op.axis_maps
        computed = _compute_where_input_is(out, tensors[name], pairs)
        axes = computed_whole(op, list(computed.axes))  # lowering.op_layouts
        return dataclasses.replace(computed, axes=tuple(axes))
    axes = list(out.axes)
    for o, axis in enumerate(out.axes):
        if axis.reduction:
            axes[o] = _reduction_layout(o, axis, maps, tensors, out)
    axes = computed_whole(op, axes)  # axes the op computes unsharded (op_layouts)
    reduced = {a for axis in axes if axis.reduction for a in axis.mesh_axes()}
    axes = [a if a.reduction else without_mesh_axes(a, reduced, out.mesh) for a in axes]
    return dataclasses.replace(out, axes=tuple(axes))


def _computed_for(out: LoweringTensor, compute: LoweringTensor) -> str:
    """What a tensor the op computes before a ``set`` makes ``out`` of it is, for messages."""
    if any(axis.reduction and axis.mesh_axes() for axis in compute.axes):
        return f"the partial results of {out.name}, before their reduction"
    return f"{out.name} as its op computes it, before a set lays it out"


def _blocked_streams(compute: LoweringTensor, out: LoweringTensor) -> LoweringTensor:
    """``compute`` (how ``out``'s op computes it) with each stream-split axis that it
    computes whole while ``out`` shards it chunked in blocks: ``out`` laid out
    ``[x, stream, c]`` holds on rank ``r`` chunk ``j`` of block ``r``, so chunk ``j`` of the
    whole axis is chunk ``j`` of every block, joined (``AxisLayout.stream_blocks``), and the
    ``set`` after the op reshards chunk by chunk (the partial sums of a row-parallel linear
    reduce-scattered one chunk per iteration). An axis that keeps some mesh axes and drops
    others would chunk blocks inside device blocks: refused by name."""
    axes = list(compute.axes)
    for o, axis in enumerate(compute.axes):
        wanted = out.axes[o]
        if axis.stream is None or wanted.stream is None or axis.layout() == wanted.layout():
            continue
        if axis.mesh_axes():
            raise LoweringError(
                f"{out.name} is split into {wanted.stream} stream chunks on an axis laid out"
                f" {layout_text(wanted.layout())}, but its op computes that axis laid out"
                f" {layout_text(axis.layout())}: a loop cannot take chunk j of blocks inside device"
                f" blocks; shard {out.name}'s axis {o} over the same mesh axes as the op's"
                " inputs, or over none"
            )
        blocks = chunk_blocks(out, o)
        if not isinstance(axis.extent, Const):
            # Chunks in blocks view the dim as [blocks, extent / blocks], a reshape the
            # verifier cannot check on a symbol (fuzz seed 8001352 at 4 ranks).
            raise LoweringError(
                f"{out.name} is split into {wanted.stream} stream chunks of its devices'"
                f" blocks on axis {o}, whose extent {print_scalar(axis.extent)} is symbolic,"
                " but its op computes that axis laid out"
                f" {layout_text(axis.layout())}: the loop would take chunk j of {blocks}"
                " blocks of a symbolic extent; give the dim a constant extent, or lay out"
                f" {out.name}'s axis {o} like the op's inputs"
            )
        axes[o] = dataclasses.replace(axis, stream_blocks=blocks)
    return dataclasses.replace(compute, axes=tuple(axes))


def _compute_where_input_is(
    out: LoweringTensor, source: LoweringTensor, pairs: tuple[tuple[int, int], ...]
) -> LoweringTensor:
    """A one-input op's output on its input's mesh, each mapped axis laid out like the
    input's. An axis the input lacks (a dim ``broadcast_in_dim`` adds) keeps the output's
    layout only on the same mesh and over mesh axes the mapped axes leave free; otherwise
    it is computed whole (it is a broadcast: the ``set`` after the op slices it)."""
    axes = [local_parts(a) if a.reduction else a for a in out.axes]
    for o, i in pairs:
        axes[o] = copy_layout(out.axes[o], source.axes[i], source.mesh)
    mapped = {o for o, _ in pairs}
    used = {a for o in mapped for a in axes[o].mesh_axes()}
    for o, axis in enumerate(axes):
        if o not in mapped and (source.mesh != out.mesh or set(axis.mesh_axes()) & used):
            axes[o] = local_parts(axis)
    return dataclasses.replace(out, mesh=source.mesh, axes=tuple(axes))


def _reduction_layout(
    o: int, axis: AxisLayout, maps: dict, tensors: dict[str, LoweringTensor], out: LoweringTensor
) -> AxisLayout:
    """A reduction axis is sharded like the first input whose mapped axis is sharded."""
    for name, pairs in maps.items():
        producer = tensors[name]
        for po, pi in pairs:
            if po == o and producer.axes[pi].mesh_axes() and producer.mesh == out.mesh:
                return copy_layout(axis, producer.axes[pi], out.mesh)
    return local_parts(axis)


def _wanted_input(
    producer: LoweringTensor, pairs: tuple[tuple[int, int], ...], compute: LoweringTensor
) -> LoweringTensor:
    """``producer`` laid out so the op can read it in the compute layout, and chunked as
    the op reads it: a mapped axis takes the compute axis's stream split (the moved copy
    is made chunk by chunk in the op's loop), any other axis none (the copy is made
    whole, after the loop that wrote ``producer``; it was the producer's split, chunking
    the copy by indices other than the producer's chunk ``j``)."""
    axes = [_unchunked(local_parts(axis)) for axis in producer.axes]
    for o, i in pairs:
        laid_out = copy_layout(producer.axes[i], compute.axes[o], compute.mesh)
        chunked = compute.axes[o]
        axes[i] = dataclasses.replace(
            laid_out,
            stream=chunked.stream,
            swizzle=chunked.swizzle,
            stream_blocks=chunked.stream_blocks,
        )
    return dataclasses.replace(producer, mesh=compute.mesh, axes=tuple(axes))


def _unchunked(axis: AxisLayout) -> AxisLayout:
    return dataclasses.replace(axis, stream=None, swizzle=None, stream_blocks=1)


def _refuse_sharded_repeats(
    op: LoweringOp, tensors: dict[str, LoweringTensor], compute: LoweringTensor
) -> None:
    """A tensor read as two operands of one op (``linear(t, t)``) on a sharded op: each
    operand position needs its own layout of it, and inputs are resharded by name, so
    one copy cannot serve both (it gave wrong local shapes): refused by name."""
    decl = op_decl(op.instruction)
    if decl is not None and decl.sharding.elementwise:
        return  # elementwise operands map dims alike: one layout serves both
    names = _operand_names(op.instruction)
    sharded = any(axis.mesh_axes() for axis in compute.axes)
    for name in dict.fromkeys(names):
        if names.count(name) > 1 and (sharded or any(a.mesh_axes() for a in tensors[name].axes)):
            raise LoweringError(
                f"{name} is read as {names.count(name)} operands of the op defining"
                f" {compute.name}, which is sharded: each operand needs its own layout of"
                f" {name}; pass a copy for one of them (fd.ops.set({name}))"
            )


def _bias_after_reduction(op: LoweringOp, compute: LoweringTensor) -> str | None:
    """The bias of a linear whose contraction is sharded: it is added after reducing
    (the operand its declaration names, ``OpSharding.added_after_reduction``)."""
    instruction = op.instruction
    decl = op_decl(instruction)
    field = decl.sharding.added_after_reduction if decl is not None else None
    if field is None or getattr(instruction, field) is None:
        return None
    if not any(axis.reduction and axis.mesh_axes() for axis in compute.axes):
        return None
    bias = getattr(instruction, field)
    if bias.ndim > 1:  # [*W, N] does not broadcast from the right onto [*W, *I, N]
        raise LoweringError(
            f"linear(..., bias={bias.name}) with a {bias.ndim}-d bias and"
            " a sharded contraction is not supported: the bias is added after reducing, and"
            " only a 1-d bias [N] broadcasts onto the result; add the bias after the linear"
        )
    return bias.name


def _rewrite(
    op: LoweringOp,
    instruction: object,
    renames: dict[str, str],
    result: LoweringTensor,
    tensors: dict[str, LoweringTensor],
    bound: bool = False,
) -> LoweringOp:
    """``op`` reading renamed inputs and writing ``result`` (``bound``: ``instruction``
    holds its final values already, as the one instruction of an op of several results)."""
    if not bound:
        # Only the op's own tensors: building every tensor's value per op made this pass
        # quadratic in the fusion's size.
        values = {name: tensors[renames.get(name, name)].value() for name in op.inputs}
        values[op.output] = result.value()
        instruction = bind_values(instruction, values)
    reads = _operand_names(instruction)
    names = tuple(renames.get(name, name) for name in op.inputs if renames.get(name, name) in reads)
    maps = tuple(
        (renames.get(name, name), pairs)
        for name, pairs in op.axis_maps
        if renames.get(name, name) in names
    )
    return dataclasses.replace(
        op, instruction=instruction, output=result.name, inputs=names, axis_maps=maps
    )


def _operand_names(instruction: object) -> list[str]:
    """The names of the tensors ``instruction`` reads, one per operand field."""
    values = (getattr(instruction, name) for name in type(instruction).INS)
    return [v.name for v in values if isinstance(v, TensorValue)]


def _bias_add(
    op: LoweringOp, reduced: LoweringTensor, out: LoweringTensor, bias: str, bias_dtype: DType
) -> LoweringOp:
    """``out = reduced + bias``, with the linear's bias axis map."""
    data = [i for i, axis in enumerate(out.axes) if not axis.reduction]
    bias_pairs = dict(op.axis_maps)[bias]
    instruction = Binary(
        op=BinaryOpKind.ADD,
        out=out.value(),
        lhs=reduced.value(),
        rhs=TensorValue(name=bias, dtype=bias_dtype, shape=(), sharding=None),
    )
    return LoweringOp(
        instruction=instruction,
        output=out.name,
        inputs=(reduced.name, bias),
        axis_maps=((reduced.name, tuple((i, i) for i in data)), (bias, bias_pairs)),
    )
