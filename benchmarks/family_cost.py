"""What the first family key cost: candidates a campaign threw away as "the same family" as a
stored program, evaluated now, against the program they were merged with.

A campaign never evaluates a candidate whose family key (`Problem.family`) it already holds. Issue
56's red team found the first key merging families that differ (two sines keyed as one, a
function of a constant keyed as a free constant, a zero that dropped a NaN term). This reads
campaigns run under that key, re-parses each completion to recover every candidate recorded as
a family repeat (the database keeps the completion, not the repeat's code), evaluates it in the
sandbox as the campaign would have, and counts how many would have scored above the program they
were merged with, and how many the current key (family.py) keeps apart.

    python benchmarks/family_cost.py --db DIR/none-seed0.db [--db ...] \
        [--out benchmarks/results/family_cost.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reporting import publish  # noqa: E402
from harness.config.errors import UserError  # noqa: E402
from harness.evaluation.evaluate import evaluate_many  # noqa: E402
from harness.evaluation.sandbox import Sandbox  # noqa: E402
from harness.evolution.parsing import parse_completion  # noqa: E402
from harness.store import Store  # noqa: E402
from problems.registry import load  # noqa: E402

FAMILY = "the same family as"  # the reason a family repeat is recorded with (iteration.py)
ABOVE = 1e-9  # a score above the merged program's by more than rounding


@dataclass
class Repeat:
    code: str
    merged_id: int  # the program (or the earlier candidate's) it was taken for


@dataclass
class Cost:
    label: str
    rollouts: int = 0
    slots: int = 0
    repeats: int = 0  # candidate slots recorded as family repeats
    distinct: int = 0  # distinct codes among them
    apart: int = 0  # ... that the current key keys apart from the program merged with
    ok: int = 0  # ... evaluated without failing
    above_id: int = 0  # ... with fit_id above the merged program's
    above_ood: int = 0
    above_both: int = 0
    above_kept: int = 0  # ... above in fit_id or fit_ood, yet the current key still merges them
    kept_gain: float = 0.0  # the largest such gain (fit_id or fit_ood)
    best_gain: float = 0.0  # the largest fit_id gain over the merged program
    campaign_best: float = 0.0  # the campaign's best fit_id
    above_campaign: int = 0  # repeats above the campaign's best fit_id
    examples: list[str] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, action="append", help="a campaign; repeatable")
    parser.add_argument("--out", default="benchmarks/results/family_cost.md")
    parser.add_argument("--workers", type=int, default=2, help="sandbox processes")
    parser.add_argument("--made-by", default="", help="how the campaigns were run, for the report")
    args = parser.parse_args(argv)
    costs = []
    for db in args.db:
        if not Path(db).is_file():
            parser.error(f"no database at {db}")
        try:
            costs.append(measure(db, args.workers))
        except UserError as error:
            parser.error(str(error))
    publish(Path(args.out), report(costs, args.db, args.made_by))
    return 0


def measure(db: str, workers: int) -> Cost:
    store = Store.open(db, create=False)
    try:
        campaign = store.campaigns()[0]
        problem = load(campaign.problem)
        compact = campaign.config.get("form") == "compact"
        m = int(campaign.config.get("candidates", 1))
        with store.engine.connect() as connection:
            programs = {
                row.id: (row.code, json.loads(row.scores or "{}"), row.status)
                for row in connection.execute(text(PROGRAMS), {"campaign": campaign.id})
            }
            rows = list(connection.execute(text(TRAJECTORIES), {"campaign": campaign.id}))
    finally:
        store.close()
    cost = Cost(f"{Path(db).parent.name}/{Path(db).name}")
    cost.campaign_best = max(
        (s.get("fit_id", 0.0) for _, s, status in programs.values() if status == "ok"),
        default=0.0,
    )
    repeats: dict[str, Repeat] = {}
    for row in rows:
        records = json.loads(row.candidates) if isinstance(row.candidates, str) else row.candidates
        cost.rollouts += 1
        cost.slots += m
        family = [
            r
            for r in records
            if r.get("outcome") == "duplicate" and FAMILY in (r.get("reason") or "")
        ]
        if not family:
            continue
        parsed = {c.index: c for c in parse_completion(row.completion, m, row.parent_code or "")}
        for record in family:
            cost.repeats += 1
            candidate = parsed.get(record["index"])
            if candidate is None or candidate.code is None:
                continue
            code = candidate.code
            if compact and problem.compact is not None:
                code = problem.compact.program(code)
            repeats.setdefault(code, Repeat(code, record["program_id"]))
    cost.distinct = len(repeats)
    merged_codes = {r.code: programs.get(r.merged_id) for r in repeats.values()}
    apart = set()
    for repeat in repeats.values():
        merged = merged_codes[repeat.code]
        if merged is not None and problem.family(repeat.code) != problem.family(merged[0]):
            apart.add(repeat.code)
    cost.apart = len(apart)
    codes = list(repeats)
    with Sandbox(workers=workers) as sandbox:
        evaluations = evaluate_many(problem, codes, sandbox)
    for code, evaluation in zip(codes, evaluations, strict=True):
        merged = merged_codes[code]
        if evaluation.status != "ok" or merged is None:
            continue
        cost.ok += 1
        mine, theirs = evaluation.scores, merged[1] if merged[2] == "ok" else {}
        gain = mine.get("fit_id", 0.0) - theirs.get("fit_id", 0.0)
        gain_ood = mine.get("fit_ood", 0.0) - theirs.get("fit_ood", 0.0)
        up_id, up_ood = gain > ABOVE, gain_ood > ABOVE
        cost.above_id += up_id
        cost.above_ood += up_ood
        cost.above_both += up_id and up_ood
        if (up_id or up_ood) and code not in apart:
            cost.above_kept += 1
            cost.kept_gain = max(cost.kept_gain, gain, gain_ood)
        cost.best_gain = max(cost.best_gain, gain)
        cost.above_campaign += mine.get("fit_id", 0.0) > cost.campaign_best + ABOVE
        if up_id and len(cost.examples) < 3:
            body = code.strip().splitlines()[-1].strip()
            merged_body = merged[0].strip().splitlines()[-1].strip()
            cost.examples.append(
                f"`{body[:120]}` (fit_id {mine['fit_id']:.4f}) taken for `{merged_body[:120]}` "
                f"(fit_id {theirs.get('fit_id', 0.0):.4f})"
            )
    return cost


PROGRAMS = """
SELECT p.id, p.code, p.status,
       (SELECT json_group_object(s.objective, s.value) FROM score s WHERE s.program_id = p.id)
       AS scores
FROM program p WHERE p.campaign_id = :campaign
"""
TRAJECTORIES = """
SELECT t.completion, t.candidates, parent.code AS parent_code
FROM trajectory t
JOIN rollout_group g ON g.id = t.group_id
LEFT JOIN program parent ON parent.id = g.parent_program_id
WHERE g.campaign_id = :campaign
ORDER BY t.id
"""


def report(costs: list[Cost], dbs: list[str], made_by: str = "") -> str:
    lines = [
        "# What the first family key cost",
        "",
        "- command: `python benchmarks/family_cost.py " + " ".join(f"--db {d}" for d in dbs) + "`",
        *([f"- campaigns: {made_by}"] if made_by else []),
        '- repeats: candidate slots a campaign recorded as "the same family as" a stored program '
        "or an earlier candidate, never evaluated; each distinct one evaluated now in the sandbox",
        "- apart: the current key (family.py) gives it a key other than the merged program's",
        f"- above: its score beats the merged program's by more than {ABOVE:g}",
        "",
        "| campaign | rollouts | slots | family repeats | distinct | apart now | evaluated ok "
        "| fit_id above | fit_ood above | both above | above, merged now (largest gain) "
        "| largest fit_id gain | above the campaign's best |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.label} | {c.rollouts} | {c.slots} | {c.repeats} | {c.distinct} | {c.apart} "
            f"| {c.ok} | {c.above_id} | {c.above_ood} | {c.above_both} "
            f"| {c.above_kept} ({c.kept_gain:+.2g}) "
            f"| {c.best_gain:+.4f} "
            f"| {c.above_campaign} (best {c.campaign_best:.4f}) |"
        )
    total = sum(c.distinct for c in costs)
    lines += [
        "",
        f"All campaigns: {sum(c.repeats for c in costs)} family repeats, {total} distinct, "
        f"{sum(c.apart for c in costs)} apart under the current key, "
        f"{sum(c.above_id for c in costs)} above the merged program in fit_id, "
        f"{sum(c.above_both for c in costs)} in fit_id and fit_ood; "
        f"{sum(c.above_kept for c in costs)} above in either that the current key still merges.",
        "",
    ]
    examples = [e for c in costs for e in c.examples]
    if examples:
        lines += ["Examples (a repeat above the program it was taken for):", ""]
        lines += [f"- {e}" for e in examples]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
