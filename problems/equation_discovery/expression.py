"""The compact form of an equation: the candidate writes only the expression `equation` returns.

    params[0] * x + params[1] * v ** 3 + params[2] * np.sin(v)

becomes the program

    import numpy as np


    def equation(x, v, params):
        '''The acceleration.'''
        return params[0] * x + params[1] * v ** 3 + params[2] * np.sin(v)

The expression is read by Python's parser and written back by `ast.unparse`, so spacing,
redundant parentheses and comments do not make two programs of one equation. A leading
`return` is dropped; a complete program (a model that wrote the whole function anyway) is
taken as it is. Only names the program defines are accepted (the inputs, `params`, `np`,
Python's builtins and names the expression binds itself), so a misspelt variable is refused
here with its name, before the sandbox is started.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable

from problems.api import Compact

MAX_CHARS = 2_000  # one expression; a longer one is a runaway generation
ALLOWED_MODULES = ("np",)


class Expression(Compact):
    """An equation skeleton written as the expression it returns."""

    what = "expression"

    def __init__(
        self, inputs: tuple[str, ...], statement: str, example: str, build: Callable[[str], str]
    ) -> None:
        self.inputs = inputs
        self.statement = statement
        self.example = example
        self._build = build  # expression source -> program

    def part(self, code: str) -> str | None:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return None
        for statement in tree.body:
            if isinstance(statement, ast.FunctionDef) and statement.name == "equation":
                body = statement.body
                if body and _is_docstring(body[0]):
                    body = body[1:]
                if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value:
                    return ast.unparse(body[0].value)
        return None

    def program(self, text: str) -> str:
        text = text.strip()
        if not text:
            raise ValueError("the candidate is empty")
        if len(text) > MAX_CHARS:
            raise ValueError(f"the expression is over {MAX_CHARS:,} characters")
        if "def equation" in text:
            return text if text.endswith("\n") else text + "\n"  # a whole program after all
        if text.startswith("return ") or text.startswith("return("):
            text = text[len("return") :].strip()
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as error:
            where = f" (line {error.lineno})" if error.lineno and "\n" in text else ""
            raise ValueError(f"not one Python expression: {error.msg}{where}") from None
        # Names a comprehension or a lambda binds, and Python's builtins (abs, min), are fine.
        bound = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
        bound |= {
            node.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
        }
        known = {*self.inputs, "params", *ALLOWED_MODULES, *bound, *dir(builtins)}
        unknown = sorted(
            {
                node.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Name) and node.id not in known
            }
        )
        if unknown:
            names = ", ".join(f"`{name}`" for name in unknown)
            allowed = ", ".join(self.inputs)
            raise ValueError(
                f"the expression uses {names}: only the inputs ({allowed}), params and np"
                " are defined"
            )
        return self._build(ast.unparse(tree.body))


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )
