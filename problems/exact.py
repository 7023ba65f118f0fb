"""Strict reading of the numbers a candidate returns, and exact arithmetic on float64 values.

Scorers use these so that feasibility never depends on rounding. Every finite float64 is an
integer times a power of two, so a list of them is exactly `m_i * 2**e` for integers m_i and
one shared e: sums, differences and products of those integers are exact, and a comparison
between them is the true comparison between the returned numbers, whatever their magnitude
(2**50 or 5e-324 alike). Only a final objective value is rounded to float64, and then in the
direction that can only understate the candidate's achievement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from problems.api import Infeasible

# The largest integer float64 holds exactly together with all smaller ones; a larger integer
# would be scored as some neighbouring value, not as the number the candidate returned.
EXACT_INT = 2**53
MAX_DIMENSIONS = 8


def real_array(value: Any, what: str, limit: int, too_large: str) -> np.ndarray:
    """`value` (a numpy array, or nested lists of numbers) as a float64 array holding exactly
    the numbers returned; Infeasible if it holds more than `limit` numbers (with the message
    `too_large`), is ragged, holds anything but real numbers (bool, complex, str, None, ...), or
    a number float64 cannot represent exactly. NaN and infinity pass: each caller words its own
    refusal of them."""
    if isinstance(value, np.ndarray):
        # Size first: everything after this is at least linear in it.
        if value.size > limit:
            raise Infeasible(too_large)
        return _from_numpy(value, what)
    if not isinstance(value, list | tuple):
        raise Infeasible(
            f"{what} must hold real numbers in a list or array, got {type(value).__name__}"
        )
    _check_nested(value, what, limit, too_large)
    # Every leaf is now a float or an int within 2**53, and the nesting is rectangular, so this
    # conversion neither fails nor rounds.
    return np.array(value, dtype=np.float64)


def _check_nested(value: list | tuple, what: str, limit: int, too_large: str) -> None:
    """Walk nested lists level by level without building anything larger than `limit` items.
    Rows may be numpy arrays (a list of array rows is a common way to return points)."""
    level: list[Any] = [value]
    depth = 0
    while level and all(_is_row(item) for item in level):
        depth += 1
        if depth > MAX_DIMENSIONS:  # numpy refuses more than 64; no scorer wants more than 2
            raise Infeasible(f"{what} is nested more than {MAX_DIMENSIONS} lists deep")
        lengths = {len(item) for item in level}
        if len(lengths) != 1:
            raise Infeasible(f"{what} is not a rectangular array (rows of different lengths)")
        if len(level) * lengths.pop() > limit:
            raise Infeasible(too_large)
        level = [inner for item in level for inner in item]
    for leaf in level:
        if _is_row(leaf):
            raise Infeasible(f"{what} is not a rectangular array (lists mixed with numbers)")
        _check_number(leaf, what)


def _is_row(item: Any) -> bool:
    return isinstance(item, list | tuple) or (isinstance(item, np.ndarray) and item.ndim > 0)


def _check_number(leaf: Any, what: str) -> None:
    # bool is an int to Python and numpy alike, but True is no coordinate: refuse it by type.
    if isinstance(leaf, bool | np.bool_):
        raise Infeasible(f"{what} must hold real numbers, found a bool")
    if isinstance(leaf, int | np.integer):
        if not -EXACT_INT <= int(leaf) <= EXACT_INT:
            raise Infeasible(f"{what} holds an integer beyond 2^53, which float64 cannot hold")
        return
    if isinstance(leaf, float | np.floating) and np.dtype(type(leaf)).itemsize <= 8:
        return
    raise Infeasible(f"{what} must hold real numbers, found a {type(leaf).__name__}")


def _from_numpy(array: np.ndarray, what: str) -> np.ndarray:
    kind = array.dtype.kind
    if kind not in "iuf":
        raise Infeasible(f"{what} must hold real numbers, got dtype {array.dtype}")
    if kind in "iu":
        if array.size and (array.max() > EXACT_INT or array.min() < -EXACT_INT):
            raise Infeasible(f"{what} holds an integer beyond 2^53, which float64 cannot hold")
        return array.astype(np.float64)
    with np.errstate(over="ignore"):  # a long double beyond float64's range is refused below
        converted = array.astype(np.float64)
    if array.dtype.itemsize > 8:
        # long double: refuse what float64 would round (NaN and infinity are left to callers).
        finite = np.isfinite(array)
        inexact = finite & ~(converted.astype(array.dtype) == array)
        if inexact.any() or not np.isfinite(converted[finite]).all():
            raise Infeasible(f"{what} holds a {array.dtype} number float64 cannot represent")
    return converted


def integers(values: Iterable[float]) -> tuple[list[int], int]:
    """Integers m_i and a shift s >= 0 with values[i] == m_i / 2**s exactly (finite values).

    The shift is never negative, so 1 is the integer 2**s in the same units.
    """
    ratios = [float(v).as_integer_ratio() for v in values]
    # Each denominator is a power of two: its bit length minus one is its exponent.
    shift = max((d.bit_length() - 1 for _, d in ratios), default=0)
    return [n << (shift - d.bit_length() + 1) for n, d in ratios], shift


def float_down(q: Fraction) -> float:
    """The largest float64 <= q (q within float64's range)."""
    f = float(q)  # int / int in Python is correctly rounded: at most one step off
    return math.nextafter(f, -math.inf) if Fraction(f) > q else f


def float_up(q: Fraction) -> float:
    """The smallest float64 >= q (q within float64's range)."""
    f = float(q)
    return math.nextafter(f, math.inf) if Fraction(f) < q else f


def sqrt_down(q: Fraction) -> float:
    """A float64 <= sqrt(q), within a few units in the last place of it (q >= 0)."""
    if q <= 0:
        return 0.0
    # Scale so the integer square root carries about 64 significant bits, then round down.
    bits = q.numerator.bit_length() - q.denominator.bit_length()
    k = max(0, 64 - bits // 2)
    root = math.isqrt((q.numerator << (2 * k)) // q.denominator)
    return float_down(Fraction(root, 1 << k))
