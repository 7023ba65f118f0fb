"""The rooms of harness/, read from the import graph. Each room's `__init__` says what it owns
and, on one line `May import: ...`, which other rooms it may import: that line is the map, and
this file checks the code against it (and docs/layout.md against the code: tests/test_docs.py).
Beside the map: the trainer and the problems know nothing of the harness, the pure parts of the
loop (selection and its population, prompts, parsing, an iteration's classification, the
measures of candidates) reach neither the database nor the sandbox, and the views do not depend
on the loop. Imports inside functions count too, and so do imports of imports: a layer that
reaches the store through a helper module reaches the store."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("harness", "trainer", "problems")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _sources() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


@cache
def direct_imports(module: str) -> frozenset[str]:
    """Project modules `module` imports anywhere in its text (the longest known prefix)."""
    path = _sources()[module]
    is_package = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    # What runs only as a script (`python -m module`) is not an import of the module.
    script = {id(node) for block in tree.body if _is_main(block) for node in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in script:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import module` depends on the module, not on the package's names.
            names = [f"{base}.{alias.name}" for alias in node.names]
            if not all(name in _sources() for name in names):
                names.append(base)
        else:
            continue
        for name in names:
            known = _known_prefix(name)
            if known and known != module:
                found.add(known)
    return frozenset(found)


def _is_main(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _known_prefix(name: str) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in _sources():
            return candidate
    return None


def reachable(module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in direct_imports(todo.pop()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def _path_to(start: str, target_prefix: str) -> list[str]:
    """One import chain from `start` to a module under `target_prefix`, for the message."""
    parents: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop(0)
        for name in sorted(direct_imports(current)):
            if name in parents or name == start:
                continue
            parents[name] = current
            if name == target_prefix or name.startswith(target_prefix + "."):
                chain = [name]
                while chain[-1] != start:
                    chain.append(parents[chain[-1]])
                return chain[::-1]
            todo.append(name)
    return []


RULES = [
    ("trainer", "harness"),
    ("problems", "harness"),
    ("harness.evolution.selection", "harness.store"),
    ("harness.evolution.population", "harness.store"),
    ("harness.evolution.prompts", "harness.store"),
    ("harness.evolution.parsing", "harness.store"),
    ("harness.evolution.iteration", "harness.store"),
    ("harness.observation.windows", "harness.store"),
    ("harness.evolution.selection", "harness.evaluation.sandbox"),
    ("harness.evolution.population", "harness.evaluation.sandbox"),
    ("harness.evolution.prompts", "harness.evaluation.sandbox"),
    ("harness.evolution.parsing", "harness.evaluation.sandbox"),
    ("harness.evolution.iteration", "harness.evaluation.sandbox"),
    ("harness.observation.windows", "harness.evaluation.sandbox"),
    ("harness.observation.views", "harness.evolution.loop"),
]
# Beside the rooms, the shared bottom every room may import: the frozen records they pass, and
# the named kill points of the fault tests. They import no room.
SHARED = ("harness.records", "harness.faults")
MAY_IMPORT = "May import:"


@cache
def rooms() -> tuple[str, ...]:
    """The packages directly under harness/."""
    return tuple(sorted(p.parent.name for p in (ROOT / "harness").glob("*/__init__.py")))


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "harness" and parts[1] in rooms() else None


@cache
def may_import(room: str) -> frozenset[str]:
    """The rooms `room` may import, as its `__init__` docstring says on its `May import:` line
    (`nothing` for none)."""
    path = ROOT / "harness" / room / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    lines = [line.strip() for line in doc.splitlines() if line.strip().startswith(MAY_IMPORT)]
    assert len(lines) == 1, f"{path}: its docstring needs one line `{MAY_IMPORT} room, room`"
    names = lines[0].removeprefix(MAY_IMPORT).strip().rstrip(".")
    allowed = frozenset() if names == "nothing" else frozenset(n.strip() for n in names.split(","))
    unknown = allowed - set(rooms())
    assert not unknown, f"{path}: {MAY_IMPORT} names {sorted(unknown)}, not rooms of harness/"
    return allowed


def imported_rooms(room: str) -> dict[str, list[str]]:
    """The other rooms `room`'s modules import directly, each with the imports that do it."""
    found: dict[str, list[str]] = {}
    for module in _sources():
        if room_of(module) != room:
            continue
        for name in sorted(direct_imports(module)):
            other = room_of(name)
            if other and other != room:
                found.setdefault(other, []).append(f"{module} -> {name}")
    return found


@pytest.mark.parametrize("room", rooms())
def test_room_imports_only_its_map(room: str) -> None:
    outside = {
        other: chains
        for other, chains in imported_rooms(room).items()
        if other not in may_import(room)
    }
    assert not outside, f"harness.{room} imports outside its `{MAY_IMPORT}` line: {outside}"


@pytest.mark.parametrize("room", rooms())
def test_room_map_names_only_what_it_imports(room: str) -> None:
    """The map says what is, not what might be: a room it names and never imports goes."""
    unused = may_import(room) - set(imported_rooms(room))
    assert not unused, f"harness.{room} says it may import {sorted(unused)} and does not"


def test_the_map_runs_one_way() -> None:
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(rooms())
    graph.add_edges_from((room, other) for room in rooms() for other in may_import(room))
    assert nx.is_directed_acyclic_graph(graph), f"room cycles: {list(nx.simple_cycles(graph))}"


def test_the_shared_bottom_imports_no_room() -> None:
    for module in SHARED:
        assert not {room_of(name) for name in reachable(module)} - {None}, module


def test_harness_init_names_every_room() -> None:
    doc = ast.get_docstring(ast.parse((ROOT / "harness" / "__init__.py").read_text())) or ""
    named = {line.split()[0] for line in doc.splitlines() if line.startswith("    ")}
    assert set(rooms()) <= named, f"harness/__init__.py does not name {set(rooms()) - named}"


@pytest.mark.parametrize("layer,forbidden", RULES, ids=[f"{a}-x->{b}" for a, b in RULES])
def test_layer_does_not_reach(layer: str, forbidden: str) -> None:
    modules = [name for name in _sources() if name == layer or name.startswith(layer + ".")]
    assert modules, f"no module {layer}"
    for module in modules:
        chain = _path_to(module, forbidden)
        assert not chain, f"{module} reaches {forbidden}: {' -> '.join(chain)}"


def test_every_harness_module_lives_in_a_room() -> None:
    """Beside the rooms only the shared bottom."""
    loose = {name for name in _sources() if name.count(".") == 1 and name.startswith("harness.")}
    assert loose - {f"harness.{room}" for room in rooms()} == set(SHARED)
    for room in rooms():
        assert (ROOT / "harness" / room / "__init__.py").read_text().startswith('"""'), room


def test_no_import_cycle_anywhere() -> None:
    """Function-level imports count: a cycle hidden inside a function is still a cycle."""
    import networkx as nx

    graph = nx.DiGraph()
    for module in _sources():
        for name in direct_imports(module):
            graph.add_edge(module, name)
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_the_graph_reader_sees_imports() -> None:
    """The reader must see a real edge, or every rule above would pass vacuously."""
    assert "harness.store" in reachable("harness.evolution.loop")
    assert "trainer.loss" in reachable("trainer.train")
    assert "problems.api" in reachable("problems.circle_packing")
