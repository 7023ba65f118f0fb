"""Speed of the batched VPO advantage against a per-group loop, at the issue's sizes.

    python benchmarks/advantages_speed.py [--repeats 50]

Ours: `trainer.advantages.vpo_advantages` on (B, G, m, d) at once. Beside it, in the same run:
the per-group NumPy loop a user would otherwise write from the VPO authors' description of
their `vpo_advantage` (one Dirichlet draw of K weights per group, the max over candidates, the
mean over weights, the population z-score), written here from that description. Both get the
same scores; the per-group loop takes masked candidates out of the max the same way.

Prints a table and writes it to benchmarks/results/advantages_speed.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

from trainer.advantages import vpo_advantages  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "advantages_speed.md"
TARGET_MS = 5.0
SIZES = [(128, 8, 3, 16), (128, 8, 3, 2), (32, 8, 3, 16), (512, 8, 3, 16)]


def per_group_loop(scores: np.ndarray, mask: np.ndarray, k: int, rng: np.random.Generator):
    out = np.zeros(scores.shape[:2])
    for b in range(scores.shape[0]):
        weights = rng.dirichlet(np.ones(scores.shape[3]), size=k)
        totals = []
        for g in range(scores.shape[1]):
            rows = scores[b, g][mask[b, g]]
            totals.append((rows @ weights.T).max(axis=0).mean() if len(rows) else 0.0)
        totals = np.array(totals)
        spread = totals.std()
        out[b] = 0.0 if spread < 1e-6 else (totals - totals.mean()) / (spread + 1e-6)
    return out


def timed(function, repeats: int) -> float:
    function()  # warm-up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--weights", type=int, default=100, help="K draws per group")
    args = parser.parse_args()
    rows = []
    for size in SIZES:
        generator = torch.Generator().manual_seed(0)
        scores = torch.rand(size, generator=generator)
        mask = torch.rand(size[:3], generator=generator) > 0.2
        ours = timed(
            functools.partial(
                vpo_advantages, scores, mask, num_weights=args.weights, generator=generator
            ),
            args.repeats,
        )
        theirs = timed(
            functools.partial(
                per_group_loop,
                scores.numpy(),
                mask.numpy(),
                args.weights,
                np.random.default_rng(0),
            ),
            max(3, args.repeats // 10),
        )
        rows.append((size, ours, theirs))
        print(f"{size}: ours {ours * 1e3:.2f} ms, per-group loop {theirs * 1e3:.1f} ms", flush=True)
    main_size = rows[0]
    verdict = "meets" if main_size[1] * 1e3 < TARGET_MS else "misses"
    lines = [
        "# VPO advantages: batched torch against a per-group loop",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), numpy {np.__version__}",
        f"- command: `python benchmarks/advantages_speed.py --repeats {args.repeats} "
        f"--weights {args.weights}`",
        f"- K = {args.weights} Dirichlet(1) draws per group; 20% of candidates masked; "
        "medians of the repeats (the loop gets a tenth of them, at least 3)",
        "",
        "| B x G x m x d | vpo_advantages ms | per-group NumPy loop ms | ratio |",
        "|---|---:|---:|---:|",
    ]
    for size, ours, theirs in rows:
        lines.append(
            f"| {' x '.join(map(str, size))} | **{ours * 1e3:.2f}** | {theirs * 1e3:.1f} | "
            f"{theirs / ours:.0f}x |"
        )
    lines += [
        "",
        f"Target: under {TARGET_MS:.0f} ms at 128 x 8 x 3 x 16; this run {verdict} it.",
    ]
    report = "\n".join(lines) + "\n"
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
