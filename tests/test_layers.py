"""The package tree is the architecture: layers depend one way, and only through public names.

Read statically from the source (every ``import``, at module level or inside a
function), so an import that only runs on some path counts too. The layer
order is the one docs/ARCHITECTURE.md's layer table gives.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import casmon
from tests.support.modules import import_if_installed

ROOT = Path(casmon.__file__).resolve().parent

#: Lowest first. A module may import from its own package, or from a package of a lower rank.
RANKS = {
    "rare_errors": -1,  # below errors, which loads it on first use of a rare class
    "errors": 0, "scrub": 0, "faultpoints": 0, "plain": 0, "view": 0,  # leaves: every layer may use them
    "keys": 1,
    "store": 2,
    "maintenance": 3,
    "caching": 4, "calllog": 4,
    "runs": 5,
    "compat": 6, "integrations": 6, "lineage": 6,
    "ui": 7,
    "cli": 8,
    "__init__": 9, "__main__": 9,  # the public API and `python -m casmon`
}
#: What may stand flat under casmon/.
FLAT = {"__init__", "__main__", "errors", "rare_errors", "scrub", "faultpoints", "plain"}
MAX_LINES = 1000


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(("casmon",) + (rel[:-1] if rel[-1] == "__init__" else rel))
        out.append((name, path))
    return out


MODULES = _modules()


def _package(module: str) -> str:
    """The layer a module belongs to: its first component under casmon (``__init__`` for casmon itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(module: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, target module, names imported from it)`` for every import of casmon in the file."""
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[: len(base) - (node.level - 1)]
                target = ".".join(parent + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "casmon" or target.startswith("casmon."):
                names = [a.name for a in node.names]
                # `from casmon.store import backend` imports a module: count it as the module's import.
                for n in names:
                    sub = f"{target}.{n}"
                    if (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                            (ROOT.parent / Path(*sub.split(".")) / "__init__.py").exists():
                        found.append((node.lineno, sub, []))
                    else:
                        found.append((node.lineno, target, [n]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "casmon" or a.name.startswith("casmon."):
                    found.append((node.lineno, a.name, []))
    return found


def _target_package(target: str) -> str:
    return _package(target) if target != "casmon" else "__init__"


def test_no_import_climbs_a_layer_or_crosses_sideways():
    bad = []
    for module, path in MODULES:
        src = _package(module)
        for line, target, _names in _imports(module, path):
            dst = _target_package(target)
            if dst == src:
                continue
            if dst not in RANKS or src not in RANKS:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} -> {target}: package not in the layer table")
            elif RANKS[dst] >= RANKS[src]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} ({src}, layer {RANKS[src]}) imports "
                           f"{target} ({dst}, layer {RANKS[dst]})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, path in MODULES:
        src = _package(module)
        for _line, target, _names in _imports(module, path):
            dst = _target_package(target)
            if dst != src:
                graph.setdefault(src, set()).add(dst)
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in trail:
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif len(trail) < len(graph) + 1:
                visit(nxt, trail + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, "import cycles between packages:\n" + "\n".join(sorted(set(cycles)))


def test_no_underscore_name_is_imported_or_reached_across_packages():
    bad = []
    for module, path in MODULES:
        src = _package(module)
        tree = ast.parse(path.read_text(), str(path))
        foreign_modules: set[str] = set()  # local names bound to modules of other packages
        for line, target, names in _imports(module, path):
            if _target_package(target) == src:
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(ROOT.parent)}:{line}: imports {target}.{n}")
            if any(p.startswith("_") and not p.startswith("__") for p in target.split(".")):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: imports private module {target}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("casmon"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if _target_package(sub) != src and (
                            (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").exists()
                            or (ROOT.parent / Path(*sub.split(".")) / "__init__.py").exists()):
                        foreign_modules.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("casmon.") and a.asname and _target_package(a.name) != src:
                        foreign_modules.add(a.asname)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in foreign_modules and node.attr.startswith("_") and not node.attr.startswith("__"):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: reaches {node.value.id}.{node.attr}")
    assert not bad, "private names used across packages:\n" + "\n".join(bad)


def test_no_module_is_over_a_thousand_lines():
    big = {str(p.relative_to(ROOT.parent)): n for _m, p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_only_the_shared_leaves_stand_flat_under_casmon():
    flat = {p.stem for p in ROOT.glob("*.py")}
    assert flat <= FLAT, f"flat modules besides the shared leaves: {sorted(flat - FLAT)}"
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(RANKS), f"packages missing from the layer table: {sorted(packages - set(RANKS))}"


@pytest.mark.parametrize("package", sorted({p.parent.name for p in ROOT.glob("*/__init__.py")}))
def test_each_package_says_its_job_and_its_submodules_stay_modules(package):
    pkg = importlib.import_module(f"casmon.{package}")
    assert (pkg.__doc__ or "").strip(), f"casmon/{package}/__init__.py has no docstring saying its job"
    for info in pkgutil.walk_packages(pkg.__path__, f"casmon.{package}."):
        mod = import_if_installed(info.name)
        if mod is None:
            continue
        parent, _, leaf = info.name.rpartition(".")
        # `import casmon.x.y as m` must give the module, not a function the package exports under its name.
        assert getattr(importlib.import_module(parent), leaf) is mod, f"{parent} exports a name {leaf!r} over its submodule"


def _layer_rows() -> dict[str, str]:
    """docs/ARCHITECTURE.md's layer table: each package (``store``, ``view``, ...) -> the text of its row."""
    doc = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows: dict[str, str] = {}
    for line in doc.split("## Layers", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or len(cells) < 3 or not cells[0][2:].strip().isdigit():
            continue
        assert line.count(" | ") == 2 and line.endswith(" |"), f"a layer table row is not one row: {line[:80]!r}"
        package = cells[1].strip("`/ ")
        rows[package] = rows.get(package, "") + cells[2]
    return rows


def test_the_architecture_table_names_every_module_and_no_module_that_is_not_there():
    rows = _layer_rows()
    leaves = rows.get("shared leaves", "")
    unnamed, ghosts = [], []
    for _, path in MODULES:
        rel = path.relative_to(ROOT)
        if rel.name == "__init__.py" and len(rel.parts) > 1:
            continue  # a package is named by its folder
        row = leaves if (len(rel.parts) == 1 or rel.parts[0] == "view") else rows.get(rel.parts[0], "")
        if rel.parts == ("__init__.py",):
            continue  # the public API's row
        if rel.parts[-1] == "__main__.py":
            row = rows.get("cli", "")
        if f"`{rel.name}`" not in row and f"{rel.name}`" not in row:
            unnamed.append(str(rel))
    for package, row in rows.items():
        base = ROOT if package in ("shared leaves", "casmon/__init__.py") else ROOT / package
        for name in {m for m in re.findall(r"`([A-Za-z_]\w*\.py)`", row)}:
            if not list(base.rglob(name)) and not list(ROOT.rglob(name)):
                ghosts.append(f"{package}: {name}")
    assert not unnamed, f"modules docs/ARCHITECTURE.md's layer table does not name: {unnamed}"
    assert not ghosts, f"modules docs/ARCHITECTURE.md's layer table names that do not exist: {ghosts}"
