"""benchmarks/discovery.py's report: the tables (each arm, paired by seed, the probe, every run)
and the plot of the best and hypervolume against tokens generated."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Sequence

import numpy as np
from discovery_runs import (
    ARM_TITLES,
    ARMS,
    BEST_AT_SHOWN,
    DISCOVERY_REWARD,
    GRID_POINTS,
    PAIRED_LEVEL,
    PROBE_SLOTS,
    RunResult,
    best_so_far,
    hypervolume_so_far,
    live_objectives,
    paired_interval,
)

# The report.


def spread(values: Sequence[float], digits: int = 3, *, bounds: bool = True) -> str:
    """mean [min, max] over seeds (the mean alone for one seed, or without `bounds`); "-"
    where no seed has a value."""
    values = [v for v in values if not np.isnan(v)]
    if not values:
        return "-"
    mean = f"{np.mean(values):.{digits}f}"
    if len(values) == 1 or not bounds:
        return mean
    return f"{mean} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def report(
    args: argparse.Namespace,
    runs: dict[str, list[RunResult]],
    seconds: float,
    failures: Sequence[tuple[str, int, str]] = (),
) -> str:
    import torch

    objectives = next(iter(runs.values()))[0].objectives
    live = live_objectives(runs)
    volume = "hypervolume (" + ", ".join(objectives[j] for j in live) + ")"
    lines = [
        "# Discovery at an equal budget of generated tokens: "
        + ", ".join(ARM_TITLES[arm] for arm in runs),
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "- command: `python benchmarks/discovery.py "
        + " ".join(sys.argv[1:])
        + f"` ({seconds / 60:.0f} min in all)",
        f"- settings: {args.problem} on {args.model} (backend {args.backend}, concurrency "
        f"{args.concurrency or 'the backend default'}), G = {args.group_size}, max_tokens "
        f"{args.max_tokens}, temperature {args.temperature}, token budget "
        f"{args.token_budget} per run (a run ends at most one batch past it), iterations "
        f"capped at {args.iterations}; the trained arms: a LoRA step (rank {args.lora_rank}, "
        f"lr {args.learning_rate:g}, micro-batch {args.micro_batch}, format reward "
        f"{args.format_reward}, "
        f"overlong buffer {args.overlong_buffer}, KL weight {args.kl_beta:g}; the "
        f"discovery-reward arms measured against {args.reward_reference}, slot cost "
        f"{args.slot_cost:g}, warm-up samples {args.warmup_samples}) "
        f"after every {args.train_every} new "
        "group"
        f"{'s' if args.train_every > 1 else ''}; seeds "
        f"{', '.join(map(str, args.seeds))}",
        "- arms: " + "; ".join(f"`{arm}` {ARM_TITLES[arm]}" for arm in runs),
        "- each run a whole `vpo run` process on a fresh database, timed from start to exit; "
        "best = the highest score among the run's valid programs; hypervolume of the valid "
        "programs' score vectors above the reference point 0, over the objectives some "
        "program scored on; diversity and parse rate: "
        "means over the run's iterations (a GRPO group has G candidate slots, the others "
        "G x 3; a rollout of m = 1 parses when its one candidate does); a training step "
        "whose advantages were all 0 (every rollout scored alike) trains nothing and "
        "publishes the weights it was given: 'sampled by trained weights' counts the "
        "rollouts of versions from the first step that moved them; values: mean [min, "
        "max] over seeds",
        f"- plot: {args.plot.name} (best per objective and hypervolume against tokens generated)",
        "",
        "| arm | "
        + " | ".join(f"best {name}" for name in objectives)
        + f" | front coverage (R2) | {volume} |",
        "|---|" + "---:|" * (len(objectives) + 2),
    ]
    for arm, results in runs.items():
        cells = [spread([r.best[j] for r in results]) for j in range(len(objectives))]
        cells.append(spread([r.coverage for r in results], 4))
        cells.append(spread([r.hypervolume(live) for r in results], 4))
        lines.append(f"| {ARM_TITLES[arm]} | " + " | ".join(cells) + " |")
    for base in PAIRED_AGAINST:
        lines += paired_table(runs, live, base)
    lines += [
        "",
        "| arm | tokens | iterations | training steps (that moved the weights) | training s | "
        "pool diversity | "
        "parse rate | parse rate, 1st half -> 2nd half | sampled by trained weights | "
        "tok/s over the wall |",
        "|---|" + "---:|" * 9,
    ]
    for arm, results in runs.items():
        first = spread([r.parse_first_half for r in results], 2, bounds=False)
        second = spread([r.parse_second_half for r in results], 2, bounds=False)
        cells = [
            spread([r.tokens for r in results], 0),
            spread([r.iterations for r in results], 0),
            f"{spread([r.steps for r in results], 0)} ({spread([r.moved for r in results], 0)})",
            spread([r.train_s for r in results], 0),
            spread([r.diversity for r in results]),
            spread([r.parse_rate for r in results], 2),
            f"{first} -> {second}",
            spread([r.trained_share for r in results], 2),
            spread([r.tokens_per_s for r in results], 1),
        ]
        lines.append(f"| {ARM_TITLES[arm]} | " + " | ".join(cells) + " |")
    lines += probe_table(runs)
    lines += [
        "",
        "Every run:",
        "",
        "| arm | seed | wall s | tokens | iterations | steps | "
        + " | ".join(f"best {name}" for name in objectives)
        + " | coverage | hypervolume | diversity | parse rate | tok/s |",
        "|---|---:|" + "---:|" * (len(objectives) + 9),
    ]
    for arm, results in runs.items():
        for r in results:
            cells = [
                f"{r.wall_s:.0f}",
                str(r.tokens),
                str(r.iterations),
                str(r.steps),
                *(f"{value:.3f}" for value in r.best),
                f"{r.coverage:.4f}",
                f"{r.hypervolume(live):.4f}",
                spread([r.diversity]),
                spread([r.parse_rate], 2),
                f"{r.tokens_per_s:.1f}",
            ]
            lines.append(f"| {arm} | {r.seed} | " + " | ".join(cells) + " |")
    if failures:
        lines += ["", "Runs that failed or were not run (left out of every table above):", ""]
        lines += ["| arm | seed | why |", "|---|---:|---|"]
        lines += [f"| {arm} | {seed} | {why} |" for arm, seed, why in failures]
    return "\n".join(lines) + "\n"


# What each arm is paired against: no training, then GRPO and the paper's VPO for the arms that
# change VPO's reward (issue 46's target: diversity at least GRPO's).
PAIRED_AGAINST: dict[str, tuple[str, ...]] = {
    "none": tuple(ARMS),
    "grpo": ("vpo", *DISCOVERY_REWARD),
    "vpo": DISCOVERY_REWARD,
}


def last_probe_diversity(result: RunResult) -> float:
    """The pool diversity of the run's last probed version; nan where none was measured."""
    if not result.probe or max(result.probe) == 0:
        return np.nan
    value = result.probe[max(result.probe)]["diversity"]
    return np.nan if value is None else float(value)


def paired_table(
    runs: dict[str, list[RunResult]], live: Sequence[int], base: str = "none"
) -> list[str]:
    """The arms PAIRED_AGAINST names for `base` against it, paired by seed: the mean difference
    and its bootstrap interval in best fit_id and fit_ood (the first two objectives), front
    coverage, hypervolume and pool diversity, and against a trained base the last version's
    probe diversity; nothing without `base` and one of those arms."""
    arms = [arm for arm in runs if arm != base and arm in PAIRED_AGAINST.get(base, ())]
    if base not in runs or not arms:
        return []
    by_seed = {r.seed: r for r in runs[base]}
    objectives = runs[base][0].objectives
    measures = [
        *(
            (f"best {objectives[j]}", lambda r, j=j: r.best[j])
            for j in range(min(2, len(objectives)))
        ),
        ("front coverage", lambda r: r.coverage),
        ("hypervolume", lambda r: r.hypervolume(live)),
        ("pool diversity", lambda r: r.diversity),
    ]
    if base != "none":
        measures.append(("probe diversity, last version", last_probe_diversity))
    level = f"{PAIRED_LEVEL:.0%}"
    against = "no training" if base == "none" else ARM_TITLES[base]
    lines = [
        "",
        f"Paired by seed against {against}: mean difference [bootstrap {level} interval] "
        "(an arm is ahead where the interval lies above 0):",
        "",
        "| arm | seeds | " + " | ".join(name for name, _ in measures) + " |",
        "|---|---:|" + "---:|" * len(measures),
    ]
    for arm in arms:
        pairs = [(r, by_seed[r.seed]) for r in runs[arm] if r.seed in by_seed]
        if not pairs:
            continue
        cells = []
        for _, measure in measures:
            differences = [measure(a) - measure(b) for a, b in pairs]
            differences = [d for d in differences if not np.isnan(d)]
            if not differences:
                cells.append("-")
                continue
            mean, low, high = paired_interval(differences)
            cells.append(f"{mean:+.4f} [{low:+.4f}, {high:+.4f}]")
        lines.append(f"| {ARM_TITLES[arm]} | {len(pairs)} | " + " | ".join(cells) + " |")
    return lines


def probe_table(runs: dict[str, list[RunResult]]) -> list[str]:
    """Version 0 (once per m) against each trained arm's last version on the first prompt, the
    last versions' values as mean [min, max] over seeds; nothing when nothing was probed."""
    rows: list[tuple[str, list[dict]]] = []
    # Version 0 of each m, once per seed (arms of one m share it; runs apart may each probe it).
    starts: dict[int, dict[int, dict]] = {}
    for arm, results in runs.items():
        for r in results:
            if r.probe and 0 in r.probe:
                starts.setdefault(ARMS[arm][0], {}).setdefault(r.seed, r.probe[0])
    for m, by_seed in starts.items():
        rows.append((f"version 0 (m = {m})", list(by_seed.values())))
    for arm, results in runs.items():
        last = [r.probe[max(r.probe)] for r in results if r.probe and max(r.probe) > 0]
        if last:
            rows.append((f"{ARM_TITLES[arm]}: last version", last))
    if not rows:
        return []
    ks = [k for k in BEST_AT_SHOWN if k <= min(len(p["best_at"]) for _, ps in rows for p in ps)]
    lines = [
        "",
        f"On one fixed prompt (the campaign's first: the seed as parent, no drafts), {PROBE_SLOTS}"
        " candidate slots per version (10 completions x m = 3, or 30 x 1), sampling seed fixed;"
        " a slot that did not parse or whose program failed scores 0; best@k: the expected best"
        " mean score among k slots drawn from the pool (benchmarks/probe.py):",
        "",
        "| version | steps | parse rate | valid slots | mean score | set score | pool diversity | "
        + " | ".join(f"best@{k}" for k in ks)
        + " |",
        "|---|" + "---:|" * (6 + len(ks)),
    ]
    for title, probes in rows:
        cells = [
            spread([p["step"] for p in probes], 0),
            spread([p["parse_rate"] for p in probes], 2),
            spread([p["valid"] for p in probes], 0),
            spread([p["mean_score"] for p in probes], 4),
            spread([p["set_score"] for p in probes], 4),
            spread([np.nan if p["diversity"] is None else p["diversity"] for p in probes], 3),
            *(spread([p["best_at"][k - 1] for p in probes], 4) for k in ks),
        ]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


def plot(args: argparse.Namespace, runs: dict[str, list[RunResult]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = next(iter(runs.values()))[0].objectives
    live = live_objectives(runs)
    end = max(r.tokens for results in runs.values() for r in results)
    grid = np.linspace(0, end, GRID_POINTS)
    panels = len(objectives) + 1
    columns = 2 if panels == 4 else panels
    rows = -(-panels // columns)
    figure, grid_of_axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4.2 * rows))
    axes = np.ravel(grid_of_axes)[:panels]
    counts = {len(results) for results in runs.values()}  # seeds an arm has; may differ
    for arm, results in runs.items():
        # A run that ended holds its last value to the longest run's end.
        best = np.stack([best_so_far(r.program_tokens, r.program_scores, grid) for r in results])
        volume = np.stack(
            [hypervolume_so_far(r.program_tokens, r.program_scores[:, live], grid) for r in results]
        )
        curves = [best[:, :, j] for j in range(len(objectives))] + [volume]
        for axis, curve in zip(axes, curves, strict=True):
            label = ARM_TITLES[arm] + (f", {len(results)} seeds" if len(counts) > 1 else "")
            (line,) = axis.plot(grid, curve.mean(axis=0), label=label)
            if len(results) > 1:
                axis.fill_between(
                    grid, curve.min(axis=0), curve.max(axis=0), color=line.get_color(), alpha=0.2
                )
    for axis, name in zip(axes, [*objectives, "hypervolume"], strict=True):
        axis.set(xlabel="tokens generated", ylabel=name, title=f"best {name}")
        axis.axvline(
            args.token_budget, color="grey", linestyle=":", linewidth=1, label="token budget"
        )
        axis.grid(alpha=0.3)
    axes[0].legend()
    axes[-1].set_title(
        "hypervolume of the valid programs (" + ", ".join(objectives[j] for j in live) + ")"
    )
    seeds = max(counts)
    over = f"{seeds} seed{'s' if seeds > 1 else ''}" if len(counts) == 1 else "its seeds"
    figure.suptitle(
        f"{args.problem} on {args.model}, token budget {args.token_budget}: each arm's mean "
        f"over {over}" + (", band min-max" if seeds > 1 else "")
    )
    figure.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.plot, dpi=110)
