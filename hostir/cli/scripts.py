"""Programs from files, for the command line: host IR text, or a Python script.

A file whose name ends in ``.py`` is a SCRIPT: it defines a module-level
function ``fusion(world_size)`` that returns a scheduled, finished
``frontend.FusionDefinition`` (or a ``HostIrContainer``). The script is
imported under a name other than ``__main__``, so the job under its ``if
__name__ == "__main__":`` does not run; ``fusion`` is called and the result is
lowered with ``host_ir(world_size=...)``, which needs no running ranks. Any
other file is host IR text, read with :func:`hostir.parse`. See docs/cli.md.

This module imports neither ``frontend`` nor ``lowering``: a script imports
what it needs, and the definition it returns is used through its ``host_ir``
method.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from hostir.errors import HostIrError
from hostir.ir.container import HostIrContainer
from hostir.ir.instructions import ForLoop, Instruction
from hostir.ir.program_info import check_meshes_fit
from hostir.text.parser import parse

DEFAULT_WORLD_SIZE = 2
"""The world size a script's ``fusion`` gets when neither the command line nor the
function's own default for ``world_size`` gives one: the smallest with communication."""

SCRIPT_FUNCTION = "fusion"
"""The function a script defines: ``fusion(world_size: int) -> FusionDefinition``."""

MODULE_NAME = "__hostir_script__"
"""The module name a script is imported under (not ``__main__``)."""


class ScriptError(HostIrError):
    """A script does not follow the convention, or raised while it was imported or called."""


def is_script(path: str) -> bool:
    """Whether ``path`` names a Python script (``.py``) rather than host IR text."""
    return path.endswith(".py")


def load_program(path: str, world_size: int | None = None) -> HostIrContainer:
    """The program of a script or of a host IR file; with ``world_size``, checks it fits
    a world of that many ranks (and passes it to a script's ``fusion``)."""
    if is_script(path):
        return load_script(path, world_size)
    program = load_hir(path)
    if world_size is not None:
        try:
            check_meshes_fit(program, world_size)
        except HostIrError as error:
            raise type(error)(f"{path}: {error}") from error
    return program


def load_hir(path: str) -> HostIrContainer:
    """Parses and verifies the host IR text in ``path``; raises ParseError (with
    ``line``/``col``), VerifyError, or ScriptError for a file that is not text."""
    with open(path, "rb") as file:
        data = file.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScriptError(
            f"{path}: not UTF-8 text (byte {error.start}); expected host IR text or a .py script"
        ) from None
    return parse(text)  # parse verifies


def load_script(path: str, world_size: int | None = None) -> HostIrContainer:
    """Imports the script at ``path``, calls its ``fusion`` and lowers the result."""
    fusion = script_function(import_script(path), path)
    if world_size is None:
        world_size = default_world_size(fusion)
    result = call_in_script(path, lambda: fusion(world_size))
    try:
        if isinstance(result, HostIrContainer):
            check_meshes_fit(result, world_size)
            return result
        host_ir = getattr(result, "host_ir", None)
        if not callable(host_ir):
            raise ScriptError(
                f"{path}: {SCRIPT_FUNCTION}({world_size}) returned {type(result).__name__};"
                " expected a FusionDefinition (or a HostIrContainer)"
            )
        return host_ir(world_size=world_size)
    except ScriptError:
        raise
    except HostIrError as error:
        raise ScriptError(f"{path}: {SCRIPT_FUNCTION}({world_size}): {error}") from error


def import_script(path: str) -> Any:
    """The script's module, imported as ``MODULE_NAME`` with its folder first on sys.path."""
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ScriptError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    sys.modules[MODULE_NAME] = module  # dataclasses and pickling look the module up
    try:
        call_in_script(path, lambda: spec.loader.exec_module(module))
    finally:
        if sys.path and sys.path[0] == folder:
            del sys.path[0]
    return module


def script_function(module: Any, path: str) -> Callable[..., Any]:
    """The script's ``fusion`` function; a ScriptError saying what to add if it has none."""
    fusion = getattr(module, SCRIPT_FUNCTION, None)
    if fusion is None:
        raise ScriptError(
            f"{path}: defines no function '{SCRIPT_FUNCTION}'; add"
            f" 'def {SCRIPT_FUNCTION}(world_size: int) -> FusionDefinition' returning the"
            " scheduled fusion (see docs/cli.md)"
        )
    if not callable(fusion):
        raise ScriptError(
            f"{path}: '{SCRIPT_FUNCTION}' is a {type(fusion).__name__}, not a function"
        )
    return fusion


def default_world_size(fusion: Callable[..., Any]) -> int:
    """The default of ``fusion``'s first parameter if it has one, else DEFAULT_WORLD_SIZE."""
    try:
        parameters = list(inspect.signature(fusion).parameters.values())
    except (TypeError, ValueError):
        return DEFAULT_WORLD_SIZE
    if parameters and isinstance(parameters[0].default, int):
        return parameters[0].default
    return DEFAULT_WORLD_SIZE


def call_in_script(path: str, call: Callable[[], Any]) -> Any:
    """Runs ``call`` (the script's code); reports what the script raised as one ScriptError
    naming the script's line, and passes HostIrErrors through prefixed with the path.
    What the script prints goes to stderr: stdout is the command's output."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return call()
    except HostIrError as error:
        if isinstance(error, ScriptError):
            raise
        raise ScriptError(f"{path}: {error}") from error
    except SyntaxError as error:
        raise ScriptError(f"{path}{_syntax_place(error)}: syntax error: {error.msg}") from error
    except SystemExit as error:
        raise ScriptError(
            f"{path}: exited (code {error.code}) while being imported; put its main job"
            " under 'if __name__ == \"__main__\":'"
        ) from error
    except Exception as error:
        line = script_line(path, error)
        where = f"{path}:{line}" if line else path
        raise ScriptError(f"{where}: {type(error).__name__}: {error}") from error


def _syntax_place(error: SyntaxError) -> str:
    """``:LINE:COL``, ``:LINE`` or nothing, as much as Python told (a file with a null
    byte has no line)."""
    if error.lineno is None:
        return ""
    return f":{error.lineno}:{error.offset}" if error.offset else f":{error.lineno}"


def script_line(path: str, error: BaseException) -> int | None:
    """The line of the script's innermost frame in ``error``'s traceback, if any."""
    target = os.path.abspath(path)
    line = None
    for frame in traceback.extract_tb(error.__traceback__):
        if os.path.abspath(frame.filename) == target:
            line = frame.lineno
    return line


def instruction_count(body: tuple[Instruction, ...]) -> int:
    """Instructions in ``body``, counting those inside loops (a loop counts as one too)."""
    return sum(
        1 + (instruction_count(inst.body) if isinstance(inst, ForLoop) else 0) for inst in body
    )
