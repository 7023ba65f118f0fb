"""The compact form of an equation: the candidate writes only the expression `equation` returns.

    params[0] * x + params[1] * v ** 3 + params[2] * np.sin(v)

becomes the program

    import numpy as np


    def equation(x, v, params):
        '''The acceleration.'''
        return params[0] * x + params[1] * v ** 3 + params[2] * np.sin(v)

The text is read by the grammar (grammar.py) and written back by `ast.unparse`, so spacing,
redundant parentheses, comments and assignments inlined do not make two programs of one
equation. A leading `return` is dropped; a whole program (a model that wrote the function
anyway) is read by the same grammar. What the grammar refuses is refused here with its reason,
before the sandbox is started, and the program is always the harness's writing of the parsed
expression, never the candidate's text.
"""

from __future__ import annotations

from collections.abc import Callable

from problems.api import Compact
from problems.equation_discovery import grammar


class Expression(Compact):
    """An equation skeleton written as the expression it returns."""

    what = "expression"
    # Asked for m "genuinely different forms", Qwen2.5-Coder-0.5B wrapped the whole current
    # expression in a different function each time (np.sin(...), np.exp(...), np.tan(...)),
    # which throws away the terms that fit. With this advice and the shorter compact prompt,
    # the demo's first prompt gave 190 valid candidates of 432 against 167, mean score 0.030
    # against 0.017 (benchmarks/results/prompt_probe.md).
    advice = (
        "Build each one on the current expression: keep its terms that fit and add a new term "
        "with its own params[k] (a power or a product of the inputs, or a function of one "
        "input), or change one term. Give each candidate a different new term."
    )

    def __init__(
        self, inputs: tuple[str, ...], statement: str, example: str, build: Callable[[str], str]
    ) -> None:
        self.inputs = inputs
        self.statement = statement
        self.example = example
        self._build = build  # expression source -> program

    def part(self, code: str) -> str | None:
        try:
            return grammar.read(code, self.inputs).text
        except grammar.Refused:
            return None

    def program(self, text: str) -> str:
        return self._build(grammar.read(text, self.inputs).text)  # Refused is a ValueError
