"""docs/design.md's package map is true: it lists every module of hostir, frontend and
lowering and only modules that exist, and each package imports only what its row says
it may (read from the import graph that import-linter checks, grimp's). And no page of
the docs names a module or file that a move left behind."""

from __future__ import annotations

import importlib
import pathlib
import re

import grimp

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("hostir", "frontend", "lowering")


def _map_rows() -> list[dict[str, str]]:
    """The rows of the first table under ``## Package map`` in docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Package map\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:  # after the header and its |---| line
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _names(cell: str) -> set[str]:
    """The backticked names of a cell."""
    return set(re.findall(r"`([^`]+)`", cell))


def _package_of(row: dict[str, str]) -> str:
    (path,) = _names(row["Package"])  # e.g. `hostir/ir/`
    return path.strip("/").replace("/", ".")


def _modules_on_disk() -> dict[str, set[str]]:
    """Per package (dotted), the modules directly in it (no ``__init__``/``__main__``)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            dotted = ".".join(init.parent.relative_to(ROOT).parts)
            found[dotted] = {
                path.stem for path in init.parent.glob("*.py") if not path.stem.startswith("__")
            }
    return found


def test_the_package_map_lists_every_module_and_only_those():
    listed = {_package_of(row): _names(row["Modules"]) for row in _map_rows()}
    on_disk = _modules_on_disk()
    assert sorted(listed) == sorted(on_disk), "packages in the map differ from the tree"
    for package, modules in on_disk.items():
        missing, extra = modules - listed[package], listed[package] - modules
        assert not missing and not extra, f"{package}: unlisted {missing}, not on disk {extra}"


def test_each_package_imports_only_what_the_map_says_it_may():
    graph = grimp.build_graph(*PACKAGES)
    rows = {_package_of(row): _names(row["May import"]) for row in _map_rows()}
    for package, allowed in rows.items():
        # a module may import its package's other modules, a package's __init__ what it
        # contains; a row names packages or single modules, as dotted names
        siblings = {f"{package}.{name}" for name in _modules_on_disk()[package]}
        for module in siblings | {package}:
            for imported in graph.find_modules_directly_imported_by(module):
                if imported.split(".")[0] not in PACKAGES:
                    continue
                inside = imported in siblings or (
                    module == package and imported.startswith(package + ".")
                )
                permitted = any(imported == a or imported.startswith(a + ".") for a in allowed)
                assert inside or permitted, f"{module} imports {imported}, not in {allowed}"


ENTRY_POINT_GROUPS = {"hostir.commands"}
"""Dotted names in the docs that are entry-point groups, not modules."""


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a name reached from one by attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def test_the_docs_name_only_modules_and_files_that_exist():
    """After a move, no page of docs/ (nor the README) points at a module or file that
    is gone: every `hostir.x.y` name resolves and every `hostir/x/y.py` path exists."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    dotted = re.compile(r"`((?:hostir|lowering|frontend)(?:\.[A-Za-z_]\w*)+)")
    paths = re.compile(r"\b((?:hostir|lowering|frontend|tests|benchmarks|examples)/[\w/]+\.\w+)")
    for page in pages:
        text = page.read_text()
        for name in set(dotted.findall(text)) - ENTRY_POINT_GROUPS:
            assert _resolves(name), f"{page.name} names {name}, which does not exist"
        for path in set(paths.findall(text)):
            assert (ROOT / path).exists(), f"{page.name} names {path}, which does not exist"
