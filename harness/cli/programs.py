"""`vpo problems` and `vpo eval`: the problems there are, and one program scored on one."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from harness.cli import render
from harness.cli.flags import positive_int
from harness.config.errors import UserError
from problems.api import Problem
from problems.registry import available
from problems.registry import load as load_problem

MAX_PROGRAM_BYTES = 1 << 20


def add_commands(commands: Any) -> None:
    p = commands.add_parser("problems", help="list the problems with their objectives")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_problems)

    p = commands.add_parser("eval", help="score one program file on a problem")
    p.add_argument("problem", help="a registered problem name, or a folder holding problem.py")
    p.add_argument("file", help="the program file to score")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="parallel sandbox workers (default: one per call, at most the CPU count)",
    )
    p.set_defaults(handler=cmd_eval)


def cmd_problems(args: argparse.Namespace) -> int:
    problems = [load_problem(name) for name in sorted(available())]
    if args.json:
        print(json.dumps([render.problem_json(p) for p in problems], indent=2))
    else:
        render.print_problems(problems)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from harness.evaluation.evaluate import evaluate
    from harness.evaluation.sandbox import Sandbox

    problem = program_problem(args.problem)
    code = read_program(args.file)
    workers = args.workers or min(len(problem.calls()), os.cpu_count() or 1)
    with Sandbox(workers=workers) as sandbox:
        evaluation = evaluate(problem, code, sandbox)
    program = admitted(problem, code)
    if args.json:
        report = {
            **evaluation.to_json(),
            # what the sandbox ran: the file as written, or the problem's own writing of it
            "program": program,
            "rewritten": None if program is None else program != code,
            "returned": render.stage_returns(evaluation.artifacts),
        }
        print(json.dumps(report))
    else:
        title = f"{problem.name}: {args.file}"
        render.print_evaluation(problem, evaluation, title, program, code)
    return 0 if evaluation.status == "ok" else 1


def admitted(problem: Problem, code: str) -> str | None:
    """The program the sandbox runs for `code` (`Problem.admit`, which `evaluate` applies the
    same way: it gives the same text every time), or None where the problem refuses it and
    nothing ran."""
    try:
        return problem.admit(code)
    except Exception:  # the evaluation's reason says why
        return None


def program_problem(spec: str) -> Problem:
    """A problem whose candidates are programs; an answer problem is a one-line error."""
    problem = load_problem(spec)
    if not isinstance(problem, Problem):
        raise UserError(
            f"{problem.name} is an answer problem (its answers are not programs to evolve): "
            f"train on it with `vpo train --problem {spec} --out DIR`"
        )
    return problem


def read_program(path: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"{path}: no such file")
    if file.stat().st_size > MAX_PROGRAM_BYTES:
        raise UserError(f"{path}: larger than {MAX_PROGRAM_BYTES >> 20} MiB; not a program")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
