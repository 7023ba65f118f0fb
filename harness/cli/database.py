"""`vpo status`, `vpo db ...` and `vpo ui`: read-only views of a campaign's database. Each
opens it read-only, so they work on a read-only mount and never write the file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.cli import db_render, render
from harness.cli.campaigns import find_campaign
from harness.cli.flags import (
    MAX_DESCENDANTS,
    add_subcommands,
    descendant_count,
    k_count,
    port,
    positive_int,
    program_id,
    row_count,
)
from harness.config.errors import UserError
from problems.api import Problem


def add_commands(commands: Any) -> None:
    p = commands.add_parser("status", help="what a campaign's database holds")
    p.add_argument("--db", required=True, help="database file or URL")
    p.add_argument("--name", default=None, help="campaign name (default: the only one)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=cmd_status)

    p = commands.add_parser("db", help="inspect a solution database")
    _add_views(add_subcommands(p, "db_command"))

    p = commands.add_parser("ui", help="a live, read-only web dashboard of a database")
    p.add_argument("--db", required=True, help="database file or URL")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: local only)")
    p.add_argument("--port", type=port, default=8300, help="port (default: 8300)")
    p.set_defaults(handler=cmd_ui)


def _add_views(db_commands: Any) -> None:
    def view(name: str, help: str) -> argparse.ArgumentParser:
        sub = db_commands.add_parser(name, help=help)
        sub.add_argument("--db", required=True, help="database file or URL")
        sub.add_argument("--name", default=None, help="campaign name (default: the only one)")
        sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(handler=cmd_db)
        return sub

    view("stats", "counts, best values, policy versions")
    sub = view("top", "the best programs by an objective, weights or the mean")
    sub.add_argument(
        "--objective", default=None, help="rank by this objective (default: the mean of all)"
    )
    sub.add_argument("--weights", default=None, help="a,b,...: one weight per objective")
    sub.add_argument("-n", type=row_count, default=10, help="how many programs")
    view("pareto", "the non-dominated programs")
    sub = view("show", "one program: code, scores, where it came from")
    sub.add_argument("id", type=program_id)
    sub = view("diff", "a program against its parent, or A against B as `git diff A B` reads")
    sub.add_argument("id", type=program_id, help="the program (A, the old side, with OTHER)")
    sub.add_argument(
        "other",
        type=program_id,
        nargs="?",
        default=None,
        help="the new side: lines of OTHER show as added (default: ID against its parent)",
    )
    sub = view("lineage", "ancestors through parents and drafts, and descendants, with scores")
    sub.add_argument("id", type=program_id)
    sub.add_argument(
        "--depth",
        type=positive_int,
        default=4,  # views.DESCENDANT_DEPTH, the dashboard's
        help="generations of descendants shown",
    )
    sub.add_argument(
        "-n",
        type=descendant_count,
        default=100,  # views.DESCENDANT_LIMIT
        help=f"the most descendants shown (up to {MAX_DESCENDANTS})",
    )
    sub = view("bestk", "best@k and pass@k over the campaign's candidates, k = 1..30")
    sub.add_argument(
        "--k",
        type=k_count,
        default=30,
        help="the largest k (default 30; at most the number of candidate slots)",
    )
    sub = view("plot", "PNG plots of progress, Pareto fronts, iterations and training")
    sub.add_argument(
        "--out", required=True, help="folder for the PNG files (made if missing; not a file)"
    )
    sub.add_argument("--pair", default=None, help="x,y: one pair of objectives to plot")
    sub = view("export", "programs or trajectories as JSONL or Parquet")
    sub.add_argument("--what", default="programs", help="programs or trajectories")
    sub.add_argument(
        "--format",
        dest="fmt",
        default=None,
        help="jsonl or parquet (default: by the suffix of --out: .jsonl or .json, .parquet; "
        "a suffix naming the other format is an error, any other suffix takes --format)",
    )
    sub.add_argument("--out", required=True, help="the file to write (not a folder)")
    sub = db_commands.add_parser(
        "upgrade",
        help="migrate a database to this release's schema now (a writable open does it on its "
        "own; read-only users cannot), after a backup copy of a SQLite file",
    )
    sub.add_argument("--db", required=True, help="database file or URL")
    sub.set_defaults(handler=cmd_upgrade)


def cmd_upgrade(args: argparse.Namespace) -> int:
    from harness.store import Store, migrations

    where, before, after = Store.upgrade(args.db)
    if before == migrations.head():
        print(f"{where} is at {after} already: nothing to migrate")
    else:
        print(f"{where} migrated from {migrations.named(before)} to {after}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from harness.observation import status
    from harness.store import Store

    with Store.open(args.db, read_only=True) as store:  # a view: works on a read-only mount
        campaign = find_campaign(store, args.name, required=True)
        report = status.report(store, campaign)
    if args.json:
        print(json.dumps(report))
    else:
        title = f"campaign {campaign.name} ({campaign.problem}, {campaign.status})"
        render.print_status(title, report)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from harness.observation.web import serve
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
    from harness.observation import exports, plots, views

    campaign = find_campaign(store, args.name, required=True)
    command = args.db_command
    if command == "export":
        out = Path(args.out)
        count = exports.export(store, campaign.id, args.what, args.fmt, out)
        if args.json:
            print(json.dumps({"rows": count, "out": str(out)}))
        else:
            print(f"{count} {args.what} written to {out}")
        return 0
    if command == "plot":
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(
                f"--out {out} is a file; plot writes several PNG files into a folder: name one "
                "(it is made if missing)"
            )
        pair = None if args.pair is None else args.pair.split(",")
        files = plots.plot(store, campaign.id, out, pair)
        if args.json:
            print(json.dumps({"files": [str(f) for f in files]}))
        else:
            print("\n".join(str(f) for f in files))
        return 0
    if command == "stats":
        data: Any = views.stats(store, campaign.id)
    elif command == "top":
        weights = None if args.weights is None else _weights(args.weights)
        data = views.top(store, campaign.id, objective=args.objective, weights=weights, n=args.n)
    elif command == "pareto":
        data = views.pareto(store, campaign.id)
    elif command == "bestk":
        data = views.bestk(store, campaign.id, args.k)
    elif command == "show":
        data = views.show(store, args.id)
        data["returned"] = _stored_returns(store, data)
    elif command == "diff":
        data = views.diff(store, args.id, args.other)
    else:
        data = views.lineage(store, args.id, depth=args.depth, limit=args.n)
    if args.json:
        print(json.dumps(data, default=str))
    else:
        db_render.print_view(command, data)
    return 0


def _weights(text: str) -> list[float]:
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise UserError(f"--weights must be numbers separated by commas, not {text!r}") from None


def _stored_returns(store: Any, program: dict[str, Any]) -> dict[str, Any] | None:
    """What a stored program's first stages returned (`render.stage_returns`: a fit's
    constants); None where its problem takes stages, its first returned and nothing was kept:
    a program stored before vpo kept it."""
    metrics = program["metrics"]
    artifacts = metrics.get("artifacts") if isinstance(metrics, dict) else None
    if not isinstance(artifacts, dict):
        return {}
    returned = render.stage_returns(artifacts)
    if returned or not artifacts:
        return returned
    problem = _installed_problem(store, program["id"])
    if not isinstance(problem, Problem) or type(problem).follow_up is Problem.follow_up:
        return {}  # one stage a call: nothing is handed on
    calls = {call.key for call in problem.calls()}
    # its first stage returned: it scored, or a later stage ran
    handed_on = program["status"] == "ok" or any(stage not in calls for stage in artifacts)
    return None if handed_on else {}


def _installed_problem(store: Any, program_id: int) -> Any:
    """The problem of the program's campaign, or None where it cannot be loaded. Only an
    installed problem is: a view never imports a folder's problem.py that a database names."""
    from problems.registry import available
    from problems.registry import load as load_problem

    program = store.program(program_id)
    spec = next((c.problem for c in store.campaigns() if c.id == program.campaign_id), None)
    if spec is None or Path(spec).exists() or "/" in spec or spec.startswith("."):
        return None
    if spec.partition(":")[0] not in available():
        return None
    try:
        return load_problem(spec)
    except Exception:  # a package that fails to load: nothing can be told
        return None
