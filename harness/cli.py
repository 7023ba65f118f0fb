"""The `vpo` command: a face over problems, the sandbox and the solution database.

Every error a user can cause is printed as one line (`vpo: error: ...`) without a traceback:
exit status 2 for usage errors, 1 when an evaluated program is not ok, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from harness.errors import UserError
from problems.api import Evaluation, Problem
from problems.registry import ProblemLoadError, available
from problems.registry import load as load_problem

MAX_PROGRAM_BYTES = 1 << 20


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage over several lines
        raise UserError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vpo", description="LLM-driven discovery kept diverse by VPO.")
    parser.add_argument("--version", action="version", version=f"vpo-evolve {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = commands.add_parser("problems", help="list the problems with their objectives")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(handler=cmd_problems)

    p = commands.add_parser("eval", help="score one program file on a problem")
    p.add_argument("problem", help="a registered problem name, or a folder holding problem.py")
    p.add_argument("file", help="the program file to score")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="parallel sandbox workers (default: one per call, at most the CPU count)",
    )
    p.set_defaults(handler=cmd_eval)

    p = commands.add_parser("run", help="start or resume a campaign on a problem")
    p.add_argument("problem", help="a registered problem name, or a folder holding problem.py")
    p.add_argument(
        "--db",
        default=None,
        help="database file or URL (default: runs/PROBLEM.db; postgresql://... works)",
    )
    p.add_argument("--name", default=None, help="campaign name (default: the problem's name)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="parallel sandbox workers (default: the CPU count)",
    )
    p.set_defaults(handler=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except (UserError, ProblemLoadError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        print("vpo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("VPO_DEBUG"):
            raise
        print(
            f"vpo: internal error: {type(exc).__name__}: {exc} "
            "(set VPO_DEBUG=1 to see the traceback)".replace("\n", " "),
            file=sys.stderr,
        )
        return 3


def cmd_problems(args: argparse.Namespace) -> int:
    problems = [load_problem(name) for name in sorted(available())]
    if args.json:
        print(json.dumps([_problem_json(p) for p in problems], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="problems")
    for column in ("problem", "objective", "direction", "best known", "source"):
        table.add_column(column)
    for problem in problems:
        for i, objective in enumerate(problem.objectives):
            table.add_row(
                problem.name if i == 0 else "",
                objective.name,
                objective.direction,
                f"{objective.best_known:.10g}",
                objective.source,
            )
    Console().print(table)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from harness.evaluate import evaluate
    from harness.sandbox import Sandbox

    problem = load_problem(args.problem)
    code = read_program(args.file)
    workers = args.workers or min(len(problem.calls()), os.cpu_count() or 1)
    with Sandbox(workers=workers) as sandbox:
        evaluation = evaluate(problem, code, sandbox)
    if args.json:
        print(json.dumps(evaluation.to_json()))
    else:
        print_evaluation(problem, evaluation, title=f"{problem.name}: {args.file}")
    return 0 if evaluation.status == "ok" else 1


def cmd_run(args: argparse.Namespace) -> int:
    from harness.evaluate import evaluate
    from harness.sandbox import Sandbox
    from harness.store import Store

    problem = load_problem(args.problem)
    db = args.db or str(Path("runs") / f"{problem.name}.db")
    if "://" not in db:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    store = Store.open(db)
    name = args.name or problem.name
    campaign = store.get_campaign(name)
    if campaign is None:
        config = {"problem": args.problem, "seed": args.seed}
        campaign_id = store.create_campaign(name, problem.name, config, args.seed)
        print(f"campaign {name!r} created in {db}")
    else:
        if campaign.problem != problem.name:
            raise UserError(
                f"campaign {name!r} in {db} runs problem {campaign.problem!r}, "
                f"not {problem.name!r}; pick another --name"
            )
        campaign_id = campaign.id
        store.record_event(campaign_id, "resumed", {})
        print(f"campaign {name!r} resumed from {db}")
    seeds = [p for p in store.programs(campaign_id) if p.origin == "seed"]
    if seeds:
        seed = seeds[0]
        evaluation = Evaluation(seed.status, seed.scores, seed.raw, seed.error, seed.eval_seconds)
    else:
        with Sandbox(workers=args.workers or os.cpu_count() or 1) as sandbox:
            evaluation = evaluate(problem, problem.seed_program, sandbox)
        store.add_program(
            campaign_id,
            problem.seed_program,
            status=evaluation.status,
            scores=dict(evaluation.scores),
            raw=dict(evaluation.raw),
            error=evaluation.reason,
            origin="seed",
            eval_seconds=evaluation.seconds,
            metrics={"artifacts": dict(evaluation.artifacts)},
        )
    print_evaluation(problem, evaluation, title=f"{problem.name}: seed program")
    return 0 if evaluation.status == "ok" else 1


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


def print_evaluation(problem: Problem, evaluation: Evaluation, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("objective", "score", "raw", "best known"):
        table.add_column(column, justify="right" if column != "objective" else "left")
    for objective in problem.objectives:
        raw = evaluation.raw.get(objective.name)
        table.add_row(
            objective.name,
            f"{evaluation.scores.get(objective.name, 0.0):.6f}",
            "-" if raw is None else f"{raw:.10f}",
            f"{objective.best_known:.10g}",
        )
    console = Console()
    console.print(table)
    line = f"status: {evaluation.status}"
    if evaluation.reason:
        line += f" ({evaluation.reason})"
    console.print(line, markup=False, highlight=False)


def _problem_json(problem: Problem) -> dict[str, Any]:
    return {
        "name": problem.name,
        "entry": problem.entry,
        "time_limit": problem.time_limit,
        "objectives": [
            {
                "name": o.name,
                "direction": o.direction,
                "best_known": o.best_known,
                "source": o.source,
                "description": o.description,
                "anchors": [{"value": a.value, "source": a.source} for a in o.anchors],
            }
            for o in problem.objectives
        ],
    }


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vpo-evolve")
    except PackageNotFoundError:
        return "unknown"


def _fail(message: str) -> NoReturn:
    print(f"vpo: error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    sys.exit(main())
