"""What `vpo db` views print: a ranking, best@k, stats, a program with the completion that
wrote it, a diff, a lineage with its descendants. The data comes from
`harness.observation.views`; the shared pieces (console, code blocks, inert text, scores) from
`render`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.cli.render import (
    code_block,
    console,
    inert,
    print_stage_returns,
    score_text,
    summary_table,
)
from harness.records import is_case


def print_view(command: str, data: Any) -> None:
    """What `vpo db COMMAND` found, as a table (top, pareto, stats, bestk, lineage), a program
    (show) or a diff."""

    out = console()
    if command in ("top", "pareto"):
        out.print(_ranking(command, data))
    elif command == "bestk":
        out.print(_best_at_k(data))
    elif command == "stats":
        by_status = data["programs_by_status"].items()
        rows = [(f"programs {status}", str(n)) for status, n in by_status]
        rows += [
            (f"skipped iteration {s['iteration']}", inert(s["reason"][:200]))
            for s in data.get("last_skipped", [])
        ]
        out.print(summary_table("database", data, rows))
    elif command == "show":
        _print_program(out, data)
    elif command == "diff":
        from rich.text import Text

        if data["diff"]:
            out.print(code_block(data["diff"], "diff"))
        else:
            out.print(Text(f"programs {data['from']} and {data['to']} have the same code"))
    else:
        _print_lineage(out, data)


def _ranking(command: str, data: Any) -> Any:
    from rich.table import Table

    table = Table(title=f"{command}: {len(data)} programs")
    objectives = sorted({k for row in data for k in row["scores"] if not is_case(k)})
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
    return table


def _best_at_k(data: dict[str, Any]) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"best@k and pass@k over {data['slots']} candidate slots",
        caption=f"{data['with_program']} slots hold a program; {data['passing']} pass "
        "(every objective at or above its best known value)",
    )
    # Objective names come from the problem's code: shown as text, never read as markup.
    names = [Text(inert(f"best@k {name}")) for name in data["objectives"]]
    for column in ["k", *names, "best@k mean", "pass@k"]:
        table.add_column(column, justify="right")
    for row in data["rows"]:
        best = [f"{row['best'][name]:.6f}" for name in data["objectives"]]
        table.add_row(str(row["k"]), *best, f"{row['best_mean']:.6f}", f"{row['pass']:.6f}")
    return table


def _print_program(console: Any, data: Any) -> None:
    """A program's row, scores and feedback, where it came from, what its first stages
    returned (a fit's constants), its code as the sandbox ran it, and the completion of the
    rollout that wrote it (seeds and migrants have none)."""
    from rich.text import Text

    console.print(
        Text(
            f"program {data['id']}: {data['status']}, {data['origin']}, island "
            f"{data['island']}, generation {data['generation']}, parent "
            f"{data['parent_id']}"
        )
    )
    for name, value in data["scores"].items():
        raw = data["raw"].get(name)
        console.print(Text(f"  {name}: {score_text(value, f'raw {raw}')}"))
    if data["error"]:
        console.print(Text(f"feedback: {inert(data['error'])}"))
    detail = data["origin_detail"]
    if detail:
        rollout = detail["trajectory"]
        console.print(
            Text(
                f"from iteration {detail['iteration']} (group {detail['group_id']}), rollout "
                f"{rollout['position']}, candidate {data['candidate_index']}; drafts shown: "
                f"{detail['draft_ids'] or 'none'}; parse {rollout['parse_status']}; sampled by "
                f"{version_text(data.get('policy_version'))}"
            )
        )
    print_stage_returns(console, data.get("returned", {}))
    # What is stored is what ran: a problem that writes its programs (an equation) stores its
    # writing, and the completion below shows what the model wrote.
    console.print(Text("program as the sandbox ran it:"))
    console.print(code_block(data["code"], "python", line_numbers=True))
    if detail:
        tokens = rollout["num_tokens"]
        console.print()
        console.print(
            Text(
                f"completion of rollout {rollout['position']} ({tokens} tokens, finish "
                f"{rollout['finish_reason']}):",
                style="bold",
            )
        )
        console.print(Text(inert(rollout["completion"]) or "(empty)"))


def version_text(step: int | None) -> str:
    """`policy version 3`; version 0 is the weights the campaign started from."""
    if step is None:
        return "a policy version no longer in the database"
    return "policy version 0 (the starting weights)" if step == 0 else f"policy version {step}"


def _print_lineage(console: Any, data: Any) -> None:
    """The program and its ancestors up to a seed, then its descendants generation by
    generation, each with its scores."""
    from rich.table import Table
    from rich.text import Text

    objectives = data.get("objectives", [])
    table = Table(
        title=f"lineage of program {data['program_id']}: depth {data['depth']}, "
        f"islands {data['islands']}, mean children {data['branching']:.2f}"
    )
    columns = ("id", "island", "generation", "origin", "status", "children")
    for column in (*columns, *objectives):
        table.add_column(Text(inert(column)), justify="right")
    for step in data["path"]:
        table.add_row(*(str(step[k]) for k in columns), *_lineage_scores(step, objectives))
    console.print(table)
    console.print(
        Text(
            f"{data['drafts_shown']} draft edges, "
            f"{data['ancestors_in_graph']} programs in the graph"
        )
    )
    descendants = data.get("descendants", [])
    if not descendants:
        console.print(Text(f"program {data['program_id']} has no descendants"))
        return
    cut = data.get("descendants_cut")
    table = Table(
        title=f"descendants of program {data['program_id']}: {len(descendants)}",
        caption=f"{cut} (see --depth and -n)" if cut else None,
    )
    columns = ("below", "id", "parent_id", "island", "generation", "origin", "status", "children")
    for column in ("below", "id", "parent", *columns[3:], *objectives):
        table.add_column(Text(inert(column)), justify="right")
    for program in descendants:
        table.add_row(*(str(program[k]) for k in columns), *_lineage_scores(program, objectives))
    console.print(table)


def _lineage_scores(program: dict[str, Any], objectives: Sequence[str]) -> list[str]:
    scores = program.get("scores", {})
    return [score_text(scores[name]) if name in scores else "-" for name in objectives]


def _score_cell(row: dict[str, Any], name: str) -> str:
    value = row["scores"].get(name)
    return "-" if value is None else score_text(value)
