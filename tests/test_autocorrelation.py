"""The autocorrelation verifiers: known values, brute force, scale invariance and the exploits
AlphaEvolve's authors reported against naive scorers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Infeasible
from problems.autocorrelation import (
    MAX_STEPS,
    Autocorrelation,
    first_autocorrelation,
    minimum_overlap,
    second_autocorrelation,
    third_autocorrelation,
)

FLAT = [1.0] * 64


def test_flat_functions_score_their_closed_forms() -> None:
    assert first_autocorrelation(FLAT) == pytest.approx(2.0, abs=1e-15)
    # a * a is a triangle; its piecewise-linear L2^2 / (L1 Linf) is exactly 2/3.
    assert second_autocorrelation(FLAT) == pytest.approx(2 / 3, abs=1e-15)
    assert third_autocorrelation(FLAT) == pytest.approx(2.0, abs=1e-15)
    assert minimum_overlap([0.5] * 64) == pytest.approx(0.5, abs=1e-15)


def _conv(a: list[float]) -> list[float]:
    out = [0.0] * (2 * len(a) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(a):
            out[i + j] += x * y
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=40).filter(lambda a: sum(a) > 1e-3))
def test_verifiers_match_a_brute_force_reading_of_the_formulas(a: list[float]) -> None:
    n = len(a)
    conv = _conv(a)
    assert first_autocorrelation(a) == pytest.approx(2 * n * max(conv) / sum(a) ** 2, rel=1e-9)
    y = [0.0, *conv, 0.0]
    l2 = sum((y[i] ** 2 + y[i] * y[i + 1] + y[i + 1] ** 2) / 3 for i in range(len(y) - 1))
    assert second_autocorrelation(a) == pytest.approx(l2 / (sum(y) * max(y)), rel=1e-9)
    signed = [x - 2.5 for x in a]
    if abs(sum(signed)) > 1e-3:
        expected = abs(2 * n * max(_conv(signed)) / sum(signed) ** 2)
        assert third_autocorrelation(signed) == pytest.approx(expected, rel=1e-9)


def test_erdos_overlap_matches_brute_force_after_rescaling() -> None:
    rng = np.random.default_rng(3)
    h = rng.uniform(0.0, 0.9, 50)
    h *= 25 / h.sum()
    h = np.minimum(h, 1.0)
    scaled = h * (25 / h.sum())
    assert (scaled <= 1).all()
    best = 0.0
    for shift in range(-49, 50):
        total = sum(scaled[i] * (1 - scaled[i + shift]) for i in range(50) if 0 <= i + shift < 50)
        best = max(best, total)
    assert minimum_overlap((h / 3).tolist()) == pytest.approx(best * 2 / 50, rel=1e-9)


@pytest.mark.parametrize("factor", [1e-300, 1e-310, 1e300, 3.0])
def test_scale_never_changes_a_value(factor: float) -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, 200)
    for verify in (first_autocorrelation, second_autocorrelation, third_autocorrelation):
        assert verify((a * factor).tolist()) == pytest.approx(verify(a.tolist()), rel=1e-12)
    h = np.full(100, 0.3)
    assert minimum_overlap((h * factor).tolist()) == pytest.approx(0.5, rel=1e-12)


EXPLOITS = {
    "negative heights in c1": (first_autocorrelation, [1.0, -0.5, 1.0], "negative"),
    "negative heights in c2": (second_autocorrelation, [1.0, -1e-9, 1.0], "negative"),
    "negative heights in erdos": (minimum_overlap, [0.5, -0.1, 0.6], "negative"),
    "nan": (first_autocorrelation, [1.0, float("nan")], "finite"),
    "infinity": (third_autocorrelation, [1.0, float("inf")], "finite"),
    "complex": (second_autocorrelation, np.array([1 + 1j, 1.0]), "real numbers"),
    "booleans": (first_autocorrelation, np.array([True, False]), "real numbers"),
    "strings": (first_autocorrelation, ["1", "2"], "real numbers"),
    "nested": (first_autocorrelation, [[1.0, 2.0], [3.0, 4.0]], "flat list"),
    "ragged": (first_autocorrelation, [[1.0], [2.0, 3.0]], "flat list"),
    "empty": (first_autocorrelation, [], "1 to"),
    "too many steps": (first_autocorrelation, [1.0] * (MAX_STEPS + 1), "1 to"),
    "all zero": (second_autocorrelation, [0.0] * 10, "every height is 0"),
    "a dict": (first_autocorrelation, {"a": 1.0}, "expected a list"),
    "signed sum 0 in c3": (third_autocorrelation, [1.0, -1.0], "sum to 0"),
    "erdos above 1 once its integral is 1": (minimum_overlap, [1.0, 0.0, 0.0, 0.0], "> 1"),
}


@pytest.mark.parametrize("case", sorted(EXPLOITS))
def test_exploits_are_rejected_with_a_reason(case: str) -> None:
    verify, value, words = EXPLOITS[case]
    with pytest.raises(Infeasible, match=words):
        verify(value)


def test_erdos_sum_is_rescaled_not_trusted() -> None:
    # Sum N/4 instead of N/2: rescaled to 0.5 everywhere, the flat function's 0.5.
    assert minimum_overlap([0.25] * 64) == pytest.approx(0.5, abs=1e-15)


def test_problem_declares_four_objectives_and_its_seed_is_ok() -> None:
    problem = Autocorrelation()
    assert [(o.name, o.direction) for o in problem.objectives] == [
        ("c1", "min"),
        ("c2", "max"),
        ("c3", "min"),
        ("erdos", "min"),
    ]
    assert [call.args for call in problem.calls()] == [("c1",), ("c2",), ("c3",), ("erdos",)]
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(problem, problem.seed_program, sandbox)
    assert evaluation.status == "ok", evaluation.reason
    assert evaluation.raw == pytest.approx({"c1": 2.0, "c2": 2 / 3, "c3": 2.0, "erdos": 0.5})
    assert evaluation.scores["c1"] == pytest.approx(1.503133 / 2)
    assert evaluation.scores["c2"] == pytest.approx((2 / 3) / 0.96102)
    assert all(0 < s < 1 for s in evaluation.scores.values())
    erdos = problem.objective("erdos")
    # A record keeps its margin: a smaller Erdos constant than the best known scores above 1.
    assert (
        math.isclose(erdos.normalise(0.38), erdos.best_known / 0.38) and erdos.normalise(0.38) > 1
    )


def test_a_candidate_that_cheats_one_kind_keeps_the_others() -> None:
    code = (
        "def construct(kind):\n"
        "    if kind == 'c1':\n"
        "        return [1.0, -5.0, 1.0]\n"
        "    if kind == 'erdos':\n"
        "        return [0.5] * 8\n"
        "    return [1.0] * 8\n"
    )
    with Sandbox(workers=2) as sandbox:
        evaluation = evaluate(Autocorrelation(), code, sandbox)
    assert evaluation.status == "invalid" and "c1: height 1 is negative" in evaluation.reason
    assert evaluation.scores["c1"] == 0.0 and evaluation.scores["c3"] > 0.7
