"""Cap sets: the fixed greedy builds caps, the candidate only orders the vectors, and a
candidate cannot replace the driver that maps its priority over F_3^n."""

from __future__ import annotations

from itertools import combinations, product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from problems.api import Infeasible
from problems.cap_set import BEST, CapSet, greedy_cap, is_cap


def brute_force_is_cap(indices: list[int], n: int) -> bool:
    vectors = [tuple(v) for v in product(range(3), repeat=n)]
    chosen = [vectors[i] for i in indices]
    for x, y, z in combinations(chosen, 3):
        if all((a + b + c) % 3 == 0 for a, b, c in zip(x, y, z, strict=True)):
            return False
    return True


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_the_greedy_builds_maximal_caps(n: int, seed: int) -> None:
    priorities = np.random.default_rng(seed).integers(0, 5, 3**n).astype(float)
    cap = greedy_cap(priorities.tolist(), n)
    assert brute_force_is_cap(cap, n) and is_cap(cap, n)
    for extra in set(range(3**n)) - set(cap):  # maximal: every other vector completes a line
        assert not brute_force_is_cap([*cap, extra], n)


def test_a_constant_priority_gives_two_to_the_n_and_the_quadric_gives_nine() -> None:
    for n in range(3, 8):
        assert len(greedy_cap([0.0] * 3**n, n)) == 2**n
    # z = x^2 + y^2 over F_3 is an elliptic quadric: no three of its 9 points on a line.
    quadric = [1.0 if z == (x * x + y * y) % 3 else 0.0 for x, y, z in product(range(3), repeat=3)]
    assert len(greedy_cap(quadric, 3)) == BEST[3] == 9


@pytest.mark.parametrize(
    "value,words",
    [
        ([0.0] * 26, "expected 27 priorities"),
        ([float("nan")] + [0.0] * 26, "not finite"),
        ([float("inf")] * 27, "not finite"),
        (["a"] * 27, "real numbers"),
        (np.zeros(27, dtype=complex), "real numbers"),
        ({"a": 1}, "expected a list"),
        ([[0.0] * 27], "expected 27 priorities"),
    ],
)
def test_bad_priorities_are_rejected(value: object, words: str) -> None:
    with pytest.raises(Infeasible, match=words):
        greedy_cap(value, 3)


def _evaluate(code: str) -> object:
    with Sandbox(workers=2) as sandbox:
        return evaluate(CapSet(), code, sandbox)


def test_seed_scores_two_to_the_n_everywhere() -> None:
    evaluation = _evaluate(CapSet().seed_program)
    assert evaluation.status == "ok", evaluation.reason
    assert evaluation.raw == {f"n{n}": float(2**n) for n in range(3, 10)}
    assert evaluation.scores["n9"] == pytest.approx(512 / 1082)


def test_a_candidate_cannot_replace_the_driver() -> None:
    code = (
        "def priority(el, n):\n"
        "    return 0.0\n"
        "def _vpo_cap_set_priorities(n):\n"
        "    return 'a cap of a million'\n"
    )
    evaluation = _evaluate(code)
    assert evaluation.status == "ok"
    assert evaluation.raw["n9"] == 512.0


def test_a_priority_that_fails_at_one_n_keeps_the_others() -> None:
    code = (
        "def priority(el, n):\n"
        "    if n == 9:\n"
        "        return float('nan')\n"
        "    return float(sum(el) % 3 == 1)\n"
    )
    evaluation = _evaluate(code)
    assert evaluation.status == "invalid" and "n9: priority of vector 0 is not finite" in (
        evaluation.reason or ""
    )
    assert evaluation.scores["n9"] == 0.0 and evaluation.scores["n3"] > 0
