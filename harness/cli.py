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
MAX_ROWS = 1_000_000  # `vpo db top -n`


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
    _campaign_flags(p)
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
        type=_positive_float,
        default=900.0,
        help="seconds after which another worker takes over an iteration this one has not "
        "recorded (default 900: longer than one iteration takes)",
    )
    _campaign_flags(p)
    p.set_defaults(handler=cmd_worker)

    p = commands.add_parser(
        "train",
        help="fine-tune a model on a database's groups (--db), "
        "or by RL on an answer problem (--problem maze)",
    )
    p.add_argument("--db", default=None, help="database file or URL of the campaign to learn from")
    p.add_argument(
        "--problem",
        default=None,
        help="an answer problem (maze): VPO reinforcement learning on generated instances, "
        "evaluated by best@k and pass@k on held-out ones",
    )
    p.add_argument(
        "--out",
        default=None,
        help="folder for the trained model (with --follow: for the policy versions; default "
        "the campaign's policy folder)",
    )
    p.add_argument("--name", default=None, help="campaign name (default: the only one)")
    p.add_argument("--model", default=None, help="base model (default: the campaign's, or smollm2)")
    p.add_argument(
        "--advantage", default="vpo", help="vpo (default), grpo, multi_rlvr, max_at_k or gdpo"
    )
    p.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="steps (default: one pass over the groups; 20 with --problem)",
    )
    p.add_argument("--groups-per-step", dest="groups_per_step", type=_positive_int, default=None)
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter, then merge it")
    p.add_argument("--lora-rank", dest="lora_rank", type=_positive_int, default=16)
    p.add_argument("--lr", dest="learning_rate", type=float, default=None)
    p.add_argument("--kl-beta", dest="kl_beta", type=float, default=1e-3)
    p.add_argument(
        "--micro-batch",
        dest="micro_batch",
        type=_positive_int,
        default=None,
        help="rollouts per forward/backward (default 8; 2 with --problem, whose prompts are long)",
    )
    p.add_argument("--seed", type=int, default=0)
    follow = p.add_argument_group("with --db --follow (beside `vpo worker` processes)")
    follow.add_argument(
        "--follow",
        action="store_true",
        help="keep training on new groups as workers record them, publishing policy versions, "
        "until the campaign's budget is recorded and used",
    )
    follow.add_argument(
        "--train-every",
        dest="train_every",
        type=_positive_int,
        default=None,
        help="groups per step with --follow (default: the campaign's train_every, else 4)",
    )
    follow.add_argument(
        "--poll", type=_positive_float, default=2.0, help="seconds between looks (default 2)"
    )
    rl = p.add_argument_group("with --problem (answer problems)")
    rl.add_argument(
        "--group-size",
        dest="group_size",
        type=_positive_int,
        default=8,
        help="completions per prompt (default 8)",
    )
    rl.add_argument(
        "--candidates", type=_positive_int, default=3, help="answers per completion, m (default 3)"
    )
    rl.add_argument("--max-tokens", dest="max_tokens", type=_positive_int, default=512)
    rl.add_argument(
        "--temperature",
        type=_positive_float,
        default=1.0,
        help="sampling temperature while training (default 1.0)",
    )
    rl.add_argument(
        "--eval-prompts",
        dest="eval_prompts",
        type=_positive_int,
        default=20,
        help="held-out instances evaluated (default 20; the paper used 100)",
    )
    rl.add_argument(
        "--eval-generations",
        dest="eval_generations",
        type=_positive_int,
        default=10,
        help="completions per held-out prompt (default 10)",
    )
    rl.add_argument(
        "--eval-every",
        dest="eval_every",
        type=_positive_int,
        default=None,
        help="also evaluate every N steps (default: before and after only)",
    )
    rl.add_argument(
        "--train-size",
        dest="train_size",
        type=_positive_int,
        default=1000,
        help="training instances cycled through (default 1000)",
    )
    p.set_defaults(handler=cmd_train)

    p = commands.add_parser("status", help="what a campaign's database holds")
    p.add_argument("--db", required=True, help="database file or URL")
    p.add_argument("--name", default=None, help="campaign name (default: the only one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_status)

    p = commands.add_parser("db", help="inspect a solution database")
    db_commands = p.add_subparsers(dest="db_command", required=True, parser_class=_Parser)

    def db_command(name: str, help: str) -> argparse.ArgumentParser:
        sub = db_commands.add_parser(name, help=help)
        sub.add_argument("--db", required=True, help="database file or URL")
        sub.add_argument("--name", default=None, help="campaign name (default: the only one)")
        sub.add_argument("--json", action="store_true", help="print JSON")
        return sub

    db_command("stats", "counts, best values, policy versions").set_defaults(handler=cmd_db)
    sub = db_command("top", "the best programs by an objective, weights or the mean")
    sub.add_argument("--objective", default=None)
    sub.add_argument("--weights", default=None, help="a,b,...: one weight per objective")
    sub.add_argument("-n", type=_row_count, default=10)
    sub.set_defaults(handler=cmd_db)
    db_command("pareto", "the non-dominated programs").set_defaults(handler=cmd_db)
    sub = db_command("show", "one program: code, scores, where it came from")
    sub.add_argument("id", type=_program_id)
    sub.set_defaults(handler=cmd_db)
    sub = db_command("diff", "a program against its parent or another program")
    sub.add_argument("id", type=_program_id)
    sub.add_argument("other", type=_program_id, nargs="?", default=None)
    sub.set_defaults(handler=cmd_db)
    sub = db_command("lineage", "ancestry through parents and drafts")
    sub.add_argument("id", type=_program_id)
    sub.set_defaults(handler=cmd_db)
    sub = db_command("plot", "PNG plots of progress, Pareto fronts and training")
    sub.add_argument("--out", required=True, help="folder for the PNG files")
    sub.add_argument("--pair", default=None, help="x,y: one pair of objectives to plot")
    sub.set_defaults(handler=cmd_db)
    sub = db_command("export", "programs or trajectories as JSONL or Parquet")
    sub.add_argument("--what", default="programs", help="programs or trajectories")
    sub.add_argument("--format", dest="fmt", default="jsonl", help="jsonl or parquet")
    sub.add_argument("--out", required=True, help="file to write")
    sub.set_defaults(handler=cmd_db)

    p = commands.add_parser("ui", help="a live, read-only web dashboard of a database")
    p.add_argument("--db", required=True, help="database file or URL")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: local only)")
    p.add_argument("--port", type=_port, default=8300, help="port (default: 8300)")
    p.set_defaults(handler=cmd_ui)

    p = commands.add_parser("config", help="campaign configuration")
    config_commands = p.add_subparsers(dest="config_command", required=True, parser_class=_Parser)
    show = config_commands.add_parser("show", help="print the effective config as TOML")
    show.add_argument("problem", nargs="?", default=None)
    _campaign_flags(show)
    show.set_defaults(handler=cmd_config_show)
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


def program_problem(spec: str) -> Problem:
    """A problem whose candidates are programs; an answer problem is a one-line error."""
    problem = load_problem(spec)
    if not isinstance(problem, Problem):
        raise UserError(
            f"{problem.name} is an answer problem (its answers are not programs to evolve): "
            f"train on it with `vpo train --problem {spec} --out DIR`"
        )
    return problem


def cmd_problems(args: argparse.Namespace) -> int:
    problems = [load_problem(name) for name in sorted(available())]
    if args.json:
        print(json.dumps([_problem_json(p) for p in problems], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="problems")
    for column in ("problem", "kind", "objective", "direction", "best known", "source"):
        table.add_column(column)
    for problem in problems:
        for i, objective in enumerate(problem.objectives):
            table.add_row(
                problem.name if i == 0 else "",
                problem.kind if i == 0 else "",
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

    problem = program_problem(args.problem)
    code = read_program(args.file)
    workers = args.workers or min(len(problem.calls()), os.cpu_count() or 1)
    with Sandbox(workers=workers) as sandbox:
        evaluation = evaluate(problem, code, sandbox)
    if args.json:
        print(json.dumps(evaluation.to_json()))
    else:
        print_evaluation(problem, evaluation, title=f"{problem.name}: {args.file}")
    return 0 if evaluation.status == "ok" else 1


def _campaign_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="a TOML file with campaign settings")
    p.add_argument(
        "--db",
        default=None,
        help="database file or URL (default: runs/PROBLEM.db; postgresql://... works)",
    )
    p.add_argument("--name", default=None, help="campaign name (default: the problem's name)")
    flag = p.add_argument_group("settings (override the config file and the stored campaign)")
    flag.add_argument("--iterations", type=int, default=None, help="total iterations (20)")
    flag.add_argument("--strategy", default=None, help="evolve (default) or best-of-n")
    flag.add_argument("--backend", default=None, help="transformers (default), vllm or openai")
    flag.add_argument("--model", default=None, help="model name, HF id or folder (smollm2)")
    flag.add_argument("--base-url", dest="base_url", default=None, help="openai endpoint URL")
    flag.add_argument(
        "--api-key-env",
        dest="api_key_env",
        default=None,
        help="variable holding the API key (OPENAI_API_KEY)",
    )
    flag.add_argument(
        "-G",
        "--group-size",
        dest="group_size",
        type=int,
        default=None,
        help="rollouts per prompt (4)",
    )
    flag.add_argument(
        "-m", "--candidates", type=int, default=None, help="candidates per rollout (3)"
    )
    flag.add_argument("--temperature", type=float, default=None, help="sampling temperature (0.8)")
    flag.add_argument("--top-p", dest="top_p", type=float, default=None, help="nucleus (0.95)")
    flag.add_argument(
        "--max-tokens",
        dest="max_tokens",
        type=int,
        default=None,
        help="tokens per completion (768)",
    )
    flag.add_argument("--islands", type=int, default=None, help="islands (4)")
    flag.add_argument(
        "--migration-interval",
        dest="migration_interval",
        type=int,
        default=None,
        help="iterations between migrations (20)",
    )
    flag.add_argument("--drafts", type=int, default=None, help="drafts beside the parent (3)")
    flag.add_argument("--workers", type=int, default=None, help="sandbox workers (0: one per CPU)")
    flag.add_argument(
        "--time-limit",
        dest="time_limit",
        type=float,
        default=None,
        help="seconds per call (0: the problem's own)",
    )
    flag.add_argument("--seed", type=int, default=None, help="random seed (0)")
    train = p.add_argument_group("training (VPO inside the campaign)")
    train.add_argument(
        "--train-every",
        dest="train_every",
        type=int,
        default=None,
        help="one training step after every K new groups (0: no training)",
    )
    train.add_argument(
        "--advantage", default=None, help="vpo (default), grpo, multi_rlvr, max_at_k or gdpo"
    )
    train.add_argument(
        "--lr", dest="learning_rate", type=float, default=None, help="learning rate (1e-6)"
    )
    train.add_argument(
        "--lora", action="store_const", const=True, default=None, help="train a LoRA adapter"
    )
    train.add_argument(
        "--lora-rank", dest="lora_rank", type=int, default=None, help="LoRA rank (16)"
    )
    train.add_argument(
        "--kl-beta", dest="kl_beta", type=float, default=None, help="KL weight (1e-3)"
    )
    train.add_argument(
        "--policy-dir",
        dest="policy_dir",
        default=None,
        help="where policy versions are saved (default: beside the database)",
    )


SETTING_FLAGS = (
    "iterations",
    "strategy",
    "backend",
    "model",
    "base_url",
    "api_key_env",
    "group_size",
    "candidates",
    "temperature",
    "top_p",
    "max_tokens",
    "islands",
    "migration_interval",
    "drafts",
    "workers",
    "time_limit",
    "seed",
    "train_every",
    "advantage",
    "learning_rate",
    "lora",
    "lora_rank",
    "kl_beta",
    "policy_dir",
)


def _effective_config(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(config, problem, store, stored campaign or None) from flags, file and database."""
    from harness.config import build, load_toml
    from harness.store import Store

    flags = {key: getattr(args, key) for key in SETTING_FLAGS}
    flags["problem"] = args.problem
    flags["name"] = args.name
    file = load_toml(args.config) if args.config else {}
    store = None
    stored = None
    if args.db is not None:
        store = Store.open(args.db)
        stored = _find_campaign(store, args.name or file.get("name"), required=False)
    problem_spec = (
        args.problem or file.get("problem") or (stored.config.get("problem") if stored else None)
    )
    if problem_spec is None:
        raise UserError(
            "which problem? give PROBLEM, a --config with `problem`, or a --db holding a campaign"
        )
    problem = program_problem(problem_spec)
    if store is None:
        db = str(Path("runs") / f"{problem.name}.db")
        store = Store.open(db)
        stored = _find_campaign(
            store, args.name or file.get("name") or problem.name, required=False
        )
    base = dict(stored.config) if stored else {}
    base["problem"] = problem_spec
    config = build(base, file, flags, where=args.config or "the settings")
    return config, problem, store, stored


def _find_campaign(store: Any, name: str | None, *, required: bool) -> Any:
    if name is not None:
        campaign = store.get_campaign(name)
        if campaign is None and required:
            raise UserError(f"no campaign named {name!r} in {store.where}")
        return campaign
    campaigns = store.campaigns()
    if len(campaigns) == 1:
        return campaigns[0]
    if required:
        names = ", ".join(c.name for c in campaigns) or "none"
        raise UserError(f"{store.where} holds campaigns {names}; pick one with --name")
    return None


def cmd_run(args: argparse.Namespace) -> int:
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
    from harness.campaign import run_campaign

    if args.problem:  # before any database is opened or created
        program_problem(args.problem)

    config, problem, store, stored = _effective_config(args)
    name = config.name or problem.name
    print(f"campaign {name!r} {'resumed from' if stored else 'created in'} {store.where}")
    with _progress_reporter(config.iterations) as report:
        campaign_id = run_campaign(config, store, problem, on_progress=report)
    summary = store.summary(campaign_id)
    _print_best(problem, summary)
    print(f"database: {store.where}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from harness.config import ADVANTAGES, check_float
    from harness.store import Store
    from harness.training import OfflineSettings, train_offline

    if args.advantage not in ADVANTAGES:
        raise UserError(
            f"--advantage must be one of {', '.join(ADVANTAGES)}, not {args.advantage!r}"
        )
    # The campaign settings' ranges, so `vpo train` takes no NaN or infinity either.
    if args.learning_rate is not None:
        check_float("learning_rate", args.learning_rate, name="--lr")
    check_float("kl_beta", args.kl_beta, name="--kl-beta")
    if (args.db is None) == (args.problem is None):
        raise UserError(
            "give either --db (learn from a campaign's groups) or --problem (RL on an answer "
            "problem such as maze)"
        )
    if args.out is None and not args.follow:
        raise UserError("--out is required: the folder the trained model is written to")
    out = Path(args.out or ".")
    if (
        args.out is not None
        and not args.follow
        and out.exists()
        and (not out.is_dir() or any(out.iterdir()))
    ):
        raise UserError(f"--out {out} exists and is not an empty folder")
    if args.problem is not None:
        if args.follow:
            raise UserError(
                "--follow trains beside workers on a campaign: give --db, not --problem"
            )
        return _train_answers(args, out)
    store = Store.open(args.db, create=False)
    campaign = _find_campaign(store, args.name, required=True)
    if args.follow:
        return _train_follow(args, store, campaign)
    stored = campaign.config
    settings = OfflineSettings(
        out=out,
        model=args.model or stored.get("model", "smollm2"),
        advantage=args.advantage,
        steps=args.steps,
        groups_per_step=args.groups_per_step or 8,
        learning_rate=args.learning_rate or (1e-5 if args.lora else 1e-6),
        lora=args.lora,
        lora_rank=args.lora_rank,
        kl_beta=args.kl_beta,
        micro_batch=args.micro_batch or 8,
        temperature=max(float(stored.get("temperature", 1.0)), 1e-3),
        seed=args.seed,
    )
    # Under torchrun or `accelerate launch` every process runs this; one of them speaks.
    speaks = os.environ.get("RANK", "0") == "0"
    if speaks:
        print(f"training {settings.model} on campaign {campaign.name!r} of {store.where}")
    history = train_offline(
        store,
        campaign.id,
        int(stored.get("candidates", 3)),
        settings,
        on_step=lambda metrics: print(metrics.line(), flush=True),
    )
    if speaks:
        print(f"{len(history)} steps; model written to {out} (vpo run --model {out})")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import socket

    from harness.worker import run_worker

    if args.db is None:
        raise UserError("a worker joins a campaign in a database: give --db (postgresql://...)")
    if args.problem:
        program_problem(args.problem)
    config, problem, store, stored = _effective_config(args)
    if config.train_every:
        raise UserError(
            "workers do not train: leave out --train-every and run one "
            "`vpo train --db ... --follow` beside them"
        )
    worker = args.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    print(f"worker {worker} on campaign {config.name or problem.name} of {store.where}")
    done = run_worker(
        config,
        store,
        problem,
        worker,
        lease_seconds=args.lease,
        on_progress=lambda iteration, progress: print(
            f"[{worker}] iteration {iteration}/{config.iterations} done", flush=True
        ),
    )
    print(f"worker {worker}: {done} iterations recorded")
    return 0


def _train_follow(args: argparse.Namespace, store: Any, campaign: Any) -> int:
    import time

    from harness.config import build
    from harness.training import maybe_train, start_trainer

    stored = dict(campaign.config)
    every = args.train_every or int(stored.get("train_every") or 0) or 4
    # The follower never samples, whatever backend the workers use.
    overrides: dict[str, Any] = {
        "train_every": every,
        "advantage": args.advantage,
        "backend": "transformers",
    }
    if args.model:
        overrides["model"] = args.model
    if args.learning_rate:
        overrides["learning_rate"] = args.learning_rate
    if args.lora:
        overrides |= {"lora": True, "lora_rank": args.lora_rank}
    overrides["kl_beta"] = args.kl_beta
    if args.out is not None:
        overrides["policy_dir"] = str(Path(args.out).resolve())
    config = build(stored, overrides, where="the campaign's settings")
    on_server = stored.get("backend") == "openai"
    if on_server and not config.lora:
        raise UserError(
            f"the workers of campaign {campaign.name!r} sample from a server, which takes new "
            "policy versions only as LoRA adapters: give --lora"
        )
    trainer = start_trainer(
        config, store, campaign.id, campaign.name, store.objectives(campaign.id)
    )
    assert trainer is not None
    # Workers elsewhere read the recorded paths: make them absolute.
    trainer.folder = trainer.folder.resolve()
    # Workers of a campaign on a server load each LoRA version there as an adapter; only
    # in-process workers need it merged into whole weights (a full model's size per version).
    trainer.write_merged = not on_server
    print(
        f"following campaign {campaign.name!r} of {store.where}: a step every {every} new "
        f"groups, versions in {trainer.folder}",
        flush=True,
    )
    steps = 0
    while True:
        metrics = maybe_train(trainer, None)
        if metrics is not None:
            steps += 1
            print(metrics.line(), flush=True)
            if args.steps is not None and steps >= args.steps:
                break
            continue
        done = store.iterations_done(campaign.id) >= config.iterations
        if done and store.open_claims(campaign.id) == 0:
            break  # every group is in; fewer than `every` are left unused
        time.sleep(args.poll)
    print(f"{steps} steps; the last policy version is step {trainer.policy.step}")
    return 0


def _train_answers(args: argparse.Namespace, out: Path) -> int:
    from harness.answers import AnswerSettings, train_answers
    from problems.api import AnswerProblem

    problem = load_problem(args.problem)
    if not isinstance(problem, AnswerProblem):
        raise UserError(
            f"{problem.name} is a program problem: run a campaign on it (vpo run {args.problem}) "
            "and train on its database (vpo train --db ...)"
        )
    if args.name is not None:
        raise UserError("--name picks a campaign of --db; it does not go with --problem")
    settings = AnswerSettings(
        out=out,
        model=args.model or "smollm2",
        advantage=args.advantage,
        steps=args.steps if args.steps is not None else 20,
        prompts_per_step=args.groups_per_step or 4,
        group_size=args.group_size,
        candidates=args.candidates,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        eval_prompts=args.eval_prompts,
        eval_generations=args.eval_generations,
        eval_every=args.eval_every or 0,
        train_size=args.train_size,
        learning_rate=args.learning_rate or (1e-5 if args.lora else 1e-6),
        lora=args.lora,
        lora_rank=args.lora_rank,
        kl_beta=args.kl_beta,
        micro_batch=args.micro_batch or 2,
        seed=args.seed,
    )
    print(
        f"training {settings.model} on {problem.name} by RL: {settings.steps} steps of "
        f"{settings.prompts_per_step} prompts x {settings.group_size} completions, "
        f"m = {settings.candidates}"
    )
    train_answers(problem, settings, say=lambda line: print(line, flush=True))
    print(f"model and report (vpo-train.json) written to {out}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from harness.store import Store
    from harness.views import summary_json

    with Store.open(args.db, read_only=True) as store:  # a view: works on a read-only mount
        campaign = _find_campaign(store, args.name, required=True)
        report = summary_json(store, campaign.id)
    if args.json:
        print(json.dumps(report))
        return 0
    from rich.console import Console

    table = _summary_table(
        f"campaign {campaign.name} ({campaign.problem}, {campaign.status})", report
    )
    Console().print(table)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from harness.dashboard import serve
    from harness.store import Store

    store = Store.open(args.db, read_only=True)
    try:
        serve(store, args.host, args.port)
    finally:
        store.close()
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from harness.store import Store

    # Views only read: a read-only open works on a read-only mount and never writes the file.
    with Store.open(args.db, read_only=True) as store:
        return _db_view(store, args)


def _db_view(store: Any, args: argparse.Namespace) -> int:
    from harness import views

    campaign = _find_campaign(store, args.name, required=True)
    command = args.db_command
    if command == "export":
        out = Path(args.out)
        count = views.export(store, campaign.id, args.what, args.fmt, out)
        if args.json:
            print(json.dumps({"rows": count, "out": str(out)}))
        else:
            print(f"{count} {args.what} written to {out}")
        return 0
    if command == "plot":
        pair = None if args.pair is None else args.pair.split(",")
        files = views.plot(store, campaign.id, Path(args.out), pair)
        if args.json:
            print(json.dumps({"files": [str(f) for f in files]}))
        else:
            print("\n".join(str(f) for f in files))
        return 0
    if command == "stats":
        data: Any = views.stats(store, campaign.id)
    elif command == "top":
        weights = None
        if args.weights is not None:
            try:
                weights = [float(w) for w in args.weights.split(",")]
            except ValueError:
                raise UserError(
                    f"--weights must be numbers separated by commas, not {args.weights!r}"
                ) from None
        data = views.top(store, campaign.id, objective=args.objective, weights=weights, n=args.n)
    elif command == "pareto":
        data = views.pareto(store, campaign.id)
    elif command == "show":
        data = views.show(store, args.id)
    elif command == "diff":
        data = views.diff(store, args.id, args.other)
    else:
        data = views.lineage(store, args.id)
    if args.json:
        print(json.dumps(data, default=str))
    else:
        _render(command, data)
    return 0


def _render(command: str, data: Any) -> None:
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.table import Table
    from rich.text import Text

    console = Console()
    if command in ("top", "pareto"):
        table = Table(title=f"{command}: {len(data)} programs")
        objectives = sorted({k for row in data for k in row["scores"]})
        for column in ("id", "island", "gen", "origin", *objectives):
            table.add_column(column, justify="right")
        if command == "top":
            table.add_column("by", justify="right")
        for row in data:
            cells = [str(row["id"]), str(row["island"]), str(row["generation"]), row["origin"]]
            cells += [_score_cell(row, name) for name in objectives]
            if command == "top":
                cells.append(f"{row['value']:.6f}")
            table.add_row(*cells)
        console.print(table)
    elif command == "stats":
        table = _summary_table(
            "database",
            data,
            [(f"programs {status}", str(n)) for status, n in data["programs_by_status"].items()],
        )
        console.print(table)
    elif command == "show":
        console.print(
            Text(
                f"program {data['id']}: {data['status']}, {data['origin']}, island "
                f"{data['island']}, generation {data['generation']}, parent "
                f"{data['parent_id']}"
            )
        )
        for name, value in data["scores"].items():
            raw = data["raw"].get(name)
            console.print(Text(f"  {name}: {value:.6f} (raw {raw})"))
        if data["error"]:
            console.print(Text(f"feedback: {_inert(data['error'])}"))
        detail = data["origin_detail"]
        if detail:
            rollout = detail["trajectory"]
            console.print(
                Text(
                    f"from iteration {detail['iteration']} (group {detail['group_id']}), rollout "
                    f"{rollout['position']}, candidate {data['candidate_index']}; drafts shown: "
                    f"{detail['draft_ids'] or 'none'}; parse {rollout['parse_status']}"
                )
            )
        console.print(Syntax(_inert(data["code"]), "python", line_numbers=True))
    elif command == "diff":
        if data["diff"]:
            console.print(Syntax(_inert(data["diff"]), "diff"))
        else:
            console.print(Text(f"programs {data['from']} and {data['to']} have the same code"))
    else:
        table = Table(
            title=f"lineage of program {data['program_id']}: depth {data['depth']}, "
            f"islands {data['islands']}, mean children {data['branching']:.2f}"
        )
        for column in ("id", "island", "generation", "origin", "children"):
            table.add_column(column, justify="right")
        for step in data["path"]:
            table.add_row(
                *(str(step[k]) for k in ("id", "island", "generation", "origin", "children"))
            )
        console.print(table)
        console.print(
            Text(
                f"{data['drafts_shown']} draft edges, "
                f"{data['ancestors_in_graph']} programs in the graph"
            )
        )


def _summary_table(
    title: str, report: dict[str, Any], extra: Sequence[tuple[str, str]] = ()
) -> Any:
    """The counts of `summary_json`, then `extra` rows, then the best value per objective."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in (
        "programs",
        "valid_programs",
        "evaluations",
        "groups",
        "trajectories",
        "policy_versions",
        "tokens",
    ):
        table.add_row(key.replace("_", " "), str(report[key]))
    for row in extra:
        table.add_row(*row)
    for objective, best in report["best"].items():
        raw = "-" if best["raw"] is None else f"{best['raw']:.10g}"
        table.add_row(
            f"best {objective}", f"{best['score']:.6f} (raw {raw}, program {best['program_id']})"
        )
    return table


def _inert(text: str | None) -> str:
    """Untrusted text (code, model output) with control characters shown, not obeyed: an ESC
    in a candidate must not drive the user's terminal."""
    if not text:
        return ""
    return "".join(c if c in "\n\t" or c.isprintable() else _escape(c) for c in text)


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def _score_cell(row: dict[str, Any], name: str) -> str:
    value = row["scores"].get(name)
    return "-" if value is None else f"{value:.6f}"


def cmd_config_show(args: argparse.Namespace) -> int:
    config, _problem, _store, _stored = _effective_config(args)
    print(config.to_toml(), end="")
    return 0


class _progress_reporter:  # noqa: N801 - used as a context manager, reads like a function
    """A rich progress bar on a terminal; one plain line per iteration elsewhere (logs, CI)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Any = None

    def __enter__(self) -> Any:
        if sys.stdout.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task("starting", total=self.total)
        return self.report

    def report(self, iteration: int, progress: Any) -> None:
        line = progress.line(iteration, self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=iteration, description=line)
        else:
            print(line, flush=True)

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print_best(problem: Problem, summary: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{problem.name}: best so far")
    for column in ("objective", "score", "raw", "best known", "program"):
        table.add_column(column, justify="left" if column == "objective" else "right")
    for objective in problem.objectives:
        best = summary.best.get(objective.name)
        if best is None:
            table.add_row(objective.name, "-", "-", f"{objective.best_known:.10g}", "-")
            continue
        raw = "-" if best["raw"] is None else f"{best['raw']:.10f}"
        table.add_row(
            objective.name,
            f"{best['score']:.6f}",
            raw,
            f"{objective.best_known:.10g}",
            str(best["program_id"]),
        )
    Console().print(table)
    print(
        f"programs: {summary.programs} ({summary.valid_programs} valid), "
        f"iterations: {summary.groups}, tokens: {summary.tokens}"
    )


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
    from rich.text import Text

    # A file name is shown as written, never read as rich markup or terminal codes.
    table = Table(title=Text(_inert(title)))
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
        # The reason quotes the candidate (its exception, its output): escaped like `vpo db`.
        line += f" ({_inert(evaluation.reason)})"
    console.print(line, markup=False, highlight=False)


def _problem_json(problem: Any) -> dict[str, Any]:
    return {
        "name": problem.name,
        "kind": problem.kind,
        "entry": getattr(problem, "entry", None),
        "time_limit": getattr(problem, "time_limit", None),
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


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"port {value} is not between 1 and 65535")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


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


def _row_count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_ROWS:  # more than any table shows; SQLite cannot bind past 2^63 at all
        raise argparse.ArgumentTypeError(f"-n is at most {MAX_ROWS}, not {value}")
    return value


def _program_id(text: str) -> int:
    from harness.db import MAX_ID

    value = _positive_int(text)
    if value > MAX_ID:  # no row has it, and the SQLite driver cannot even bind it
        raise argparse.ArgumentTypeError(f"no program can have id {value} (ids end at 2^63 - 1)")
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
