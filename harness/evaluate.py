"""Score one candidate program: run the problem's calls in the sandbox, score the returned data.

The candidate runs untrusted in the sandbox and only returns data; the problem's scorer runs
here, in the trusted process, on that data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.results import one_line
from harness.sandbox import Call as SandboxCall
from harness.sandbox import Limits, Outcome, Sandbox
from problems.api import Call, Evaluation, Infeasible, Problem, Status, combine


def limits_for(problem: Problem) -> Limits:
    return Limits(wall_seconds=float(problem.time_limit), memory_mb=int(problem.memory_mb))


def evaluate(
    problem: Problem, code: str, sandbox: Sandbox, limits: Limits | None = None
) -> Evaluation:
    """Run every call of `problem` on `code` in parallel; fold the results into one Evaluation."""
    return evaluate_many(problem, [code], sandbox, limits)[0]


def evaluate_many(
    problem: Problem, codes: Sequence[str], sandbox: Sandbox, limits: Limits | None = None
) -> list[Evaluation]:
    """Evaluate several programs, all their calls in one parallel batch to keep workers busy."""
    calls = list(problem.calls())
    limits = limits or limits_for(problem)
    entry = problem.driver_entry or problem.entry
    private = tuple(problem.private_paths())
    jobs = [
        SandboxCall(with_driver(problem, code), entry, tuple(call.args), limits, private)
        for code in codes
        for call in calls
    ]
    outcomes = sandbox.map(jobs)
    evaluations = []
    for i in range(len(codes)):
        mine = outcomes[i * len(calls) : (i + 1) * len(calls)]
        results: dict[str, tuple[Status, dict[str, float], str | None]] = {}
        artifacts: dict[str, Any] = {}
        for call, outcome in zip(calls, mine, strict=True):
            results[call.key] = _score_call(problem, call, outcome)
            artifacts[call.key] = {
                "seconds": round(outcome.seconds, 4),
                "stdout": outcome.stdout,
                "stderr": outcome.stderr,
                "warnings": list(outcome.warnings),
            }
        # Calls run in parallel; the program's cost is what its calls took together.
        seconds = sum(outcome.seconds for outcome in mine)
        evaluations.append(combine(problem, results, seconds, artifacts))
    return evaluations


def with_driver(problem: Problem, code: str) -> str:
    """The candidate's code, followed by the problem's trusted driver when it has one (after it,
    so a candidate cannot redefine the driver)."""
    if not problem.driver:
        return code
    return (
        f"{code.rstrip()}\n\n\n# The harness's driver, appended to the program.\n{problem.driver}"
    )


def _score_call(
    problem: Problem, call: Call, outcome: Outcome
) -> tuple[Status, dict[str, float], str | None]:
    if outcome.status != "ok":
        return outcome.status, {}, outcome.reason
    try:
        values = dict(problem.score(call, outcome.value))
    except Infeasible as exc:
        return "invalid", {}, one_line(str(exc))
    except Exception as exc:  # data shaped so oddly that the scorer could not even read it
        return "invalid", {}, f"the scorer could not read the returned data: {_exc_line(exc)}"
    for name in call.objectives:
        value = values.get(name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return "invalid", {}, f"objective {name} has no finite value ({value!r})"
    return "ok", {name: float(values[name]) for name in call.objectives}, None


def _exc_line(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")
