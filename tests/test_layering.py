"""The import direction of SPEC section 2: hostir <- frontend <- lowering."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


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


def test_hostir_imports_neither_frontend_nor_lowering():
    """hostir is a self-contained program format and runtime."""
    for module, names in _imports("hostir").items():
        assert not names & {"frontend", "lowering"}, module


def test_only_fusion_definition_reaches_into_lowering():
    """frontend uses lowering only where execute lowers the fusion."""
    for module, names in _imports("frontend").items():
        if module != "frontend/fusion_definition.py":
            assert "lowering" not in names, module
