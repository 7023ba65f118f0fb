"""`vpo run`, `vpo worker` and `vpo config show`: a campaign's effective settings (flags over
a TOML file over the campaign stored in the database), then the campaign loop or a worker."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from harness.cli import render
from harness.cli.flags import SETTING_FLAGS, add_campaign_flags, add_subcommands, positive_float
from harness.cli.programs import program_problem
from harness.config import logs
from harness.config.errors import UserError
from problems.registry import load as load_problem


def add_commands(commands: Any) -> None:
    p = commands.add_parser("run", help="run or resume a discovery campaign")
    p.add_argument(
        "problem",
        nargs="?",
        default=None,
        help="a registered problem name, or a folder holding problem.py "
        "(default: from --config, or the campaign stored in --db)",
    )
    p.add_argument(
        "--tasks",
        default=None,
        help="N,M,...: one campaign per task of a problem that takes a task number "
        "(humaneval --tasks 0,12 runs humaneval:0 and humaneval:12 in turn)",
    )
    add_campaign_flags(p)
    p.set_defaults(handler=cmd_run)

    p = commands.add_parser(
        "worker",
        help="take iterations of a campaign beside other workers (PostgreSQL, any machines)",
    )
    p.add_argument(
        "problem",
        nargs="?",
        default=None,
        help="the problem (default: the campaign's, from --db)",
    )
    p.add_argument(
        "--id",
        dest="worker_id",
        default=None,
        help="this worker's name in the claims (default: host:pid)",
    )
    p.add_argument(
        "--lease",
        type=positive_float,
        default=900.0,
        help="seconds after which another worker takes over an iteration this one has not "
        "recorded (default 900: longer than one iteration takes)",
    )
    add_campaign_flags(p)
    p.set_defaults(handler=cmd_worker)


def add_config_command(commands: Any) -> None:
    p = commands.add_parser("config", help="campaign configuration")
    config_commands = add_subcommands(p, "config_command")
    show = config_commands.add_parser("show", help="print the effective config as TOML")
    show.add_argument("problem", nargs="?", default=None)
    add_campaign_flags(show)
    show.set_defaults(handler=cmd_config_show)


def single_process(command: str) -> None:
    """`vpo run` and `vpo worker` sample and evaluate in one process: under torchrun or
    `accelerate launch` each process would run its own copy of the campaign."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(
            f"vpo {command} runs in one process, not under torchrun or accelerate launch; to "
            "train on several GPUs, run workers and one `torchrun --nproc_per_node N -m "
            "harness.cli.train --db ... --follow` beside them"
        )


def cmd_run(args: argparse.Namespace) -> int:
    single_process("run")
    if args.tasks is not None:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        if not args.problem or ":" in args.problem or not tasks:
            raise UserError("--tasks needs a problem name (humaneval) and task numbers: 0,12")
        if args.name is not None:
            raise UserError("--tasks names each campaign after its task; leave out --name")
        # Every task exists before any runs; each campaign is named after its task.
        names = {task: load_problem(f"{args.problem}:{task}").name for task in tasks}
        for task in tasks:
            spec = f"{args.problem}:{task}"
            status = _run_one(
                argparse.Namespace(**{**vars(args), "problem": spec, "name": names[task]})
            )
            if status:
                return status
        return 0
    return _run_one(args)


def _run_one(args: argparse.Namespace) -> int:
    from harness.evolution.loop import run_campaign
    from harness.learning.steps import checked_cases

    if args.problem:  # before any database is opened or created
        program_problem(args.problem)

    config, problem, store, stored = effective_config(args)
    checked_cases(config, problem)  # cases the problem lacks: said before "created"
    logs.attach_file(store.where, args.log_dir)
    name = config.name or problem.name
    logs.say(f"campaign {name!r} {'resumed from' if stored else 'created in'} {store.where}")
    with render.progress_reporter(config.iterations) as report:
        campaign_id = run_campaign(config, store, problem, on_progress=report, say=logs.say)
    summary = store.summary(campaign_id)
    render.print_best(problem, summary)
    if summary.policy_versions:
        objectives = [objective.name for objective in problem.objectives]
        versions = [row.as_json() for row in store.version_measures(campaign_id, objectives)]
        render.print_versions(versions, objectives)
        logs.say(f"sampled by trained weights: {render.trained_share(versions)}")
    if config.price_prompt is not None or config.price_completion is not None:
        from harness.evolution.budgets import stored_spend

        logs.say(stored_spend(store, campaign_id).line(config))
    logs.say(f"database: {store.where}")
    print(next_steps(args.db or store.where))
    return 0


def next_steps(db: str) -> str:
    """What to look at once a campaign has run."""
    return (
        "look next:\n"
        f"  vpo ui --db {db}                 the dashboard: programs, lineage, training\n"
        f"  vpo db plot --db {db} --out plots   best scores, parse rate, diversity (PNG)\n"
        f"  vpo db top --db {db}             the best programs"
    )


def cmd_worker(args: argparse.Namespace) -> int:
    import socket

    from harness.evolution.worker import run_worker

    single_process("worker")
    if args.db is None:
        raise UserError("a worker joins a campaign in a database: give --db (postgresql://...)")
    if args.problem:
        program_problem(args.problem)
    config, problem, store, stored = effective_config(args)
    if config.training.train_every:
        raise UserError(
            "workers do not train: leave out --train-every and run one "
            "`vpo train --db ... --follow` beside them"
        )
    worker = args.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    logs.attach_file(store.where, args.log_dir)
    logs.say(f"worker {worker} on campaign {config.name or problem.name} of {store.where}")
    done = run_worker(
        config,
        store,
        problem,
        worker,
        lease_seconds=args.lease,
        on_progress=lambda iteration, progress: logs.say(
            f"[{worker}] iteration {iteration}/{config.iterations} done"
        ),
    )
    logs.say(f"worker {worker}: {done} iterations recorded")
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    config, _problem, store, _stored = effective_config(args, create=False)
    if store is not None:
        store.close()
    print(config.to_toml(), end="")
    return 0


def effective_config(args: argparse.Namespace, *, create: bool = True) -> tuple[Any, Any, Any, Any]:
    """(config, problem, store, stored campaign or None) from flags, file and database.

    With `create` false nothing is written: the database is opened read-only, and the default
    one (runs/PROBLEM.db) only where it exists; store is then None when there is none."""
    from harness.config.files import load_toml
    from harness.config.settings import build
    from harness.store import Store

    flags = {key: getattr(args, key) for key in SETTING_FLAGS}
    flags["problem"] = args.problem
    flags["name"] = args.name
    file = load_toml(args.config) if args.config else {}
    store = None
    stored = None
    if args.db is not None:
        store = Store.open(args.db, read_only=not create)
        stored = find_campaign(store, args.name or file.get("name"), required=False)
    problem_spec = (
        args.problem or file.get("problem") or (stored.config.get("problem") if stored else None)
    )
    if problem_spec is None:
        raise UserError(
            "which problem? give PROBLEM, a --config with `problem`, or a --db holding a campaign"
        )
    problem = program_problem(problem_spec)
    default_db = Path("runs") / f"{problem.name}.db"
    if store is None and (create or default_db.is_file()):
        store = Store.open(str(default_db), read_only=not create)
        stored = find_campaign(store, args.name or file.get("name") or problem.name, required=False)
    base = dict(stored.config) if stored else {}
    base["problem"] = problem_spec
    config = build(base, file, flags, where=args.config or "the settings")
    return config, problem, store, stored


def find_campaign(store: Any, name: str | None, *, required: bool) -> Any:
    """The campaign named `name`, else the database's only one; None when there is none to
    pick, or a UserError saying why when one is `required`."""
    if name is not None:
        campaign = store.get_campaign(name)
        if campaign is None and required:
            raise UserError(f"no campaign named {name!r} in {store.where}")
        return campaign
    campaigns = store.campaigns()
    if len(campaigns) == 1:
        return campaigns[0]
    if required and not campaigns:
        raise UserError(
            f"{store.where} holds no campaign; start one with `vpo run PROBLEM --db {store.where}`"
        )
    if required:
        names = ", ".join(c.name for c in campaigns)
        raise UserError(f"{store.where} holds campaigns {names}; pick one with --name")
    return None
