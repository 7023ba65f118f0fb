"""Discovery at an equal budget of generated tokens: no training, GRPO and VPO in the loop.

    python benchmarks/discovery.py [--arms none,grpo,vpo] [--seeds 0,1,2] [--model qwen-coder]
        [--token-budget 4000] [--group-size 4] [--max-tokens 320] [--concurrency 8]
        [--train-every 8] [--micro-batch 8] [--keep DIR [--extend]] [--out FILE.md]
        [--plot FILE.png]

Arms, on one problem (equation_discovery:oscillator1) with the same model, backend, G,
max_tokens, temperature, token budget and LoRA settings:

    none   m = 3 candidates per rollout, no training (evolution alone)
    grpo   m = 1, one LoRA step of GRPO after every `train_every` new groups
    multi  m = 3, Multi-RLVR: the candidates' summed scalar reward, one LoRA step likewise
    vpo    m = 3, one LoRA step of VPO after every `train_every` new groups (absolute set
           score, as in the VPO paper)
    vpo_front  m = 3, VPO with the discovery reward: the set score's gain over what the
           campaign held (--reward-reference), less --slot-cost for the share of wasted slots
    entropic   m = 3, the same reward under TTT-Discover's entropic advantage

Each (arm, seed) is a whole `vpo run` process on a fresh SQLite database with
`--token-budget`: it stops starting batches once it has generated that many tokens (at most one
batch past it), so every arm pays the same generation cost; `--iterations` is set high enough
never to bind. The wall clock runs from start to exit (model loading, evaluation and training
steps included). Eight iterations are in flight by default (vLLM's CPU default: one engine call
holds eight groups: 3.1-3.6x the tokens/s of one group a call, docs/generation.md)
and a step follows each batch of eight groups, so every batch after the first is sampled by
weights one step newer. At a small `--token-budget` that is few steps: lower both flags
together to trade tokens/s for steps. At 21,000 tokens the untrained arm found less at 8 than
at 1 on both of two paired seeds (docs/generation.md): to compare with the committed grid, pass
`--concurrency 1 --train-every 1` as it did. The other defaults match `make demo`'s settings:
temperature 1.0, 320 tokens, no drafts, LoRA at lr 1e-5, no KL term.

Measured per run, from its database: the best score per objective among valid programs as a
function of the tokens generated before the program's group was stored (a running max; the
seed counts at 0 tokens); the hypervolume of the valid programs' score vectors (reference
point 0 in every objective, exact, by slicing); the mean over iterations of pool diversity
(mean pairwise L1 distance between the reward vectors of a group's candidate slots: G x m
slots, so G for GRPO) and of parse rate (the share of rollouts whose m candidates all parsed),
the parse rate of the first and the second half of the iterations; tokens/s over the wall;
training steps and their seconds; front coverage, the R2 indicator of the valid programs
(E_w[max_s w . r(s)] over 2,000 fixed Dirichlet(1) weightings of every objective). Per arm:
mean and [min, max] over seeds, and against `none`, paired by seed, the mean difference with a
bootstrap 90% interval.

Prints a table and writes it to benchmarks/results/discovery.md and the plot (best per
objective and hypervolume against tokens generated, mean over seeds with a min-max band) to
benchmarks/results/discovery.png. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from probe import probe_apart  # noqa: E402
from reporting import publish  # noqa: E402

from harness.cli.flags import add_protocol, protocol_flags  # noqa: E402
from trainer.measures import front_points as pareto_front  # noqa: E402,F401
from trainer.measures import hypervolume  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# oscillator1: the embedded model beats its seed out of domain within a few batches (make demo),
# while on stressstrain none of its first 32 rollouts did better than predicting the mean.
PROBLEM = "equation_discovery:oscillator1"
# Arm -> (candidates per rollout, advantage estimator; None: no training).
ARMS: dict[str, tuple[int, str | None]] = {
    "none": (3, None),
    "grpo": (1, "grpo"),
    "multi": (3, "multi_rlvr"),
    "vpo": (3, "vpo"),
    "vpo_front": (3, "vpo"),
    "entropic": (3, "entropic"),
}
# The arms that take the discovery reward (--reward-reference, --slot-cost, --warmup-samples);
# `vpo` keeps the paper's absolute set score.
DISCOVERY_REWARD = ("vpo_front", "entropic")
ARM_TITLES = {
    "none": "no training (m = 3)",
    "grpo": "GRPO in the loop (m = 1)",
    "multi": "Multi-RLVR in the loop (m = 3, summed scalar)",
    "vpo": "VPO in the loop (m = 3)",
    "vpo_front": "VPO, discovery reward (m = 3)",
    "entropic": "entropic, discovery reward (m = 3)",
}
# Front coverage: the R2 indicator of a run's valid programs, E_w[max_s w . r(s)], over these
# many Dirichlet(1) weightings drawn once (seed 0), so every run is measured on the same ones.
COVERAGE_WEIGHTINGS = 2000
BOOTSTRAP = 10_000  # resamples of the seeds for a paired interval
PAIRED_LEVEL = 0.90
BEST_AT_SHOWN = (1, 3, 5, 10, 20, 30)
GRID_POINTS = 101  # points on the tokens axis where the seeds' curves are averaged
STDERR_TAIL_LINES = 3
STOP_GRACE_S = 10


# The measures: pure functions on arrays (the hypervolume is trainer.measures').


def best_so_far(tokens: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The running best of `values` (n,) or (n, d) among the entries whose `tokens` (n,) are
    at most each point of `grid`: shape (len(grid),) or (len(grid), d); -inf before any."""
    order = np.argsort(tokens, kind="stable")
    running = np.maximum.accumulate(np.asarray(values, dtype=np.float64)[order], axis=0)
    upto = np.searchsorted(np.asarray(tokens)[order], grid, side="right")  # entries <= x
    padded = np.concatenate([np.full((1, *running.shape[1:]), -np.inf), running])
    return padded[upto]


def hypervolume_so_far(tokens: np.ndarray, vectors: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The hypervolume of the vectors (n, d) whose tokens (n,) are at most each grid point."""
    return np.array([hypervolume(vectors[tokens <= x]) for x in grid])


def coverage(vectors: np.ndarray) -> float:
    """The R2 indicator of the rows of `vectors` (n, d): the mean over fixed Dirichlet(1)
    weightings of the best weighted sum, 0 for no rows. Unlike the hypervolume it does not drop
    to 0 when one objective stayed at 0 for every program."""
    if not len(vectors):
        return 0.0
    weights = np.random.default_rng(0).dirichlet(np.ones(vectors.shape[1]), COVERAGE_WEIGHTINGS)
    return float((vectors @ weights.T).max(axis=0).mean())


def paired_interval(
    differences: Sequence[float], level: float = PAIRED_LEVEL
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-seed differences and its percentile bootstrap
    interval at `level` (seeds resampled with replacement, BOOTSTRAP times, seed 0)."""
    values = np.asarray(differences, dtype=np.float64)
    if len(values) == 0:
        return (float("nan"),) * 3
    draws = np.random.default_rng(0).integers(0, len(values), (BOOTSTRAP, len(values)))
    means = values[draws].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(values.mean()), float(low), float(high)


def mean_of(values: Sequence[float | None]) -> float:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else float("nan")


# One run: a `vpo run` process, then its database read back.


@dataclass(frozen=True)
class RunResult:
    arm: str
    seed: int
    objectives: list[str]
    wall_s: float
    tokens: int
    iterations: int
    steps: int
    moved: int  # steps that trained some rollout (a step whose advantages were all 0 did not)
    train_s: float
    program_tokens: np.ndarray  # (n,) tokens generated when each valid program was stored
    program_scores: np.ndarray  # (n, d) the valid programs' score vectors
    diversity: float
    parse_rate: float
    parse_first_half: float
    parse_second_half: float
    rollouts: int
    # Sampled by weights a step has changed: a version from the first step that trained some
    # rollout on (a step whose advantages were all 0 publishes the weights it was given).
    trained_rollouts: int
    probe: dict | None = None  # what the last version samples on the first prompt (probe.py)

    @property
    def best(self) -> np.ndarray:
        return self.program_scores.max(axis=0)

    def hypervolume(self, live: Sequence[int]) -> float:
        """Over the `live` objectives: one that no program scored on would make it 0."""
        return hypervolume(self.program_scores[:, list(live)])

    @property
    def coverage(self) -> float:
        """Front coverage over every objective (`coverage`)."""
        return coverage(self.program_scores)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def save(self, path: Path) -> None:
        """Everything the report needs from this run, as JSON: a few kB that can be committed,
        so that seeds run in different sessions make one report (`--report-from`)."""
        save_summary(self, path)

    @classmethod
    def load(cls, path: Path) -> RunResult:
        fields = summary_fields(path)
        if fields.get("probe") is not None:  # JSON keys are strings; the steps are ints
            fields["probe"] = {int(step): row for step, row in fields["probe"].items()}
        return cls(**fields)

    @property
    def trained_share(self) -> float:
        return self.trained_rollouts / self.rollouts if self.rollouts else float("nan")


def save_summary(run: object, path: Path) -> None:
    """A run's fields as JSON, its programs' tokens and score vectors as lists (this benchmark's
    runs and peers.py's)."""
    fields = dict(vars(run))
    fields["program_tokens"] = fields["program_tokens"].tolist()
    fields["program_scores"] = fields["program_scores"].tolist()
    path.write_text(json.dumps(fields, indent=1) + "\n")


def summary_fields(path: Path) -> dict:
    """What `save_summary` wrote, the programs' tokens and scores as arrays again (an empty run's
    scores keep their shape: no rows, one column an objective)."""
    fields = json.loads(path.read_text())
    fields["program_tokens"] = np.array(fields["program_tokens"], dtype=np.int64)
    scores = np.array(fields["program_scores"], dtype=np.float64)
    fields["program_scores"] = scores.reshape(len(scores), len(fields["objectives"]))
    return fields


def database(folder: Path, arm: str, seed: int) -> Path:
    return folder / f"{arm}-seed{seed}.db"


def summary_path(db: Path) -> Path:
    return db.with_suffix(".run.json")


def live_objectives(runs: dict[str, list[RunResult]]) -> list[int]:
    """The objectives some valid program of some run scored above 0 on (all, if none did): a
    gated objective that never opened (simplicity) would make every hypervolume 0."""
    results = [r for rs in runs.values() for r in rs]
    scored = [
        j
        for j in range(len(results[0].objectives))
        if any(len(r.program_scores) and r.program_scores[:, j].max() > 0 for r in results)
    ]
    return scored or list(range(len(results[0].objectives)))


# The campaign settings each `vpo run` of the grid gets, as flags (their names, help and types
# are the product's: harness/config). These values are the benchmark's protocol, not the
# product's defaults: a LoRA step at its own rate and no KL anchor, the discovery reward's
# settings for its arms.
RUN_SETTINGS = {
    "model": "qwen-coder", "backend": "auto", "concurrency": 8, "group_size": 4,
    "max_tokens": 320, "temperature": 1.0, "iterations": 1000, "token_budget": 4000,
    "drafts": 0, "form": "program",
}  # fmt: skip
TRAINED_SETTINGS = {
    "train_every": 8, "lora_rank": 16, "learning_rate": 1e-5, "kl_beta": 0.0,
    "micro_batch": 8, "format_reward": "partial", "overlong_buffer": 0,
}  # fmt: skip
DISCOVERY_SETTINGS = {"reward_reference": "parent", "slot_cost": 0.03, "warmup_samples": 0}


def run_command(arm: str, seed: int, args: argparse.Namespace, db: Path) -> list[str]:
    candidates, advantage = ARMS[arm]
    command = [
        sys.executable, "-m", "harness.cli", "run", args.problem, "--db", str(db),
        "--seed", str(seed), "--candidates", str(candidates),
    ]  # fmt: skip
    given = list(RUN_SETTINGS)
    if advantage is not None:
        command += ["--advantage", advantage, "--lora"]
        given += TRAINED_SETTINGS
        if arm in DISCOVERY_REWARD:
            given += DISCOVERY_SETTINGS
    return command + protocol_flags(args, given)


def run(
    arm: str, seed: int, args: argparse.Namespace, folder: Path, label: str, probe: str = ""
) -> RunResult:
    """One `vpo run` to its end, its iteration lines echoed to stderr, then the `probe` of its
    versions ("0", "last" or both; "" for none); a failed run is RunFailed with the tail of its
    stderr, which the grid records and goes on from."""
    db = database(folder, arm, seed)
    log = db.with_suffix(".stderr")
    # --extend: a kept run goes on to the larger budget; its wall clock adds to the first one's.
    before = float(db.with_suffix(".wall").read_text()) if db.exists() else 0.0
    started = time.perf_counter()
    with log.open("a" if before else "w") as stderr:
        # Its own process group, so that a stopped benchmark stops the run with its sandbox.
        process = subprocess.Popen(
            run_command(arm, seed, args, db),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        try:
            assert process.stdout is not None
            for line in process.stdout:  # one plain line per iteration when not on a terminal
                if line.startswith(("iteration ", "token budget")):
                    print(f"  {label} {line.rstrip()}", file=sys.stderr, flush=True)
                    # The clock so far, so that a run killed with its machine keeps it.
                    spent = before + time.perf_counter() - started
                    db.with_suffix(".wall").write_text(f"{spent:.1f}\n")
            returncode = process.wait()
        finally:
            stop(process)
    wall = before + time.perf_counter() - started
    db.with_suffix(".wall").write_text(f"{wall:.1f}\n")  # for --report-from
    if returncode != 0:
        lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
        # `vpo` says what went wrong in one line; otherwise the end of a traceback.
        said = [line for line in lines if line.startswith("vpo: error:")]
        tail = said[-1:] or lines[-STDERR_TAIL_LINES:] or ["nothing on stderr"]
        reason = f"exit {returncode}: " + " / ".join(tail)
        db.with_suffix(".failed").write_text(reason + "\n")
        raise RunFailed(reason)
    db.with_suffix(".failed").unlink(missing_ok=True)  # an earlier try's, now --extended
    if probe:
        print(f"{label} probing version(s) {probe}", file=sys.stderr, flush=True)
        probe_run(db, probe, args.probe_seed)
    result = read_run(arm, seed, db, wall)
    result.save(summary_path(db))
    return result


class RunFailed(Exception):
    """A `vpo run` of the grid that did not finish; the message says why in one line."""


def stop(process: subprocess.Popen[str]) -> None:
    """End a run still going: SIGTERM to its process group, SIGKILL after a grace period."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=STOP_GRACE_S)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def read_run(arm: str, seed: int, db: Path, wall: float) -> RunResult:
    from harness.store import Store
    from harness.store.versions import moved_weights

    with Store.open(db, read_only=True) as store:
        campaign_id = store.campaigns()[0].id
        objectives = store.objectives(campaign_id)
        summary = store.summary(campaign_id)
        # Tokens generated up to and including each group, in the order groups were stored.
        group_of: dict[int, int] = {}
        group_tokens: dict[int, int] = {}
        for group, trajectories in store.iter_trajectory_groups(campaign_id):
            group_tokens[group["id"]] = sum(t["num_tokens"] for t in trajectories)
            group_of.update((t["id"], group["id"]) for t in trajectories)
        spent, total = {}, 0
        for group_id in sorted(group_tokens):
            total += group_tokens[group_id]
            spent[group_id] = total
        tokens, scores, now = [], [], 0
        for program in store.iter_programs(campaign_id):
            # A program without a trajectory (the seed, a migrant's copy) came with no tokens.
            if program.trajectory_id is not None:
                now = spent[group_of[program.trajectory_id]]
            if program.status == "ok":
                tokens.append(now)
                scores.append([program.scores.get(name, 0.0) for name in objectives])
        measures = store.iteration_measures(campaign_id)
        policies = store.policies(campaign_id)
        versions = store.version_measures(campaign_id, objectives)
    rates = [m.parse_rate for m in measures if m.parse_rate is not None]
    half = len(rates) // 2
    return RunResult(
        arm=arm,
        seed=seed,
        objectives=objectives,
        wall_s=wall,
        tokens=summary.tokens,
        iterations=summary.groups,
        steps=summary.policy_versions,
        moved=sum(moved_weights(p.metrics) for p in policies),
        train_s=sum(float(p.metrics.get("seconds", 0.0)) for p in policies),
        program_tokens=np.array(tokens, dtype=np.int64),
        program_scores=np.array(scores, dtype=np.float64).reshape(len(scores), len(objectives)),
        diversity=mean_of([m.pool_diversity for m in measures]),
        parse_rate=mean_of(rates),
        parse_first_half=mean_of(rates[:half]),
        parse_second_half=mean_of(rates[half:]),
        rollouts=sum(row.rollouts for row in versions),
        trained_rollouts=sum(row.rollouts for row in versions if row.changed),
        probe=read_probe(db.with_suffix(".probe.json")),
    )


# The probe: version 0 and a run's last version on the campaign's first prompt (probe.py), each
# in a process of its own (a second engine in this one would hold two models' memory).
PROBE_SLOTS = 30  # the VPO paper's pool: 10 completions x m = 3, or 30 x 1


def probe_run(db: Path, versions: str, seed: int) -> None:
    """Probe `versions` of the run in `db`: 30 slots (30 // m completions), a table and JSON
    beside the database."""
    from harness.config.settings import build
    from harness.store import Store

    with Store.open(str(db), read_only=True) as store:
        (campaign,) = store.campaigns()
        m = build(campaign.config).candidates
    probe_apart(db, versions, PROBE_SLOTS // m, seed, db.with_suffix(".probe.md"))


def kept_run(arm: str, seed: int, folder: Path) -> RunResult:
    """A run that a --keep run left in `folder`: its summary, or else its database (then the
    summary is written beside it)."""
    db = database(folder, arm, seed)
    if summary_path(db).exists():
        return RunResult.load(summary_path(db))
    wall = db.with_suffix(".wall")
    if not db.exists() or not wall.exists():
        raise SystemExit(f"{summary_path(db)} or {db.name} is missing: was it kept by a run?")
    result = read_run(arm, seed, db, float(wall.read_text()))
    result.save(summary_path(db))
    return result


def read_probe(path: Path) -> dict | None:
    if not path.exists():
        return None
    return {row["step"]: row for row in json.loads(path.read_text())}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="none,grpo,vpo", help=f"of {', '.join(ARMS)}")
    parser.add_argument("--seeds", default="0,1,2", help="campaign seeds, e.g. 0,1,2")
    parser.add_argument("--problem", default=PROBLEM)
    add_protocol(parser, RUN_SETTINGS | TRAINED_SETTINGS | DISCOVERY_SETTINGS)
    parser.add_argument(
        "--probe",
        action="store_true",
        help="probe version 0 and each trained run's last version on the first prompt "
        f"({PROBE_SLOTS} candidate slots: benchmarks/probe.py)",
    )
    parser.add_argument("--probe-seed", type=int, default=0, help="the probes' sampling seed")
    parser.add_argument(
        "--keep", type=Path, help="keep each run's database, log and summary (.run.json) here"
    )
    parser.add_argument(
        "--extend",
        action="store_true",
        help="with --keep DIR: resume the runs kept there to this --token-budget (larger, or "
        "the same for a grid cut short), each campaign going on from its last policy version "
        "(the wall clock adds up); a run not kept there starts afresh",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "discovery.md")
    parser.add_argument("--plot", type=Path, default=RESULTS / "discovery.png")
    parser.add_argument(
        "--report-from",
        type=Path,
        help="write the table and plot from what --keep runs left here: each run's summary "
        "(ARM-seedN.run.json, a few kB: seeds run apart can be gathered in one folder) or its "
        "database; run nothing (the same settings flags, for the report's header); a run "
        "not kept there is named in the report and left out",
    )
    args = parser.parse_args()
    arms = [arm.strip() for arm in args.arms.split(",") if arm.strip()]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown or not arms:
        parser.error(f"--arms takes some of {', '.join(ARMS)}; got {args.arms!r}")
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes whole numbers separated by commas; got {args.seeds!r}")
    if args.token_budget <= 0:
        parser.error("--token-budget must be > 0: the arms are compared at an equal budget")
    if args.extend and args.keep is None:
        parser.error("--extend goes on with the runs of --keep DIR: give it")

    plan = [(arm, seed) for seed in args.seeds for arm in arms]
    if args.report_from:
        runs = {arm: [] for arm in arms}
        kept_failures, not_run = [], []
        for arm, seed in plan:
            db = database(args.report_from, arm, seed)
            failed = db.with_suffix(".failed")
            if failed.exists() and not summary_path(db).exists():
                kept_failures.append((arm, seed, failed.read_text().strip()))
                continue
            if not summary_path(db).exists() and not db.exists():
                # An arm given fewer seeds than the rest (the 3 against 5): said in the
                # report, and the paired tables pair the seeds both arms have.
                not_run.append((arm, seed, "not run"))
                continue
            runs[arm].append(kept_run(arm, seed, args.report_from))
        runs = {arm: results for arm, results in runs.items() if results}
        if not runs:
            raise SystemExit(f"no kept run of --arms {args.arms} in {args.report_from}")
        if not_run:
            print("not kept, left out: " + ", ".join(f"{a} seed {s}" for a, s, _ in not_run))
        kept_failures += not_run
        seconds = sum(r.wall_s for results in runs.values() for r in results)
        plot(args, runs)
        publish(args.out, report(args, runs, seconds, kept_failures))
        print(f"plot written to {args.plot}")
        return

    # A terminated benchmark unwinds (and stops the run in progress) as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    # Seed by seed, the arms in turn: a machine that slows down mid-way slows every arm.
    runs: dict[str, list[RunResult]] = {arm: [] for arm in arms}
    failures: list[tuple[str, int, str]] = []  # (arm, seed, why): recorded, never the grid's end
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vpo-discovery-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        there = [str(database(folder, *pair)) for pair in plan if database(folder, *pair).exists()]
        if there and not args.extend:
            # A run on an existing database would resume it, not start afresh on the clock.
            raise SystemExit(
                f"already there: {', '.join(there)}; remove them, --keep elsewhere, or "
                "--extend them to a larger --token-budget"
            )
        if args.extend and not there:
            raise SystemExit(f"--extend goes on with kept runs; none in {folder}")
        if args.extend and len(there) != len(plan):
            # A grid cut short (its machine stopped): the runs not begun start afresh.
            missing = [
                f"{arm} seed {seed}"
                for arm, seed in plan
                if not database(folder, arm, seed).exists()
            ]
            print(f"--extend: not kept, run afresh: {', '.join(missing)}", file=sys.stderr)
        unprobed = {m for m, _ in ARMS.values()}  # version 0 is probed once per m
        for n, (arm, seed) in enumerate(plan, 1):
            label = f"[{n}/{len(plan)} {arm} seed {seed}]"
            print(f"{label} starting", file=sys.stderr, flush=True)
            m, advantage = ARMS[arm]
            versions = []
            if args.probe and m in unprobed:
                versions.append("0")
                unprobed.discard(m)
            if args.probe and advantage is not None:
                versions.append("last")
            try:
                result = run(arm, seed, args, folder, label, ",".join(versions))
            except RunFailed as failed:
                print(f"{label} failed, the grid goes on: {failed}", file=sys.stderr, flush=True)
                failures.append((arm, seed, str(failed)))
                continue
            runs[arm].append(result)
            named = zip(result.objectives, result.best, strict=True)
            best = " ".join(f"{name} {value:.3f}" for name, value in named)
            print(
                f"{label} done in {result.wall_s:.0f} s: {result.tokens} tokens, "
                f"{result.iterations} iterations, {result.steps} steps, best {best}, "
                f"parse rate {result.parse_rate:.2f}, "
                f"{result.tokens_per_s:.1f} tok/s",
                file=sys.stderr,
                flush=True,
            )
    seconds = time.perf_counter() - started
    runs = {arm: results for arm, results in runs.items() if results}
    if not runs:
        raise SystemExit(
            "every run failed: " + "; ".join(f"{a} seed {s}: {w}" for a, s, w in failures)
        )
    plot(args, runs)
    publish(args.out, report(args, runs, seconds, failures))
    print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
