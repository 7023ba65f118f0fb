"""What the dashboard and the plots take from a campaign's problem and its programs' code: each
objective's own description (why a score is what it is), a line of each program for the top
table, and where each policy version started sampling."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from problems.api import Compact

# What the top table shows of a program: a line of it, and the code its hover shows (the
# program's page has all of it).
GIST_CHARS = 120
CODE_CHARS = 2000


@dataclass(frozen=True)
class ProblemFacts:
    """What the views take from a campaign's problem where it is installed: each objective's
    own description (why a score is what it is: the gate that holds simplicity at 0 until the
    fit earns it), the entry function, and the compact form (the part a model evolves: an
    equation's expression). Empty where the problem does not load here."""

    notes: dict[str, str] = field(default_factory=dict)
    entry: str | None = None
    compact: Compact | None = None


def problem_facts(name: str) -> ProblemFacts:
    """The facts of the installed problem `name`. A problem folder is not loaded: that would
    run a file the database names, and a database is read here, never trusted to pick code."""
    from problems.registry import ProblemLoadError, load

    if "/" in name or name.startswith(".") or Path(name).exists():
        return ProblemFacts()
    try:
        problem = load(name)
    except ProblemLoadError:
        return ProblemFacts()
    return ProblemFacts(
        {o.name: o.description for o in problem.objectives if o.description},
        getattr(problem, "entry", None),
        getattr(problem, "compact", None),
    )


def gist(code: str, facts: ProblemFacts) -> dict[str, str]:
    """What the top table shows of a program, as text: `kind` "expression" with the part the
    problem's compact form names (an equation's expression) or the one expression the entry
    function returns, else "code" with the first line of the entry function's body and the
    program's length; `text` cut to GIST_CHARS, `code` to CODE_CHARS."""
    part = None
    if facts.compact is not None:
        try:
            part = facts.compact.part(code)
        except Exception:  # a problem's own parser on model output: show the code instead
            part = None
    kind, text = ("expression", part) if part else _code_gist(code, facts.entry)
    return {
        "kind": kind,
        "text": _cut(" ".join(text.split()), GIST_CHARS),
        "code": _cut(code, CODE_CHARS),
    }


def _code_gist(code: str, entry: str | None) -> tuple[str, str]:
    lines = [line.strip() for line in code.splitlines()]
    length = f"({sum(1 for line in lines if line and not line.startswith('#'))} lines)"
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    functions = [
        node
        for node in (tree.body if tree else [])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    # The entry function, else the last one: helpers come before the function they serve.
    chosen = next((f for f in functions if f.name == entry), functions[-1] if functions else None)
    if chosen is None:
        said = [line for line in lines if line and not line.startswith(("#", "import ", "from "))]
        return "code", f"{said[0]} … {length}" if said else length
    body = chosen.body[1:] if ast.get_docstring(chosen) is not None else chosen.body
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        return "expression", ast.get_source_segment(code, body[0].value) or ""
    first = (ast.get_source_segment(code, body[0]) or "").split("\n")[0] if body else ""
    return "code", f"{chosen.name}: {first} … {length}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def version_starts(versions: Sequence[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(first iteration, step) of each policy version after the starting weights that sampled
    a group, by iteration: where the per-iteration charts draw a boundary."""
    first: dict[int, int] = {}
    for _, iteration, step in versions:
        if step > 0:
            first[step] = min(iteration, first.get(step, iteration))
    return sorted((iteration, step) for step, iteration in first.items())
