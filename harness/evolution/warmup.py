"""The format warm-up (`vpo warmup`): teach a model the m-candidate answer format from its own
well-formed answers, before a campaign.

    report = warm_up(config, problem, WarmupSettings(samples=64), out=Path("models/warm"))

1. The campaign's first prompt (the seed program, no drafts) is sampled `samples` times at the
   campaign's temperature, and each completion is parsed as a campaign parses it.
2. The completions whose m candidates all parsed are kept; the share of them is the parse rate
   before.
3. A LoRA adapter (or every weight) is fine-tuned on the kept completions for `epochs` passes,
   raising their likelihood (`trainer.imitation`): rejection-sampling fine-tuning on the model's
   own text, token for token, so the trained log-probs are of what the policy really wrote.
4. The model is written merged to `out`, sampled `measure` times on the same prompt with another
   seed, and the parse rate after is measured the same way.

The report (`out/vpo-warmup.json`) holds both rates, the kept count and every step's metrics.
`vpo run --model out` then starts the campaign from the warmed-up model.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.config.errors import UserError
from harness.config.settings import CampaignSettings
from harness.evolution.iteration import expanded
from harness.evolution.loop import compact_form
from harness.evolution.parsing import parse_completion
from harness.llm.base import Completion, Sampling
from problems.api import Problem

# Supervised LoRA fine-tuning takes a larger rate than RL's 1e-5: QLoRA's was 2e-4 (Dettmers et
# al. 2023, arXiv 2305.14314). At 1e-5, three steps on Qwen2.5-Coder-0.5B's own answers left
# their NLL at 0.231 -> 0.230 nats a token and the parse rate where it was.
WARMUP_LORA_LEARNING_RATE = 2e-4
WARMUP_FULL_LEARNING_RATE = 1e-5


@dataclass(frozen=True)
class WarmupSettings:
    samples: int = 64  # completions of the first prompt to choose well-formed answers from
    epochs: int = 3  # passes over the kept answers
    answers_per_step: int = 8
    measure: int = 64  # completions sampled after, to measure the parse rate (0: skip)
    lora: bool = True
    lora_rank: int = 16
    learning_rate: float = WARMUP_LORA_LEARNING_RATE

    def __post_init__(self) -> None:
        for name in ("samples", "epochs", "answers_per_step", "lora_rank"):
            if getattr(self, name) < 1:
                raise UserError(f"warm-up {name} must be at least 1, got {getattr(self, name)}")
        if self.measure < 0:
            raise UserError(f"warm-up measure must be 0 or more, got {self.measure}")
        if not 0 < self.learning_rate < 1:
            raise UserError(f"warm-up learning rate must be in (0, 1), got {self.learning_rate}")


def well_formed(
    completion: Completion,
    candidates: int,
    parent_code: str,
    expand: Callable[[str], str] | None = None,
) -> bool:
    """Every one of the m candidates came back and parsed, as a campaign reads them (`expand`:
    the compact form's `program`, when the campaign asks for compact candidates)."""
    parsed = parse_completion(completion.text, candidates, parent_code)
    if expand is not None:
        parsed = [expanded(candidate, expand) for candidate in parsed]
    return all(candidate.code is not None for candidate in parsed)


def warm_up(
    config: CampaignSettings,
    problem: Problem,
    settings: WarmupSettings,
    out: Path,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Sample, keep the well-formed, fine-tune on them, write the model to `out`, measure."""
    from harness.llm.choice import base_generator

    prompt, parent_code = _first_prompt(config, problem)
    sampling = Sampling(
        config.temperature, config.top_p, config.max_tokens, top_k=config.top_k, seed=config.seed
    )
    completions = _sample(base_generator(config), prompt, settings.samples, sampling)
    expand = compact.reader(parent_code) if (compact := compact_form(config, problem)) else None
    kept = [c for c in completions if well_formed(c, config.candidates, parent_code, expand)]
    before = len(kept) / len(completions)
    say(
        f"{config.model}: {len(kept)} of {len(completions)} answers well-formed "
        f"({before:.0%}: all {config.candidates} candidates in their tags and parsed)"
    )
    if not kept:
        raise UserError(
            f"none of {len(completions)} answers had all {config.candidates} candidates: there "
            "is nothing of the model's own to learn the format from; sample more (--samples) "
            "or ask for fewer candidates (--candidates)"
        )
    steps = _fine_tune(config, settings, kept, out, say)
    report: dict[str, Any] = {
        "problem": problem.name,
        "model": config.model,
        "candidates": config.candidates,
        "sampling": asdict(sampling),
        "settings": asdict(settings),
        "samples": len(completions),
        "kept": len(kept),
        "parse_rate_before": before,
        "steps": steps,
    }
    if settings.measure:
        measured = replace(config, model=str(out))
        after_sampling = replace(sampling, seed=(config.seed or 0) + 1)
        again = _sample(base_generator(measured), prompt, settings.measure, after_sampling)
        formed = sum(well_formed(c, config.candidates, parent_code, expand) for c in again)
        report["parse_rate_after"] = formed / len(again)
        report["measured"] = len(again)
        say(
            f"after the warm-up: {formed} of {len(again)} answers well-formed "
            f"({report['parse_rate_after']:.0%}; before {before:.0%})"
        )
    (out / "vpo-warmup.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _first_prompt(config: CampaignSettings, problem: Problem) -> tuple[list[dict[str, str]], str]:
    """A campaign's first prompt: the seed, evaluated in the sandbox, no drafts (built in a
    scratch database by the campaign's own code)."""
    from harness.evaluation.sandbox import Sandbox
    from harness.evolution.loop import prepare
    from harness.evolution.prompts import build_prompt
    from harness.store import Store

    with tempfile.TemporaryDirectory(prefix="vpo-warmup-") as scratch:
        store = Store.open(Path(scratch) / "warmup.db")
        try:
            campaign_id = store.create_campaign("warmup", problem.name, config.to_dict(), 0)
            with Sandbox(workers=1) as sandbox:
                run = prepare(config, store, problem, campaign_id, sandbox)
            seed = store.program(run.seed_id)
        finally:
            store.close()
    assert seed is not None
    compact = compact_form(config, problem)
    return build_prompt(problem, seed, [], config.candidates, compact=compact), seed.code


def _sample(
    generator: Any, prompt: list[dict[str, str]], n: int, sampling: Sampling
) -> list[Completion]:
    try:
        return generator.generate([prompt], n, sampling)[0]
    finally:
        generator.close()


def _fine_tune(
    config: CampaignSettings,
    settings: WarmupSettings,
    kept: list[Completion],
    out: Path,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    from trainer.imitation import imitation_step
    from trainer.models import ModelError
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Rollout

    rollouts = [Rollout(c.prompt_token_ids or (), c.token_ids) for c in kept]
    if any(not r.prompt_ids or not r.completion_ids for r in rollouts):
        raise UserError(f"the {config.backend} backend gave no token ids to fine-tune on")
    try:
        policy = Policy.load(
            config.model,
            PolicyConfig(
                lr=settings.learning_rate,
                lora=settings.lora,
                lora_rank=settings.lora_rank,
                reference=False,
            ),
        )
    except ModelError as error:
        raise UserError(str(error)) from None
    order = random.Random(config.seed)
    steps: list[dict[str, Any]] = []
    for _ in range(settings.epochs):
        shuffled = rollouts[:]
        order.shuffle(shuffled)
        for start in range(0, len(shuffled), settings.answers_per_step):
            metrics = imitation_step(
                policy, shuffled[start : start + settings.answers_per_step], micro_batch=1
            )
            steps.append(metrics.as_dict())
            say(metrics.line())
    policy.save_merged(out)
    return steps
