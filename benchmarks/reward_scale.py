"""How large the discovery reward's two parts are on a real campaign: each rollout's R2 gain over
what its campaign (or parent, or island) held before its group, and the share of its candidate
slots that were wasted. The slot cost is chosen from this: a wasted slot should cost about what
a rollout that moves the front typically gains, so that neither part drowns the other.

    python benchmarks/reward_scale.py --db runs/x.db [--reference campaign]

Prints the share of rollouts with a gain above 0, the quartiles of those gains, and the
distribution of wasted slots, and writes them to benchmarks/results/reward_scale.md.
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
from harness.campaign.rewards import references, to_group, wasted_slots  # noqa: E402
from harness.store import Store  # noqa: E402
from trainer.advantages import set_scores  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--reference", default="campaign")
    parser.add_argument("--out", default="benchmarks/results/reward_scale.md")
    args = parser.parse_args(argv)
    store = Store.open(args.db, create=False)
    try:
        campaign = store.campaigns()[0]
        objectives = store.objectives(campaign.id)
        candidates = int(campaign.config.get("candidates", 3))
        stored = store.training_groups(campaign.id)
        against = references(store, campaign.id, stored, objectives, args.reference)
    finally:
        store.close()
    gains, wasted = [], []
    generator = torch.Generator().manual_seed(0)
    for record in stored:
        group = to_group(record, objectives, candidates, reference=against.get(record.id))
        if group is None:
            continue
        reference = None if group.reference is None else torch.from_numpy(group.reference[None])
        values = set_scores(
            torch.from_numpy(group.scores[None]),
            torch.from_numpy(group.mask[None]),
            num_weights=1000,
            generator=generator,
            reference=reference,
        )[0]
        gains += values.tolist()
        wasted += [wasted_slots(r, candidates) for r in record.rollouts]
    gains_array = np.array(gains)
    moved = gains_array[gains_array > 0]
    quartiles = np.percentile(moved, [25, 50, 75]) if len(moved) else [float("nan")] * 3
    counts = np.bincount(wasted, minlength=candidates + 1)
    lines = [
        "# The discovery reward's parts on a stored campaign",
        "",
        f"- command: `python benchmarks/reward_scale.py --db {args.db} --reference "
        f"{args.reference}`",
        f"- rollouts: {len(gains)}; objectives: {', '.join(objectives)}; m = {candidates}",
        "",
        "| rollouts with a gain > 0 | gain, 25% | median | 75% | "
        + " | ".join(f"{k} slots wasted" for k in range(candidates + 1))
        + " |",
        "|---:|---:|---:|---:|" + "---:|" * (candidates + 1),
        f"| {len(moved)} ({len(moved) / max(len(gains), 1):.0%}) | {quartiles[0]:.4f} | "
        f"{quartiles[1]:.4f} | {quartiles[2]:.4f} | "
        + " | ".join(f"{c / max(len(wasted), 1):.0%}" for c in counts)
        + " |",
    ]
    publish(Path(args.out), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
