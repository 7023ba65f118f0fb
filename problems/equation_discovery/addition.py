"""A candidate written as `+ <term>`: the term added to the parent's expression.

    params[0] * x + params[1] * v + params[2]      the parent's expression
    + params[0] * x * v                            the candidate
    params[0] * x + params[1] * v + params[2] + params[3] * x * v     what is fitted

The addition is read by the grammar (grammar.py), its params renumbered where the parent uses
them, and the sum is read by the grammar again, so every bound on a candidate holds for it.
"""

from __future__ import annotations

import ast

from problems.equation_discovery.grammar import NPARAMS, Equation, Refused, read


def extend(base: str, addition: str, inputs: tuple[str, ...]) -> Equation:
    """The equation `base` (the current expression) with `addition` appended: `addition` is a
    term after a plus sign, `+ params[3] * x * v` (more terms may follow; a fitted constant
    gives the sign, so a whole expression may start with a minus but not with a plus). The
    addition's params[k] that `base` also uses are renumbered, in order, to the lowest indices
    neither uses, so each added term gets constants of its own; Refused when the two need
    more than NPARAMS of them, or when either part, or the sum, is refused."""
    addition = addition.strip()
    if not addition.startswith("+"):
        raise Refused("an addition to the current expression starts with +")
    current = read(base, inputs)
    added = read(addition[1:], inputs)
    used = _indices(current.tree)
    wanted = sorted(_indices(added.tree))
    free = iter(k for k in range(NPARAMS) if k not in used and k not in wanted)
    moved = {}
    for k in wanted:
        if k in used:
            if (target := next(free, None)) is None:
                raise Refused(
                    f"the current expression and the added term need more than {NPARAMS}"
                    " params: write a whole expression instead"
                )
            moved[k] = target
    tree = _Renumbered(moved).visit(added.tree)
    text = ast.unparse(tree)
    return read(f"{current.text} {text if text.startswith('-') else '+ ' + text}", inputs)


def _indices(tree: ast.AST) -> set[int]:
    return {node.slice.value for node in ast.walk(tree) if _is_param(node)}  # type: ignore[attr-defined]


def _is_param(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "params"
        and isinstance(node.slice, ast.Constant)
    )


class _Renumbered(ast.NodeTransformer):
    def __init__(self, moved: dict[int, int]) -> None:
        self.moved = moved

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if _is_param(node) and node.slice.value in self.moved:  # type: ignore[attr-defined]
            return ast.Subscript(node.value, ast.Constant(self.moved[node.slice.value]), node.ctx)  # type: ignore[attr-defined]
        return node
