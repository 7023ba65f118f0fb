"""How large the discovery reward's two parts are on real campaigns: each rollout's R2 gain over
what its campaign (or parent, or island) held before its group, and the share of its candidate
slots that were wasted. The slot cost is chosen from this: a wasted slot should cost about what
a rollout that moves the front typically gains, so that neither part drowns the other. Given a
grid's databases (trained arms beside untrained ones), it shows how often each arm's rollouts
earn anything under each reference: the density of the signal a step learns from.

    python benchmarks/reward_scale.py --db runs/x.db [--db runs/y.db ...]
        [--references parent,island,campaign,none]

Prints, per database and reference, the share of rollouts with a gain above 0 and the quartiles
of those gains, with the distribution of wasted slots, and writes them to
benchmarks/results/reward_scale.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.reporting import publish  # noqa: E402
from harness.config.errors import UserError  # noqa: E402
from harness.learning.rewards import references, to_group, wasted_slots  # noqa: E402
from harness.store import Store  # noqa: E402
from trainer.advantages import set_scores  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, action="append", help="a campaign; repeatable")
    parser.add_argument("--references", default="parent,island,campaign,none")
    parser.add_argument("--out", default="benchmarks/results/reward_scale.md")
    args = parser.parse_args(argv)
    scopes = [scope.strip() for scope in args.references.split(",") if scope.strip()]
    try:
        measured = [measure(db, scopes) for db in args.db]
    except UserError as error:  # a missing file, a folder, a URL that does not parse
        parser.error(str(error))
    objectives = measured[0][0]
    lines = [
        "# The discovery reward's parts on stored campaigns",
        "",
        "- command: `python benchmarks/reward_scale.py "
        + " ".join(f"--db {db}" for db in args.db)
        + f" --references {','.join(scopes)}`",
        f"- objectives: {', '.join(objectives)}; gain: the set score's R2 gain over the "
        "reference (1,000 Dirichlet(1) weightings a group, seed 0); `none`: the absolute set "
        "score",
    ]
    for db, (_, candidates, wasted, _) in zip(args.db, measured, strict=True):
        counts = np.bincount(wasted, minlength=candidates + 1)
        lines.append(
            f"- {label(db)}: m = {candidates}, {len(wasted)} rollouts; wasted slots per "
            "rollout: "
            + ", ".join(f"{k}: {c / max(len(wasted), 1):.0%}" for k, c in enumerate(counts))
        )
    lines += [
        "",
        "| database | reference | rollouts with a gain > 0 | gain, 25% | median | 75% |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for db, (_, _, _, gains_of) in zip(args.db, measured, strict=True):
        for scope in scopes:
            gains = np.array(gains_of[scope])
            moved = gains[gains > 0]
            q = np.percentile(moved, [25, 50, 75]) if len(moved) else [float("nan")] * 3
            lines.append(
                f"| {label(db)} | {scope} | {len(moved)} "
                f"({len(moved) / max(len(gains), 1):.0%}) | {q[0]:.4f} | {q[1]:.4f} | "
                f"{q[2]:.4f} |"
            )
    publish(Path(args.out), "\n".join(lines) + "\n")
    return 0


def measure(db: str, scopes: list[str]) -> tuple[list[str], int, list[int], dict[str, list]]:
    """One campaign's objectives, m, each rollout's wasted slots and, per reference, each
    rollout's set score against it."""
    store = Store.open(db, create=False)
    try:
        campaign = store.campaigns()[0]
        objectives = store.objectives(campaign.id)
        candidates = int(campaign.config.get("candidates", 3))
        stored = store.training_groups(campaign.id)
        against = {s: references(store, campaign.id, stored, objectives, s) for s in scopes}
    finally:
        store.close()
    wasted = [wasted_slots(r, candidates, objectives) for record in stored for r in record.rollouts]
    gains = {s: scope_gains(stored, objectives, candidates, against[s]) for s in scopes}
    return objectives, candidates, wasted, gains


def scope_gains(stored, objectives, candidates, against) -> list[float]:  # noqa: ANN001
    """Every rollout's set score against its group's reference (absolute without one)."""
    generator = torch.Generator().manual_seed(0)
    gains: list[float] = []
    for record in stored:
        group = to_group(record, objectives, candidates, reference=against.get(record.id))
        if group is None:
            continue
        reference = None if group.reference is None else torch.from_numpy(group.reference[None])
        gains += set_scores(
            torch.from_numpy(group.scores[None]),
            torch.from_numpy(group.mask[None]),
            num_weights=1000,
            generator=generator,
            reference=reference,
        )[0].tolist()
    return gains


def label(db: str) -> str:
    """A database's name in the report: a file's folder and name, or a server's URL without
    its password."""
    if "://" in db and not db.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        return make_url(db).render_as_string(hide_password=True)
    path = Path(db.split("///")[-1])
    return f"{path.parent.name}/{path.name}"  # a grid's arms share names across its folders


if __name__ == "__main__":
    raise SystemExit(main())
