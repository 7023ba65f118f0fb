"""Which learning rate makes the policy learn within a short campaign: `make demo`'s campaign at
several LoRA learning rates, each run's last version against the starting weights on one fixed
prompt (benchmarks/probe.py).

    python benchmarks/lr_sweep.py [--lrs 2e-5,1e-4,5e-4] [--config examples/demo.toml]
        [--iterations 12] [--completions 10] [--keep DIR] [--out FILE.md]

Each learning rate is a whole `vpo run --config CONFIG --lr LR` on a fresh database (the
config's model, problem, form, G, m and training settings); the starting weights are probed
once, in the first run's database (every run starts from the same weights and prompt). Per run:
its wall time, training steps, the share of its rollouts sampled by trained weights, and what
its last version samples on the campaign's first prompt, with the same sampling seed as the
starting weights: parse rate, mean score, VPO's set score, pool diversity, best@1 and best@k
over the whole pool. Prints the table and writes it to `--out` (default
benchmarks/results/lr_sweep.md). Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from probe import probe_apart  # noqa: E402
from reporting import publish  # noqa: E402


def campaign_config(db: Path) -> Any:
    from harness.config.settings import build
    from harness.store import Store

    with Store.open(str(db), read_only=True) as store:
        (campaign,) = store.campaigns()
        return build(campaign.config)


def trained_share(db: Path) -> tuple[int, int, int]:
    """(training steps, rollouts sampled by weights a step changed, rollouts) of the database."""
    from harness.store import Store

    with Store.open(str(db)) as store:
        (campaign,) = store.campaigns()
        rows = store.version_measures(campaign.id, store.objectives(campaign.id))
        steps = len(store.policies(campaign.id))
    trained = sum(row.rollouts for row in rows if row.changed)
    return steps, trained, sum(row.rollouts for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", default="2e-5,1e-4,5e-4", help="LoRA learning rates")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "demo.toml")
    parser.add_argument("--iterations", type=int, default=None, help="default: the config's")
    parser.add_argument("--completions", type=int, default=10, help="per probed version")
    parser.add_argument("--seed", type=int, default=0, help="the probes' sampling seed")
    parser.add_argument("--keep", type=Path, help="keep the runs' databases and logs here")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lr_sweep.md")
    args = parser.parse_args()
    try:
        rates = [float(word) for word in args.lrs.split(",")]
    except ValueError:
        parser.error(f"--lrs takes numbers separated by commas, not {args.lrs!r}")
    if not all(0 < rate < 1 for rate in rates):
        parser.error("every learning rate must be in (0, 1)")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="vpo-lr-sweep-"))
    folder.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    start_row = None
    for rate in rates:
        db = folder / f"lr-{rate:g}.db"
        for stale in folder.glob(f"lr-{rate:g}.*"):
            if stale.is_file():
                stale.unlink()
        command = [
            sys.executable, "-m", "harness.cli", "run", "--config", str(args.config),
            "--db", str(db), "--lr", str(rate),
        ]  # fmt: skip
        if args.iterations:
            command += ["--iterations", str(args.iterations)]
        started = time.perf_counter()
        with db.with_suffix(".log").open("w") as log:
            done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(
                f"lr_sweep: the run at lr {rate:g} failed; see {db.with_suffix('.log')}"
            )
        steps, trained, rollouts = trained_share(db)
        versions = "last" if start_row is not None else "0,last"
        # Each probe in a process of its own: two engines in this one ran out of memory.
        rows = probe_apart(db, versions, args.completions, args.seed, db.with_suffix(".probe.md"))
        if start_row is None:
            start_row = rows[0]
        results.append(
            {"lr": rate, "wall": wall, "steps": steps, "trained": trained,
             "rollouts": rollouts, "step": rows[-1]["step"], "probe": rows[-1]}
        )  # fmt: skip
        print(f"lr {rate:g}: {wall:.0f} s, {steps} steps, probe {rows[-1]}", flush=True)
    assert start_row is not None
    write(args, campaign_config(folder / f"lr-{rates[0]:g}.db"), start_row, results)


def write(
    args: argparse.Namespace, config: Any, start: dict[str, Any], results: list[dict[str, Any]]
) -> None:
    slots = start["slots"]
    training = config.training

    def measures(m: dict[str, Any]) -> str:
        diversity = "-" if m["diversity"] is None else f"{m['diversity']:.3f}"
        return (
            f"{m['parse_rate']:.2f} | {m['mean_score']:.4f} | {m['set_score']:.4f} | "
            f"{diversity} | {m['best_at'][0]:.4f} | {m['best_at'][slots - 1]:.4f}"
        )

    lines = [
        "# Learning rate sweep: the last version of a short campaign against the starting weights",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}",
        f"- command: `python benchmarks/lr_sweep.py {' '.join(sys.argv[1:])}`",
        f"- each run: `vpo run --config {args.config.relative_to(ROOT)} --lr LR` ({config.problem},"
        f" {config.model}, form {config.form}, G = {config.group_size}, m = {config.candidates},"
        f" {config.iterations} iterations, a {training.advantage} LoRA step (rank"
        f" {training.lora_rank}) after every {training.train_every} groups); the probe: the"
        f" campaign's first prompt, {args.completions} completions a version, sampling seed"
        f" {args.seed}, {slots} candidate slots (benchmarks/probe.py)",
        "",
        "| learning rate | wall s | steps | sampled by trained weights | version | parse rate |"
        f" mean score | set score | pool diversity | best@1 | best@{slots} |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        f"| - | - | - | - | 0 (start) | {measures(start)} |",
    ]
    for r in results:
        share = f"{r['trained']} of {r['rollouts']}"
        lines.append(
            f"| {r['lr']:g} | {r['wall']:.0f} | {r['steps']} | {share} | {r['step']} |"
            f" {measures(r['probe'])} |"
        )
    publish(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
