"""What the commands print: rich tables on a terminal, one plain line per event elsewhere.

Text from a candidate or a model (code, feedback, file names) is shown with its control
characters escaped (`inert`), never obeyed by the terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from problems.api import Evaluation, Problem, record_note

# The width rich is given for a file or a pipe: more than any line it prints, so that a table
# takes its natural width and a line its own length (rich assumes 80 columns there and would
# cut paths and wrap rows). Nothing printed there fills the width: code and diffs are printed
# as plain lines (`code_block`), not as rich's Syntax, which pads every line to the width.
PIPE_WIDTH = 100_000


def console() -> Any:
    """A rich console: the terminal's width on a terminal, natural widths elsewhere (`COLUMNS`
    set in the environment wins)."""
    from rich.console import Console

    return Console(width=PIPE_WIDTH, soft_wrap=True) if piped() else Console()


def piped() -> bool:
    """Whether what is printed goes to a file or a pipe at natural width (`console`)."""
    return not sys.stdout.isatty() and "COLUMNS" not in os.environ


def code_block(text: str, lexer: str, *, line_numbers: bool = False) -> Any:
    """Untrusted code or a diff, shown inert: highlighted on a terminal; in a file or a pipe,
    its own lines (numbered like the terminal's), neither padded nor wrapped."""
    from rich.syntax import Syntax
    from rich.text import Text

    shown = inert(text)
    if not piped():
        return Syntax(shown, lexer, line_numbers=line_numbers)
    lines = shown.splitlines()
    if line_numbers:
        width = len(str(len(lines)))
        lines = [
            f"{n:>{width}} {line}" if line else f"{n:>{width}}" for n, line in enumerate(lines, 1)
        ]
    return Text("\n".join(lines))


def print_problems(problems: Sequence[Any]) -> None:
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
    console().print(table)


def problem_json(problem: Any) -> dict[str, Any]:
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


def stage_returns(artifacts: Mapping[str, Any]) -> dict[str, Any]:
    """What each stage that another followed returned, by stage (`evaluate_many` keeps it):
    `{"fit": {"params": [...], "training_mse": ...}}`; empty for a problem of one stage."""
    return {
        stage: found["returned"]
        for stage, found in artifacts.items()
        if isinstance(found, Mapping) and "returned" in found
    }


def data_text(value: Any, nested: bool = False) -> str:
    """Kept data (`results.kept`) on one line, numbers to six significant digits, text inert:
    `params [1.5, -0.25], training_mse 3.1e-05`."""
    if isinstance(value, Mapping):
        text = ", ".join(f"{inert(str(k))} {data_text(v, True)}" for k, v in value.items())
        return f"{{{text}}}" if nested else text
    if isinstance(value, list):
        return "[" + ", ".join(data_text(item, True) for item in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return inert(value) if isinstance(value, str) else str(value)


def print_stage_returns(out: Any, returned: Mapping[str, Any] | None) -> None:
    """`fit returned: params [...], training_mse ...`, one line per stage; None: a program
    stored before they were kept."""
    if returned is None:
        out.print(
            "what its earlier stages returned (a fit's constants) was not recorded: the program"
            " was stored before vpo kept it (`vpo eval` of its code shows it)",
            markup=False,
            highlight=False,
        )
    for stage, value in (returned or {}).items():
        out.print(f"{inert(stage)} returned: {data_text(value)}", markup=False, highlight=False)


def print_evaluation(
    problem: Problem, evaluation: Evaluation, title: str, program: str | None, written: str
) -> None:
    """The program the sandbox ran (where the problem rewrote the file's text `written`; None:
    it refused it), the scores, what its earlier stages returned (a fit's constants), and last
    the status with its reason."""
    from rich.table import Table
    from rich.text import Text

    out = console()
    driver = ", followed by the problem's driver" if problem.driver else ""
    if problem.referee:  # the verdict is the referee's, in a process of its own
        driver += ", called by the problem's referee"
    if program == written:
        out.print(f"program: run as written{driver}", markup=False, highlight=False)
    elif program is not None:
        out.print(f"program the sandbox ran, as the problem wrote it{driver}:", markup=False)
        out.print(code_block(program, "python", line_numbers=True))
    # A file name is shown as written, never read as rich markup or terminal codes.
    table = Table(title=Text(inert(title)))
    for column in ("objective", "score", "raw", "best known"):
        table.add_column(column, justify="right" if column != "objective" else "left")
    for objective in problem.objectives:
        raw = evaluation.raw.get(objective.name)
        table.add_row(
            objective.name,
            score_text(evaluation.scores.get(objective.name, 0.0)),
            "-" if raw is None else f"{raw:.10f}",
            f"{objective.best_known:.10g}",
        )
    out.print(table)
    print_stage_returns(out, stage_returns(evaluation.artifacts))
    line = f"status: {evaluation.status}"
    if evaluation.reason:
        # The reason quotes the candidate (its exception, its output): escaped like `vpo db`.
        line += f" ({inert(evaluation.reason)})"
    out.print(line, markup=False, highlight=False)


class progress_reporter:  # noqa: N801 - used as a context manager, reads like a function
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
        from harness.config import logs

        line = progress.line(iteration, self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=iteration, description=line)
            logs.progress(line)
        else:
            logs.say(line)

    def __exit__(self, *exc_info: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_best(problem: Problem, summary: Any) -> None:
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
            score_text(best["score"]),
            raw,
            f"{objective.best_known:.10g}",
            str(best["program_id"]),
        )
    console().print(table)
    print(
        f"programs: {summary.programs} ({summary.valid_programs} valid), "
        f"iterations: {summary.groups}, tokens: {summary.tokens}"
        + (f", skipped: {summary.skipped} (vpo db stats)" if summary.skipped else "")
        + (f", policy versions: {summary.policy_versions}" if summary.policy_versions else "")
    )


def print_versions(versions: list[dict[str, Any]], objectives: Sequence[str]) -> None:
    """What each policy version sampled (`vpo run`'s end, `vpo status`): version 0 is the
    weights the campaign started from."""
    from rich.table import Table

    table = Table(title="what each policy version sampled")
    for column in ("version", "groups", "rollouts", "parse rate", "diversity"):
        table.add_column(column, justify="right")
    for objective in objectives:
        table.add_column(f"best {objective}", justify="right")
    for row in versions:
        rate, diversity = row["parse_rate"], row["pool_diversity"]
        table.add_row(
            str(row["step"]),
            str(row["groups"]),
            str(row["rollouts"]),
            "-" if rate is None else f"{rate:.2f}",
            "-" if diversity is None else f"{diversity:.3f}",
            *(score_text(row["best"][o]) if o in row["best"] else "-" for o in objectives),
        )
    console().print(table)


def trained_share(versions: list[dict[str, Any]]) -> str:
    """`12 of 16 rollouts (75%)`: those sampled by weights a step changed (a version of a step
    that trained nothing holds the starting weights)."""
    rollouts = sum(row["rollouts"] for row in versions)
    trained = sum(row["rollouts"] for row in versions if row["changed"])
    share = f" ({trained / rollouts:.0%})" if rollouts else ""
    return f"{trained} of {rollouts} rollouts{share}"


def print_status(title: str, report: dict[str, Any]) -> None:
    """`vpo status`: the counts, then how it is going (harness/observation/status.py), then the
    best."""

    console().print(summary_table(title, report, status_rows(report)))
    if report["steps"]:
        print_versions(report["versions"], list(report["best"]))


# The training metrics `vpo status` shows of the last step, with how each is printed.
STEP_METRICS = (
    ("loss", "loss", "{:+.4f}"),
    ("kl", "kl", "{:.2e}"),
    ("grad_norm", "grad norm", "{:.3g}"),
    ("clip_fraction", "clip", "{:.1%}"),
    ("set_score", "set score", "{:.3f}"),
    ("diversity", "diversity", "{:.3f}"),
    ("staleness", "staleness", "{:.1f}"),
)


def status_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Iterations of the budget, time, pace and ETA, training, and rejected candidates."""
    done, budget = report["iterations"], report["budget"]
    state = "running" if report["running"] else f"idle for {duration(report['idle_s'])}"
    rows = [
        ("iterations done", f"{done} of {budget}" if budget is not None else str(done)),
        *([("stopped by", report["stopped_by"])] if report.get("stopped_by") else []),
        ("elapsed", f"{duration(report['elapsed_s'])} ({state})"),
        ("time left", "-" if report["eta_s"] is None else f"about {duration(report['eta_s'])}"),
    ]
    if report["seconds_per_iteration"] is not None:
        rows.append(
            (
                f"pace (last {report['pace_window']} iterations)",
                f"{report['seconds_per_iteration']:.1f} s per iteration, "
                f"{report['tokens_per_s']:.0f} tokens/s, {report['evals_per_s']:.2f} evals/s",
            )
        )
    split = report.get("time_split") or {}
    if split.get("batches"):
        rows.append(
            (
                f"time (last {split['batches']} batches)",
                f"{split['line']} ({split['tokens_per_s']:.0f} tokens/s over them)",
            )
        )
    last = report["last_step"]
    shown = [
        f"{label} {template.format(last[key])}"
        for key, label, template in STEP_METRICS
        if last is not None and isinstance(last.get(key), int | float)
    ]
    rows.append(("training steps", str(report["steps"])))
    if report["steps"]:
        rows.append(("sampled by trained weights", trained_share(report["versions"])))
    if shown:
        rows.append((f"last step ({last.get('step', report['steps'])})", ", ".join(shown)))
    note = report.get("policy_folder_note")
    if report.get("policy_bytes") is not None:
        rows.append(
            (
                "policy versions on disk",
                f"{report['policy_versions_on_disk']}, {size(report['policy_bytes'])} in "
                f"{report['policy_folder']}" + (f" ({note})" if note else ""),
            )
        )
    elif note:
        rows.append(("policy versions on disk", f"none found: {note}"))
    rejected = ", ".join(f"{name} {n}" for name, n in report["rejections"].items())
    rows.append((f"rejected of {report['candidates']} candidates", rejected))
    return rows


def size(count: int) -> str:
    """Bytes in the largest decimal unit with a whole part: 512 B, 41.2 MB, 1.9 GB."""
    value, unit = float(count), "B"
    for larger in ("kB", "MB", "GB", "TB"):
        if value < 999.95:  # else it would round up to 1000.0
            break
        value, unit = value / 1000, larger
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"


def duration(seconds: float) -> str:
    """42 s, 3 min 20 s, 2 h 05 min, 3 d 4 h."""
    whole = max(0, round(seconds))
    minutes, s = divmod(whole, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days} d {h} h"
    if hours:
        return f"{hours} h {m:02d} min"
    return f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def summary_table(title: str, report: dict[str, Any], extra: Sequence[tuple[str, str]] = ()) -> Any:
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
        "skipped",
        "trajectories",
        "policy_versions",
        "tokens",
    ):
        table.add_row(key.replace("_", " "), str(report[key]))
    measured = report.get("measures")
    if measured is not None:
        for name, label, shown in (
            ("pool_diversity", "pool diversity", lambda v: f"{v:.4f}"),
            ("parse_rate", "parse rate", lambda v: f"{v:.1%}"),
        ):
            measure = measured[name]
            if measure["latest"] is None:
                table.add_row(label, "-")
                continue
            table.add_row(f"{label} (iteration {measure['iteration']})", shown(measure["latest"]))
            table.add_row(f"{label} (mean of last {measured['window']})", shown(measure["mean"]))
    for row in extra:
        table.add_row(*row)
    for objective, best in report["best"].items():
        raw = "-" if best["raw"] is None else f"{best['raw']:.10g}"
        found = f", iteration {best['iteration']}" if "iteration" in best else ""
        table.add_row(
            f"best {objective}",
            score_text(best["score"], f"raw {raw}, program {best['program_id']}{found}"),
        )
    return table


def score_text(score: float, detail: str = "") -> str:
    """A score to six decimals, with what `detail` says and, above 1, the record it sets:
    "1.020000 (record: +2.0% over best known; raw 2.04)"."""
    notes = "; ".join(note for note in (record_note(score), detail) if note)
    return f"{score:.6f} ({notes})" if notes else f"{score:.6f}"


def inert(text: str | None) -> str:
    """Untrusted text (code, model output) with control characters shown, not obeyed: an ESC
    in a candidate must not drive the user's terminal."""
    if not text:
        return ""
    return "".join(c if c in "\n\t" or c.isprintable() else _escape(c) for c in text)


def _escape(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"
