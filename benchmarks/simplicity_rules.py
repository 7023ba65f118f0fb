"""Which simplicity rule makes equation discovery's objectives trade off: measured on the programs
and rollouts a real campaign stored.

For each rule, simplicity = HALF / (HALF + size) (the grammar's size) times a gate g(NMSE_id):

- `step`: 1 at or below the gate NMSE (half the seed's in-domain NMSE), else 0 (the rule
  before issue 46);
- `ramp`: log(1/NMSE) / log(1/gate), clipped to [0, 1]: 0 for an equation no better than
  predicting the mean (NMSE >= 1), 1 at the gate, continuous between;
- `seed_ramp`: the same ramp, 1 already at the seed's NMSE;
- `open`: 1 for any NMSE < 1 (no gate beyond beating the mean).

Measured on the campaign's scored programs (fit_id, fit_ood as stored, simplicity recomputed):
the size of the three-objective front; how many distinct programs win under 2,000 Dirichlet(1)
weightings (the programs a VPO set score can pay); the share of rollouts with two or more scored
candidates in which two or more candidates win under some weighting (a set score that pays more
than one slot); and the front points that are trivial (NMSE_id >= 0.9: barely better than a
constant) or that are a padded copy (the same fit_id and fit_ood as a smaller front point).

    python benchmarks/simplicity_rules.py --db runs/none-seed100.db --out simplicity_rules.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reporting import publish  # noqa: E402
from harness.store import Store  # noqa: E402
from problems.equation_discovery import EquationDiscovery, grammar  # noqa: E402
from trainer.measures import pareto_front  # noqa: E402

RULES = ("step", "ramp", "seed_ramp", "open")
WEIGHTINGS = 2000
TRIVIAL_NMSE = 0.9


def gate(rule: str, nmse: float, problem: EquationDiscovery) -> float:
    if not math.isfinite(nmse) or nmse >= 1:
        return 0.0
    at = problem.simplicity_gate if rule in ("step", "ramp") else min(problem.spec.seed_nmse[0], 1)
    if rule == "step":
        return float(nmse <= at)
    if rule == "open":
        return 1.0
    return min(max(math.log(nmse) / math.log(at), 0.0), 1.0) if nmse > 0 else 1.0


def measure(db: str, problem: EquationDiscovery, rule: str) -> dict[str, float]:
    store = Store.open(db, create=False)
    try:
        campaign = store.campaigns()[0]
        programs = [p for p in store.programs(campaign.id, limit=None) if p.status == "ok"]
        groups = store.training_groups(campaign.id)
    finally:
        store.close()
    vectors: dict[int, np.ndarray] = {}
    nmse: dict[int, float] = {}
    for p in programs:
        equation = problem.read(p.code)
        size = None if equation is None else equation.size
        raw = p.raw.get("fit_id")
        nmse[p.id] = math.inf if raw is None else float(raw)
        simple = grammar.simplicity(size) * gate(rule, nmse[p.id], problem)
        vectors[p.id] = np.array([p.scores["fit_id"], p.scores["fit_ood"], simple])
    ids = list(vectors)
    points = np.stack([vectors[i] for i in ids])
    front = [ids[i] for i in pareto_front(points)]
    weights = np.random.default_rng(0).dirichlet(np.ones(3), size=WEIGHTINGS)
    winners = {ids[i] for i in np.argmax(points @ weights.T, axis=0)}
    paid_many = rollouts = 0
    for group in groups:
        for rollout in group.rollouts:
            scored = sorted({i for i in rollout.programs if i in vectors})
            if len(scored) < 2:
                continue
            rollouts += 1
            local = np.stack([vectors[i] for i in scored])
            paid_many += len(set(np.argmax(local @ weights.T, axis=0).tolist())) >= 2
    trivial = sum(nmse[i] >= TRIVIAL_NMSE for i in front)
    padded = sum(
        any(
            j != i and np.allclose(vectors[j][:2], vectors[i][:2]) and vectors[j][2] > vectors[i][2]
            for j in front
        )
        for i in front
    )
    return {
        "programs": len(ids),
        "front": len(front),
        "winners": len(winners),
        "rollouts": rollouts,
        "paid_many": paid_many / rollouts if rollouts else 0.0,
        "trivial": trivial,
        "padded": padded,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", required=True, help="a campaign database")
    parser.add_argument("--problem", default="oscillator1")
    parser.add_argument("--out", default="benchmarks/results/simplicity_rules.md")
    args = parser.parse_args(argv)
    problem = EquationDiscovery(args.problem)
    rows = []
    for db in args.db:
        for rule in RULES:
            m = measure(db, problem, rule)
            rows.append(
                [Path(db).name, rule, m["programs"], m["front"], m["winners"],
                 f"{m['paid_many']:.2f} of {m['rollouts']}", m["trivial"], m["padded"]]
            )  # fmt: skip
    header = ["database", "rule", "scored programs", "front", "win some weighting",
              "rollouts paying 2+ slots", "trivial on front", "padded on front"]  # fmt: skip
    title = "Simplicity rules on equation discovery: which makes the objectives trade off"
    command = (
        "python benchmarks/simplicity_rules.py "
        + " ".join(f"--db {db}" for db in args.db)
        + f" --problem {args.problem}"
    )
    lines = [f"# {title}", "", f"- command: `{command}`", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]  # fmt: skip
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    publish(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
