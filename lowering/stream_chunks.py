"""A stream loop's chunks: its state, its chunk index, and the chunks its ops read.

:class:`LoopChunks` holds what one stream loop (``lowering/stream_loops.py``) knows while
it is emitted (its ops, index, swizzle, the tensors it allocates before it, the chunks it
took) and takes the chunks of one iteration: ``shard_by_stream`` aliases of chunk
``j`` (or ``(j + coord) % count`` when swizzled) of the tensors an op reads and writes,
read by another dim's chunks or whole where an earlier op of the loop chunked an input
on a dim this op does not map to the stream axis.
"""

from __future__ import annotations

import dataclasses
import itertools

from hostir import (
    Const,
    Mesh,
    MeshAxis,
    MeshCoordinate,
    Set,
    ShardByStream,
    Sharding,
    ShardPart,
    Symbol,
    TensorValue,
)
from hostir.ir.instructions import Instruction
from hostir.ir.scalars import Scalar, add, floordiv, mod
from hostir.ir.shape_ops import Reshape
from hostir.ir.sharding import normalized
from lowering.emitter import Emitter
from lowering.errors import LoweringError
from lowering.snapshot import LoweringOp
from lowering.stream_checks import check_chunks_divide, check_repeated_operands, check_same_chunks
from lowering.stream_splits import StreamSplit, chunk_value, chunks_alike, stream_split


def _split_dim(sharding: Sharding | None, dim: int, shape: tuple) -> Sharding | None:
    """``sharding`` of a tensor whose local ``dim`` is viewed as two dims (a stream chunk
    in blocks): both local, of ``shape``'s extents."""
    if sharding is None:
        return None
    parts = (
        (ShardPart(axis=None, extent=shape[dim]),),
        (ShardPart(axis=None, extent=shape[dim + 1]),),
    )
    dims = (*sharding.dims[:dim], *parts, *sharding.dims[dim + 1 :])
    return normalized(dataclasses.replace(sharding, dims=dims), shape)


class LoopChunks:
    """The state of one stream loop being emitted, and the chunks its iteration takes."""

    def __init__(self, emitter: Emitter, count: int, ops: list[LoweringOp], later: list) -> None:
        self.emitter = emitter
        self.count = count
        self.ops = ops
        self.tensors = emitter.tensors
        self.index = Symbol(name=f"j{next(emitter.loops)}")
        self.defined = {op.output for op in ops}
        used_later = {name for op in later for name in op.inputs} | set(emitter.fusion.outputs)
        # In definition order: iterating the set would order the allocations by string
        # hashes, which differ between processes (and ranks then run different programs).
        self.allocated = [op.output for op in ops if op.output in used_later]
        self.swizzle: tuple[MeshAxis, Mesh] | None = None  # both set by _chunk_index
        self.swizzled = ""  # the first tensor of the loop that is swizzled
        self.chunk = self._chunk_index()
        self.preallocated_views: set[str] = set()
        self.remapped: dict[str, int] = {}  # inputs read by the chunks of this loop's dim
        self.chunk_dims: dict[str, int] = {}  # the data dim each chunked tensor is chunked on
        self.chunk_blocks: dict[str, int] = {}  # and in how many blocks (StreamSplit.blocks)

    def _chunk_index(self) -> Scalar:
        # The loop's own tensors decide its swizzle: an input from an earlier, swizzled
        # loop was written whole there (each chunk at its place), so reading it does not
        # rotate this loop (issue 34: a ReduceScatter loop after a swizzled Allgather loop
        # was refused as if it sat in the swizzled one).
        names = [op.output for op in self.ops]  # in order
        swizzles: dict[tuple[MeshAxis, Mesh], str] = {}  # -> the first tensor swizzled so
        for name in names:
            split = stream_split(self.tensors[name])
            if split is not None and split.swizzle:
                swizzles.setdefault((split.swizzle, split.mesh), name)
        if len(swizzles) > 1:
            mixed = ", ".join(sorted(f"mesh_{axis.value} of {mesh}" for axis, mesh in swizzles))
            raise LoweringError(
                f"the stream loop over {sorted(self.defined)} mixes swizzles {mixed}"
            )
        if not swizzles:
            return self.index
        (((axis, mesh), self.swizzled),) = swizzles.items()
        self.swizzle = (axis, mesh)
        return mod(add(self.index, MeshCoordinate(mesh=mesh, axis=axis)), self.count)

    def split_of(self, name: str) -> StreamSplit | None:
        split = stream_split(self.tensors[name])
        if split is not None and split.count != self.count:
            raise LoweringError(
                f"{name} is split into {split.count} stream chunks inside a loop of {self.count}"
            )
        return split

    def _chunk(self, name: str, split: StreamSplit) -> TensorValue:
        """Chunk ``split`` of ``name``, named ``T_c``, or ``T_c<k>`` (``k`` this loop's
        index number) when an earlier loop of the program defined ``T_c``."""
        whole = self.emitter.values[name]
        check_chunks_divide(name, whole, split)
        value = chunk_value(whole, split)
        self.chunk_dims[name] = split.dim
        self.chunk_blocks[name] = split.blocks
        self.emitter.chunked.add(name)
        if value.name in self.emitter.chunk_names:
            value = dataclasses.replace(value, name=f"{value.name}{self.index.name[1:]}")
        self.emitter.chunk_names.add(value.name)
        return value

    def _slice(
        self, name: str, chunks: dict[str, TensorValue], split: StreamSplit | None = None
    ) -> list[Instruction]:
        """A ``shard_by_stream`` alias of chunk ``self.chunk`` of ``name`` (a copy for a
        chunk in blocks, :meth:`_take`)."""
        split = split or self.split_of(name)
        if split.blocks > 1 and name in self.defined:
            raise LoweringError(
                f"{name} is computed in stream chunks of {split.blocks} blocks each (chunk j"
                f" of every block, joined: the partial sums a set reshards chunk by chunk),"
                " which exist only inside the loop; but it is used after the loop, which"
                f" would need them written back block by block: use {name} only through"
                " the set that reshards it, or compute it before the loop"
            )
        value = self._chunk(name, split)
        chunks[name] = value
        return self._take(self.emitter.values[name], value, split)

    def _take(self, whole: TensorValue, value: TensorValue, split: StreamSplit) -> list:
        """The instructions that make ``value``, chunk ``self.chunk`` of ``whole``: one
        ``shard_by_stream`` alias; in ``b`` blocks (``split.blocks``), the dim viewed as
        ``[b, n / b]`` (a reshape, no copy), chunk ``j`` of the second taken there and the
        ``b`` pieces joined in block order (a reshape, which copies)."""
        if split.blocks == 1:
            return [ShardByStream(out=value, src=whole, axis=split.dim, index=self.chunk)]
        dim, blocks = split.dim, split.blocks
        shape = list(whole.shape)
        viewed = [*shape[:dim], Const(value=blocks), floordiv(shape[dim], blocks)]
        viewed += shape[dim + 1 :]
        taken = list(viewed)
        taken[dim + 1] = floordiv(viewed[dim + 1], split.count)
        names = [self.fresh_chunk_name(f"{value.name}_{suffix}") for suffix in ("blocks", "block")]
        view, piece = (
            TensorValue(
                name=n,
                dtype=whole.dtype,
                shape=tuple(s),
                sharding=_split_dim(whole.sharding, dim, tuple(s)),
            )
            for n, s in zip(names, (viewed, taken), strict=True)
        )
        return [
            Reshape(out=view, src=whole),
            ShardByStream(out=piece, src=view, axis=dim + 1, index=self.chunk),
            Reshape(out=value, src=piece),
        ]

    def _input_split(self, op: LoweringOp, name: str) -> StreamSplit | None:
        """How input ``name`` of ``op`` is read per iteration: its own stream split, or,
        if it has none, the chunks of the dim that maps to the output's split dim when
        both dims are sharded alike (otherwise the op reshards that dim: a gather)."""
        split = self.split_of(name) if name in self.defined else stream_split(self.tensors[name])
        output = self.tensors[op.output]
        stream_axis = next(i for i, axis in enumerate(output.axes) if axis.stream is not None)
        producer = self.tensors[name]
        pairs = dict(op.axis_maps).get(name, ())
        is_set = isinstance(op.instruction, Set)
        own = [
            o
            for o, i in pairs
            if producer.axes[i].stream is not None
            and chunks_alike(is_set, producer, i, output, o)
            and producer.axes[i].stream == self.count  # else an earlier loop wrote it whole
        ]
        if split is not None and (name in self.defined or own == [stream_axis]):
            return split
        # Whole here (an earlier loop, split on another dim, wrote all of it): read by the
        # chunks of the dim that maps to this loop's, as if it had no split of its own, in
        # the output's blocks.
        for o, i in pairs:
            if o == stream_axis and producer.axes[i].layout() == output.axes[o].layout():
                dim = sum(1 for axis in producer.axes[:i] if not axis.reduction)
                self.remapped[name] = dim
                return StreamSplit(
                    dim=dim,
                    count=self.count,
                    swizzle=None,
                    mesh=producer.mesh,
                    blocks=output.axes[o].stream_blocks,
                )
        return None

    def _read_whole(
        self, op: LoweringOp, chunks: dict[str, TensorValue], stream_axis: int
    ) -> tuple[dict[str, TensorValue], list[Instruction]]:
        """What ``op`` reads instead of the chunks an earlier op of the loop took of its
        inputs, where their chunked dim does not map to ``op``'s stream axis, and the
        instructions that make it: another chunk (``sub(permute(t2), t2)`` reads ``t2``'s
        rows for the permute, its columns for the sub: fuzz seed 500091) or the whole
        tensor (``linear(t0, t1)`` after ``sub(t0, t1)`` chunked ``t1``'s rows, which the
        linear reads as the weight's: seed 301456). A tensor the loop computes chunk by
        chunk exists only as its chunks: reading it by another dim is refused."""
        override: dict[str, TensorValue] = {}
        emitted: list[Instruction] = []
        for name in dict.fromkeys(op.inputs):
            if name not in chunks or self._reads_chunk(op, name, stream_axis):
                continue
            if name in self.defined:
                raise LoweringError(
                    f"{name} is computed chunk by chunk on its dim {self.chunk_dims[name]} in"
                    f" the stream loop over {sorted(self.defined)}, but the op defining"
                    f" {op.output} reads it by another dim's chunks: split {op.output} (or"
                    f" {name}) so that both are chunked on the dims the op maps to each other,"
                    f" or compute {name} before the loop"
                )
            whole = self.emitter.values[name]
            dim = self._dim_at_stream_axis(op, name, stream_axis)
            if dim is None:
                override[name] = whole
                continue
            mesh = self.tensors[name].mesh
            blocks = self.tensors[op.output].axes[stream_axis].stream_blocks
            split = StreamSplit(dim=dim, count=self.count, swizzle=None, mesh=mesh, blocks=blocks)
            value = chunk_value(whole, split)
            value = dataclasses.replace(value, name=self.fresh_chunk_name(value.name))
            override[name] = value
            emitted.extend(self._take(whole, value, split))
        return override, emitted

    def _dim_at_stream_axis(self, op: LoweringOp, name: str, stream_axis: int) -> int | None:
        """The data dim of ``name`` that ``op`` maps to its stream axis, laid out alike."""
        producer, output = self.tensors[name], self.tensors[op.output]
        for o, i in dict(op.axis_maps).get(name, ()):
            if o == stream_axis and producer.axes[i].layout() == output.axes[o].layout():
                return sum(1 for axis in producer.axes[:i] if not axis.reduction)
        return None

    def fresh_chunk_name(self, name: str) -> str:
        """``name`` with a suffix no chunk of the program has yet."""
        for k in itertools.count(2):
            candidate = f"{name}_{k}"
            if candidate not in self.emitter.chunk_names:
                self.emitter.chunk_names.add(candidate)
                return candidate
        raise AssertionError("unreachable")

    def _reads_chunk(self, op: LoweringOp, name: str, stream_axis: int) -> bool:
        """Whether ``op`` reads ``name``'s chunk as it is: the dim it is chunked on maps
        to the output's stream axis, laid out alike."""
        producer, output = self.tensors[name], self.tensors[op.output]
        chunked = self.chunk_dims.get(name)
        is_set = isinstance(op.instruction, Set)
        for o, i in dict(op.axis_maps).get(name, ()):
            dim = sum(1 for axis in producer.axes[:i] if not axis.reduction)
            if dim == chunked and not producer.axes[i].reduction:
                if producer.axes[i].stream is None:  # chunked by this loop's own chunks
                    taken = self.chunk_blocks.get(name, 1)
                    alike = producer.axes[i].layout() == output.axes[o].layout()
                    return o == stream_axis and alike and taken == output.axes[o].stream_blocks
                return o == stream_axis and chunks_alike(is_set, producer, i, output, o)
        return False

    def _read_inputs(
        self, op: LoweringOp, chunks: dict[str, TensorValue]
    ) -> tuple[list[Instruction], dict[str, TensorValue]]:
        """The instructions that take the chunks ``op`` reads of its inputs, and what it
        reads instead of a chunk an earlier op took by another dim (:meth:`_read_whole`)."""
        out: list[Instruction] = []
        for name in op.inputs:
            if name in chunks or name in self.defined:
                continue
            split = self._input_split(op, name)
            if split is not None:
                out.extend(self._slice(name, chunks, split))
        output = self.tensors[op.output]
        stream_axis = next(i for i, axis in enumerate(output.axes) if axis.stream is not None)
        for name in op.inputs:
            if name in chunks and name not in self.remapped:
                check_same_chunks(op, name, self.tensors[name], output, stream_axis)
        check_repeated_operands(op)
        whole, rechunked = self._read_whole(op, chunks, stream_axis)
        return out + rechunked, whole
