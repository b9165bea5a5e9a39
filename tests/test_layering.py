"""The import direction of SPEC section 2: hostir <- frontend <- lowering.

Import statements are read from the source; dynamic imports too (``importlib``,
``__import__``, ``pkgutil``): hostir names neither frontend nor lowering in any
of them, and imports nothing whose name it computes at run time except the
user's own scripts. A fresh interpreter that refuses to import frontend and
lowering must still import every hostir module.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DYNAMIC = {"import_module", "__import__", "find_spec", "spec_from_file_location", "iter_modules"}
"""Calls that import (or find) a module named by a value."""
USER_SCRIPTS = {"hostir/cli/scripts.py": {"spec_from_file_location"}}
"""Where hostir imports by path on purpose: the user's SCRIPT files (``hostir dump``)."""


def _imports(package: str) -> dict[str, set[str]]:
    """Top-level package names imported by each module of ``package``."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def _dynamic_imports(package: str) -> list[tuple[str, int, str, str]]:
    """(module, line, function, first argument's source) of every dynamic import call."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else None
            name = function.id if isinstance(function, ast.Name) else name
            if name in DYNAMIC:
                argument = ast.unparse(node.args[0]) if node.args else ""
                found.append((module, node.lineno, name, argument))
    return found


def test_hostir_imports_neither_frontend_nor_lowering():
    """hostir is a self-contained program format and runtime."""
    for module, names in _imports("hostir").items():
        assert not names & {"frontend", "lowering"}, module


def test_hostir_has_no_dynamic_imports_but_the_users_scripts():
    """No ``importlib.import_module("lowering...")`` (or any name computed at run time) hides
    a dependency from the test above; the only dynamic import loads the user's script."""
    for module, line, function, argument in _dynamic_imports("hostir"):
        assert function in USER_SCRIPTS.get(module, set()), (
            f"{module}:{line}: {function}({argument}) imports by name at run time"
        )
        assert "frontend" not in argument and "lowering" not in argument, (module, line)


def test_every_hostir_module_imports_without_frontend_and_lowering():
    """The same at run time: with frontend and lowering made unimportable, every hostir
    module imports (an import hidden in a string would fail here)."""
    modules = sorted(
        "hostir." + path.stem for path in (ROOT / "hostir").glob("*.py") if path.stem != "__init__"
    )
    code = (
        "import sys\n"
        "sys.modules['frontend'] = None\n"
        "sys.modules['lowering'] = None\n"
        f"import importlib\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        "import hostir.cli\nhostir.cli.COMMANDS\nprint('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_only_fusion_definition_reaches_into_lowering():
    """frontend uses lowering only where execute lowers the fusion."""
    for module, names in _imports("frontend").items():
        if module != "frontend/fusion_definition.py":
            assert "lowering" not in names, module


def test_the_plan_command_comes_from_lowering_through_an_entry_point():
    """``hostir plan`` is declared by lowering and found through the hostir.commands entry
    point group, not imported by hostir."""
    from hostir import cli

    names = {add.__module__ for add in cli.plugin_commands()}
    assert "lowering.commands" in names
    assert all(add.__module__.startswith("hostir.") for add in cli.COMMANDS)
