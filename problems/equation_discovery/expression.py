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
from problems.equation_discovery import addition, grammar


class Expression(Compact):
    """An equation skeleton written as the expression it returns."""

    what = "expression"
    # Asked for m "genuinely different forms", Qwen2.5-Coder-0.5B wrapped the whole current
    # expression in a different function each time (np.sin(...), np.exp(...), np.tan(...)),
    # which throws away the terms that fit; asked to build on the current expression, it
    # mostly rewrote it with the terms dropped or copied it whole. A candidate may therefore be
    # `+ <term>`, which the harness adds to the parent's expression (`reader`), the example
    # candidates show that form, and the answer opens with it: on the demo's first prompt 31
    # of 192 slots beat the seed against 2 (benchmarks/results/prompt_probe_addition.md).
    advice = (
        "Build each one on the current expression: write + and a new term with its own "
        "params[k] (a power or a product of the inputs, or a function of one input), which is "
        "added to the current expression, or write a whole expression that changes one of its "
        "terms. Give each candidate a different new term."
    )
    sketches = ("+ params[3] * ...a new term...", "+ params[3] * ...another new term...")
    opening = "+"

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

    def reader(self, parent_code: str) -> Callable[[str], str]:
        """`program`, but a candidate that starts with + is a term added to the parent's
        expression (`addition.extend`)."""

        def read(text: str) -> str:
            if not text.lstrip().startswith("+"):
                return self.program(text)
            base = self.part(parent_code)
            if base is None:
                raise grammar.Refused(
                    "the current program is not one expression, so nothing can be added to it:"
                    " write a whole expression"
                )
            return self._build(addition.extend(base, text, self.inputs).text)

        return read
