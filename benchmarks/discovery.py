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
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from discovery_report import plot, report  # noqa: E402
from discovery_runs import (  # noqa: E402
    ARMS,
    DISCOVERY_REWARD,
    PROBE_SLOTS,
    RunResult,
    database,
    mean_of,
    scored_candidates,
    summary_path,
)
from probe import probe_apart  # noqa: E402
from reporting import publish, stop  # noqa: E402

from harness.cli.flags import add_protocol, protocol_flags  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# oscillator1: the embedded model beats its seed out of domain within a few batches (make demo),
# while on stressstrain none of its first 32 rollouts did better than predicting the mean.
PROBLEM = "equation_discovery:oscillator1"
STDERR_TAIL_LINES = 3


# The campaign settings each `vpo run` of the grid gets, as flags (their names, help and types
# are the product's: harness/config). These values are the benchmark's protocol, not the
# product's defaults: a LoRA step at its own rate and no KL anchor, the discovery reward's
# settings for its arms.
RUN_SETTINGS = {
    "model": "qwen-coder", "backend": "auto", "concurrency": 8, "group_size": 4,
    "max_tokens": 320, "temperature": 1.0, "iterations": 1000, "token_budget": 4000,
    "drafts": 0, "form": "program", "parent_selection": "scalarised",
}  # fmt: skip
TRAINED_SETTINGS = {
    "train_every": 8, "lora_rank": 16, "learning_rate": 1e-5, "kl_beta": 0.0,
    "micro_batch": 8, "format_reward": "partial", "overlong_buffer": 0, "vector": "objectives",
}  # fmt: skip
DISCOVERY_SETTINGS = {
    "reward_reference": "parent", "slot_cost": 0.03, "warmup_samples": 0, "gain": "clipped",
}  # fmt: skip


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
        rollout_scores = [
            scored_candidates(rollout, objectives)
            for group in store.training_groups(campaign_id)
            for rollout in group.rollouts
        ]
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
        rollout_scores=rollout_scores,
    )


# The probe: version 0 and a run's last version on the campaign's first prompt (probe.py), each
# in a process of its own (a second engine in this one would hold two models' memory).


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
