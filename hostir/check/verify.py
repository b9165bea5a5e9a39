"""``verify``: whether a host IR program is well formed, before anything runs it.

Checked in one pass over the program (linear in its size):

- every use sees a definition of the *same* value (name, dtype, extents,
  sharding; a JSON document can spell a use differently from its definition),
  no value is defined twice, and what a loop body defines stays in that body;
- nothing is used after its ``deallocate``, deallocated twice, or deallocated
  in a loop body that did not define it (the second iteration would free it
  again); outputs are never deallocated;
- each compute result's dtype and extents agree with its op and operands (its op's
  declaration, :mod:`hostir.check.verify_ops`; :mod:`hostir.check.verify_compute` for
  ``shard_by_stream``) and each communication's operands agree with
  what it does (:mod:`hostir.check.verify_communication`) and its team lies on the
  devices of the tensors it reads and writes (:mod:`hostir.check.verify_teams`); every
  sharding's parts multiply to its dim's extent (:mod:`hostir.check.verify_shardings`);
- every request is waited exactly once, in the body that posted it;
- every output is written on every path: an ``allocate``d output needs a write
  (``out=`` into it or a ``shard_by_stream`` alias of it) that certainly runs; a
  loop whose range is constant and empty runs nothing (a loop with a symbolic
  range counts as running here; whether it runs enough is checked when its
  symbols are bound, :mod:`hostir.check.extent_checks`);
- a collective in a swizzled loop sees the same chunk on every member of its
  team (:mod:`hostir.check.verify_chunks`; only point-to-point exchanges may pair
  different chunks);
- the program's requirements (``HostIrContainer.requires``) read only what its inputs
  bind, and no requirement's constants break it, carried or shown by an instruction
  (:mod:`hostir.ir.requirements`; the symbolic ones are checked when the inputs bind
  them, :mod:`hostir.check.value_rules`);
- every scalar is one the text can write (:func:`hostir.ir.scalars.scalar_problem`):
  at most ``MAX_SCALAR_DEPTH`` (100) operators deep, constants that print, symbols
  named like names; where an integer is meant (loop bounds, indices, roots, peers,
  extents) it is one, never a float or a bool that ``int()`` would truncate; every
  extent is a whole number >= 0 (:func:`hostir.ir.extents.extent_problem`) and a mesh
  axis part of a sharding has that axis's size;
- loops nest at most :data:`MAX_LOOP_DEPTH` (32) deep.

The limits keep every walk over a program (this one, which never recurses deeper
than them, the printer, the JSON codec, the evaluator) far from Python's recursion
limit: a deeper program is refused by name, never with a ``RecursionError``.

A failure is a :class:`~hostir.errors.VerifyError` whose ``path`` holds the
instruction's index in the body and in each enclosing loop body; ``parse`` turns
it into ``line:col``, ``from_json`` into the JSON path, and without a source the
message names the instruction (:mod:`hostir.check.verify_locations`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

from hostir.check.collector import collector_paused
from hostir.check.verify_chunks import check_chunk_uniformity
from hostir.check.verify_communication import COMMUNICATION_RULES
from hostir.check.verify_locations import Path, _describe_path, describe_location
from hostir.check.verify_ops import compute_problem
from hostir.check.verify_run_time import counts_problem
from hostir.check.verify_shardings import _check_sharding
from hostir.check.verify_teams import team_problem
from hostir.errors import VerifyError
from hostir.ir.catalog import is_instruction
from hostir.ir.communications import RaggedAllToAll, Wait
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import python_type
from hostir.ir.extents import extent_problem
from hostir.ir.fields import FieldKind, field_kinds
from hostir.ir.host_reads import ToHost
from hostir.ir.instructions import (
    Allocate,
    Deallocate,
    ForLoop,
    Instruction,
    PipelineStage,
    ShardByStream,
    defined_values,
    keyword,
    used_values,
)
from hostir.ir.mesh import Mesh
from hostir.ir.mesh_names import MeshNames, mesh_names
from hostir.ir.requirements import (
    explain,
    input_symbol_types,
    instruction_requirements,
    refuted,
    requirement_problem,
)
from hostir.ir.scalars import RANK, Const, Symbol, scalar_problem
from hostir.ir.values import RequestValue, TensorValue

MAX_LOOP_DEPTH = 32
"""How deep loops may nest (programs lowered from fusions nest two or three)."""


def verify(program: HostIrContainer) -> None:
    """Raises VerifyError (with ``path``) at the first thing that makes ``program``
    ill formed (see the module docstring)."""
    with collector_paused():
        walk = _Walk(program)
        walk.body(program.body, ())
        walk.finish()
        check_chunk_uniformity(program)  # collectives in swizzled loops see one chunk


def verify_located(program: HostIrContainer) -> None:
    """:func:`verify`, with the message naming the instruction at fault (for programs that
    come from no text: lowered, or built in Python)."""
    try:
        verify(program)
    except VerifyError as error:
        where = describe_location(program, error.path, error.field)
        raise VerifyError(f"{where}: {error.message}", path=error.path, field=error.field) from None


verify_program = verify_located
"""The name the lowering pipeline and the scripts use."""


@dataclass
class _Scope:
    """What one body (the program's or a loop's) defined, and the requests it posted."""

    defined: dict[str, None] = field(default_factory=dict)  # a dict: ordered, O(1) lookups
    posted: dict[str, Path] = field(default_factory=dict)


class _Walk:
    """The verifier's state while it walks the program once."""

    def __init__(self, program: HostIrContainer) -> None:
        self.program = program
        self.values: dict[str, object] = {}  # name -> the value its definition declared
        self.where: dict[str, Path] = {}  # name -> the path of its definition (inputs: ())
        self.freed: set[str] = set()
        self.waited: set[str] = set()
        self.outputs = {value.name for value in program.outputs}
        self.scalars: dict[str, type] = {}
        self.aliases: dict[str, str] = {}  # shard_by_stream out -> the buffer it aliases
        self.allocated: dict[str, Path] = {}  # allocated, not yet certainly written
        self.scopes: list[_Scope] = [_Scope()]
        self.runs: list[bool] = [True]  # does each enclosing body certainly run?
        self.meshes: MeshNames | None = None  # the text's mesh names, for messages
        for index, value in enumerate(program.inputs):
            if value.name in self.values:
                raise VerifyError(f"input {value.name} is declared twice", field=("inputs", index))
            self.values[value.name] = value
            self.where[value.name] = ()
            if isinstance(value, ScalarInput):
                problem = scalar_problem(Symbol(name=value.name))  # it is read as one
                if problem is not None:
                    raise VerifyError(f"input {value.name}: {problem}", field=("inputs", index))
                self.scalars[value.name] = python_type(value.dtype)
        for index, value in enumerate(program.inputs):  # once every scalar input's type is known
            if isinstance(value, TensorValue):
                with _declared_at("inputs", index):
                    self.check_tensor(value, ())
        bound = input_symbol_types(program.inputs)
        self.input_symbols = frozenset(bound)
        self.host_reads: dict[str, TensorValue] = {}  # host value -> the tensor it read
        for requirement in program.requires:
            problem = requirement_problem(requirement, bound)
            if problem is not None:
                raise VerifyError(problem, path=())  # the inputs: what they must bind

    # ----- bodies -----
    def body(self, body: Sequence[Instruction], prefix: Path) -> None:
        for index, instruction in enumerate(body):
            self.instruction(instruction, (*prefix, index))

    def instruction(self, instruction: Instruction, path: Path) -> None:
        if not is_instruction(instruction):
            name = type(instruction).__name__
            raise VerifyError(f"{name} is not a declared host IR instruction", path=path)
        self.check_scalars(instruction, path)
        if isinstance(instruction, Deallocate):
            self.deallocate(instruction.tensor, path)
        for value in used_values(instruction):
            self.use(value, instruction, path)
        if isinstance(instruction, Deallocate):
            self.freed.add(instruction.tensor.name)
        elif isinstance(instruction, Wait):
            self.wait(instruction.request, path)
        elif isinstance(instruction, ForLoop):
            self.loop(instruction, path)
        elif isinstance(instruction, PipelineStage) and (
            len(self.scopes) == 1 or instruction.depth < 1
        ):
            raise VerifyError(
                "pipeline_stage: expected inside a loop body, with depth >= 1"
                f" (got depth={instruction.depth}"
                + (", outside every loop)" if len(self.scopes) == 1 else ")"),
                path=path,
            )
        self.check_rules(instruction, path)
        self.note_writes(instruction)
        for value in defined_values(instruction):
            self.define(value, instruction, path)

    def loop(self, loop: ForLoop, path: Path) -> None:
        name = loop.index.name
        if name in self.scalars or name in self.values:
            raise VerifyError(f"loop index {name} is already bound", path=path)
        if len(self.scopes) > MAX_LOOP_DEPTH:
            raise VerifyError(f"loops nest deeper than {MAX_LOOP_DEPTH}", path=path)
        start, stop = _constant(loop.start), _constant(loop.stop)
        runs = start is None or stop is None or stop > start
        self.scalars[name] = int
        self.scopes.append(_Scope())
        self.runs.append(self.runs[-1] and runs)
        self.body(loop.body, path)
        scope = self.scopes.pop()
        self.runs.pop()
        del self.scalars[name]
        self.close(scope, path, f"the body of loop {name}")
        for defined in scope.defined:  # a body's values live one iteration
            if isinstance(self.values.pop(defined, None), Symbol):
                del self.scalars[defined]
            self.freed.discard(defined)

    def finish(self) -> None:
        self.close(self.scopes[0], None, "the program")
        for index, value in enumerate(self.program.outputs):
            with _declared_at("outputs", index):
                self.use(value, None, None, what=f"output {value.name}")
            if value.name in self.allocated:
                raise VerifyError(
                    f"output {value.name} is allocated but never certainly written: every"
                    " write to it is in a loop whose range is empty",
                    path=self.allocated[value.name],
                )

    def close(self, scope: _Scope, path: Path | None, what: str) -> None:
        """Every request ``scope`` posted was waited in it."""
        for request, posted in scope.posted.items():
            if request not in self.waited:
                raise VerifyError(f"request {request} is never waited in {what}", path=posted)

    # ----- values -----
    def define(self, value: object, instruction: Instruction, path: Path) -> None:
        name = value.name
        if name in self.values or name in self.scalars:
            raise VerifyError(
                f"{keyword(instruction)} defines {name} a second time (first at"
                f" {_describe_path(self.where.get(name, ()))})",
                path=path,
            )
        if isinstance(value, Symbol):  # a run-time extent, bound as the instruction runs
            if name in self.input_symbols or name == RANK:
                raise VerifyError(
                    f"{keyword(instruction)} binds {name}, which the inputs bind already",
                    path=path,
                )
            self.scalars[name] = int
        if isinstance(value, TensorValue):
            self.check_tensor(value, path)
        if isinstance(instruction, ToHost):
            self.host_reads[name] = instruction.src
        self.values[name] = value
        self.where[name] = path
        self.scopes[-1].defined[name] = None
        if isinstance(value, RequestValue):
            self.scopes[-1].posted[name] = path
        if isinstance(instruction, Allocate):
            self.allocated[name] = path
        if isinstance(instruction, ShardByStream):
            self.aliases[name] = self.aliases.get(instruction.src.name, instruction.src.name)

    def use(self, value: object, instruction: Instruction | None, path: Path | None, what=None):
        name = value.name
        what = what or f"{keyword(instruction)}"
        if name not in self.values:
            raise VerifyError(f"{what} uses {name} before it is defined", path=path)
        if name in self.freed:
            raise VerifyError(f"{what} uses {name} after its deallocate", path=path)
        declared = self.values[name]
        if declared != value:
            raise VerifyError(
                f"{what} uses {name} as a value other than the one defined at"
                f" {_describe_path(self.where[name])} (its type or sharding differ)",
                path=path,
            )

    def deallocate(self, value: TensorValue, path: Path) -> None:
        """Checks a deallocate before its operand is used (a second one reads as that)."""
        name = value.name
        if name in self.outputs:
            raise VerifyError(f"deallocate {name}: {name} is an output of the program", path=path)
        if name in self.freed:
            raise VerifyError(f"deallocate {name}: {name} is deallocated twice", path=path)
        if name not in self.scopes[-1].defined and len(self.scopes) > 1:
            raise VerifyError(
                f"deallocate {name}: a loop body deallocates {name}, which it did not define"
                " (the next iteration would deallocate it again)",
                path=path,
            )

    def wait(self, request: RequestValue, path: Path) -> None:
        name = request.name
        if name in self.waited:
            raise VerifyError(f"wait {name}: {name} is waited twice", path=path)
        if name not in self.scopes[-1].posted:
            raise VerifyError(
                f"wait {name}: {name} was posted outside this loop body; it would be waited"
                " in every iteration",
                path=path,
            )
        self.waited.add(name)

    def note_writes(self, instruction: Instruction) -> None:
        """An ``out=`` write into an allocated buffer (or an alias of one) that certainly
        runs makes the buffer written."""
        if not getattr(instruction, "preallocated", False) or not self.runs[-1]:
            return
        target = instruction.out.name
        self.allocated.pop(self.aliases.get(target, target), None)

    # ----- scalars and extents -----
    def check_scalars(self, instruction: Instruction, path: Path) -> None:
        """Every scalar field of ``instruction`` is a scalar the text can write; an integer
        where one is meant (every field of kind SCALAR, a stream's index)."""
        for name, kind in _scalar_fields(type(instruction)):
            value = getattr(instruction, name)
            if value is None or isinstance(value, TensorValue):
                continue
            if kind is FieldKind.STREAM:
                name, value = f"{name}'s index", getattr(value, "index", None)
                if value is None:
                    continue
            problem = scalar_problem(
                value, integer=kind is not FieldKind.OPERAND, types=self.scalars
            )
            if problem is not None:
                raise VerifyError(f"{keyword(instruction)}: {name}: {problem}", path=path)

    def check_tensor(self, value: TensorValue, path: Path) -> None:
        """Each extent of ``value`` (shape and sharding parts) is a whole number >= 0 over
        integer symbols, and its sharding fits its shape."""
        extents = [(f"dim {dim}", extent) for dim, extent in enumerate(value.shape)]
        if value.sharding is not None:
            extents += [
                (f"dim {dim}'s sharding", part.extent)
                for dim, parts in enumerate(value.sharding.dims)
                for part in parts
            ]
        for where, extent in extents:
            if type(extent) is Const and type(extent.value) is int and extent.value >= 0:
                continue  # the common case, without the general walk
            problem = extent_problem(extent) or scalar_problem(
                extent, integer=True, types=self.scalars
            )
            if problem is not None:
                raise VerifyError(f"{value.name} {where}: {problem}", path=path)
        _check_sharding(value, path)

    # ----- rules -----
    def mesh_name(self, mesh: Mesh) -> str:
        """``M0``: the name the program's text gives ``mesh`` (found on the first failure)."""
        if self.meshes is None:
            self.meshes = mesh_names(self.program)
        return self.meshes.name(mesh)

    def check_rules(self, instruction: Instruction, path: Path) -> None:
        for requirement in instruction_requirements(instruction):
            if refuted(requirement):  # its constants break it; symbols: when bound
                raise VerifyError(explain(requirement, {}), path=path)
        problem = compute_problem(instruction, self.scalars)  # hostir.check.verify_ops
        rule = COMMUNICATION_RULES.get(type(instruction))
        if rule is not None and problem is None:
            problem = rule(instruction)
        if problem is None and isinstance(instruction, RaggedAllToAll):
            problem = counts_problem(instruction, self.host_reads[instruction.counts.name])
        if problem is None:  # any instruction with a team, those declared elsewhere too
            problem = team_problem(instruction, self.mesh_name)
        if problem is not None:
            raise VerifyError(f"{keyword(instruction)}: {problem}", path=path)


@contextmanager
def _declared_at(kind: str, index: int) -> Iterator[None]:
    """Gives a VerifyError raised in the check of the declaration ``program.<kind>[index]``
    (an input or an output: no instruction, so no path names it) that declaration as its
    ``field``, so that text, JSON and words point at it and not at the program's end."""
    try:
        yield
    except VerifyError as error:
        raise VerifyError(error.message, field=(kind, index)) from None


@cache
def _scalar_fields(cls: type) -> tuple[tuple[str, FieldKind], ...]:
    """The fields of ``cls`` that hold scalars: SCALAR (integers), OPERAND (a tensor or
    any scalar) and STREAM (whose index is an integer)."""
    wanted = (FieldKind.SCALAR, FieldKind.OPERAND, FieldKind.STREAM)
    return tuple(
        (name, kind)
        for name, (kind, _, _) in field_kinds(cls).items()
        if kind in wanted and name not in cls.OUTS  # a symbol it defines is not read
    )


def _constant(scalar: object) -> int | None:
    return scalar.value if isinstance(scalar, Const) and isinstance(scalar.value, int) else None
