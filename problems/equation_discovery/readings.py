"""The lenient readings of a candidate that is not a whole program (grammar.py): a body whose
lines share an indentation, and a text of assignments alone read as `equation`'s body returning
the last name bound (what a small model writes for "the expression alone")."""

from __future__ import annotations

import ast
import textwrap


def dedented(text: str) -> str:
    """`text`, stripped, with the indentation its lines after the first share taken off them
    (the first line's was stripped with the text's leading space)."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([first, *textwrap.dedent("\n".join(rest)).splitlines()])


def named_result(body: list[ast.stmt], reserved: tuple[str, ...]) -> str | None:
    """The name a text of assignments alone ends by binding (`y = params[0] * x`, what a small
    model writes for "the expression alone"), read as `equation`'s body returning that name;
    None for any other text and for a last assignment to a `reserved` name (the grammar's: an
    input, `x = params[0]`, states no equation for the output; `equation` is the function's
    name)."""
    assignments = (ast.Assign, ast.AnnAssign, ast.AugAssign)
    if not body or not all(isinstance(statement, assignments) for statement in body):
        return None
    last = body[-1]
    targets = last.targets if isinstance(last, ast.Assign) else [last.target]
    if len(targets) != 1 or not isinstance(targets[0], ast.Name):
        return None
    name = targets[0].id
    return None if name in reserved else name


def assigns(statement: ast.stmt, name: str) -> bool:
    """Whether `statement` is an assignment whose targets include the bare `name`."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return False
    return any(isinstance(target, ast.Name) and target.id == name for target in targets)
