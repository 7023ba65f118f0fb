"""The layers DESIGN.md draws, read from the import graph: the trainer and the problems know
nothing of the harness, the pure parts of the loop (selection and its population, prompts,
parsing, an iteration's classification, the measures of candidates) reach neither the database
nor the sandbox, and the views do not depend on the loop. Imports inside functions count too,
and so do imports of imports: a layer that reaches the store through a helper module reaches
the store."""

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
    ("harness.campaign.selection", "harness.store"),
    ("harness.campaign.population", "harness.store"),
    ("harness.campaign.prompts", "harness.store"),
    ("harness.campaign.parsing", "harness.store"),
    ("harness.campaign.iteration", "harness.store"),
    ("harness.inspect.measures", "harness.store"),
    ("harness.campaign.selection", "harness.evaluation.sandbox"),
    ("harness.campaign.population", "harness.evaluation.sandbox"),
    ("harness.campaign.prompts", "harness.evaluation.sandbox"),
    ("harness.campaign.parsing", "harness.evaluation.sandbox"),
    ("harness.campaign.iteration", "harness.evaluation.sandbox"),
    ("harness.inspect.measures", "harness.evaluation.sandbox"),
    ("harness.inspect.views", "harness.campaign.loop"),
]
# The rooms of harness/ (its __init__ draws them): each reaches only the rooms below it.
ROOMS = ("cli", "campaign", "inspect", "evaluation", "llm", "store", "config")
BELOW = {
    "cli": {"campaign", "inspect", "evaluation", "llm", "store", "config"},
    "campaign": {"inspect", "evaluation", "llm", "store", "config"},
    "inspect": {"store", "config"},
    "evaluation": {"config"},
    "llm": {"config"},
    "store": {"config"},
    "config": set(),
}
RULES += [
    (f"harness.{room}", f"harness.{other}")
    for room in ROOMS
    for other in ROOMS
    if other != room and other not in BELOW[room]
]


@pytest.mark.parametrize("layer,forbidden", RULES, ids=[f"{a}-x->{b}" for a, b in RULES])
def test_layer_does_not_reach(layer: str, forbidden: str) -> None:
    modules = [name for name in _sources() if name == layer or name.startswith(layer + ".")]
    assert modules, f"no module {layer}"
    for module in modules:
        chain = _path_to(module, forbidden)
        assert not chain, f"{module} reaches {forbidden}: {' -> '.join(chain)}"


def test_every_harness_module_lives_in_a_room() -> None:
    """Beside the rooms only the shared bottom: the records every room passes and the named
    kill points of the fault tests."""
    loose = {name for name in _sources() if name.count(".") == 1 and name.startswith("harness.")}
    assert loose - {f"harness.{room}" for room in ROOMS} == {"harness.records", "harness.faults"}
    for room in ROOMS:
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
    assert "harness.store" in reachable("harness.campaign.loop")
    assert "trainer.loss" in reachable("trainer.train")
    assert "problems.api" in reachable("problems.circle_packing")
