"""How much a campaign's reward vector trades off: do its parts move together?

    python benchmarks/reward_geometry.py [PATH ...] [--vector objectives|cases]
        [--weightings 100] [--out FILE.md]

VPO rewards a rollout by the mean, over Dirichlet(1) weightings w of the objectives, of its best
candidate under w. When the parts of the vector move together, the same candidate is best under
every w and VPO is scalar RL on their mean; its authors report it falls back to that when the
components are nearly collinear (arXiv 2605.22817). Measured per campaign:

- the Spearman rank correlation of each pair of objectives over the scored candidates (every
  parsed, evaluated slot of every rollout, a repeat included; over the valid programs for a
  run summary, which keeps no rollouts);
- of the rollouts with two or more scored candidates that are not all one vector, the share
  whose best candidate changes with the weighting (over `--weightings` fixed draws of w); the
  rollouts with two or more scored candidates, for scale.

`--vector cases`: the same over the problem's case scores (`[training] vector = "cases"`), in
the databases that stored them. PATH: a campaign database (SQLite), a folder of them (every
*.db), or a run summary (`*.run.json`, benchmarks/discovery.py's) or a folder of those; with no
PATH, every grid under benchmarks/results/discovery/. Prints a table and writes it to
benchmarks/results/reward_geometry.md. It reads; nothing else should matter.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from discovery_runs import scored_candidates, summary_fields  # noqa: E402
from reporting import publish  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GRIDS = RESULTS / "discovery"
WEIGHTINGS = 100  # as the VPO paper's K


@dataclass(frozen=True)
class Geometry:
    name: str
    objectives: list[str]
    scored: int  # candidates (or programs) the correlations are over
    correlations: dict[tuple[str, str], float]  # nan where a part is constant
    eligible: int | None  # rollouts with 2+ scored candidates; None: no rollouts kept
    distinct: int | None  # of those, the ones whose candidates are not all one vector
    switched: int | None  # of those, the ones whose best candidate changes with w

    @property
    def switch_share(self) -> float:
        return self.switched / self.distinct if self.distinct else float("nan")


def rank_correlations(vectors: np.ndarray, objectives: list[str]) -> dict[tuple[str, str], float]:
    """Spearman's rho of each pair of columns of `vectors` (n, d): Pearson's on average ranks;
    nan where a column is constant or fewer than 3 rows."""
    ranks = np.column_stack([_ranks(column) for column in vectors.T]) if len(vectors) else vectors
    out = {}
    for i, j in itertools.combinations(range(len(objectives)), 2):
        a, b = ranks[:, i], ranks[:, j]
        constant = len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0
        rho = float("nan") if constant else float(np.corrcoef(a, b)[0, 1])
        out[objectives[i], objectives[j]] = rho
    return out


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def best_switches(candidates: np.ndarray, weights: np.ndarray) -> bool:
    """Whether the best of `candidates` (m, d) under w . s differs between the rows of `weights`
    (K, d); candidates with equal vectors are one (the first)."""
    _, first = np.unique(candidates, axis=0, return_index=True)
    distinct = candidates[np.sort(first)]
    if len(distinct) < 2:
        return False
    best = (weights @ distinct.T).argmax(axis=1)
    return bool((best != best[0]).any())


def weightings(dims: int, count: int) -> np.ndarray:
    return np.random.default_rng(0).dirichlet(np.ones(dims), count)


def of_rollouts(
    name: str, objectives: list[str], scored: Sequence[Sequence[Sequence[float]]], count: int
) -> Geometry:
    """From each rollout's scored candidates (k score vectors): the geometry above."""
    weights = weightings(len(objectives), count)
    rollouts = [np.array(r, dtype=np.float64).reshape(len(r), len(objectives)) for r in scored]
    slots = [row for rollout in rollouts for row in rollout]
    vectors = np.array(slots).reshape(len(slots), len(objectives))
    several = [r for r in rollouts if len(r) >= 2]
    distinct = [r for r in several if len(np.unique(r, axis=0)) >= 2]
    return Geometry(
        name,
        objectives,
        len(vectors),
        rank_correlations(vectors, objectives),
        len(several),
        len(distinct),
        sum(best_switches(r, weights) for r in distinct),
    )


def of_database(path: Path, count: int, vector: str = "objectives") -> Geometry:
    from harness.store import Store

    with Store.open(str(path), read_only=True) as store:
        campaign = store.campaigns()[0]
        if vector == "cases":
            objectives = store.cases(campaign.id)
            if not objectives:
                raise SystemExit(f"{path} stored no case scores")
        else:
            objectives = store.objectives(campaign.id)
        groups = store.training_groups(campaign.id)
    rollouts = [
        scored_candidates(rollout, objectives) for group in groups for rollout in group.rollouts
    ]
    return of_rollouts(_label(path), objectives, rollouts, count)


def of_summary(path: Path, count: int, vector: str = "objectives") -> Geometry:
    """A run summary: from its rollouts where it kept them, else its valid programs' vectors
    (correlations only)."""
    if vector == "cases":
        raise SystemExit(f"{path}: a run summary keeps no case scores; pass its database")
    fields = summary_fields(path)
    objectives = fields["objectives"]
    if fields.get("rollout_scores") is not None:
        return of_rollouts(_label(path), objectives, fields["rollout_scores"], count)
    vectors = fields["program_scores"]
    correlations = rank_correlations(vectors, objectives)
    return Geometry(_label(path), objectives, len(vectors), correlations, None, None, None)


def _label(path: Path) -> str:
    name = path.name.removesuffix(".run.json").removesuffix(".db")
    return f"{path.parent.name}/{name}"


def sources(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths or sorted(p for p in GRIDS.iterdir() if p.is_dir()):
        if path.is_dir():
            found += sorted(path.glob("*.db")) + sorted(path.glob("*.run.json"))
        elif path.exists():
            found.append(path)
        else:
            raise SystemExit(f"{path}: no such database, summary or folder")
    return found


def report(rows: list[Geometry], command: str, count: int) -> str:
    pairs = sorted({pair for row in rows for pair in row.correlations}, key=str)
    head = "| campaign | scored | " + " | ".join(f"rho {a}~{b}" for a, b in pairs)
    head += " | rollouts with 2+ scored | not all one vector | best changes with w |\n"
    head += "|---|---:|" + "---:|" * len(pairs) + "---:|---:|---:|\n"
    lines = []
    for row in rows:
        cells = [row.name, str(row.scored)]
        cells += [_num(row.correlations.get(pair, float("nan"))) for pair in pairs]
        if row.eligible is None:
            cells += ["(not kept)"] * 3
        else:
            cells += [str(row.eligible), str(row.distinct), f"{row.switched} ({_share(row)})"]
        lines.append("| " + " | ".join(cells) + " |")
    medians = []
    for pair in pairs:
        values = [r.correlations.get(pair, np.nan) for r in rows]
        values = [value for value in values if not np.isnan(value)]
        if values:
            median = np.median(values)
            medians.append(f"rho {pair[0]}~{pair[1]} median {median:+.2f} over {len(values)}")
    kept = [r for r in rows if r.distinct]
    if kept:
        switched, distinct = sum(r.switched for r in kept), sum(r.distinct for r in kept)
        share = switched / distinct
        medians.append(f"best changes with w in {switched} of {distinct} rollouts ({share:.0%})")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return (
        "# Reward geometry: do the parts of the reward vector move together?\n\n"
        f"- date: {now}; commit {commit}\n"
        f"- command: `{command}`\n"
        f"- weightings: {count} fixed Dirichlet(1) draws; rho: Spearman's over the scored "
        "candidates (a database) or the valid programs (a run summary, which keeps no rollouts)\n\n"
        + ("**" + "; ".join(medians) + ".**\n\n" if medians else "")
        + head
        + "\n".join(lines)
        + "\n"
    )


def _num(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{value:+.2f}"


def _share(row: Geometry) -> str:
    return "n/a" if np.isnan(row.switch_share) else f"{row.switch_share:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--vector", choices=("objectives", "cases"), default="objectives")
    parser.add_argument("--weightings", type=int, default=WEIGHTINGS)
    parser.add_argument("--out", type=Path, default=RESULTS / "reward_geometry.md")
    args = parser.parse_args()
    if args.weightings < 1:
        parser.error("--weightings must be at least 1")
    read = {".db": of_database}
    rows = [
        read.get(p.suffix, of_summary)(p, args.weightings, args.vector) for p in sources(args.paths)
    ]
    if not rows:
        raise SystemExit("no database or run summary found")
    command = "python benchmarks/reward_geometry.py " + " ".join(sys.argv[1:])
    publish(args.out, report(rows, command.strip(), args.weightings))


if __name__ == "__main__":
    main()
