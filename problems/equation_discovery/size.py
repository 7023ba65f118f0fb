"""The size of an equation program, read from its syntax tree in trusted code (it never runs).

    size = operators + literals + parameters

counted over the whole program but its imports and docstrings (a helper costs what it holds,
called or not, so nothing can hide where a reader of the entry would not look):
- operators: each arithmetic or logical operator, comparison, function call, conditional
  expression and subscript (`x[0]`), as symbolic regression counts the nodes of an expression
  (PySR's complexity, Cranmer 2023, arXiv 2305.01582);
- literals: a number costs 1 (a negative number too), as a fitted constant does, so constants
  typed in from an earlier fit are no cheaper than fitting them; a string or bytes literal
  costs its length, so code hidden in text (for `eval`, `exec`, `pickle`) costs at least what
  it would cost written out;
- parameters: the entries of `params` (the entry's last argument) the program reads:
  `params[3]` is one, `params[2:5]` three, and any other use of the name (bare, a computed
  index, passed on to a helper) counts all ten.

simplicity = HALF / (HALF + size): 1 for an equation of size 0 (an input returned as it is),
one half at HALF, never 0, so of two equations the smaller scores more.
"""

from __future__ import annotations

import ast

NPARAMS = 10
HALF = 10
OPERATORS = (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.IfExp, ast.Subscript, ast.AugAssign)
DEFINITIONS = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def simplicity(size: int | None) -> float:
    """HALF / (HALF + size); 0 where there is no size (a program that does not parse)."""
    return 0.0 if size is None else HALF / (HALF + size)


def size(code: str, entry: str = "equation") -> int | None:
    """operators + literals + parameters of `code` (see the module); None when the code does
    not parse or defines no function `entry`."""
    try:
        tree = ast.parse(code)
        functions = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == entry]
        if not functions:
            return None
        arguments = functions[-1].args.posonlyargs + functions[-1].args.args
        return _count(tree, arguments[-1].arg if arguments else None)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _count(tree: ast.Module, params: str | None) -> int:
    skipped: set[int] = set()  # nodes counted already: imports, docstrings, parts of a parameter
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skipped.update(id(n) for n in ast.walk(node))
        elif isinstance(node, DEFINITIONS) and node.body and _is_text(node.body[0]):
            skipped.update(id(n) for n in ast.walk(node.body[0]))  # a docstring
    used: set[int] = set()
    operators = literals = 0
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        indices = _parameter(node, params)
        if indices is not None:
            used.update(indices)
            skipped.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.Name) and node.id == params:
            used.update(range(NPARAMS))  # the whole vector, used some other way
        elif _negative_number(node):
            literals += 1
            skipped.update(id(n) for n in ast.walk(node))
        elif isinstance(node, ast.Constant):
            text = isinstance(node.value, str | bytes)
            literals += max(1, len(node.value)) if text else 1
        elif isinstance(node, OPERATORS):
            operators += 1
        elif isinstance(node, ast.BoolOp):
            operators += len(node.values) - 1
    return operators + literals + len(used)


def _is_text(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _parameter(node: ast.AST, params: str | None) -> set[int] | None:
    """The entries of `params` that `params[...]` reads when its index is written as constants
    (`params[3]`, `params[-1]`, `params[2:5]`); every entry for another index; None when
    `node` is not a subscript of `params`."""
    if params is None or not isinstance(node, ast.Subscript):
        return None
    if not (isinstance(node.value, ast.Name) and node.value.id == params):
        return None
    index = node.slice
    every = set(range(NPARAMS))
    if isinstance(index, ast.Slice):
        parts = (index.lower, index.upper, index.step)
        bounds = [None if part is None else _integer(part) for part in parts]
        if any(
            part is not None and bound is None for part, bound in zip(parts, bounds, strict=True)
        ):
            return every
        if bounds[2] == 0:
            return every
        return set(range(NPARAMS)[slice(*bounds)])
    value = _integer(index)
    if value is None or not -NPARAMS <= value < NPARAMS:
        return every
    return {value % NPARAMS}


def _integer(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if _negative_number(node) and type(node.operand.value) is int:  # type: ignore[attr-defined]
        return -node.operand.value  # type: ignore[attr-defined]
    return None


def _negative_number(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float, complex)
    )
