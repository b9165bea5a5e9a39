"""The instruction catalog: every instruction class, declared once.

An instruction class is a frozen dataclass of typed fields (data only) that says
which fields it defines and reads (``OUTS``, ``INS``). Registering it with
:func:`declare` gives it the rest from that one declaration:

- its **keyword** (``Allgather``, ``linear``; for classes with an ``op`` enum
  field, such as ``Unary``, one keyword per member: ``relu``, ``neg``);
- its **text syntax**: which fields are written positionally; every other field
  is written ``name=value`` in field order (``None`` left out), the defined
  tensor is declared on the left of ``=`` (or written ``out=NAME`` when
  ``preallocated``), a request or stream it defines is named there too. The
  printer and parser read fields by their annotated types, so a new class needs
  no printing or parsing code (``hostir.text.syntax``);
- its **kind**, which says how pictures draw it and which other tables must
  know it (a communication has an exchange, see ``hostir.analysis.exchanges``);
- its place in :func:`instruction_classes`, which the JSON codec, the
  evaluator's completeness check and the tests read.

A class registered from outside the package (docs/extending.md) is a host IR
instruction like the others.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol


class Kind(enum.Enum):
    """What an instruction does, as far as pictures and completeness tables care."""

    COMPUTE = "compute"  # a torch op on local data
    COLLECTIVE = "collective"  # communication over a team's groups
    POINT_TO_POINT = "point-to-point"  # pairs of members (send/recv, permute)
    LOCAL_RESHARD = "local reshard"  # a local slice that reshards (no communication)
    MEMORY = "memory"  # buffers and views: allocate, deallocate, shard_by_stream
    STREAM = "stream"  # which stream runs, and ordering between streams
    CONTROL = "control"  # loops and waits
    HOST_SYNC = "host sync"  # a device-to-host read of values (run-time extents)


class Instruction(Protocol):
    """What every instruction class is: a frozen dataclass with ``OUTS`` (the fields it
    defines) and ``INS`` (the fields it reads), declared with :func:`declare`."""

    OUTS: ClassVar[tuple[str, ...]]
    INS: ClassVar[tuple[str, ...]]


def is_instruction(value: object) -> bool:
    """Whether ``value`` is an instance of a declared instruction class."""
    return type(value) in _DECLARATIONS


COMMUNICATING = frozenset({Kind.COLLECTIVE, Kind.POINT_TO_POINT})
"""Kinds that move data between ranks (each has an exchange and defines a request)."""


@dataclass(frozen=True)
class Declaration:
    """What :func:`declare` recorded about one instruction class."""

    cls: type
    keyword: str | None
    positional: tuple[str, ...]
    kind: Kind
    op_field: str | None = None  # the enum field whose member names the instruction

    def keywords(self) -> dict[str, dict[str, Any]]:
        """Every keyword of the class, with the fields it fixes (``relu`` -> op=RELU)."""
        if self.op_field is None:
            return {self.keyword: {}}
        hint = _field_type(self.cls, self.op_field)
        return {member.value: {self.op_field: member} for member in hint}


_DECLARATIONS: dict[type, Declaration] = {}
_BY_KEYWORD: dict[str, tuple[Declaration, dict[str, Any]]] = {}


def declare(
    *,
    kind: Kind,
    keyword: str | None = None,
    positional: tuple[str, ...] = (),
    op_field: str | None = None,
) -> Callable[[type], type]:
    """Registers an instruction class (a class decorator, see the module docstring).

    ``keyword`` names it in text (default: the class name); with ``op_field``, the
    members of that enum field name it instead. ``positional`` fields are written
    first, without their names.
    """

    def register(cls: type) -> type:
        names = {f.name for f in fields(cls)}
        missing = [f for f in (*positional, *cls.OUTS, *cls.INS) if f not in names]
        if missing:
            raise TypeError(f"{cls.__name__} declares unknown fields {missing}")
        declaration = Declaration(
            cls=cls,
            keyword=None if op_field else (keyword or cls.__name__),
            positional=positional,
            kind=kind,
            op_field=op_field,
        )
        for word, fixed in declaration.keywords().items():
            other = _BY_KEYWORD.get(word)
            if other is not None and other[0].cls.__qualname__ != cls.__qualname__:
                raise TypeError(f"keyword {word!r} names both {other[0].cls} and {cls}")
            _BY_KEYWORD[word] = (declaration, fixed)
        stale = [c for c in _DECLARATIONS if c.__qualname__ == cls.__qualname__]
        for old in stale:  # a class declared again (a module re-run) replaces the old one
            if old.__module__ == cls.__module__:
                del _DECLARATIONS[old]
        _DECLARATIONS[cls] = declaration
        return cls

    return register


def declaration_of(cls: type) -> Declaration:
    """The declaration of an instruction class; TypeError for a class never declared."""
    try:
        return _DECLARATIONS[cls]
    except KeyError:
        raise TypeError(f"{cls.__name__} is not a declared host IR instruction") from None


def kind_of(cls: type) -> Kind | None:
    """The kind of a declared class; None for a class never declared."""
    declaration = _DECLARATIONS.get(cls)
    return declaration.kind if declaration is not None else None


def by_keyword(word: str) -> tuple[Declaration, dict[str, Any]] | None:
    """The declaration a keyword names, and the fields it fixes; None if unknown."""
    return _BY_KEYWORD.get(word)


def instruction_classes() -> tuple[type, ...]:
    """Every declared instruction class, in the order they were declared."""
    return tuple(_DECLARATIONS)


def classes_of_kind(*kinds: Kind) -> frozenset[type]:
    """The declared classes of any of ``kinds``."""
    return frozenset(cls for cls, d in _DECLARATIONS.items() if d.kind in kinds)


def keyword(instruction: Any) -> str:
    """The instruction's keyword in text and profiler ranges (``hir::<keyword>``)."""
    declaration = declaration_of(type(instruction))
    if declaration.op_field is not None:
        return getattr(instruction, declaration.op_field).value
    return declaration.keyword


def _field_type(cls: type, name: str) -> Any:
    from typing import get_type_hints

    return get_type_hints(cls)[name]
