"""One key per family of equations: two expressions that differ only in how their free constants
are written get the same key, so that a candidate which pads its parent with constants is known
for the copy it is before the sandbox fits it.

    params[0] * x + params[1] * v + params[2]
    params[0] * x + params[1] * v + params[2] + params[8] + params[9] - params[9]
    params[3] * (x + params[4]) + v * params[1]

are one family: fitted, each is a * x + b * v + c. The key is read from Python's parser, never
`eval`ed: each `params[i]` becomes a symbol, the inputs become symbols, `np.<function>` becomes
sympy's function, and the product is expanded over its sums (not inside powers or functions).
Each term splits into a coefficient (numbers and constants only) and a basis (what holds an
input); terms of one basis add up. A basis whose coefficient holds a constant is free ("c"); one
whose coefficients are numbers keeps their sum (and is dropped when it is 0). Constants inside a
basis (`np.sin(params[3] * x)`) are all written `c`, so a renaming of them is the same family.

An expression with anything else (a comparison, a conditional, an unknown function, an index
that is not `params[i]`), or one whose expansion could exceed `MAX_TERMS` terms, has no key: it
is compared by its code alone.

Why: in the VPO grid on oscillator1 the policy learned to write its parent again padded with
`+ params[8] + params[9] - params[9]`: new code, so not a duplicate, scoring what the parent did
(benchmarks/results/discovery.md); the padding grew until the completions were cut.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import sympy

MAX_TERMS = 256

_UNARY: dict[str, Callable[[Any], Any]] = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "exp": sympy.exp, "log": sympy.log,
    "sqrt": sympy.sqrt, "abs": sympy.Abs, "absolute": sympy.Abs, "tanh": sympy.tanh,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "arcsin": sympy.asin, "arccos": sympy.acos,
    "arctan": sympy.atan, "square": lambda a: a**2, "cbrt": lambda a: sympy.cbrt(a),
    "log10": lambda a: sympy.log(a, 10), "log2": lambda a: sympy.log(a, 2),
}  # fmt: skip
_CONSTANTS = {"pi": sympy.pi, "e": sympy.E}
_FREE = sympy.Symbol("c")


class _NoKey(Exception):
    pass


def family_key(expression: str, inputs: tuple[str, ...]) -> str | None:
    """The key of the equation family `expression` (in `inputs` and `params[i]`) stands for;
    None when it has none (see the module)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    try:
        if _term_bound(tree.body) > MAX_TERMS:
            return None
        reader = _Reader(inputs)
        expr = reader.read(tree.body)
        expanded = sympy.expand(
            expr, multinomial=False, power_exp=False, power_base=False, log=False
        )
    except (_NoKey, RecursionError, TypeError, ValueError, ZeroDivisionError):
        return None
    params = reader.params
    sums: dict[str, Any] = {}
    for term in sympy.Add.make_args(expanded):
        coefficient, basis = [], []
        for factor in sympy.Mul.make_args(term):
            (basis if factor.free_symbols - params else coefficient).append(factor)
        written = str(sympy.Mul(*basis).subs({p: _FREE for p in params}))
        value = sympy.Mul(*coefficient)
        value = _FREE if value.free_symbols & params else value
        total = sums.get(written, 0)
        sums[written] = _FREE if _FREE in (total, value) else total + value
    parts = sorted(f"{'c' if v is _FREE else v}*{b}" for b, v in sums.items() if v != 0)
    return " + ".join(parts) or "0"


class _Reader:
    """A parsed expression as a sympy expression, node by node; anything else is _NoKey."""

    def __init__(self, inputs: tuple[str, ...]) -> None:
        self.inputs = {name: sympy.Symbol(name) for name in inputs}
        self.params: set[sympy.Symbol] = set()

    def read(self, node: ast.AST) -> Any:
        if isinstance(node, ast.BinOp):
            left, right = self.read(node.left), self.read(node.right)
            operator = type(node.op)
            if operator is ast.Add:
                return left + right
            if operator is ast.Sub:
                return left - right
            if operator is ast.Mult:
                return left * right
            if operator is ast.Div:
                return left / right
            if operator is ast.Pow:
                return left**right
            raise _NoKey
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.read(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return sympy.Integer(node.value) if type(node.value) is int else sympy.Float(node.value)
        if isinstance(node, ast.Name) and node.id in self.inputs:
            return self.inputs[node.id]
        if isinstance(node, ast.Subscript):
            return self._param(node)
        if isinstance(node, ast.Attribute) and _is_np(node.value) and node.attr in _CONSTANTS:
            return _CONSTANTS[node.attr]
        if isinstance(node, ast.Call) and not node.keywords:
            return self._call(node)
        raise _NoKey

    def _param(self, node: ast.Subscript) -> Any:
        index = node.slice
        if (
            isinstance(node.value, ast.Name)
            and node.value.id == "params"
            and isinstance(index, ast.Constant)
            and type(index.value) is int
        ):
            symbol = sympy.Symbol(f"params_{index.value}")
            self.params.add(symbol)
            return symbol
        raise _NoKey

    def _call(self, node: ast.Call) -> Any:
        function = node.func
        if isinstance(function, ast.Attribute) and _is_np(function.value):
            name = function.attr
        elif isinstance(function, ast.Name) and function.id == "abs":
            name = "abs"
        else:
            raise _NoKey
        args = [self.read(arg) for arg in node.args]
        if name == "power" and len(args) == 2:
            return args[0] ** args[1]
        if name in _UNARY and len(args) == 1:
            return _UNARY[name](args[0])
        raise _NoKey


def _is_np(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "np"


def _term_bound(node: ast.AST) -> int:
    """An upper bound on the terms expanding `node` gives (products multiply, sums add; a power
    or a function is one term: the expansion does not open them)."""
    if isinstance(node, ast.BinOp):
        left, right = _term_bound(node.left), _term_bound(node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return left + right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left
        return 1
    if isinstance(node, ast.UnaryOp):
        return _term_bound(node.operand)
    return 1
