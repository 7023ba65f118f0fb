"""One key per family of equations: two expressions that differ only in how their free constants
are written get the same key, so that a candidate which pads its parent with constants is known
for the copy it is before the sandbox fits it.

    params[0] * x + params[1] * v + params[2]
    params[0] * x + params[1] * v + params[2] + params[8] + params[9] - params[9]
    params[3] * (x + params[4]) + v * params[1]

are one family: fitted, each is a * x + b * v + c. The key is computed from the grammar's tree
(grammar.py: a bounded expression, never run), by a small algebra of our own: the expression is
expanded into a sum of terms, products over sums (not inside powers or functions). Each term is
a coefficient (numbers and params only) times a basis (a product of powers of inputs,
functions and other atoms that hold an input); terms of one basis add up. A coefficient that
holds a param is free ("c"); a numeric one is kept as a float (and the term dropped when it is
0). Inside a function or a power that is not opened, every param is written c, so a renaming of
them is the same family.

Every step is bounded: the tree has at most grammar.MAX_NODES nodes, a product that would hold
more than MAX_TERMS terms gives no key, and numbers are float64 with overflow to inf (never an
exception, never a huge integer): `np.exp(np.exp(100.0)) * x` and `x + 0 * 9 ** 9 ** 9` have
keys like any other expression. A text the grammar refuses has no key (None).

Why: in the VPO grid on oscillator1 the policy learned to write its parent again padded with
`+ params[8] + params[9] - params[9]`: new code, so not a duplicate, scoring what the parent did
(benchmarks/results/discovery.md); the padding grew until the completions were cut.
"""

from __future__ import annotations

import ast
import math

import numpy as np

from problems.equation_discovery import grammar

MAX_TERMS = 256


class _Free:
    """The coefficient of a term that holds a fitted constant."""

    def __repr__(self) -> str:
        return "c"


FREE = _Free()
Coefficient = float | _Free
Basis = tuple[tuple[str, float], ...]  # sorted (atom, exponent) pairs; () is the constant 1
Sum = dict[Basis, Coefficient]


class _NoKey(Exception):
    pass


def family_key(text: str, inputs: tuple[str, ...]) -> str | None:
    """The key of the equation family `text` states (an expression or a program the grammar
    accepts); None when the grammar refuses it or its expansion is too large."""
    try:
        equation = grammar.read(text, inputs)
    except grammar.Refused:
        return None
    return key_of(equation.tree, inputs)


def key_of(tree: ast.expr, inputs: tuple[str, ...]) -> str | None:
    """The family key of a tree the grammar accepted; None when its expansion is too large."""
    try:
        with np.errstate(all="ignore"):
            return _written(_Algebra(frozenset(inputs)).read(tree))
    except _NoKey:
        return None


def _written(terms: Sum) -> str:
    parts = sorted(f"{_number(c)}*{_basis(b)}" for b, c in terms.items())
    return " + ".join(parts) or "0"


def _number(value: Coefficient) -> str:
    return "c" if value is FREE else repr(float(value))


def _basis(basis: Basis) -> str:
    if not basis:
        return "1"
    return "*".join(atom if power == 1.0 else f"{atom}^{power!r}" for atom, power in basis)


class _Algebra:
    def __init__(self, inputs: frozenset[str]) -> None:
        self.inputs = inputs

    def read(self, node: ast.expr) -> Sum:
        if isinstance(node, ast.BinOp):
            left, right = self.read(node.left), self.read(node.right)
            if isinstance(node.op, ast.Add):
                return _add(left, right)
            if isinstance(node.op, ast.Sub):
                return _add(left, _scaled(right, -1.0))
            if isinstance(node.op, ast.Mult):
                return _multiply(left, right)
            if isinstance(node.op, ast.Div):
                return _multiply(left, _inverse(right))
            return _power(left, right)
        if isinstance(node, ast.UnaryOp):
            return _scaled(self.read(node.operand), -1.0)
        if isinstance(node, ast.Constant):
            return _constant(float(node.value))
        if isinstance(node, ast.Name):
            return {((node.id, 1.0),): 1.0}
        if isinstance(node, ast.Subscript):
            return {(): FREE}
        if isinstance(node, ast.Attribute):
            return _constant(math.pi if node.attr == "pi" else math.e)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Attribute)
            return _function(node.func.attr, [self.read(arg) for arg in node.args])
        raise _NoKey  # the grammar admits nothing else


def _constant(value: float) -> Sum:
    return {(): value} if value != 0.0 else {}


def _number_of(terms: Sum) -> Coefficient | None:
    """The value of a sum that holds no input (a number, or FREE); None when it holds one."""
    if not terms:
        return 0.0
    if len(terms) == 1 and () in terms:
        return terms[()]
    return None


def _add(a: Sum, b: Sum) -> Sum:
    total = dict(a)
    for basis, value in b.items():
        if basis in total:
            other = total[basis]
            value = FREE if FREE in (other, value) else float(np.float64(other) + value)  # type: ignore[arg-type]
        total[basis] = value
    return {basis: value for basis, value in total.items() if value is FREE or value != 0.0}


def _scaled(terms: Sum, factor: float) -> Sum:
    return {b: v if v is FREE else float(np.float64(v) * factor) for b, v in terms.items()}


def _times(a: Coefficient, b: Coefficient) -> Coefficient:
    return FREE if FREE in (a, b) else float(np.float64(a) * b)  # type: ignore[arg-type]


def _multiply(a: Sum, b: Sum) -> Sum:
    if len(a) * len(b) > MAX_TERMS:
        raise _NoKey
    total: Sum = {}
    for basis_a, value_a in a.items():
        for basis_b, value_b in b.items():
            total = _add(total, {_joined(basis_a, basis_b): _times(value_a, value_b)})
    return total


def _joined(a: Basis, b: Basis) -> Basis:
    powers = dict(a)
    for atom, power in b:
        powers[atom] = float(np.float64(powers.get(atom, 0.0)) + power)
    return tuple(sorted((atom, p) for atom, p in powers.items() if p != 0.0))


def _inverse(terms: Sum) -> Sum:
    """1 / terms: a single term is inverted (a free coefficient stays free); a sum becomes an
    atom to the power -1."""
    if len(terms) == 1:
        ((basis, value),) = terms.items()
        inverted = FREE if value is FREE else float(np.float64(1.0) / value)  # type: ignore[arg-type]
        return {tuple((atom, -p) for atom, p in basis): inverted}
    if not terms:
        return _constant(math.inf)
    return {((f"({_written(terms)})", -1.0),): 1.0}


def _power(base: Sum, exponent: Sum) -> Sum:
    n = _number_of(exponent)
    b = _number_of(base)
    if n is not None and b is not None:
        return {(): FREE} if FREE in (n, b) else _constant(float(np.float64(b) ** n))  # type: ignore[operator]
    if n is not None and n is not FREE and float(n).is_integer() and len(base) == 1:
        ((basis, value),) = base.items()  # (c * x * v^2) ** 3: each factor to the power
        coefficient = FREE if value is FREE else float(np.float64(value) ** n)  # type: ignore[operator]
        powered = tuple((atom, float(np.float64(p) * n)) for atom, p in basis)  # type: ignore[arg-type]
        return {tuple(sorted((a, p) for a, p in powered if p != 0.0)): coefficient}
    if n is not None and n is not FREE and len(base) == 1 and _is_atom(base):
        ((basis, _),) = base.items()  # x ** 0.5
        return {((basis[0][0], float(n)),): 1.0}  # type: ignore[arg-type]
    written = f"({_written(base)})**({_written(exponent)})"
    return {((written, 1.0),): 1.0}


def _is_atom(terms: Sum) -> bool:
    ((basis, value),) = terms.items()
    return value == 1.0 and len(basis) == 1 and basis[0][1] == 1.0


def _function(name: str, args: list[Sum]) -> Sum:
    numbers = [_number_of(arg) for arg in args]
    if all(n is not None for n in numbers):
        if FREE in numbers:
            return {(): FREE}
        return _constant(float(getattr(np, name)(*[np.float64(n) for n in numbers])))  # type: ignore[arg-type]
    if name == "square":
        return _power(args[0], _constant(2.0))
    if name == "power":
        return _power(args[0], args[1])
    inside = ", ".join(_written(arg) for arg in args)
    return {((f"{name}({inside})", 1.0),): 1.0}
