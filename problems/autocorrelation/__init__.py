"""Autocorrelation inequalities and Erdős' minimum overlap: step functions, four objectives.

One search program answers four questions, each scored by its own verifier (AlphaEvolve,
Novikov et al., arXiv 2506.13131, Appendix B.1-B.3 and B.5; the conventions follow the notes
in the AlphaEvolve results notebook and are written out in DESCRIPTION below):

- c1, the first autocorrelation inequality, an upper bound (lower is better): f >= 0 on
  [-1/4, 1/4] with N equal steps of heights a; bound = 2N max(a * a) / (sum a)^2.
  1.5098 (Matolcsi and Vinuesa) -> 1.5053 (AlphaEvolve) -> 1.503133 (ThetaEvolve, Wang et al.,
  arXiv 2511.23473).
- c2, the second, a lower bound (higher is better): f >= 0; with g = a * a sampled on
  [-1/2, 1/2], ratio = ||g||_2^2 / (||g||_1 ||g||_inf), the L2 norm taken on the piecewise-linear
  interpolation of the samples. 0.88922 (Matolcsi and Vinuesa) -> 0.8962 (AlphaEvolve) ->
  0.96102 (Georgiev, Gómez-Serrano, Tao and Wagner, arXiv 2511.02864).
- c3, the third, an upper bound: heights may be negative; bound = |2N max(a * a) / (sum a)^2|.
  1.4581 (Vinuesa) -> 1.4557 (AlphaEvolve).
- erdos, Erdős' minimum overlap, an upper bound: h on [0, 2] with values in [0, 1] and integral 1
  (N steps, sum h = N / 2); bound = max over shifts of the correlation of h with 1 - h, times
  2 / N. 0.380927 (Haugland) -> 0.380924 (AlphaEvolve) -> 0.380876 (TTT-Discover, arXiv
  2601.16175, as a secondary summary quotes it).

Verifiers recompute everything from the returned heights. They refuse what AlphaEvolve's authors
saw candidates exploit in naive scorers: negative heights where the inequality forbids them,
values so small they underflow (heights are rescaled by an exact power of two first, so scale
cannot matter), NaN and infinity, complex numbers, and an Erdős function whose sum is not N/2
(it is rescaled to N/2 and must then still lie in [0, 1], decided in exact arithmetic so that
no rounding lets a height of 1 + 1e-17 through). Booleans, integers beyond 2^53 and more than
MAX_STEPS heights are refused before anything is computed. Sums use math.fsum; the values
themselves are float64 computations (a convolution of 50k steps in exact arithmetic would not
fit the time a verifier has).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from problems import exact
from problems.api import Anchor, Call, Infeasible, Objective, Problem

# The verifier convolves directly (no FFT rounding): 50k steps took 0.24 s on a 2-core CPU.
MAX_STEPS = 60_000

SOURCE_AE = "AlphaEvolve, Novikov et al., arXiv 2506.13131, Appendix B"
SOURCE_AE2 = "Georgiev, Gómez-Serrano, Tao and Wagner, arXiv 2511.02864 (50,000 steps)"
SOURCE_THETA = "ThetaEvolve, Wang et al., arXiv 2511.23473"
SOURCE_MV = "Matolcsi and Vinuesa 2010, as AlphaEvolve (arXiv 2506.13131) quotes it"
SOURCE_VINUESA = "Vinuesa's thesis, as AlphaEvolve (arXiv 2506.13131) quotes it"
SOURCE_HAUGLAND = "Haugland 2016, as AlphaEvolve (arXiv 2506.13131) quotes it"
SOURCE_TTT = "TTT-Discover, Yuksekgonul et al., arXiv 2601.16175, as a secondary summary quotes it"

DESCRIPTION = """\
Find step functions that prove four bounds. Write a Python function

    def construct(kind: str) -> list[float]

that returns the heights of a step function with N equal steps (1 <= N <= {max_steps}). It is
called four times, each call in its own process with a time limit of {limit:g} seconds, with
kind = "c1", "c2", "c3" and "erdos"; numpy and scipy are available. The function may search or
optimise, but only the returned heights count. Below, a * a is the full discrete
autoconvolution of the heights (numpy.convolve(a, a)), computed in float64.

- "c1" (lower is better): heights >= 0, not all 0, of f on [-1/4, 1/4].
  Score value: 2 N max(a * a) / (sum a)^2. Best known 1.503133.
- "c2" (higher is better): heights >= 0, not all 0. With y the samples of a * a padded with
  one 0 at each end (2N + 1 points, equally spaced on [-1/2, 1/2]):
  value = L2 / (L1 * Linf), where L2 = sum over neighbouring pairs of (y_i^2 + y_i y_(i+1) +
  y_(i+1)^2) / 3 (the squared L2 norm of the piecewise-linear interpolation), L1 = sum of y and
  Linf = max of y (the common step width cancels). Best known 0.96102.
- "c3" (lower is better): heights may be negative; sum a must not be 0.
  Value: |2 N max(a * a) / (sum a)^2|. Best known 1.4557.
- "erdos" (lower is better): h on [0, 2] with values in [0, 1] and integral 1, that is
  sum h = N / 2. The heights are rescaled to make the sum exactly N / 2 and must then lie in
  [0, 1]. Value: max over all shifts of numpy.correlate(h, 1 - h, "full"), times 2 / N.
  Best known 0.380876.

Heights must be finite real numbers. Their scale never matters (each value is unchanged when all
heights are multiplied by the same positive number), so tiny or huge heights gain nothing. The
score for each kind is the best known value divided by yours (yours divided by it for c2),
capped at 1.
"""

SEED_PROGRAM = '''\
import numpy as np


def construct(kind):
    """Flat step functions: an honest start for every kind."""
    n = 64
    if kind == "erdos":
        return [0.5] * n  # sum = n / 2: integral 1 over [0, 2]
    return np.ones(n).tolist()
'''


def heights(value: Any, *, allow_negative: bool) -> np.ndarray:
    """The returned heights as float64, checked, and rescaled by an exact power of two so that
    the largest magnitude lies in [0.5, 1): no later sum or product can underflow."""
    if not isinstance(value, np.ndarray | list | tuple):
        raise Infeasible(f"expected a list of heights, got {type(value).__name__}")
    too_many = f"expected 1 to {MAX_STEPS} heights in a flat list, got more"
    # Length before anything that walks the items: a list of 10^7 numbers is refused at once.
    if isinstance(value, list | tuple):
        if len(value) > MAX_STEPS:
            raise Infeasible(too_many)
        if any(isinstance(item, list | tuple | np.ndarray) for item in value):
            raise Infeasible("heights are not a flat list of numbers (found a nested list)")
    array = exact.real_array(value, "heights", MAX_STEPS, too_many)
    if array.ndim != 1 or not 1 <= len(array) <= MAX_STEPS:
        raise Infeasible(
            f"expected 1 to {MAX_STEPS} heights in a flat list, got shape {array.shape}"
        )
    if not np.isfinite(array).all():
        raise Infeasible("heights must be finite (found NaN or infinity)")
    if not allow_negative and (array < 0).any():
        i = int(np.flatnonzero(array < 0)[0])
        raise Infeasible(f"height {i} is negative ({array[i]:.3g}); this kind needs f >= 0")
    largest = float(np.abs(array).max())
    if largest == 0.0:
        raise Infeasible("every height is 0")
    _, exponent = math.frexp(largest)
    return np.ldexp(array, -exponent)


def first_autocorrelation(value: Any) -> float:
    a = heights(value, allow_negative=False)
    return 2 * len(a) * float(np.convolve(a, a).max()) / math.fsum(a.tolist()) ** 2


def second_autocorrelation(value: Any) -> float:
    a = heights(value, allow_negative=False)
    y = np.concatenate(([0.0], np.convolve(a, a), [0.0]))
    left, right = y[:-1], y[1:]
    l2 = math.fsum((left * left + left * right + right * right).tolist()) / 3
    l1 = math.fsum(y.tolist())
    return l2 / (l1 * float(y.max()))


def third_autocorrelation(value: Any) -> float:
    a = heights(value, allow_negative=True)
    total = math.fsum(a.tolist())
    if total == 0.0:
        raise Infeasible("the heights sum to 0: the bound divides by it")
    return abs(2 * len(a) * float(np.convolve(a, a).max()) / total**2)


def minimum_overlap(value: Any) -> float:
    h = heights(value, allow_negative=False)
    n = len(h)
    # Rescaled to sum N/2, height i is h_i N / (2 sum h): it stays <= 1 exactly when
    # h_i N <= 2 sum h, decided in exact integers (the rescaling below rounds, so it cannot).
    whole, _ = exact.integers(h.tolist())
    i = int(np.argmax(h))
    if whole[i] * n > 2 * sum(whole):
        scaled = Fraction(whole[i] * n, 2 * sum(whole))
        raise Infeasible(
            f"scaled to sum N/2 = {n / 2:g}, height {i} is 1 + {float(scaled - 1):.3g} > 1; "
            "h must stay within [0, 1] with integral 1"
        )
    h = np.minimum(h * ((n / 2) / math.fsum(h.tolist())), 1.0)
    return float(np.correlate(h, 1.0 - h, mode="full").max()) * 2 / n


VERIFIERS = {
    "c1": first_autocorrelation,
    "c2": second_autocorrelation,
    "c3": third_autocorrelation,
    "erdos": minimum_overlap,
}


class Autocorrelation(Problem):
    name = "autocorrelation"
    description = DESCRIPTION.format(limit=10.0, max_steps=MAX_STEPS)
    seed_program = SEED_PROGRAM
    entry = "construct"
    time_limit = 10.0
    objectives = (
        Objective(
            "c1",
            "min",
            1.503133,
            SOURCE_THETA,
            "first autocorrelation constant, an upper bound",
            (Anchor(1.5098, SOURCE_MV), Anchor(1.5053, SOURCE_AE), Anchor(1.503133, SOURCE_THETA)),
        ),
        Objective(
            "c2",
            "max",
            0.96102,
            SOURCE_AE2,
            "second autocorrelation constant, a lower bound",
            (Anchor(0.88922, SOURCE_MV), Anchor(0.8962, SOURCE_AE), Anchor(0.96102, SOURCE_AE2)),
        ),
        Objective(
            "c3",
            "min",
            1.4557,
            SOURCE_AE,
            "third autocorrelation constant, an upper bound",
            (Anchor(1.4581, SOURCE_VINUESA), Anchor(1.4557, SOURCE_AE)),
        ),
        Objective(
            "erdos",
            "min",
            0.380876,
            SOURCE_TTT,
            "Erdős' minimum overlap constant, an upper bound",
            (
                Anchor(0.380927, SOURCE_HAUGLAND),
                Anchor(0.380924, SOURCE_AE),
                Anchor(0.380876, SOURCE_TTT),
            ),
        ),
    )

    def calls(self) -> tuple[Call, ...]:
        return tuple(Call(kind, (kind,), (kind,)) for kind in VERIFIERS)

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        return {call.key: VERIFIERS[call.key](value)}


def make_problem() -> Problem:
    return Autocorrelation()
