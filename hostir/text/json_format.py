"""The JSON form of a program: ``container.to_json()`` and ``HostIrContainer.from_json(text)``.

A document is one object with three keys, in this order::

    {"format": "hostir", "version": 2, "program": <node>}

Version 2 writes values as follows (version 1, still read, differed only in its
meshes: a device list and a shape, where version 2 writes a layout or a table):

- A **node** (every IR dataclass: the container and its scalar inputs, tensor,
  stream and request values, scalars, meshes, shardings, teams, and every class
  in ``INSTRUCTIONS``) is an object whose first key ``"node"`` names its class,
  followed by *every* dataclass field in declaration order, defaults included::

      {"node": "Wait", "request": {"node": "RequestValue", "name": "R0"}}

  The one exception: the container's ``requires`` (``hostir.ir.requirements``) is
  written only when it holds a requirement, and read as empty when absent, so a
  program without one writes and reads as before it existed (``ADDED_FIELDS``).

- An **enum** member is ``{"enum": "<enum class>", "value": <its .value>}``, e.g.
  ``{"enum": "DType", "value": "float32"}``.
- A **tuple** is a list (read back as a tuple); ``None`` is ``null``; bools, ints
  (of any size up to 4300 digits), finite floats and strings are JSON's own.
  Python's ``json`` keeps ``true``, ``1`` and ``1.0`` apart, so a ``Const`` comes
  back with the type it had, ``-0.0`` included.
- A **non-finite float**, which standard JSON cannot write (Python's ``json``
  would write the non-standard bare ``NaN`` and ``Infinity``), is the object
  ``{"float": "inf"}``, ``{"float": "-inf"}`` or ``{"float": "nan"}``. Every
  document is standard JSON: the writer refuses to write bare ``NaN``/``Infinity``
  and the reader refuses them, and refuses a number that does not fit a float64
  (``1e400``) rather than reading it as infinity.

The text is deterministic: keys in the order above (never sorted) and
``indent=1``, so documents diff line by line.

Reading is strict. :func:`from_json` refuses, as :class:`JsonFormatError` (a
``VerifyError``) naming the JSON path of the problem (``program.body[3].team.mesh``):
text that is not JSON, a ``format`` other than ``"hostir"``, a version it does
not read (naming the version found and those supported), an unknown ``node`` or
``enum`` tag, a missing or an unexpected field, a value of the wrong type for
its field (checked against the dataclass annotations), and a node its own
constructor rejects (a mesh with repeated devices), an extent that is not a whole
number >= 0 (naming the tensor and the dim), and what :mod:`hostir.text.json_text` refuses
as text: anything but standard JSON text or bytes, numbers a program cannot hold, and
a document nested deeper than the verifier's limits need (``MAX_JSON_DEPTH``).

Why not dataclasses-json all the way down: it decodes a field by its annotation,
and most IR fields are unions of several dataclasses (``Scalar``, an operand,
``ForLoop.body``'s instructions); it cannot tell their members apart, and the
IR classes must not grow a mixin (nodes hold data only, serializers live
outside). So the nodes go through the small tagged encoder and decoder below,
driven by explicit registries, while dataclasses-json carries the envelope:
:class:`JsonDocument` is a ``DataClassJsonMixin`` that writes the document,
refuses unknown top-level keys (``Undefined.RAISE``), and hands its ``program``
field to the tagged codec through ``dataclasses_json.config``.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from dataclasses_json import DataClassJsonMixin, Undefined, config
from dataclasses_json.undefined import UndefinedParameterError

from hostir.check.verify import verify
from hostir.errors import HostIrError, JsonFormatError, VerifyError
from hostir.ir.catalog import instruction_classes
from hostir.ir.container import HostIrContainer, ScalarInput
from hostir.ir.dtypes import DType
from hostir.ir.extents import extent_problem
from hostir.ir.fields import FieldKind, field_kinds
from hostir.ir.instructions import INSTRUCTIONS, BinaryOpKind, UnaryOpKind
from hostir.ir.mesh import Mesh, MeshAxis
from hostir.ir.requirements import Requirement
from hostir.ir.scalars import (
    BinaryExpr,
    Const,
    MeshCoordinate,
    ScalarOp,
    Symbol,
)
from hostir.ir.sharding import PartialAxis, ReduceOp, Sharding, ShardPart
from hostir.ir.team import Team
from hostir.ir.values import HostValue, RequestValue, StreamValue, TensorValue
from hostir.text.json_text import load
from hostir.text.json_types import PRIMITIVES, describe_json, describe_value, fields_of, mismatch

FORMAT = "hostir"
"""The ``format`` every document carries."""

VERSION = 2
"""The version :func:`to_json` writes."""

SUPPORTED_VERSIONS = (1, 2)
"""The versions :func:`from_json` reads."""

_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}

ADDED_FIELDS: dict[type, tuple[str, ...]] = {HostIrContainer: ("requires",)}
"""Fields added to version 2 after it was first written: left out when empty (their
default), and read as empty when absent."""

VALUE_CLASSES: tuple[type, ...] = (
    HostIrContainer,
    Requirement,
    ScalarInput,
    TensorValue,
    StreamValue,
    RequestValue,
    HostValue,
    Const,
    Symbol,
    MeshCoordinate,
    BinaryExpr,
    Mesh,
    ShardPart,
    PartialAxis,
    Sharding,
    Team,
)
"""Every dataclass a program holds besides its instructions; a node's JSON tag is its class
name, for instructions too (every class of ``hostir.ir.catalog.instruction_classes()``)."""

NODE_CLASSES: tuple[type, ...] = (*VALUE_CLASSES, *INSTRUCTIONS)
"""The value classes and the built-in instructions."""

ENUM_CLASSES: tuple[type[enum.Enum], ...] = (
    DType,
    MeshAxis,
    ScalarOp,
    ReduceOp,
    UnaryOpKind,
    BinaryOpKind,
)
"""Every enum a program holds; its JSON tag is its class name."""


def _by_name(classes: tuple[type, ...]) -> dict[str, type]:
    table = {cls.__name__: cls for cls in classes}
    if len(table) != len(classes):
        raise TypeError(f"two JSON tags share a class name in {[c.__name__ for c in classes]}")
    return table


NODES: dict[str, type] = _by_name(NODE_CLASSES)
ENUMS: dict[str, type[enum.Enum]] = _by_name(ENUM_CLASSES)


def node_class(tag: str) -> type | None:
    """The class a node tag names: a value class, or any declared instruction class."""
    found = NODES.get(tag)
    if found is not None:
        return found
    return next((cls for cls in instruction_classes() if cls.__name__ == tag), None)


def enum_class(tag: str) -> type[enum.Enum] | None:
    """The enum an enum tag names: one of ENUM_CLASSES, or one a declared instruction's
    fields use."""
    found = ENUMS.get(tag)
    if found is not None:
        return found
    for cls in instruction_classes():
        for kind, member_class, _ in field_kinds(cls).values():
            if kind is FieldKind.ENUM and member_class.__name__ == tag:
                return member_class
    return None


# ----- writing -----


def to_json(program: HostIrContainer) -> str:
    """The JSON document of ``program`` (see the module docstring)."""
    if not isinstance(program, HostIrContainer):
        raise JsonFormatError(f"to_json: expected a HostIrContainer, got {type(program).__name__}")
    return JsonDocument(program=program).to_json(indent=1, allow_nan=False)


def encode(value: Any, path: str = "program") -> Any:
    """``value`` as JSON-ready data: tagged objects, lists and primitives."""
    if isinstance(value, enum.Enum):
        if enum_class(type(value).__name__) is not type(value):
            raise JsonFormatError(f"{path}: {value!r} is not a host IR enum")
        return {"enum": type(value).__name__, "value": value.value}
    if type(value) is float and not math.isfinite(value):
        return {"float": "nan" if math.isnan(value) else repr(value)}
    if value is None or type(value) in PRIMITIVES:
        return value
    if isinstance(value, tuple):
        return [encode(item, f"{path}[{i}]") for i, item in enumerate(value)]
    cls = type(value)
    if node_class(cls.__name__) is not cls:
        raise JsonFormatError(f"{path}: {cls.__name__} {value!r} is not a host IR node")
    obj: dict[str, Any] = {"node": cls.__name__}
    added = ADDED_FIELDS.get(cls, ())
    for name, _ in fields_of(cls):
        if name in added and not getattr(value, name):
            continue
        obj[name] = encode(getattr(value, name), f"{path}.{name}")
    return obj


# ----- reading -----


def from_json(text: str | bytes) -> HostIrContainer:
    """The program of a JSON document, verified (``hostir.check.verify``); raises JsonFormatError
    naming what is wrong and where (the JSON path of the node, or of the instruction the
    verifier refuses)."""
    program = read_document(text)
    try:
        verify(program)
    except VerifyError as error:
        raise JsonFormatError(
            f"{json_path(error)}: {error.message}", path=error.path, field=error.field
        ) from None
    return program


def json_path(error: VerifyError) -> str:
    """The JSON path of what a verifier error points at: ``program.inputs[1]`` for a
    declaration, ``program.body[3].body[0]`` for an instruction."""
    if error.field is not None:
        kind, index = error.field
        return f"program.{kind}[{index}]"
    return "program" + "".join(f".body[{index}]" for index in error.path or ())


def read_document(text: str | bytes) -> HostIrContainer:
    """The program of a JSON document as written, *not* verified: the codec alone, for
    tools that inspect documents that need not run (``from_json`` verifies)."""
    data = load(text)
    if not isinstance(data, dict):
        raise JsonFormatError(
            "not a host IR JSON document: expected an object with format, version and program,"
            f" got {describe_json(data)}"
        )
    _check_envelope(data)
    if data["version"] == 1:
        data = {**data, "program": _meshes_from_version_1(data["program"])}
    try:
        return JsonDocument.from_dict(data).program
    except UndefinedParameterError:
        known = [f.name for f in fields(JsonDocument)]
        extra = ", ".join(repr(k) for k in data if k not in known)
        raise JsonFormatError(
            f"unexpected top-level key(s) {extra}; a document has {', '.join(known)}"
        ) from None


def _meshes_from_version_1(data: Any) -> Any:
    """Version 1 wrote a mesh as its device list and shape; version 2 as a layout (shape,
    strides, offset) or, for irregular meshes, a device table. Reads the first as the
    second (the mesh finds its layout from its devices)."""
    if isinstance(data, list):
        return [_meshes_from_version_1(item) for item in data]
    if not isinstance(data, dict):
        return data
    if data.get("node") == "Mesh" and "devices" in data:
        rest = {k: v for k, v in data.items() if k not in ("node", "devices", "shape")}
        return {
            "node": "Mesh",
            "shape": data.get("shape"),
            "strides": [],
            "offset": 0,
            "table": data["devices"],
            **rest,
        }
    return {key: _meshes_from_version_1(value) for key, value in data.items()}


def decode(data: Any, path: str = "program") -> Any:
    """The IR value of JSON-ready ``data`` (the inverse of :func:`encode`)."""
    if isinstance(data, list):
        return tuple(decode(item, f"{path}[{i}]") for i, item in enumerate(data))
    if isinstance(data, dict):
        if "node" in data:
            return _decode_node(data, path)
        if "enum" in data:
            return _decode_enum(data, path)
        if "float" in data:
            return _decode_float(data, path)
        keys = ", ".join(repr(k) for k in data)
        raise JsonFormatError(
            f'{path}: an object needs a "node", an "enum" or a "float" tag, got keys {keys}'
        )
    return data


def _decode_float(data: dict[str, Any], path: str) -> float:
    if set(data) != {"float"} or data["float"] not in _NON_FINITE:
        raise JsonFormatError(
            f'{path}: a non-finite float is {{"float": "inf"}}, {{"float": "-inf"}} or'
            f' {{"float": "nan"}}, got {json.dumps(data)[:80]}'
        )
    return _NON_FINITE[data["float"]]


def _check_envelope(data: dict[str, Any]) -> None:
    if data.get("format") != FORMAT:
        found = json.dumps(data["format"]) if "format" in data else "no format"
        raise JsonFormatError(f'format: expected "{FORMAT}", got {found}')
    supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
    if "version" not in data:
        raise JsonFormatError(f"version: missing; this hostir reads version {supported}")
    version = data["version"]
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise JsonFormatError(
            f"version: unsupported host IR JSON version {json.dumps(version)};"
            f" this hostir reads version {supported}"
        )
    if "program" not in data:
        raise JsonFormatError("program: missing")


def _decode_program(data: Any) -> HostIrContainer:
    program = decode(data, "program")
    if not isinstance(program, HostIrContainer):
        raise JsonFormatError(f"program: expected HostIrContainer, got {describe_value(program)}")
    return program


def _decode_node(data: dict[str, Any], path: str) -> Any:
    tag = data["node"]
    cls = node_class(tag) if isinstance(tag, str) else None
    if cls is None:
        raise JsonFormatError(
            f"{path}: unknown node tag {json.dumps(tag)}; known tags: {', '.join(NODES)}"
        )
    declared = fields_of(cls)
    names = [name for name, _ in declared]
    added = ADDED_FIELDS.get(cls, ())
    missing = [name for name in names if name not in data and name not in added]
    if missing:
        raise JsonFormatError(f"{path}: {tag} lacks field(s) {', '.join(missing)}")
    extra = [key for key in data if key != "node" and key not in names]
    if extra:
        raise JsonFormatError(
            f"{path}: {tag} has no field(s) {', '.join(extra)}; its fields are {', '.join(names)}"
        )
    kwargs = {}
    for name, hint in declared:
        if name not in data:
            continue  # an added field, absent: its default
        value = decode(data[name], f"{path}.{name}")
        problem = mismatch(value, hint, f"{path}.{name}")
        if problem is not None:
            raise JsonFormatError(problem)
        kwargs[name] = value
    try:
        node = cls(**kwargs)
    except HostIrError as error:  # its own checks (a mesh's devices, a team's axes)
        raise JsonFormatError(f"{path}: {error}") from None
    if cls is TensorValue:
        _check_extents(node, path)
    return node


def _check_extents(value: TensorValue, path: str) -> None:
    """Every extent of ``value``, in its shape and its sharding's parts, is a whole number
    >= 0 (``hostir.ir.extents.extent_problem``)."""
    found = [(f"{path}.shape[{d}]", f"dim {d}", e) for d, e in enumerate(value.shape)]
    for d, parts in enumerate(value.sharding.dims if value.sharding is not None else ()):
        for k, part in enumerate(parts):
            where = f"{path}.sharding.dims[{d}][{k}].extent"
            found.append((where, f"dim {d}'s sharding", part.extent))
    for where, dim, extent in found:
        problem = extent_problem(extent)
        if problem is not None:
            raise JsonFormatError(f"{where}: {value.name} {dim}: {problem}")


def _decode_enum(data: dict[str, Any], path: str) -> enum.Enum:
    tag = data["enum"]
    cls = enum_class(tag) if isinstance(tag, str) else None
    if cls is None:
        raise JsonFormatError(
            f"{path}: unknown enum tag {json.dumps(tag)}; known tags: {', '.join(ENUMS)}"
        )
    if set(data) != {"enum", "value"}:
        keys = ", ".join(repr(k) for k in data)
        raise JsonFormatError(f'{path}: an enum object has keys "enum" and "value", got {keys}')
    try:
        return cls(data["value"])
    except ValueError:
        choices = ", ".join(json.dumps(member.value) for member in cls)
        raise JsonFormatError(
            f"{path}: {json.dumps(data['value'])} is not a {tag}; expected one of {choices}"
        ) from None


# ----- the envelope -----


@dataclass(frozen=True, kw_only=True)
class JsonDocument(DataClassJsonMixin):
    """The top-level object: ``format``, ``version`` and the ``program`` node."""

    dataclass_json_config = config(undefined=Undefined.RAISE)["dataclasses_json"]

    format: str = FORMAT
    version: int = VERSION
    program: HostIrContainer = field(metadata=config(encoder=encode, decoder=_decode_program))
