"""Stream loops: consecutive ops on stream-split tensors become one host for-loop.

For a run of ops whose outputs are split into the same number of stream
chunks, the loop ``for j in range(0, count)``:

- runs iteration ``j`` on ``stream(j)``, after ``synchronize(main)``; after
  the loop, main waits for every stream;
- handles chunk ``j`` of every stream-split tensor, or chunk
  ``(j + coord(mesh, a)) % count`` when a tensor of the loop is swizzled over
  mesh axis ``a``;
- reads tensors from before the loop through ``shard_by_stream`` aliases (or
  whole, if they are not stream-split);
- writes tensors used after the loop into buffers allocated before it, through
  per-iteration slices (compute with ``out=``); other tensors live one
  iteration;
- takes apart the planner's Allgather of a tensor read whole into a stream-
  split one (over one mesh axis or a flattened team): one Broadcast per
  iteration (root: the chunk the iteration handles), or, with the swizzle, one
  CollectivePermute per iteration (receive from ``(r + j) % D``, send to
  ``(r - j) % D``; iteration 0 is a local copy); other resharding inside the
  loop is planned per chunk (e.g. one Allreduce per iteration);
- refuses, in a swizzled loop, any other communication over a team whose
  members differ on the swizzled mesh axis: they hold different chunks in the
  same iteration (``lowering/swizzle_teams.py``).

The loop's state and the chunks it reads are ``lowering/stream_chunks.py``'s, how a tensor
is split ``lowering/stream_splits.py``'s, the Allgather taken apart
``lowering/stream_allgather.py``'s and the refusals ``lowering/stream_checks.py``'s; this
module groups the ops into loops and emits each loop, pipelined.
"""

from __future__ import annotations

import collections
import dataclasses

from hostir import (
    Allocate,
    Const,
    ForLoop,
    GetCurrentStream,
    PipelineStage,
    Set,
    SetCurrentStream,
    ShardByStream,
    StreamValue,
    Symbol,
    Synchronize,
    TensorValue,
    Wait,
)
from hostir.ir.instructions import Instruction
from hostir.settings import count_setting
from lowering.emitter import Emitter
from lowering.snapshot import LoweringFusion, LoweringOp, op_units
from lowering.stream_allgather import stream_allgather
from lowering.stream_chunks import LoopChunks
from lowering.stream_splits import StreamSplit, chunk_value, chunks_alike, stream_split
from lowering.swizzle_teams import check_swizzled_communication

__all__ = [
    "DEPTH_VARIABLE",
    "MAIN",
    "StreamSplit",
    "chunk_value",
    "emit_stream_loop",
    "group_ops",
    "stream_split",
]

MAIN = StreamValue(name="main")


def group_ops(fusion: LoweringFusion) -> list[tuple[int | None, list[LoweringOp]]]:
    """Consecutive ops whose outputs have the same stream chunk count and swizzle share
    a loop where each reads the chunks the loop's earlier ops made by the axis its own
    output is chunked on (a permute moving the chunked dim stays in; an op chunked on an
    unrelated dim gets a loop of its own, the first writing its output whole for the
    second: :func:`_chunks_follow`); returns (chunk count or None, ops)
    segments in order. A swizzled loop visits
    chunk (j + coordinate) % count on each rank, so an unswizzled op beside it would
    read and write chunks of other indices than its peers' in the same iteration (an
    Allgather in it would join rows of different chunks): it gets a loop of its own. An
    op outside loops that reads nothing the open loop computes runs before that loop."""
    tensors = {t.name: t for t in fusion.tensors}
    segments: list[tuple[int | None, list[LoweringOp]]] = []
    keys: list[tuple | None] = []
    defined: set[str] = set()  # the outputs of the current segment's ops
    for op in fusion.ops:
        split = stream_split(tensors[op.output])
        key = (split.count, split.swizzle, split.mesh) if split is not None else None
        if segments and keys[-1] == key and _chunks_follow(op, tensors, defined):
            segments[-1][1].append(op)
            defined.add(op.output)
        elif key is None and keys and keys[-1] is not None and not set(op.inputs) & defined:
            # Needs nothing of the open loop (a weight's cast written among the loop's
            # ops): computed before the loop, which stays one loop.
            if len(keys) > 1 and keys[-2] is None:
                segments[-2][1].append(op)
            else:
                segments.insert(len(segments) - 1, (None, [op]))
                keys.insert(len(keys) - 1, None)
        else:
            segments.append((split.count if split is not None else None, [op]))
            keys.append(key)
            defined = {op.output}
    return segments


def _chunks_follow(op: LoweringOp, tensors: dict, defined: set[str]) -> bool:
    """Whether ``op`` can join the loop whose ops defined ``defined``: each input the
    loop defines is chunked on an axis that ``op`` maps to its output's stream axis, laid
    out alike, so chunk ``j`` of the input holds what chunk ``j`` of the output needs (a
    permute that moves the sequence dim stays in the loop; a tensor chunked by rows read
    by an op chunked by columns starts a loop of its own, which reads it whole)."""
    output = tensors[op.output]
    stream_axis = next((o for o, axis in enumerate(output.axes) if axis.stream), None)
    if stream_axis is None:  # not a loop: ops outside loops group freely
        return True
    for name, pairs in op.axis_maps:
        if name not in defined:
            continue
        producer = tensors[name]
        chunked = next((i for i, axis in enumerate(producer.axes) if axis.stream), None)
        if chunked is None:
            continue
        is_set = isinstance(op.instruction, Set)
        follows = any(
            o == stream_axis and i == chunked and chunks_alike(is_set, producer, i, output, o)
            for o, i in pairs
        )
        if not follows:
            return False
    return True


class _Loop(LoopChunks):
    """One stream loop being emitted: each op (or op of several results) run on the
    iteration's chunks (which :class:`~lowering.stream_chunks.LoopChunks` takes)."""

    def emit(self) -> list[Instruction]:
        values = self.emitter.values
        before: list[Instruction] = [Allocate(out=values[name]) for name in self.allocated]
        if not self.emitter.main_stream_defined:  # later loops start on main too
            before.append(GetCurrentStream(out=MAIN))
            self.emitter.main_stream_defined = True
        body: list[Instruction] = [
            SetCurrentStream(stream=StreamValue(index=self.index)),
            Synchronize(stream=MAIN),
        ]
        chunks: dict[str, TensorValue] = {}
        units = op_units(self.ops)
        for index, ops in enumerate(units):
            if len(ops) > 1:  # an op of several results: one instruction
                body.extend(self._emit_group(ops, chunks))
                continue
            following = units[index + 1][0] if index + 1 < len(units) else None
            self._reduce_in_place(ops[0], following, chunks, body)
            body.extend(self._emit_op(ops[0], chunks))
        sync = Symbol(name=f"j{next(self.emitter.loops)}")
        after = [
            SetCurrentStream(stream=MAIN),
            ForLoop(
                index=sync,
                start=Const(value=0),
                stop=Const(value=self.count),
                body=(Synchronize(stream=StreamValue(index=sync)),),
            ),
        ]
        loop = ForLoop(
            index=self.index,
            start=Const(value=0),
            stop=Const(value=self.count),
            body=tuple(_pipelined(body)),
        )
        return before + [loop] + after

    def _reduce_in_place(
        self,
        op: LoweringOp,
        following: LoweringOp | None,
        chunks: dict[str, TensorValue],
        body: list[Instruction],
    ) -> None:
        """When ``op`` computes partial sums that only ``following`` reduces into a buffer
        allocated before the loop, let ``op`` write them straight into that buffer's
        chunk (a partial-sum view of it) so the reduction runs in place: no separate
        partial tensor per iteration, no copy."""
        if following is None or not isinstance(following.instruction, Set):
            return
        partial, out = op.output, following.output
        value, target = self.emitter.values[partial], self.emitter.values[out]
        if following.inputs != (partial,) or out not in self.allocated:
            return
        if value.sharding is None or not value.sharding.partial or target.sharding is None:
            return
        reduced = dataclasses.replace(value.sharding, partial=())
        if reduced != target.sharding or partial in self.allocated:
            return
        if any(partial in later.inputs for later in self.ops if later is not following):
            return
        split = self.split_of(partial)
        view = self._chunk(partial, split)
        chunks[partial] = view
        self.preallocated_views.add(partial)
        body.append(
            ShardByStream(out=view, src=self.emitter.values[out], axis=split.dim, index=self.chunk)
        )

    def _emit_group(
        self, ops: list[LoweringOp], chunks: dict[str, TensorValue]
    ) -> list[Instruction]:
        """The instruction of an op of several results (``ops``, one per result, chunked
        alike: ``decompose_resharding``), run on this iteration's chunks. An op of several
        results writes into no existing tensor: a result used after the loop is computed
        into a chunk of its own and copied into its buffer's chunk (``set(..., out=)``), as
        a preallocated one-result op copies its result."""
        out, whole = self._read_inputs(ops[0], chunks)
        fresh: dict[str, TensorValue] = {}
        copies: list[Instruction] = []
        for op in ops:
            if op.output not in self.allocated:
                chunks[op.output] = self._chunk(op.output, self.split_of(op.output))
                continue
            out.extend(self._slice(op.output, chunks))
            target = chunks[op.output]
            fresh[op.output] = dataclasses.replace(target, name=self.fresh_chunk_name(target.name))
            copies.append(Set(out=target, src=fresh[op.output], preallocated=True))
        values = collections.ChainMap(fresh, whole, chunks, self.emitter.values)
        emitted = self.emitter.emit_op(ops[0], values) + copies
        if self.swizzle is not None:  # its chunks differ between ranks in one iteration
            check_swizzled_communication(ops[0], emitted, self.swizzle, self.swizzled, self.count)
        return out + emitted

    def _emit_op(self, op: LoweringOp, chunks: dict[str, TensorValue]) -> list[Instruction]:
        out, whole = self._read_inputs(op, chunks)
        preallocated = op.output in self.allocated or op.output in self.preallocated_views
        if op.output in self.preallocated_views:
            pass  # its chunk view was created by _reduce_in_place
        elif preallocated:
            out.extend(self._slice(op.output, chunks))
        else:
            split = self.split_of(op.output)
            chunks[op.output] = self._chunk(op.output, split)
        values = collections.ChainMap(whole, chunks, self.emitter.values)  # no copy per op
        # A set that reads its input whole (not chunked, or chunked on a dim this op does
        # not chunk alike: fuzz seed 701842 planned the whole input into one chunk).
        if isinstance(op.instruction, Set) and (
            op.inputs[0] not in chunks or op.inputs[0] in whole
        ):
            return out + stream_allgather(self, op, values, preallocated)
        emitted = self.emitter.emit_op(op, values, preallocated)
        if self.swizzle is not None:  # its chunks differ between ranks in one iteration
            check_swizzled_communication(op, emitted, self.swizzle, self.swizzled, self.count)
        return out + emitted


DEPTH_VARIABLE = "HOSTIR_PIPELINE_DEPTH"
"""How many chunks behind a stream loop waits for a chunk's communication: 1 by default
(the chunk's communication runs while the next chunk is computed), 2 for double
buffering, 0 for loops without stages (each chunk waits before the next starts)."""


def _pipelined(body: list[Instruction]) -> list[Instruction]:
    """``body`` in two stages (``hostir.run.pipelined_loops``): the second starts at the first
    ``wait``, so a chunk's first communication is in flight while the next chunk is
    computed and is waited for right before its result is used. Unchanged without a
    wait (nothing to overlap) or at depth 0."""
    depth = count_setting(DEPTH_VARIABLE, default=1, minimum=0)
    first_wait = next((k for k, i in enumerate(body) if isinstance(i, Wait)), None)
    if first_wait is None or depth == 0:
        return body
    return [*body[:first_wait], PipelineStage(depth=depth), *body[first_wait:]]


def emit_stream_loop(
    emitter: Emitter, count: int, ops: list[LoweringOp], later: list[LoweringOp]
) -> list[Instruction]:
    """The instructions of one stream loop over ``ops`` (``later``: the ops after it)."""
    return _Loop(emitter, count, ops, later).emit()
