"""The host IR instruction catalog.

Instructions hold data only. Each class states once which fields it defines
(``OUTS``) and which it reads (``INS``); generic def/use walks read those.
Printing, evaluating and verifying live in tables keyed by class elsewhere.

A compute instruction normally *defines* its ``out``. With ``preallocated``
set, ``out`` was created before (by ``Allocate`` or ``ShardByStream``) and the
compute writes into it (torch's ``out=``): then ``out`` is read, not defined.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from hostir.ir.catalog import Instruction, Kind, classes_of_kind, declare, instruction_classes
from hostir.ir.catalog import keyword as keyword
from hostir.ir.contraction import Linear as Linear
from hostir.ir.contraction import Matmul as Matmul
from hostir.ir.fields import SCALAR_TYPES, FieldKind, defined_fields, field_kinds, written_fields_of
from hostir.ir.layout_ops import BroadcastInDim as BroadcastInDim
from hostir.ir.layout_ops import Cast as Cast
from hostir.ir.layout_ops import Permute as Permute
from hostir.ir.layout_ops import Set as Set
from hostir.ir.ops import BinaryOpKind as BinaryOpKind
from hostir.ir.ops import TernaryOpKind as TernaryOpKind
from hostir.ir.ops import UnaryOpKind as UnaryOpKind
from hostir.ir.pointwise import Binary as Binary
from hostir.ir.pointwise import Operand as Operand
from hostir.ir.pointwise import Ternary as Ternary
from hostir.ir.pointwise import Unary as Unary
from hostir.ir.reductions import Reduction as Reduction
from hostir.ir.reductions import ReductionOpKind as ReductionOpKind
from hostir.ir.scalars import Scalar, Symbol, symbols_of
from hostir.ir.values import HostValue, RequestValue, TensorValue, value_symbols

# The op enums (UnaryOpKind, ...) are generated from the pointwise op declarations
# (hostir.ir.ops) and re-exported here with the declared ops' instructions (declared,
# with their ops, in hostir.ir.pointwise, hostir.ir.reductions, hostir.ir.layout_ops
# and hostir.ir.contraction).


@declare(kind=Kind.MEMORY, keyword="allocate")
@dataclass(frozen=True, slots=True, kw_only=True)
class Allocate:
    """Create an uninitialised local buffer for ``out`` (its local shard shape)."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ()
    out: TensorValue


@declare(kind=Kind.MEMORY, keyword="deallocate")
@dataclass(frozen=True, slots=True, kw_only=True)
class Deallocate:
    """Release the buffer bound to ``tensor``; later uses are errors."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ("tensor",)
    tensor: TensorValue


@declare(kind=Kind.MEMORY, keyword="shard_by_stream", positional=("src",))
@dataclass(frozen=True, slots=True, kw_only=True)
class ShardByStream:
    """``out`` aliases chunk ``index`` of ``src`` split evenly along ``axis``."""

    OUTS: ClassVar[tuple[str, ...]] = ("out",)
    INS: ClassVar[tuple[str, ...]] = ("src", "index")
    out: TensorValue
    src: TensorValue
    axis: int
    index: Scalar


@declare(kind=Kind.CONTROL, keyword="for")
@dataclass(frozen=True, slots=True, kw_only=True)
class ForLoop:
    """Run ``body`` with ``index`` bound to ``start, start+1, ..., stop-1``."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ("start", "stop")
    index: Symbol
    start: Scalar
    stop: Scalar
    body: tuple[Instruction, ...]


@declare(kind=Kind.CONTROL, keyword="pipeline_stage")
@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineStage:
    """Ends a stage of the enclosing loop's body and starts the next, which runs ``depth``
    iterations behind: the loop is software-pipelined (see :mod:`hostir.run.pipelined_loops`).
    Typically the first stage computes a chunk and posts its communication, the next
    waits for it and uses it, so a chunk's communication runs while the next chunk is
    computed."""

    OUTS: ClassVar[tuple[str, ...]] = ()
    INS: ClassVar[tuple[str, ...]] = ()
    depth: int = 1


# The communication, stream and attention instructions live in their own modules; importing them
# here declares them, so that importing this module gives the whole built-in catalog.
import hostir.ir.attention  # noqa: E402, F401
import hostir.ir.communications  # noqa: E402, F401 - after the local classes on purpose
import hostir.ir.creation  # noqa: E402, F401
import hostir.ir.host_reads  # noqa: E402, F401
import hostir.ir.indexing  # noqa: E402, F401
import hostir.ir.scatter_ops  # noqa: E402, F401
import hostir.ir.shape_ops  # noqa: E402, F401
import hostir.ir.streams  # noqa: E402, F401

COMPUTE = classes_of_kind(Kind.COMPUTE)
"""Instructions that run a torch op and may write into a preallocated ``out``."""

INSTRUCTIONS: tuple[type, ...] = instruction_classes()
"""The built-in catalog (``hostir.ir.catalog.instruction_classes()`` also lists classes
declared later, from outside the package)."""


def defined_values(instruction: Instruction) -> list[TensorValue | RequestValue]:
    """The values ``instruction`` defines (not counting loop bodies)."""
    return [getattr(instruction, name) for name in defined_fields(instruction)]


def used_values(instruction: Instruction) -> list[TensorValue | RequestValue | HostValue]:
    """The tensors, requests and host values ``instruction`` reads or writes without
    defining them."""
    names = list(instruction.INS) + written_fields_of(instruction)
    used = [getattr(instruction, name) for name in names]
    return [v for v in used if isinstance(v, TensorValue | RequestValue | HostValue)]


def defined_symbols(instruction: Instruction) -> list[str]:
    """The symbols ``instruction`` binds when it runs (run-time extents, such as
    ``RaggedAllToAll``'s ``received``); a loop's index is not one of them."""
    return [v.name for v in defined_values(instruction) if isinstance(v, Symbol)]


def read_symbols(instruction: Instruction) -> set[str]:
    """The symbols ``instruction`` reads: those of its scalar fields (a stream's index, the
    scalars of a tuple such as a shape included) and of its tensors' extents; a loop's
    bounds, not its index or body."""
    if isinstance(instruction, ForLoop):
        return symbols_of(instruction.start) | symbols_of(instruction.stop)
    names: set[str] = set()
    for name, (kind, _, _) in field_kinds(type(instruction)).items():
        value = getattr(instruction, name)
        if kind is FieldKind.STREAM:
            value = getattr(value, "index", None)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, TensorValue):
                names |= value_symbols(item)
            elif type(item) in SCALAR_TYPES:
                names |= symbols_of(item)
    return names.difference(defined_symbols(instruction))


def field_names(cls: type) -> list[str]:
    """The dataclass field names of an instruction class, in order."""
    return [f.name for f in fields(cls)]
