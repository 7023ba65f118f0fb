"""The problem contract: objectives, folding call results, and finding problems."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from problems.api import MAX_SCORE, Call, Infeasible, Objective, Problem, combine, record_note
from problems.circle_packing import CirclePacking
from problems.registry import ProblemLoadError, available, load


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(1e-6, 1e6))
def test_normalised_scores_are_finite_and_not_negative(raw: float, best: float) -> None:
    for direction in ("max", "min"):
        value = Objective("x", direction, best, "test").normalise(raw)
        assert 0.0 <= value <= MAX_SCORE
        if not math.isfinite(raw) or raw <= 0:
            assert value == 0.0
        else:  # not clipped at 1: a record keeps its margin
            ratio = raw / best if direction == "max" else best / raw
            assert value == min(ratio, MAX_SCORE)


def test_normalise_directions() -> None:
    assert Objective("x", "max", 2.0, "s").normalise(1.0) == 0.5
    assert Objective("x", "min", 2.0, "s").normalise(4.0) == 0.5
    assert Objective("x", "min", 2.0, "s").normalise(0.0) == 0.0
    # Beating the best known value by 2% scores 1.02, in either direction.
    assert Objective("x", "max", 2.0, "s").normalise(2.04) == pytest.approx(1.02)
    assert Objective("x", "min", 1.02, "s").normalise(1.0) == pytest.approx(1.02)
    # An overflow stays a finite number the database takes.
    assert Objective("x", "max", 1e-6, "s").normalise(1e308) == MAX_SCORE


@pytest.mark.parametrize(
    ("score", "note"),
    [
        (0.5, None),
        (1.0, None),
        (float("nan"), None),
        (1.02, "record: +2.0% over best known"),
        (1.2, "record: +20.0% over best known"),
        (1.001, "record: +0.10% over best known"),
        (1.1234, "record: +12.3% over best known"),
        (1.0000000089, None),  # the best known value's own rounding: no record
        (1.0000012, "record: +0.00012% over best known"),
    ],
)
def test_a_record_reads_as_its_margin_over_the_best_known(score: float, note: str | None) -> None:
    assert record_note(score) == note
    with pytest.raises(ValueError):
        Objective("x", "up", 2.0, "s")  # type: ignore[arg-type]


def test_combine_keeps_the_credit_of_calls_that_worked() -> None:
    problem = CirclePacking()
    evaluation = combine(
        problem,
        {
            "n26": ("ok", {"n26": 2.0}, None),
            "n32": ("timeout", {}, "timed out after 10 s"),
            "rect21": ("ok", {"rect21": 2.0}, None),
        },
    )
    assert evaluation.status == "timeout"
    assert evaluation.reason == "n32: timed out after 10 s"
    assert evaluation.scores["n26"] == pytest.approx(2.0 / 2.63598308)
    assert evaluation.scores["n32"] == 0.0
    assert evaluation.scores["rect21"] == pytest.approx(2.0 / 2.3658321)
    assert evaluation.raw == {"n26": 2.0, "n32": None, "rect21": 2.0}


def test_empty_evaluation_is_all_zeros() -> None:
    evaluation = CirclePacking().empty_evaluation("invalid", "did not parse")
    assert evaluation.scores == {"n26": 0.0, "n32": 0.0, "rect21": 0.0}
    assert evaluation.to_json()["reason"] == "did not parse"


def test_installed_problems_are_found_by_entry_point() -> None:
    assert "circle_packing" in available()
    assert load("circle_packing").name == "circle_packing"


def test_unknown_problem_names_what_exists() -> None:
    with pytest.raises(ProblemLoadError, match="unknown problem 'nope'.*circle_packing"):
        load("nope")


FOLDER_PROBLEM = """
from problems.api import Call, Infeasible, Objective, Problem

class Square(Problem):
    name = "square"
    description = "Return a number close to 3."
    seed_program = "def answer():\\n    return 1.0\\n"
    entry = "answer"
    time_limit = 2.0
    objectives = (Objective("closeness", "max", 1.0, "by definition"),)

    def score(self, call, value):
        if not isinstance(value, float):
            raise Infeasible("not a float")
        return {"closeness": 1.0 / (1.0 + abs(value - 3.0))}

{export}
"""


@pytest.mark.parametrize(
    "export", ["problem = Square()", "def make_problem():\n    return Square()"]
)
def test_folder_problem_loads(tmp_path: Path, export: str) -> None:
    (tmp_path / "problem.py").write_text(FOLDER_PROBLEM.replace("{export}", export))
    problem = load(str(tmp_path))
    assert problem.name == "square"
    assert problem.calls() == (Call("main", (), ("closeness",)),)


@pytest.mark.parametrize(
    "body,words",
    [
        ("x = (", "could not load.*SyntaxError"),
        ("raise RuntimeError('boom')", "could not load.*boom"),
        ("x = 1", "defines neither"),
        ("def make_problem():\n    return 42", "not a Problem"),
        ("def make_problem():\n    raise ValueError('bad')", "factory.*bad"),
        (
            FOLDER_PROBLEM.replace("{export}", "problem = Square()").replace('"answer"', '"1x"'),
            "not a name",
        ),
        (
            FOLDER_PROBLEM.replace("{export}", "problem = Square()").replace(
                "objectives = (", "objectives = (Objective('closeness', 'max', 1.0, 's'), "
            ),
            "repeats",
        ),
    ],
)
def test_broken_folder_problems_give_one_line(tmp_path: Path, body: str, words: str) -> None:
    (tmp_path / "problem.py").write_text(body)
    with pytest.raises(ProblemLoadError, match=words) as info:
        load(str(tmp_path))
    assert "\n" not in str(info.value)


def test_folder_without_problem_py(tmp_path: Path) -> None:
    with pytest.raises(ProblemLoadError, match="no problem.py"):
        load(str(tmp_path))


SUITE = (
    "circle_packing",
    "autocorrelation",
    "heilbronn",
    "min_distance_ratio",
    "cap_set",
    "bin_packing",
    "humaneval",
    "maze",
)


def test_the_suite_is_installed_and_every_seed_evaluates_ok() -> None:
    from harness.evaluation.evaluate import evaluate
    from harness.evaluation.sandbox import Sandbox
    from problems.api import AnswerProblem

    assert set(SUITE) <= set(available())
    with Sandbox(workers=2) as sandbox:
        for name in available():
            problem = load(name)
            if isinstance(problem, AnswerProblem):
                continue  # no program to run: the maze is scored in tests/test_maze.py
            evaluation = evaluate(problem, problem.seed_program, sandbox)
            assert evaluation.status == "ok", f"{name}: {evaluation.reason}"
            assert all(0.0 <= v <= 1.0 for v in evaluation.scores.values())


class TwoStages(Problem):
    """The first stage keeps a secret in its process and hands on a number; the second, a fresh
    process, gets only that number. `stages` more than MAX_STAGES loops for ever."""

    name = "two stages"
    description = "stages"
    seed_program = ""
    entry = "first"
    objectives = (Objective("value", "max", 1.0, "by definition"),)

    def __init__(self, stages: int = 2) -> None:
        self.stages = stages

    def calls(self) -> tuple[Call, ...]:
        return (Call("main", (41,), ("value",), context=1),)

    def follow_up(self, call: Call, value: object, code: str) -> Call | None:
        if value == "refuse":
            raise Infeasible("the first stage refused")
        if call.context >= self.stages:
            return None
        return Call("next", (value,), ("value",), entry="second", context=call.context + 1)

    def score(self, call: Call, value: object) -> dict[str, float]:
        return {"value": float(value) if call.key == "next" else -1.0}


STAGES = """
import os
SECRET = []


def first(n):
    SECRET.append(n)
    os.environ["SECRET"] = str(n)
    with open("/tmp/secret", "w") as out:
        out.write(str(n))
    print("first")
    return n + 1


def second(n):
    found = [SECRET, os.environ.get("SECRET"), os.path.exists("/tmp/secret")]
    print("second", found)
    return n + 100 * (found != [[], None, False])
"""


def test_a_follow_up_runs_in_a_fresh_process_and_only_its_value_is_scored() -> None:
    from harness.evaluation.evaluate import MAX_STAGES, evaluate_many
    from harness.evaluation.sandbox import Sandbox

    refusing = STAGES.replace("return n + 1\n", "return 'refuse'\n")
    with Sandbox(workers=2) as box:
        chained, refused, endless = evaluate_many(
            TwoStages(), [STAGES, refusing], box
        ) + evaluate_many(TwoStages(stages=99), [STAGES], box)
    assert chained.status == "ok" and chained.scores == {"value": 42.0}, chained
    assert chained.artifacts["main"]["stdout"] == "first\n"
    assert chained.artifacts["next"]["stdout"] == "second [[], None, False]\n"
    assert refused.status == "invalid" and refused.reason == "main: the first stage refused"
    assert endless.status == "error" and endless.scores == {"value": 0.0}
    assert f"asked for more than {MAX_STAGES} stages" in (endless.reason or "")
