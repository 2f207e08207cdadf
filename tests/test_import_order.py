"""Imports run down the request's path: the order `docs/architecture.md` lists, read from that
file, so the document and the code cannot drift apart. Every import counts, also one made only
for type checking or inside a function: an arrow back up or a circle there is the same knot in
the design, whether or not it runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TOP = "<top>"


def _order() -> dict[str, list[set[str]]]:
    """The layers, top first: under "" the top-level folders, under a folder its entries."""
    text = DOC.read_text().split("## Import order", 1)[1]
    layers: dict[str, list[set[str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        heading = re.fullmatch(r"(Top level|Inside `(\w+)/`):", line.strip())
        if heading:
            current = heading[2] or ""
            layers[current] = []
        elif line.startswith("- ") and current is not None:
            layers[current].append({name.rstrip("/") for name in re.findall(r"`([^`]+)`", line)})
    return layers


ORDER = _order()
PACKAGES = [next(iter(layer)) for layer in ORDER[""]]


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module `name` is or lies in (an imported name may be a function of a module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        imported.update(owner for owner in map(_owner, names) if owner and owner != module)
    return imported


EDGES = {module: _imports(module) for module in MODULES}


def _rank(layers: list[set[str]], entry: str) -> int:
    for i, layer in enumerate(layers):
        if entry in layer:
            return i
    return next(i for i, layer in enumerate(layers) if TOP in layer)


def _place(module: str) -> tuple[int, str, int]:
    """Where a module stands: its top-level folder's rank, that folder, its entry's rank in it."""
    parts = module.split(".")
    top_rank = _rank(ORDER[""], parts[0])
    layers = ORDER.get(parts[0])
    if layers is None or len(parts) == 1:
        return top_rank, parts[0], _rank(layers, TOP) if layers else 0
    entry = parts[1] if (ROOT / parts[0] / parts[1]).is_dir() or any(parts[1] in layer for layer in layers) else TOP
    return top_rank, parts[0], _rank(layers, entry)


def arrows_back_up() -> list[str]:
    found = []
    for module, imported in EDGES.items():
        here = _place(module)
        for target in imported:
            there = _place(target)
            if there[0] < here[0] or (there[1] == here[1] and there[2] < here[2]):
                found.append(f"{module} -> {target}")
    return sorted(found)


def circles() -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), each a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in EDGES[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(EDGES):
        if node not in index:
            visit(node)
    return found


def test_the_order_covers_every_folder() -> None:
    assert sorted(PACKAGES) == sorted(p.name for p in ROOT.iterdir() if p.name in PACKAGES), PACKAGES
    for folder, layers in ORDER.items():
        if not folder:
            continue
        listed = {entry for layer in layers for entry in layer} - {TOP}
        present = {p.stem if p.is_file() else p.name for p in (ROOT / folder).iterdir()
                   if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
        assert listed <= present, f"docs/architecture.md lists entries of {folder}/ that are gone: {listed - present}"
        packages = {p.name for p in (ROOT / folder).iterdir() if (p / "__init__.py").exists()}
        assert packages <= listed, f"packages of {folder}/ missing from docs/architecture.md: {packages - listed}"


def test_no_import_runs_back_up() -> None:
    assert arrows_back_up() == []


def test_no_import_circles() -> None:
    assert circles() == []


def test_the_checks_see_a_wrong_way_import() -> None:
    """The checks are not vacuous: an arrow from the contract up to the gateway is caught."""
    EDGES["plugins.contract.protocol"].add("gateway.app")
    try:
        assert "plugins.contract.protocol -> gateway.app" in arrows_back_up()
        assert any("gateway.app" in group for group in circles())
    finally:
        EDGES["plugins.contract.protocol"].discard("gateway.app")
