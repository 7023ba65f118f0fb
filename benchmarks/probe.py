"""What a campaign's policy versions sample on one fixed prompt: the starting weights (version 0)
against trained versions, on the same prompt with the same seed.

    python benchmarks/probe.py --db runs/demo.db [--versions 0,last] [--completions 10]
        [--seed 0] [--out FILE.md] [--json FILE.json]

The prompt is the campaign's first: its seed program as the parent, no drafts (what its first
iteration showed). Each version samples `--completions` completions at the campaign's
temperature, top_p and max_tokens with one sampling seed, on the campaign's backend; each
completion is parsed as the campaign parses it (whole programs or its compact form), the
candidates are evaluated in the sandbox, and a slot that did not parse or whose program failed
scores 0 in every objective. A trained version is resumed from its folder (the campaign keeps
the newest `keep_versions`) and reaches the engine as the campaign's versions do.

Per version (the VPO paper's protocol: a pool of completions x m candidates, 30 for 10 x 3):
- parse rate: the share of completions whose m candidates all parsed; valid: the candidates
  whose program scored; above the seed: the slots whose program beats the seed's first
  objective (fit_id for equation discovery) by at least 0.01, as issue 57 counts a discovery,
  and how many distinct programs they are;
- mean score: the mean over the pool's slots of the mean of the score vector;
- set score: VPO's own reward, per completion the mean over 1,000 Dirichlet(1) weightings of
  the best candidate's weighted score, averaged over completions;
- pool diversity: the mean L1 distance between the reward vectors of the pool's slots;
- best@k, k = 1..30: the expected best mean-of-vector among k slots drawn from the pool.

Prints a table and writes it to `--out` (default benchmarks/results/probe.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reporting import publish  # noqa: E402

WEIGHTINGS = 1000
BEST_AT = (1, 3, 10, 30)
MARGIN = 0.01  # above the seed: its first objective at least this much over the seed's (issue 57)


def set_score(vectors: np.ndarray, rng: np.random.Generator) -> float:
    """VPO's set score of each completion's candidates (n, m, d), averaged over completions."""
    weights = rng.dirichlet(np.ones(vectors.shape[-1]), size=WEIGHTINGS)  # (K, d)
    weighted = np.einsum("nmd,kd->nkm", vectors, weights)
    return float(weighted.max(axis=2).mean())


def sample_version(
    generator: Any, prompt: list[dict[str, str]], completions: int, seed: int, config: Any
) -> list[str]:
    from harness.llm.base import Sampling

    # vLLM gives the i-th of n samples seed + i: sampling seeds s and s + 1 would share all but
    # one completion, so seed s samples from s * completions on.
    sampling = Sampling(
        config.temperature,
        config.top_p,
        config.max_tokens,
        top_k=config.top_k,
        seed=seed * completions,
    )
    (sampled,) = generator.generate([prompt], completions, sampling)
    return [c.text for c in sampled]


def score(
    texts: list[str], campaign: Any, seed_code: str, seed_first: float = 0.0
) -> dict[str, Any]:
    """The pool's measures (see the module); `seed_first`: the seed program's score in the
    first objective, which a slot must beat by MARGIN to count as above the seed."""
    from harness.evaluation.evaluate import evaluate_many
    from harness.evolution.iteration import classify_group
    from trainer.measures import best_at_k, pool_diversity

    problem, config = campaign.problem, campaign.config
    expand = campaign.compact.reader(seed_code) if campaign.compact else None
    group = classify_group(texts, config.candidates, seed_code, set(), problem.entry, expand)
    codes = sorted({c.code for r in group.rollouts for c in r.candidates if c.code is not None})
    evaluations = dict(
        zip(codes, evaluate_many(problem, codes, campaign.sandbox, campaign.limits), strict=True)
    )
    objectives = [o.name for o in problem.objectives]
    vectors = np.zeros((len(texts), config.candidates, len(objectives)))
    valid = 0
    for i, rollout in enumerate(group.rollouts):
        for j, candidate in enumerate(rollout.candidates):
            evaluation = evaluations.get(candidate.code) if candidate.code else None
            if evaluation is not None and evaluation.status == "ok":
                vectors[i, j] = [evaluation.scores[name] for name in objectives]
                valid += 1
    pool = vectors.reshape(-1, len(objectives))
    means = pool.mean(axis=1)
    rng = np.random.default_rng(0)
    above = {
        code
        for code, evaluation in evaluations.items()
        if evaluation.status == "ok" and evaluation.scores[objectives[0]] >= seed_first + MARGIN
    }
    return {
        "above": int(sum(1 for r in group.rollouts for c in r.candidates if c.code in above)),
        "above_distinct": len(above),
        "parse_rate": float(np.mean([r.status == "ok" for r in group.rollouts])),
        "valid": valid,
        "slots": len(pool),
        "mean_score": float(means.mean()),
        "set_score": set_score(vectors, rng),
        "diversity": pool_diversity(pool),
        "best_at": best_at_k(means, len(pool)),
        "best": pool.max(axis=0),
        "objectives": objectives,
    }


def probe_apart(
    db: Path, versions: str, completions: int, seed: int, out: Path
) -> list[dict[str, Any]]:
    """`probe` in a process of its own (an engine in the caller's would hold a second model's
    memory), its table at `out` and its rows as JSON beside it: each row a version's measures
    with its "step". A failed probe stops the caller with its last line."""
    import subprocess

    command = [
        sys.executable, str(Path(__file__).resolve()), "--db", str(db), "--versions", versions,
        "--completions", str(completions), "--seed", str(seed), "--out", str(out),
        "--json", str(out.with_suffix(".json")),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise SystemExit(f"probe of {db.name} failed: {(lines or ['no output'])[-1]}")
    return json.loads(out.with_suffix(".json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the campaign's database")
    parser.add_argument("--name", help="the campaign (default: the database's only one)")
    parser.add_argument("--versions", default="0,last", help="steps to probe: 0, N or last")
    parser.add_argument("--completions", type=int, default=10)
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed s: the N completions take seeds s*N to s*N + N - 1",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/probe.md")
    parser.add_argument(
        "--json", type=Path, help="also write each version's measures and completions here"
    )
    args = parser.parse_args()
    if args.completions < 1:
        parser.error("--completions must be >= 1")
    record, config, rows = probe(args.db, args.versions, args.completions, args.seed, args.name)
    write(args, record, config, rows)
    if args.json:
        plain = [
            {"step": step, **{k: np.asarray(v).tolist() for k, v in m.items()}} for step, m in rows
        ]
        args.json.write_text(json.dumps(plain))


def probe(
    db: str, versions: str, completions: int, seed: int, name: str | None = None
) -> tuple[Any, Any, list[tuple[int, dict[str, Any]]]]:
    """The campaign record, its config and, per version asked for, what it sampled."""
    from harness.config.settings import build
    from harness.evaluation.sandbox import Sandbox
    from harness.evolution.loop import prepare
    from harness.evolution.prompts import build_prompt
    from harness.learning.publish import SavedVersion, step_name
    from harness.llm.choice import base_generator
    from harness.store import Store
    from problems.registry import load
    from trainer.policy import Policy

    store = Store.open(db)
    campaigns = [c for c in store.campaigns() if name in (None, c.name)]
    if len(campaigns) != 1:
        raise SystemExit(f"probe: {len(campaigns)} campaigns match; name one with --name")
    record = campaigns[0]
    config = build(record.config)
    problem = load(record.problem)
    policies = {p.step: p for p in store.policies(record.id)}
    steps = []
    for word in versions.split(","):
        if word == "last":
            if not policies:
                raise SystemExit("probe: the campaign has no trained version")
            steps.append(max(policies))
        elif word.isdigit() and (int(word) == 0 or int(word) in policies):
            steps.append(int(word))
        else:
            raise SystemExit(f"probe: no version {word!r} (versions: 0, {sorted(policies)})")
    rows = []
    with Sandbox(workers=os.cpu_count() or 1) as sandbox:
        campaign = prepare(config, store, problem, record.id, sandbox)
        seed_program = store.program(campaign.seed_id)
        assert seed_program is not None
        prompt = build_prompt(
            problem, seed_program, [], config.candidates, compact=campaign.compact
        )
        seed_first = seed_program.scores.get(problem.objectives[0].name, 0.0)
        generator = base_generator(config)
        try:
            for step in steps:
                if step:
                    folder = Path(policies[step].path)
                    if not folder.exists():
                        raise SystemExit(f"probe: version {step} is no longer on disk ({folder})")
                    policy = Policy.resume(folder)
                    generator.load_weights(SavedVersion(folder, step, record.name, policy))
                    del policy
                texts = sample_version(generator, prompt, completions, seed, config)
                measured = score(texts, campaign, seed_program.code, seed_first)
                rows.append((step, {**measured, "completions": texts}))
                shown = {k: v for k, v in measured.items() if k not in ("best_at", "objectives")}
                print(step_name(step), shown, flush=True)
        finally:
            generator.close()
    store.close()
    return record, config, rows


def write(args: argparse.Namespace, record: Any, config: Any, rows: list[Any]) -> None:
    objectives = rows[0][1]["objectives"]
    slots = rows[0][1]["slots"]
    ks = [k for k in BEST_AT if k <= slots]
    lines = [
        "# One fixed prompt: what each policy version samples",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}",
        f"- command: `python benchmarks/probe.py {' '.join(sys.argv[1:])}`",
        f"- campaign {record.name!r} ({record.problem}, {config.model}, form {config.form},"
        f" m = {config.candidates}, temperature {config.temperature}, max_tokens"
        f" {config.max_tokens}); the prompt: its seed as the parent, no drafts;"
        f" {args.completions} completions a version, sampling seed {args.seed}",
        "",
        f"| version | parse rate | valid | above the seed's {objectives[0]} (distinct) |"
        " mean score | set score | pool diversity | "
        + " | ".join(f"best@{k}" for k in ks)
        + " | "
        + " | ".join(f"best {name}" for name in objectives)
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(ks) + "---:|" * len(objectives),
    ]
    for step, m in rows:
        diversity = "-" if m["diversity"] is None else f"{m['diversity']:.3f}"
        lines.append(
            f"| {step if step else '0 (start)'} | {m['parse_rate']:.2f} | {m['valid']}/{m['slots']}"
            f" | {m['above']} ({m['above_distinct']}) | {m['mean_score']:.4f}"
            f" | {m['set_score']:.4f} | {diversity} | "
            + " | ".join(f"{m['best_at'][k - 1]:.4f}" for k in ks)
            + " | "
            + " | ".join(f"{value:.4f}" for value in m["best"])
            + " |"
        )
    publish(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
