"""Score one candidate program: run the problem's calls in the sandbox, score the returned data.

The candidate runs untrusted in the sandbox and only returns data; the problem's scorer runs
here, in the trusted process, on that data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from harness.evaluation.calls import Call as SandboxCall
from harness.evaluation.calls import Limits, Referee
from harness.evaluation.results import kept, one_line
from harness.evaluation.sandbox import Sandbox
from problems.api import Call, Evaluation, Infeasible, Problem, Status, combine


def limits_for(problem: Problem) -> Limits:
    return Limits(wall_seconds=float(problem.time_limit), memory_mb=int(problem.memory_mb))


def evaluate(
    problem: Problem, code: str, sandbox: Sandbox, limits: Limits | None = None
) -> Evaluation:
    """Run every call of `problem` on `code` in parallel; fold the results into one Evaluation."""
    return evaluate_many(problem, [code], sandbox, limits)[0]


# Stages a call may chain (`Problem.follow_up`): a problem asking for more is a problem's bug.
MAX_STAGES = 4


def evaluate_many(
    problem: Problem, codes: Sequence[str], sandbox: Sandbox, limits: Limits | None = None
) -> list[Evaluation]:
    """Evaluate several programs, all their calls in one parallel batch to keep workers busy.

    Each program is first admitted by the problem (`Problem.admit`): one it refuses is `invalid`
    with the reason, and never reaches a process; what runs is the admitted program.

    A call the problem follows up (`Problem.follow_up`) runs its next stage in a fresh process,
    every program's next stages again in one batch; the last stage's data are scored. What an
    earlier stage returned is kept in its artifacts (`returned`, bounded by `results.kept`), and
    a failure's reason names the stage that raised it ("predict: ...")."""
    calls = list(problem.calls())
    limits = limits or limits_for(problem)
    private = tuple(problem.private_paths())
    refused: dict[int, str] = {}
    codes = list(codes)
    for i, code in enumerate(codes):
        try:
            codes[i] = problem.admit(code)
        except ValueError as exc:
            refused[i] = one_line(f"refused before running: {exc}")
        except Exception as exc:  # the problem's reader failed on it: a refusal all the same
            refused[i] = f"refused before running: the problem could not read it: {_exc_line(exc)}"
    # one chain per (program, call): (index of the program, the call as first made)
    chains = [(i, call) for i in range(len(codes)) if i not in refused for call in calls]
    current: list[Call | None] = [call for _, call in chains]
    ended = [call.key for _, call in chains]  # the stage each chain is at: its result's label
    results: list[tuple[Status, dict[str, float], str | None] | None] = [None] * len(chains)
    artifacts: list[dict[str, Any]] = [{} for _ in codes]
    seconds = [0.0] * len(codes)
    for stage in range(MAX_STAGES):
        waiting = [k for k, call in enumerate(current) if call is not None]
        if not waiting:
            break
        jobs = [_job(problem, codes[chains[k][0]], current[k], limits, private) for k in waiting]
        for k, outcome in zip(waiting, sandbox.map(jobs), strict=True):
            index, first = chains[k]
            call = current[k]
            assert call is not None
            artifact = artifacts[index][call.key] = {
                "seconds": round(outcome.seconds, 4),
                "stdout": outcome.stdout,
                "stderr": outcome.stderr,
                "warnings": list(outcome.warnings),
            }
            # Calls run in parallel; the program's cost is what its calls took together.
            seconds[index] += outcome.seconds
            current[k] = None
            if outcome.status != "ok":
                results[k] = outcome.status, {}, outcome.reason
                continue
            try:
                following = problem.follow_up(call, outcome.value, codes[index])
            except Exception as exc:
                artifact["returned"] = kept(outcome.value)  # what the problem refused, to see
                results[k] = "invalid", {}, _refusal(exc)
                continue
            if following is None:
                named = first.objectives + first.cases
                results[k] = _score_call(problem, call, named, outcome.value)
                continue
            # What one stage hands to the next (a fit's constants) is kept beside the scores:
            # the last stage's data are scored, but these are what they were computed from.
            artifact["returned"] = kept(outcome.value)
            if stage + 1 == MAX_STAGES:
                reason = f"the problem's call {first.key!r} asked for more than {MAX_STAGES} stages"
                results[k] = "error", {}, reason
            else:
                current[k], ended[k] = following, following.key
    evaluations = []
    for index in range(len(codes)):
        if index in refused:
            evaluations.append(problem.empty_evaluation("invalid", refused[index]))
            continue
        mine = {first.key: results[k] for k, (i, first) in enumerate(chains) if i == index}
        assert all(result is not None for result in mine.values())
        # a failure is labelled with the stage that raised it, not the call that began there
        stages = {first.key: ended[k] for k, (i, first) in enumerate(chains) if i == index}
        evaluations.append(combine(problem, mine, seconds[index], artifacts[index], stages))  # type: ignore[arg-type]
    return evaluations


def _job(
    problem: Problem, code: str, call: Call, limits: Limits, private: tuple[str, ...]
) -> SandboxCall:
    program, args = with_driver(problem, code), tuple(call.args)
    if problem.referee:  # the call's arguments go to the referee, never to the candidate
        referee = Referee(problem.referee, call.entry or problem.referee_entry)
        return SandboxCall(program, problem.entry, args, limits, private, referee)
    entry = call.entry or problem.driver_entry or problem.entry
    return SandboxCall(program, entry, args, limits, private)


def with_driver(problem: Problem, code: str) -> str:
    """The candidate's code, followed by the problem's trusted driver when it has one (after it,
    so a candidate cannot redefine the driver)."""
    if not problem.driver:
        return code
    return (
        f"{code.rstrip()}\n\n\n# The harness's driver, appended to the program.\n{problem.driver}"
    )


def _score_call(
    problem: Problem, call: Call, objectives: tuple[str, ...], value: Any
) -> tuple[Status, dict[str, float], str | None]:
    """Score the data the call's last stage returned; `objectives` are the first call's (its
    cases among them)."""
    try:
        values = dict(problem.score(call, value))
    except Exception as exc:  # Infeasible, or data shaped so oddly that it could not be read
        return "invalid", {}, _refusal(exc)
    for name in objectives:
        found = values.get(name)
        if not isinstance(found, int | float) or not math.isfinite(found):
            return "invalid", {}, f"objective {name} has no finite value ({found!r})"
    return "ok", {name: float(values[name]) for name in objectives}, None


def _refusal(exc: Exception) -> str:
    """Why the problem refused what a stage returned: its Infeasible's message, or the
    failure of its reader on data shaped too oddly to read."""
    if isinstance(exc, Infeasible):
        return one_line(str(exc))
    return f"the scorer could not read the returned data: {_exc_line(exc)}"


def _exc_line(exc: BaseException) -> str:
    return one_line(f"{type(exc).__name__}: {exc}")
