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
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from dataclasses import dataclass

from hostir import (
    Allgather,
    Allocate,
    Binary,
    Broadcast,
    CollectivePermute,
    Const,
    ForLoop,
    GetCurrentStream,
    Mesh,
    MeshAxis,
    MeshCoordinate,
    PipelineStage,
    RequestValue,
    Set,
    SetCurrentStream,
    ShardByStream,
    ShardPart,
    StreamValue,
    Symbol,
    Synchronize,
    TensorValue,
    Wait,
)
from hostir.ir.instructions import Instruction
from hostir.ir.opdecl import op_decl
from hostir.ir.scalars import Scalar, add, floordiv, mod, print_scalar, sub
from hostir.ir.sharding import normalized
from hostir.ir.team import Team
from hostir.settings import count_setting
from lowering.emitter import Emitter, bind_values
from lowering.errors import LoweringError
from lowering.redistribution.plan_resharding import plan_resharding
from lowering.snapshot import LoweringFusion, LoweringOp, LoweringTensor, op_units
from lowering.swizzle_teams import check_swizzled_communication

MAIN = StreamValue(name="main")


@dataclass(frozen=True, kw_only=True)
class StreamSplit:
    """How a tensor is split into stream chunks: data dim, chunk count, swizzle."""

    dim: int
    count: int
    swizzle: MeshAxis | None
    mesh: Mesh | None


def stream_split(tensor: LoweringTensor) -> StreamSplit | None:
    """The stream split of ``tensor``, if one of its data dims has one."""
    data = [axis for axis in tensor.axes if not axis.reduction]
    for dim, axis in enumerate(data):
        if axis.stream is not None:
            return StreamSplit(dim=dim, count=axis.stream, swizzle=axis.swizzle, mesh=tensor.mesh)
    return None


def group_ops(fusion: LoweringFusion) -> list[tuple[int | None, list[LoweringOp]]]:
    """Consecutive ops whose outputs have the same stream chunk count, split dim and
    swizzle share a loop (ops split on different dims get loops of their own, the first
    writing its output whole for the second); returns (chunk count or None, ops)
    segments in order. A swizzled loop visits
    chunk (j + coordinate) % count on each rank, so an unswizzled op beside it would
    read and write chunks of other indices than its peers' in the same iteration (an
    Allgather in it would join rows of different chunks): it gets a loop of its own."""
    tensors = {t.name: t for t in fusion.tensors}
    segments: list[tuple[int | None, list[LoweringOp]]] = []
    keys: list[tuple | None] = []
    for op in fusion.ops:
        split = stream_split(tensors[op.output])
        key = (split.count, split.dim, split.swizzle, split.mesh) if split is not None else None
        if segments and keys[-1] == key:
            segments[-1][1].append(op)
        else:
            segments.append((split.count if split is not None else None, [op]))
            keys.append(key)
    return segments


def chunk_value(value: TensorValue, split: StreamSplit) -> TensorValue:
    """One stream chunk of ``value``: its split dim divided by the chunk count (the
    first local part of that dim is the one the stream axis splits)."""
    shape = list(value.shape)
    shape[split.dim] = floordiv(shape[split.dim], split.count)
    sharding = value.sharding
    if sharding is not None:
        parts = list(sharding.dims[split.dim])
        for index, part in enumerate(parts):
            if part.axis is None:
                parts[index] = ShardPart(axis=None, extent=floordiv(part.extent, split.count))
                break
        dims = list(sharding.dims)
        dims[split.dim] = tuple(parts)
        sharding = normalized(dataclasses.replace(sharding, dims=tuple(dims)), tuple(shape))
    return TensorValue(
        name=f"{value.name}_c", dtype=value.dtype, shape=tuple(shape), sharding=sharding
    )


class _Loop:
    """The state of one stream loop being emitted."""

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

    def _chunk_index(self) -> Scalar:
        names = [n for op in self.ops for n in (*op.inputs, op.output)]  # in order
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

    def _chunk(self, name: str, split: StreamSplit) -> TensorValue:
        """Chunk ``split`` of ``name``, named ``T_c``, or ``T_c<k>`` (``k`` this loop's
        index number) when an earlier loop of the program defined ``T_c``."""
        whole = self.emitter.values[name]
        if whole.sharding is not None:
            parts = whole.sharding.dims[split.dim]
            local = [p.extent for p in parts if p.axis is None]
            count = 1
            for extent in local:
                count *= extent.value if isinstance(extent, Const) else 0
            if all(isinstance(e, Const) for e in local) and count % split.count:
                raise LoweringError(
                    f"{name} dim {split.dim} holds {count} index(es) per device"
                    f" ({_print_parts(parts)}), which do not split into {split.count} stream"
                    " chunks; use fewer chunks or shard that dim over fewer devices"
                )
        value = chunk_value(whole, split)
        self.chunk_dims[name] = split.dim
        self.emitter.chunked.add(name)
        if value.name in self.emitter.chunk_names:
            value = dataclasses.replace(value, name=f"{value.name}{self.index.name[1:]}")
        self.emitter.chunk_names.add(value.name)
        return value

    def _slice(
        self, name: str, chunks: dict[str, TensorValue], split: StreamSplit | None = None
    ) -> list[Instruction]:
        """A ``shard_by_stream`` alias of chunk ``self.chunk`` of ``name``."""
        split = split or self.split_of(name)
        value = self._chunk(name, split)
        chunks[name] = value
        return [
            ShardByStream(
                out=value, src=self.emitter.values[name], axis=split.dim, index=self.chunk
            )
        ]

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

    def _input_split(self, op: LoweringOp, name: str) -> StreamSplit | None:
        """How input ``name`` of ``op`` is read per iteration: its own stream split, or,
        if it has none, the chunks of the dim that maps to the output's split dim when
        both dims are sharded alike (otherwise the op reshards that dim: a gather)."""
        split = self.split_of(name)
        output = self.tensors[op.output]
        stream_axis = next(i for i, axis in enumerate(output.axes) if axis.stream is not None)
        producer = self.tensors[name]
        pairs = dict(op.axis_maps).get(name, ())
        own = [o for o, i in pairs if producer.axes[i].stream is not None]
        if split is not None and (name in self.defined or own == [stream_axis]):
            return split
        # Whole here (an earlier loop, split on another dim, wrote all of it): read by the
        # chunks of the dim that maps to this loop's, as if it had no split of its own.
        for o, i in pairs:
            if o == stream_axis and producer.axes[i].layout() == output.axes[o].layout():
                dim = sum(1 for axis in producer.axes[:i] if not axis.reduction)
                self.remapped[name] = dim
                return StreamSplit(dim=dim, count=self.count, swizzle=None, mesh=producer.mesh)
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
            split = StreamSplit(dim=dim, count=self.count, swizzle=None, mesh=mesh)
            value = chunk_value(whole, split)
            value = dataclasses.replace(value, name=self._fresh_chunk_name(value.name))
            override[name] = value
            emitted.append(ShardByStream(out=value, src=whole, axis=dim, index=self.chunk))
        return override, emitted

    def _dim_at_stream_axis(self, op: LoweringOp, name: str, stream_axis: int) -> int | None:
        """The data dim of ``name`` that ``op`` maps to its stream axis, laid out alike."""
        producer, output = self.tensors[name], self.tensors[op.output]
        for o, i in dict(op.axis_maps).get(name, ()):
            if o == stream_axis and producer.axes[i].layout() == output.axes[o].layout():
                return sum(1 for axis in producer.axes[:i] if not axis.reduction)
        return None

    def _fresh_chunk_name(self, name: str) -> str:
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
        for o, i in dict(op.axis_maps).get(name, ()):
            dim = sum(1 for axis in producer.axes[:i] if not axis.reduction)
            if dim == chunked and not producer.axes[i].reduction:
                return o == stream_axis and producer.axes[i].layout() == output.axes[o].layout()
        return False

    def _check_same_chunks(
        self, op: LoweringOp, name: str, producer, output, stream_axis: int
    ) -> None:
        """An input with its own stream split is read chunk by chunk only where its chunk
        ``j`` holds the same indices as the output's: its split dim maps to the output's
        and both are laid out over the same mesh axes. (A stream split inside a sharded
        dim, ``[x, stream, 1]``, holds rows ``{2 d + j}``, an unsharded dim's chunk ``j``
        a block of rows: mixing them computed wrong numbers, fuzzer seed 53.)"""
        for o, i in dict(op.axis_maps).get(name, ()):
            if producer.axes[i].stream is None and o != stream_axis:
                continue
            mine, theirs = producer.axes[i].layout(), output.axes[o].layout()
            sizes = (_axis_sizes(producer, mine), _axis_sizes(output, theirs))
            if o == stream_axis and mine == theirs and sizes[0] == sizes[1]:
                return
            if o == stream_axis and mine == theirs:  # one layout over meshes of other sizes
                raise LoweringError(
                    f"{name} is split into stream chunks on an axis laid out"
                    f" {_axes_text(mine)} over mesh axes of sizes {sizes[0]}, but"
                    f" {output.name}'s loop chunks it over sizes {sizes[1]}: their chunk j"
                    " holds different indices (fuzz seed 830156); give both the same mesh"
                    f" and stream splits, or reshard {name} with a set before the loop"
                )
            raise LoweringError(
                f"{name} is split into stream chunks on an axis laid out"
                f" {_axes_text(mine)}, but {output.name}'s loop chunks an axis laid out"
                f" {_axes_text(theirs) if o == stream_axis else 'differently'}: their chunk j"
                f" holds different indices; give both the same mesh and stream splits, or"
                f" reshard {name} with a set before the loop"
            )

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
                self._check_same_chunks(op, name, self.tensors[name], output, stream_axis)
        _check_repeated_operands(op)
        whole, rechunked = self._read_whole(op, chunks, stream_axis)
        return out + rechunked, whole

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
            fresh[op.output] = dataclasses.replace(target, name=self._fresh_chunk_name(target.name))
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
            return out + self._stream_allgather(op, values, preallocated)
        emitted = self.emitter.emit_op(op, values, preallocated)
        if self.swizzle is not None:  # its chunks differ between ranks in one iteration
            check_swizzled_communication(op, emitted, self.swizzle, self.swizzled, self.count)
        return out + emitted

    def _stream_allgather(
        self, op: LoweringOp, values: dict[str, TensorValue], preallocated: bool
    ) -> list[Instruction]:
        """A set that reads its input whole into stream chunks. The planner reshards the
        whole input into the whole output; when its plan is one Allgather of the loop's
        dim in blocks, with one team member per chunk, the loop takes that Allgather apart
        by sender: iteration ``j`` receives the block of team position ``j`` (a Broadcast
        from ``j``), or, swizzled, of position ``(p + j) % count`` (a CollectivePermute).
        Any other plan cannot be cut into chunks here: a LoweringError names it."""
        (name,) = op.inputs
        src, dst = self.emitter.values[name], self.emitter.values[op.output]
        split = self.split_of(op.output)
        steps = plan_resharding(src, dst).steps if src.sharding.mesh == dst.sharding.mesh else ()
        step = steps[0] if len(steps) == 1 else None
        gathers_dim = step is not None and step.kind is Allgather and step.get("axis") == split.dim
        if not gathers_dim or step.get("inner") is not None:  # inner: not in blocks
            planned = ", ".join(s.name for s in steps) or "steps between two meshes"
            raise LoweringError(
                f"{dst.name} is split into {split.count} stream chunks on dim {split.dim} and"
                f" reads {name} whole; a stream loop takes apart one Allgather of that dim"
                f" in blocks, but the planner reshards {name} into {dst.name} (dim"
                f" {split.dim}: {_print_parts(src.sharding.dims[split.dim])} to"
                f" {_print_parts(dst.sharding.dims[split.dim])}) with {planned}; reshard it"
                " with a set before the loop"
            )
        team = step.team
        self._check_allgather(name, op.output, team, split)
        instruction = bind_values(op.instruction, values)
        request = RequestValue(name=f"R{next(self.emitter.requests)}")
        common = {
            "out": instruction.out,
            "src": instruction.src,
            "team": team,
            "request": request,
            "preallocated": preallocated,
        }
        if split.swizzle is None:
            # The root holds the chunk this iteration writes: chunk j, or in a loop that
            # another tensor swizzles, (j + coordinate) % count, the same on the team's
            # members unless the team spans the swizzled axis (then refused).
            comm = Broadcast(**common, root=self.chunk)
            if self.swizzle is not None:
                check_swizzled_communication(op, [comm], self.swizzle, self.swizzled, self.count)
        else:
            me = MeshCoordinate(mesh=team.mesh, axis=split.swizzle)
            comm = CollectivePermute(
                **common,
                send_peer=mod(sub(me, self.index), self.count),
                recv_peer=mod(add(me, self.index), self.count),
            )
        return [comm, Wait(request=request)]

    def _check_allgather(self, src: str, dst: str, team: Team, split: StreamSplit) -> None:
        axes = "mesh axis " + " and ".join(a.value for a in team.axes)
        if team.size != split.count:
            raise LoweringError(
                f"{dst} gathers {src} over {split.count} stream chunks, but {src} is sharded"
                f" over {team.size} devices of {axes}; they must match"
            )
        if split.swizzle is not None and (split.swizzle,) != team.axes:
            raise LoweringError(
                f"{dst} is swizzled over mesh_{split.swizzle.value}, but {src} is sharded over"
                f" {' and '.join(f'mesh_{a.value}' for a in team.axes)}; swizzle1d must name"
                " the producer's mesh axis"
            )


def _check_repeated_operands(op: LoweringOp) -> None:
    """A tensor read as two operands in different roles (``linear(t0, t0)``: rows of the
    input, rows of the weight) cannot be read by one chunking in both: chunked (or not)
    for one role, it is read wrongly in the other (fuzz seeds 430076 and 300376 at 8
    ranks). Only an elementwise op's operands play one role (its declaration says it,
    ``OpSharding.elementwise``; of the ops not declared yet, ``Binary``'s)."""
    decl = op_decl(op.instruction)
    if decl.sharding.elementwise if decl is not None else isinstance(op.instruction, Binary):
        return
    for name in dict.fromkeys(op.inputs):
        if op.inputs.count(name) > 1:
            raise LoweringError(
                f"{name} is read as {op.inputs.count(name)} operands of the op defining"
                f" {op.output} in a stream loop: each operand needs its own chunks of {name};"
                f" pass a copy for one of them (fd.ops.set({name}))"
            )


def _axis_sizes(tensor: LoweringTensor, layout: tuple) -> tuple:
    """The size of each mesh axis of ``layout`` on ``tensor``'s mesh (chunk ``j`` of one
    layout holds the same indices on two meshes only where these agree)."""
    if tensor.mesh is None:
        return ()
    return tuple(tensor.mesh.axis_size(a) for a in layout if a is not None)


def _axes_text(axes: list) -> str:
    return "[" + ", ".join(a.value if a is not None else "local" for a in axes) + "]"


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


def _print_parts(parts: tuple[ShardPart, ...]) -> str:
    return "[" + ", ".join(p.axis.value if p.axis else print_scalar(p.extent) for p in parts) + "]"


def emit_stream_loop(
    emitter: Emitter, count: int, ops: list[LoweringOp], later: list[LoweringOp]
) -> list[Instruction]:
    """The instructions of one stream loop over ``ops`` (``later``: the ops after it)."""
    return _Loop(emitter, count, ops, later).emit()
