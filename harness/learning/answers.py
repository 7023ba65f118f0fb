"""Reinforcement learning on an answer problem (the maze): the VPO paper's own setting.

No database and no evolution: each step samples `prompts_per_step` training instances, draws
`group_size` completions of each from the current policy, scores the m answers of every
completion into an (m, d) matrix, and takes one VPO step on those groups. Before training,
every `eval_every` steps and at the end, the policy is evaluated on held-out instances the way
the paper reports it: a pool of `eval_generations` x m candidates per prompt, sampled at
temperature 0.7, best@k of the mean of the vector and pass@k (every component 1), with the
diversity of the pool (mean pairwise L1 distance between candidate vectors).

best@k and pass@k are exact expectations over the k-subsets of each prompt's pool (the paper
averages a random permutation's running maximum; the expectation is the same number without
the sampling noise), then averaged over prompts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.config.training import AnswerSettings
from harness.llm.base import Completion, Sampling
from problems.api import AnswerProblem
from trainer.measures import best_at_k, pass_at_k, pool_diversity

KS = (1, 3, 5, 10, 30)
# Room for the prompt beside the completion in a training sequence.
PROMPT_TOKENS = 2048


@dataclass(frozen=True)
class Scored:
    """One completion's answers: an (m, d) matrix and which rows exist."""

    scores: np.ndarray
    mask: np.ndarray
    reasons: list[str | None]


def score(problem: AnswerProblem, instance: Any, text: str, candidates: int) -> Scored:
    names = [o.name for o in problem.objectives]
    values, reasons = problem.score_completion(instance, text, candidates)
    scores = np.zeros((candidates, len(names)))
    mask = np.zeros(candidates, dtype=bool)
    for row, value in enumerate(values):
        if value is not None:
            scores[row] = [value[name] for name in names]
            mask[row] = True
    return Scored(scores, mask, reasons)


def evaluate_policy(
    problem: AnswerProblem, generator: Any, settings: AnswerSettings, seed: int
) -> dict[str, Any]:
    """best@k, pass@k and pool diversity on the first `eval_prompts` test instances."""
    instances = [problem.instance("test", i) for i in range(settings.eval_prompts)]
    m = settings.candidates
    completions = _sample(
        problem, generator, instances, m, settings.eval_generations,
        settings.eval_temperature, settings.max_tokens, seed,
    )  # fmt: skip
    pool = settings.eval_generations * m
    ks = [k for k in KS if k <= pool]
    best = {k: [] for k in ks}
    passed = {k: [] for k in ks}
    diversity, answered, completed = [], 0, 0
    for instance, samples in zip(instances, completions, strict=True):
        rows = [score(problem, instance, c.text, m) for c in samples]
        # The paper's padding: a missing or repeated answer is a zero vector in the pool.
        vectors = np.concatenate([r.scores for r in rows])
        present = np.concatenate([r.mask for r in rows])
        answered += int(present.sum())
        completed += int((vectors[:, 0] > 0).sum())
        scalar = vectors.mean(axis=1)
        perfect = int(np.all(vectors >= 1.0, axis=1).sum())
        best_k, passed_k = best_at_k(scalar, ks[-1]), pass_at_k(pool, perfect, ks[-1])
        for k in ks:
            best[k].append(float(best_k[k - 1]))
            passed[k].append(float(passed_k[k - 1]))
        spread = pool_diversity(vectors[present])
        if spread is not None:  # fewer than two answers have no spread
            diversity.append(spread)
    total = pool * len(instances)
    return {
        "prompts": len(instances),
        "pool": pool,
        "best_at_k": {str(k): float(np.mean(v)) for k, v in best.items()},
        "pass_at_k": {str(k): float(np.mean(v)) for k, v in passed.items()},
        "diversity": float(np.mean(diversity)) if diversity else None,
        "answered": answered / total,  # answers present and not repeated
        "reach_exit": completed / total,
    }


def eval_line(label: str, report: dict[str, Any]) -> str:
    best = " ".join(f"best@{k} {v:.3f}" for k, v in report["best_at_k"].items())
    passed = " ".join(f"pass@{k} {v:.3f}" for k, v in report["pass_at_k"].items())
    return (
        f"eval {label}: {best} | {passed} | diversity {_shown(report['diversity'])} | "
        f"answered {report['answered']:.0%} | reach exit {report['reach_exit']:.0%}"
    )


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def train_answers(
    problem: AnswerProblem,
    settings: AnswerSettings,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train `settings.sampling.model` with RL on `problem`; write the model and a report to
    `out`."""
    from harness.learning.offline import settings_json
    from harness.learning.steps import load_policy
    from harness.llm.transformers_backend import TransformersGenerator

    sampled = replace(settings.sampling, sequence_tokens=settings.max_tokens + PROMPT_TOKENS)
    settings = replace(settings, sampling=sampled)
    policy, config = load_policy(settings.training, sampled)
    # The generator samples from the very model being trained: each step is seen at once.
    generator = TransformersGenerator(
        sampled.model,
        hf_model=policy.model,
        tokenizer=policy.tokenizer,
        context=policy.generation_context,
    )
    evals: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []

    def run_eval(step: int) -> None:
        report = evaluate_policy(problem, generator, settings, seed=sampled.seed + 7919 * step)
        report["step"] = step
        evals.append(report)
        say(eval_line(f"after step {step}" if step else "before training", report))

    order = np.random.default_rng(sampled.seed).permutation(settings.train_size)
    per_step = settings.prompts_per_step
    run_eval(0)
    for step in range(1, settings.steps + 1):
        picks = [int(order[((step - 1) * per_step + j) % len(order)]) for j in range(per_step)]
        metrics, record = _rl_step(problem, generator, policy, config, settings, picks)
        steps.append(record)
        say(
            f"{metrics.line()} | answered {record['answered']:.0%} | "
            f"generation {record['generation_seconds']:.0f} s"
        )
        if settings.eval_every and step % settings.eval_every == 0 and step < settings.steps:
            run_eval(step)
    if settings.steps:
        run_eval(settings.steps)
    out = policy.save_merged(settings.out)
    report = {
        "problem": problem.name,
        "base_model": sampled.model,
        "settings": settings_json(settings),
        "steps": steps,
        "evals": evals,
    }
    (out / "vpo-train.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _rl_step(
    problem: AnswerProblem,
    generator: Any,
    policy: Any,
    config: Any,
    settings: AnswerSettings,
    picks: Sequence[int],
) -> tuple[Any, dict[str, Any]]:
    """The next step: G completions of each picked training instance, scored, then one
    policy step on those groups; its metrics, and them with what the sampling yielded."""
    from harness.learning.steps import seeded_step
    from trainer.train import Group, Rollout

    started = time.perf_counter()
    sampled, m = settings.sampling, settings.candidates
    step = policy.step + 1
    instances = [problem.instance("train", i) for i in picks]
    samples = _sample(
        problem, generator, instances, m, settings.group_size,
        sampled.temperature, settings.max_tokens, sampled.seed * 1_000_003 + step,
    )  # fmt: skip
    generated = time.perf_counter() - started
    groups = [
        _group(problem, instance, completions, m, Group, Rollout)
        for instance, completions in zip(instances, samples, strict=True)
    ]
    metrics = seeded_step(policy, config, groups, seed=sampled.seed * 7_919 + step)
    return metrics, metrics.as_dict() | {
        "generation_seconds": generated,
        "mean_reward": float(
            np.mean([g.scores[g.mask].mean() if g.mask.any() else 0.0 for g in groups])
        ),
        "answered": float(np.mean([g.mask.mean() for g in groups])),
    }


def _sample(
    problem: AnswerProblem,
    generator: Any,
    instances: Sequence[Any],
    m: int,
    n: int,
    temperature: float,
    max_tokens: int,
    seed: int,
) -> list[list[Completion]]:
    """n completions of each instance's prompt (top-p 1, as the paper samples)."""
    return generator.generate(
        [[{"role": "user", "content": problem.prompt(x, m)}] for x in instances],
        n,
        Sampling(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed),
    )


def _group(
    problem: AnswerProblem,
    instance: Any,
    completions: Sequence[Completion],
    m: int,
    group_type: Any,
    rollout_type: Any,
) -> Any:
    scored = [score(problem, instance, c.text, m) for c in completions]
    return group_type(
        rollouts=[
            rollout_type(c.prompt_token_ids or (), c.token_ids, c.logprobs) for c in completions
        ],
        scores=np.stack([s.scores for s in scored]),
        mask=np.stack([s.mask for s in scored]),
    )
