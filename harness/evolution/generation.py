"""Many iterations in flight: parents chosen, prompts built and completions sampled for a batch
of iterations at once.

    batch = sample_batch(campaign, generator, [12, 13, 14, 15], settings)
    # one SampledIteration per iteration, in order; `skipped` set where it produced nothing

An in-process generator (transformers, vllm) gets every prompt of the batch in one `generate`
call, which it decodes together; a server gets one request per prompt, all at once, from a
thread each, so one slow or failed request holds up nothing but its own iteration. A prompt
that does not fit the model, or a request that failed after the backend's retries, makes its
iteration *skipped*: it is stored with the reason and no rollouts, and the campaign goes on.
So does a call cut at its wall-clock limit (`call_timeout`, carried by `Sampling.timeout`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.config.errors import CampaignFailed, UserError
from harness.config.settings import (
    DEFAULT_CONCURRENCY,
    GPU_VLLM_CONCURRENCY,
    IN_PROCESS_CALL_TIMEOUT,
    SERVER_CALL_TIMEOUT,
)
from harness.evolution.iteration import SampledIteration
from harness.evolution.prompts import PromptBudget, PromptTooLong, build_prompt
from harness.evolution.run import refresh_population
from harness.evolution.selection import Selection, SelectionConfig, migrants, select, should_migrate
from harness.llm import Completion, GenerationError, Generator, Message, Sampling
from harness.llm.base import storable
from harness.observation.ledger import Ledger, timed

if TYPE_CHECKING:
    from harness.config.settings import CampaignSettings
    from harness.evolution.run import CampaignRun
    from harness.records import PolicyVersion


@dataclass(frozen=True)
class LoopConfig:
    """How iterations select, prompt and sample, from the campaign's settings."""

    selection: SelectionConfig
    sampling: Sampling
    concurrency: int
    budget: PromptBudget | None  # None: the model's context length is unknown


def loop_settings(config: CampaignSettings, generator: Generator) -> LoopConfig:
    selection = SelectionConfig(
        islands=config.islands,
        migration_interval=config.migration_interval,
        drafts=config.drafts,
    )
    sampling = Sampling(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_tokens=config.max_tokens,
        timeout=call_timeout_for(config, generator),
    )
    return LoopConfig(
        selection, sampling, concurrency_for(config, generator), prompt_budget(config, generator)
    )


def describe(generator: Generator, settings: LoopConfig) -> str:
    """One line on how a campaign generates, for the start of its output."""
    budget = (
        f"prompts up to {settings.budget.tokens} tokens ({settings.budget.why})"
        if settings.budget
        else "prompt length unchecked (the model's context length is unknown)"
    )
    return (
        f"generating with {generator.backend} ({generator.model}), "
        f"{settings.concurrency} iteration{'s' if settings.concurrency > 1 else ''} in flight, "
        f"calls cut at {settings.sampling.timeout} s, {budget}"
    )


def concurrency_for(config: CampaignSettings, generator: Generator) -> int:
    """`config.concurrency`, or the backend's default when it is 0."""
    if config.concurrency:
        return config.concurrency
    if generator.backend == "vllm" and _cuda():
        return GPU_VLLM_CONCURRENCY
    return DEFAULT_CONCURRENCY.get(generator.backend, 1)


def call_timeout_for(config: CampaignSettings, generator: Generator) -> int:
    """`config.call_timeout`, or the default for a server or an in-process backend when 0."""
    if config.call_timeout:
        return config.call_timeout
    return IN_PROCESS_CALL_TIMEOUT if generator.in_process else SERVER_CALL_TIMEOUT


def _cuda() -> bool:
    import torch  # loaded already: the vllm backend runs on it

    return torch.cuda.is_available()


def prompt_budget(config: CampaignSettings, generator: Generator) -> PromptBudget | None:
    """The prompt's token budget: the context length (`context_tokens`, else what the model or
    server says) minus `max_tokens`, and in a campaign that trains no more than the training
    length minus `max_tokens`, so the trainer takes every rollout whole (one budget: a prompt
    that fits is never cut by a step). None when neither bounds it (no training, and a hosted
    API that does not say its context length: a prompt it finds too long is then a recorded
    failure)."""
    limits: list[tuple[int, str]] = []
    context = config.context_tokens or generator.context_tokens()
    if context is not None:
        source = "context_tokens" if config.context_tokens else "the model's context length"
        room = context - config.max_tokens
        if room < 64:
            raise UserError(
                f"max_tokens {config.max_tokens} leaves no room for a prompt in {source} of "
                f"{context} tokens; lower --max-tokens"
            )
        limits.append((room, f"{source} {context} - max_tokens {config.max_tokens}"))
    if config.training.train_every:
        length = config.sampling().sequence_tokens
        why = f"the training length {length} - max_tokens {config.max_tokens}"
        limits.append((length - config.max_tokens, why))
    if not limits:
        return None
    room, why = min(limits)
    return PromptBudget(
        tokens=room,
        count=generator.count_tokens,
        draft_chars=config.draft_chars,
        feedback_chars=config.feedback_chars,
        why=why,
    )


def sample_batch(
    run: CampaignRun,
    generator: Generator,
    iterations: Sequence[int],
    settings: LoopConfig,
    version: PolicyVersion | None = None,
    ledger: Ledger | None = None,
) -> list[SampledIteration]:
    """Iterations `iterations` up to their evaluation, in order: each one's parent and drafts
    chosen with the random stream of (seed, k), its prompt, its G completions (from policy
    version `version`; None: the base weights) and the programs migrating after it. `ledger`
    times the selecting and the generating."""
    with timed(ledger, "selecting"):
        chosen = [_choose(run, k, settings, version) for k in iterations]
    asking = [c for c in chosen if c.skipped is None]
    with timed(ledger, "generating"):
        results = _generate(
            generator, [c.prompt for c in asking], run.config.group_size, settings.sampling
        )
    progress = run.progress
    done: dict[int, SampledIteration] = {}
    for c, (result, _) in zip(asking, results, strict=True):
        if isinstance(result, GenerationError):
            reason = ("permanent: " if result.permanent else "") + str(result)
            done[c.iteration] = replace(c, skipped=f"generation failed: {reason}")
            continue
        completions = [storable(completion) for completion in result]
        progress.tokens += sum(completion.num_tokens for completion in completions)
        done[c.iteration] = replace(c, completions=completions)
    progress.generate_seconds += max((s for _, s in results), default=0.0)
    return [done.get(c.iteration, c) for c in chosen]


def _choose(
    run: CampaignRun, iteration: int, settings: LoopConfig, version: PolicyVersion | None
) -> SampledIteration:
    """Iteration k before generation: selection, prompt (or why there is none), migrations."""
    rng = np.random.default_rng([run.config.seed, iteration])
    refresh_population(run)
    population = snapshot(run)
    selection = _select(run, iteration, rng, settings.selection)
    parent, *drafts = run.store.programs_by_ids([selection.parent_id, *selection.draft_ids])
    skipped = None
    prompt: list[Message] = []
    try:
        prompt = build_prompt(
            run.problem,
            parent,
            drafts,
            run.config.candidates,
            settings.budget,
            run.compact,
        )
    except PromptTooLong as error:
        skipped = f"prompt too long: {error}"
    moving = _migrations(run, iteration, rng, settings.selection)
    return SampledIteration(
        iteration,
        selection,
        parent,
        prompt,
        (),
        moving,
        version,
        skipped=skipped,
        population=population,
    )


def snapshot(run: CampaignRun) -> dict[str, Any]:
    """What a selection sees now: the population's size, its valid programs, the highest
    program id in it (the population is every program of the campaign up to that id) and its
    programs per island."""
    population = run.population
    islands = np.bincount(population.islands, minlength=run.config.islands)
    return {
        "programs": len(population),
        "valid": int(population.valid.sum()),
        "upto": run.last_program_id,
        "islands": [int(n) for n in islands],
    }


def _select(
    run: CampaignRun, iteration: int, rng: np.random.Generator, config: SelectionConfig
) -> Selection:
    if run.config.strategy == "best-of-n":
        # The baseline: the same prompt every time, so evolution's gain can be measured.
        return Selection(island=0, parent_id=run.seed_id, draft_ids=())
    return select(run.population, iteration, rng, config, run.cases)


def _migrations(
    run: CampaignRun, iteration: int, rng: np.random.Generator, config: SelectionConfig
) -> list[tuple[int, int]]:
    """(program id, destination island) of the programs migrating after this iteration."""
    if run.config.strategy != "evolve" or not should_migrate(iteration, config.migration_interval):
        return []
    return migrants(run.population, config.islands, config.migrants_per_island, rng)


Result = tuple[list[Completion] | GenerationError, float]  # and the seconds it took


def _generate(
    generator: Generator, prompts: list[list[Message]], n: int, sampling: Sampling
) -> list[Result]:
    """n completions for each prompt, or the GenerationError its request ended in."""
    if not prompts:
        return []
    if generator.in_process:
        started = time.perf_counter()
        try:
            groups: list[list[Completion] | GenerationError] = list(
                generator.generate(prompts, n, sampling)
            )
        except GenerationError as error:
            groups = [error] * len(prompts)
        seconds = time.perf_counter() - started
        return [(group, seconds) for group in groups]
    with ThreadPoolExecutor(len(prompts), thread_name_prefix="request") as pool:
        return list(pool.map(_one_request(generator, n, sampling), prompts))


def _one_request(
    generator: Generator, n: int, sampling: Sampling
) -> Callable[[list[Message]], Result]:
    def request(prompt: list[Message]) -> Result:
        started = time.perf_counter()
        try:
            result: list[Completion] | GenerationError = generator.generate([prompt], n, sampling)[
                0
            ]
        except GenerationError as error:
            result = error
        return result, time.perf_counter() - started

    return request


@dataclass
class FailureStreak:
    """Iterations in a row that were skipped; the campaign stops at `limit`."""

    limit: int
    count: int = 0
    last: str = ""

    def update(self, batch: Sequence[SampledIteration]) -> None:
        for sampled in batch:
            if sampled.skipped is None:
                self.count, self.last = 0, ""
            else:
                self.count, self.last = self.count + 1, sampled.skipped

    @property
    def reached(self) -> bool:
        return self.count >= self.limit

    def error(self) -> CampaignFailed:
        return CampaignFailed(
            f"{self.count} iterations in a row produced nothing (max_failures {self.limit}); "
            f"the last: {self.last}"
        )
