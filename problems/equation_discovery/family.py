"""One key per family of equations: two expressions that differ only in how their free constants
are written get the same key, so that a candidate which pads its parent with constants is known
for the copy it is before the sandbox fits it.

    params[0] * x + params[1] * v + params[2]
    params[0] * x + params[1] * v + params[2] + params[8] + params[9] - params[9]
    params[3] * (x + params[4]) + v * params[1]

are one family: fitted, each is a * x + b * v + c, keyed `c*1 + c*v + c*x`.

The rule (docs/problems.md, "Families"): two expressions share a key only when they are the same
function family up to the values of the fitted constants. The key is computed from the grammar's
tree (grammar.py: a bounded expression, never run) by a small algebra of our own:

- The expression is expanded into a sum of monomials over atoms, products over sums (and small
  whole powers of sums). An atom is an input, a constant `params[k]` (written `$k`), or a
  function, a power or a quotient of sums that is not opened, written with its expanded
  argument: `sin($1*x)`. Inside an atom every constant keeps its identity, so
  `p0*sin(p1*x) + p5*sin(p6*x)` is two terms, never one.
- Terms are grouped by the part that holds an input (the basis); what multiplies a basis is its
  coefficient, a polynomial in the constants. A coefficient is free (written `c`) when it can
  take every value whatever the other coefficients are: it holds a constant that appears in it
  only to the first power and nowhere else but in coefficients already found free (peeled one
  at a time, as a triangular system is solved). `params[3] * (x + params[4])` has two free
  coefficients (p3 and p3*p4); `params[0] * (x + v)` has none (one constant sets both), and
  `np.exp(params[0]) * x` none (it cannot be negative): they key as `$0*v + $0*x` and
  `exp($0)*x`.
- Constants are then renamed in order of first appearance, so renumbering them is one family.
- Numbers fold as the written program computes them, or not at all: a fold whose result is not
  a finite real number within 1e-100..1e100 in size (an overflow, a complex power, a division
  by zero, a subnormal staircase) keys the expression by its structure instead (below).
- A zero coefficient drops a monomial only where the monomial is finite for any finite inputs
  and constants (inputs to whole powers >= 0, constants to whole powers): `0.0 * np.log(x)` keeps
  its term (`0.0*log(x)`), since the program is NaN where log is not finite.
- An input divided by itself (`x / x`, `x ** 2 / x`) is not cancelled: the program is NaN where
  it is 0. The expression is keyed by its structure. Constants are taken as nonzero (the fit
  starts them at 1), so `params[7] / params[7]` is 1.

Every step is bounded: the tree has at most grammar.MAX_NODES nodes; a sum may hold at most
MAX_TERMS monomials, the whole expansion at most MAX_WORK monomial products, an atom's text
MAX_ATOM_CHARS and the key MAX_KEY_CHARS characters. Past any bound, or where a fold is not
exact (above), the key is `tree:` and a digest of the canonical text with its constants renamed
in order of appearance: the same expression up to renumbered constants, sound, never huge,
never an exception. A text the grammar refuses has no key (None).

Why: in the VPO grid on oscillator1 the policy learned to write its parent again padded with
`+ params[8] + params[9] - params[9]`: new code, so not a duplicate, scoring what the parent did
(benchmarks/results/discovery.md). Issue 56's red team then found the first key unbounded (a
438-character equation keyed to 37 million characters) and unsound (two sines keyed as one, a
child better than its parent thrown away as a repeat); benchmarks/results/family_cost.md counts
what that cost.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from dataclasses import dataclass

import numpy as np

from problems.equation_discovery import grammar

MAX_TERMS = 256  # monomials in one sum
MAX_WORK = 100_000  # monomial products and sums in one expansion
MAX_ATOM_CHARS = 1_000  # an atom's written text
MAX_KEY_CHARS = 4_000  # the key
MAX_POWER = 4  # a sum raised to a whole power up to this is multiplied out
SMALLEST, LARGEST = 1e-100, 1e100  # a folded number outside is not folded (the key falls back)

Monomial = tuple[tuple[str, int | float], ...]  # sorted (atom, exponent) pairs; () is 1
Sum = dict[Monomial, float]
_PARAM = re.compile(r"\$(\d+)")


class _Fallback(Exception):
    """The expansion is over a bound or would fold differently from the program."""


@dataclass(frozen=True)
class _Atom:
    holds_input: bool
    params: frozenset[str]  # the constants ($k) it holds
    opaque: bool  # a function, power or quotient (not an input or a constant)


def family_key(text: str, inputs: tuple[str, ...]) -> str | None:
    """The key of the equation family `text` states (an expression or a program the grammar
    accepts); None when the grammar refuses it."""
    try:
        equation = grammar.read(text, inputs)
    except grammar.Refused:
        return None
    return key_of(equation.tree, inputs)


def key_of(tree: ast.expr, inputs: tuple[str, ...]) -> str:
    """The family key of a tree the grammar accepted (see the module)."""
    algebra = _Algebra(frozenset(inputs))
    try:
        with np.errstate(all="ignore"):
            key = algebra.key(algebra.read(tree))
    except (_Fallback, RecursionError, MemoryError, OverflowError, ZeroDivisionError, ValueError):
        return structural_key(tree)
    return key


def structural_key(tree: ast.expr) -> str:
    """The tree's canonical text with its constants renamed in order of appearance, digested:
    equal only for one expression written with other constant numbers."""
    order: dict[str, str] = {}

    def renamed(match: re.Match[str]) -> str:
        return f"params[{order.setdefault(match.group(1), str(len(order)))}]"

    text = re.sub(r"params\[(\d+)\]", renamed, ast.unparse(tree))
    return "tree:" + hashlib.sha256(text.encode()).hexdigest()[:32]


class _Algebra:
    def __init__(self, inputs: frozenset[str]) -> None:
        self.inputs = inputs
        self.atoms: dict[str, _Atom] = {}
        self.work = 0

    # -- reading the tree ------------------------------------------------------------------

    def read(self, node: ast.expr) -> Sum:
        if isinstance(node, ast.BinOp):
            left, right = self.read(node.left), self.read(node.right)
            if isinstance(node.op, ast.Add):
                return self.add(left, right)
            if isinstance(node.op, ast.Sub):
                return self.add(left, self.scaled(right, -1.0))
            if isinstance(node.op, ast.Mult):
                return self.multiply(left, right)
            if isinstance(node.op, ast.Div):
                return self.multiply(left, self.inverse(right))
            return self.power(left, right)
        if isinstance(node, ast.UnaryOp):
            return self.scaled(self.read(node.operand), -1.0)
        if isinstance(node, ast.Constant):
            return _constant(_checked(float(node.value)))
        if isinstance(node, ast.Name):
            return {((self.atom(node.id, _Atom(True, frozenset(), False)), 1),): 1.0}
        if isinstance(node, ast.Subscript):
            assert isinstance(node.slice, ast.Constant)
            name = f"${node.slice.value}"
            return {((self.atom(name, _Atom(False, frozenset({name}), False)), 1),): 1.0}
        if isinstance(node, ast.Attribute):
            return _constant(math.pi if node.attr == "pi" else math.e)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Attribute)
            return self.function(node.func.attr, [self.read(arg) for arg in node.args])
        raise _Fallback  # the grammar admits nothing else

    def atom(self, text: str, facts: _Atom) -> str:
        if len(text) > MAX_ATOM_CHARS:
            raise _Fallback
        self.atoms.setdefault(text, facts)
        return text

    def opaque(self, text: str, *parts: Sum) -> Sum:
        """A function, power or quotient of `parts`, kept whole as one atom."""
        held = [a for part in parts for monomial in part for a, _ in monomial]
        facts = _Atom(
            any(self.atoms[a].holds_input for a in held),
            frozenset().union(*(self.atoms[a].params for a in held)),
            True,
        )
        return {((self.atom(text, facts), 1),): 1.0}

    # -- the algebra -----------------------------------------------------------------------

    def spend(self, amount: int) -> None:
        self.work += amount
        if self.work > MAX_WORK:
            raise _Fallback

    def add(self, a: Sum, b: Sum) -> Sum:
        self.spend(len(a) + len(b))
        total = dict(a)
        for monomial, value in b.items():
            total[monomial] = _checked(total[monomial] + value) if monomial in total else value
        result = {m: v for m, v in total.items() if v != 0.0 or not self.safe(m)}
        if len(result) > MAX_TERMS:
            raise _Fallback
        return result

    def scaled(self, terms: Sum, factor: float) -> Sum:
        return {m: _checked(v * factor) for m, v in terms.items()}

    def multiply(self, a: Sum, b: Sum) -> Sum:
        if not a or not b:  # an exact zero: it keeps the monomials that can be non-finite
            return {m: 0.0 for m in (a or b) if not self.safe(m)}
        if len(a) * len(b) > MAX_TERMS:
            raise _Fallback
        self.spend(len(a) * len(b))
        total: Sum = {}
        for monomial_a, value_a in a.items():
            for monomial_b, value_b in b.items():
                monomial = self.joined(monomial_a, monomial_b)
                value = _checked(value_a * value_b)
                total[monomial] = _checked(total[monomial] + value) if monomial in total else value
        return {m: v for m, v in total.items() if v != 0.0 or not self.safe(m)}

    def joined(self, a: Monomial, b: Monomial) -> Monomial:
        powers = dict(a)
        for atom, power in b:
            if atom in powers:
                before = powers[atom]
                if self.atoms[atom].holds_input and (before < 0) != (power < 0):
                    raise _Fallback  # x / x is NaN at 0: not cancelled (see the module)
                powers[atom] = before + power
            else:
                powers[atom] = power
        return tuple(sorted((atom, p) for atom, p in powers.items() if p != 0))

    def inverse(self, terms: Sum) -> Sum:
        if len(terms) == 1:
            ((monomial, value),) = terms.items()
            if value == 0.0:
                raise _Fallback  # a division by zero: the program raises or gives inf
            return {tuple((atom, -p) for atom, p in monomial): _checked(1.0 / value)}
        if not terms:
            raise _Fallback
        return self.power_atom(terms, -1)

    def power_atom(self, base: Sum, exponent: int) -> Sum:
        """(base) ** exponent with base kept whole as one atom: `(x + $1)^-1`."""
        atom = self.opaque(f"({self.written(base)})", base)
        ((monomial, _),) = atom.items()
        return {((monomial[0][0], exponent),): 1.0}

    def power(self, base: Sum, exponent: Sum) -> Sum:
        n, b = _number(exponent), _number(base)
        if n is not None and b is not None:
            return _constant(_checked(float(np.float64(b) ** n)))
        if n is not None and float(n).is_integer() and abs(n) <= grammar.MAX_LITERAL:
            whole = int(n)
            if whole == 0:
                return {(): 1.0}  # numpy: anything ** 0 is 1, NaN and inf included
            if len(base) == 1:
                ((monomial, value),) = base.items()  # (c * x * v^2) ** 3: each factor powered
                if value == 0.0 and whole < 0:
                    raise _Fallback
                powered = tuple((atom, p * whole) for atom, p in monomial)
                return {powered: _checked(float(np.float64(value) ** whole))}
            if 2 <= whole <= MAX_POWER:
                result = base
                for _ in range(whole - 1):
                    result = self.multiply(result, base)
                return result
            if base and whole < 0 and -whole <= MAX_POWER:
                return self.power_atom(base, whole)
        written = f"({self.written(base)})**({self.written(exponent)})"
        return self.opaque(written, base, exponent)

    def function(self, name: str, args: list[Sum]) -> Sum:
        numbers = [_number(arg) for arg in args]
        if all(n is not None for n in numbers):
            value = getattr(np, name)(*[np.float64(n) for n in numbers])  # type: ignore[arg-type]
            return _constant(_checked(float(value)))
        if name == "square":
            return self.power(args[0], _constant(2.0))
        if name == "power":
            return self.power(args[0], args[1])
        inside = ", ".join(self.written(arg) for arg in args)
        return self.opaque(f"{name}({inside})", *args)

    def safe(self, monomial: Monomial) -> bool:
        """Finite for any finite inputs and constants: inputs to whole powers >= 0, constants
        to whole powers (nonzero, see the module), nothing opaque."""
        for atom, power in monomial:
            facts = self.atoms[atom]
            if facts.opaque or not float(power).is_integer():
                return False
            if facts.holds_input and power < 0:
                return False
        return True

    # -- writing ---------------------------------------------------------------------------

    def written(self, terms: Sum) -> str:
        """A sum as text, its terms sorted; over MAX_ATOM_CHARS is a fallback."""
        parts = []
        length = 0
        for monomial, value in terms.items():
            text = _term(monomial, value)
            length += len(text) + 3
            if length > MAX_ATOM_CHARS:
                raise _Fallback
            parts.append(text)
        return " + ".join(sorted(parts, key=_order)) or "0"

    def key(self, terms: Sum) -> str:
        """Group by basis, find the free coefficients, write, rename the constants."""
        coefficients: dict[Monomial, Sum] = {}
        zeros: list[Monomial] = []
        for monomial, value in terms.items():
            basis = tuple((a, p) for a, p in monomial if self.atoms[a].holds_input)
            rest = tuple((a, p) for a, p in monomial if not self.atoms[a].holds_input)
            if value == 0.0:  # kept only where it can be non-finite: never merged into a c
                zeros.append(monomial)
                continue
            coefficients.setdefault(basis, {})[rest] = value
        free = self.free(coefficients, zeros)
        parts = [f"0.0*{_monomial(monomial)}" for monomial in zeros]
        for basis, coefficient in coefficients.items():
            written = "c" if basis in free else self.coefficient(coefficient)
            parts.append(f"{written}*{_monomial(basis)}")
        text = " + ".join(sorted(parts, key=_order)) or "0"
        order: dict[str, int] = {}
        key = _PARAM.sub(lambda m: f"${order.setdefault(m.group(1), len(order))}", text)
        if len(key) > MAX_KEY_CHARS:
            raise _Fallback
        return key

    def coefficient(self, coefficient: Sum) -> str:
        text = self.written(coefficient)
        return text if len(coefficient) == 1 else f"({text})"

    def free(self, coefficients: dict[Monomial, Sum], zeros: list[Monomial]) -> set[Monomial]:
        """The bases whose coefficients are free, peeled one at a time: a coefficient with a
        constant to the first power that appears nowhere but in it and in coefficients
        already peeled can take any value whatever the rest are (solve the peeled ones from
        the last to the first, each for its own constant). Each peel uses up a constant, so
        there are at most ten."""
        fixed: set[str] = set()  # constants in bases, in opaque atoms, in the kept zeros
        for monomial in [*coefficients, *zeros]:
            for atom, _ in monomial:
                fixed |= self.atoms[atom].params
        holders = {}
        for basis, coefficient in coefficients.items():
            holders[basis] = set()
            for monomial in coefficient:
                for atom, _ in monomial:
                    facts = self.atoms[atom]
                    (fixed if facts.opaque else holders[basis]).update(facts.params)
        unpeeled = dict.fromkeys(fixed, 2)  # a count over 1: never a pivot
        for held in holders.values():
            for param in held:
                unpeeled[param] = unpeeled.get(param, 0) + 1
        free: set[Monomial] = set()
        progress = True
        while progress:
            progress = False
            for basis, coefficient in coefficients.items():
                if basis in free:
                    continue
                if any(unpeeled[p] == 1 and _linear(coefficient, p) for p in holders[basis]):
                    free.add(basis)
                    progress = True
                    for param in holders[basis]:
                        unpeeled[param] -= 1
        return free


def _linear(coefficient: Sum, param: str) -> bool:
    """Whether `param` appears in the coefficient only to the first power."""
    powers = [p for monomial in coefficient for atom, p in monomial if atom == param]
    return bool(powers) and all(p == 1 for p in powers)


def _checked(value: float) -> float:
    """A folded number as the program has it, or a fallback where the program's arithmetic
    (Python floats, numpy scalars) could differ from ours: not finite, complex (NaN here),
    or so small or large that a reordered product under- or overflows."""
    if value != value or value in (math.inf, -math.inf):
        raise _Fallback
    if value != 0.0 and not SMALLEST <= abs(value) <= LARGEST:
        raise _Fallback
    return float(value)


def _constant(value: float) -> Sum:
    return {(): value} if value != 0.0 else {}


def _number(terms: Sum) -> float | None:
    """The value of a sum that is a number alone; None when it holds an atom."""
    if not terms:
        return 0.0
    if len(terms) == 1 and () in terms:
        return terms[()]
    return None


def _term(monomial: Monomial, value: float) -> str:
    if not monomial:
        return repr(value)
    return _monomial(monomial) if value == 1.0 else f"{value!r}*{_monomial(monomial)}"


def _monomial(monomial: Monomial) -> str:
    if not monomial:
        return "1"
    return "*".join(atom if p == 1 else f"{atom}^{_exponent(p)}" for atom, p in monomial)


def _exponent(power: int | float) -> str:
    return str(int(power)) if float(power).is_integer() else repr(float(power))


def _order(text: str) -> tuple[str, str]:
    """Sort terms by their text with constants anonymous first, so renumbered constants sort
    alike where they can."""
    return _PARAM.sub("$", text), text
