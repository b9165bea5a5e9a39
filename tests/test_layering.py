"""The layering that import-linter cannot see, and import-linter's own check of it.

The import statements' direction (SPEC section 2, and hostir's layers) is declared
as import-linter contracts in pyproject.toml and checked by ``lint-imports`` (.ci/run
runs it; :func:`test_lint_imports_refuses_an_upward_import_and_a_circle` shows the
contracts catch what they claim to). What no static graph sees is checked here:
dynamic imports (``importlib``, ``__import__``, ``pkgutil``) name neither frontend
nor lowering, hostir imports nothing whose name it computes at run time except the
user's own scripts, and a fresh interpreter that refuses to import frontend and
lowering still imports every hostir module.
"""

from __future__ import annotations

import ast
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DYNAMIC = {"import_module", "__import__", "find_spec", "spec_from_file_location", "iter_modules"}
"""Calls that import (or find) a module named by a value."""
USER_SCRIPTS = {"hostir/cli/scripts.py": {"spec_from_file_location"}}
"""Where hostir imports by path on purpose: the user's SCRIPT files (``hostir dump``)."""


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
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / "hostir").rglob("*.py")
        if path.name != "__main__.py"
    )
    assert "hostir.ir.container" in modules and "hostir.text" in modules
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


def test_the_plan_command_comes_from_lowering_through_an_entry_point():
    """``hostir plan`` is declared by lowering and found through the hostir.commands entry
    point group, not imported by hostir."""
    from hostir import cli

    names = {add.__module__ for add in cli.plugin_commands()}
    assert "lowering.commands" in names
    assert all(add.__module__.startswith("hostir.") for add in cli.COMMANDS)


LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"
"""The ``lint-imports`` command, run by the interpreter running the tests."""


def _lint_imports(tree: pathlib.Path) -> subprocess.CompletedProcess:
    """``lint-imports`` run on a copy of the packages and pyproject.toml at ``tree``."""
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "500"},  # no folded lines
        capture_output=True,
        text=True,
        timeout=120,
    )


def _copy_of_the_packages(tree: pathlib.Path) -> pathlib.Path:
    for package in ("hostir", "frontend", "lowering"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def _add_import(tree: pathlib.Path, module: str, statement: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(("from hostir", "import ")))
    path.write_text("".join(lines[:at] + [statement + "\n"] + lines[at:]))


WRONG_IMPORTS = [
    # (module, the import added to it, what lint-imports must then report)
    # the IR importing its text form: an arrow up hostir's layers
    (
        "hostir.ir.container",
        "from hostir.text import printer",
        "hostir.ir.container -> hostir.text",
    ),
    # two modules of one layer importing each other: a circle that crosses no layer
    (
        "hostir.ir.values",
        "from hostir.ir import container",
        "- .values -> .container",
    ),
    # hostir reaching the frontend
    ("hostir.run.evaluator", "import frontend", "hostir.run.evaluator -> frontend"),
    # a second module of frontend reaching lowering
    ("frontend.ops", "import lowering", "frontend.ops -> lowering"),
]


def test_lint_imports_keeps_the_contracts_and_refuses_each_kind_of_wrong_import(tmp_path):
    """On a copy of the tree, ``lint-imports`` keeps all four contracts; with the wrong
    imports above added, it breaks all four and names each import."""
    clean = _lint_imports(_copy_of_the_packages(tmp_path / "clean"))
    assert clean.returncode == 0 and "4 kept, 0 broken" in clean.stdout, clean.stdout
    tree = _copy_of_the_packages(tmp_path / "wrong")
    for module, statement, _ in WRONG_IMPORTS:
        _add_import(tree, module, statement)
    done = _lint_imports(tree)
    assert done.returncode != 0 and "0 kept, 4 broken" in done.stdout, done.stdout
    for _, _, reported in WRONG_IMPORTS:
        assert reported in done.stdout, (reported, done.stdout)
