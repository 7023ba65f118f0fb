"""The campaign loop, top to bottom: select -> prompt -> generate -> parse -> evaluate -> store.

One iteration picks a parent (and drafts) on one island, builds one prompt, samples G rollouts of
m candidates each, evaluates the new candidates in the sandbox and stores the group, its
rollouts and programs in one transaction. Generation of the next iteration overlaps the
evaluation of the previous one (a single background thread evaluates and stores, in order), so
the generator is not idle while candidates run.

The database is the checkpoint: the number of iterations done is the number of groups, the
random stream of iteration k depends only on (seed, k), and a killed run loses at most the
iterations in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.config import CampaignConfig
from harness.errors import UserError
from harness.evaluate import evaluate, evaluate_many
from harness.llm import Completion, GenerationError, Generator, Sampling, make_generator
from harness.llm.base import storable
from harness.parsing import parse_completion
from harness.prompts import build_prompt
from harness.records import (
    CampaignRecord,
    CandidateRecord,
    NewProgram,
    ProgramRecord,
    RolloutRecord,
    code_hash,
)
from harness.sandbox import Limits, Sandbox
from harness.selection import (
    Population,
    Selection,
    SelectionConfig,
    migrants,
    select,
    should_migrate,
)
from harness.store import Store
from harness.training import (
    Trainer,
    base_generator,
    check_backend,
    maybe_train,
    serve_adapter,
    start_trainer,
    trainer_generator,
)
from problems.api import Evaluation, Problem

GENERATION_RETRIES = 3


@dataclass
class Progress:
    """What this run did so far, for the progress line (the database holds the real counts)."""

    started: float = field(default_factory=time.perf_counter)
    iterations: int = 0
    evaluations: int = 0
    tokens: int = 0
    generate_seconds: float = 0.0
    best: dict[str, float] = field(default_factory=dict)
    train: str | None = None  # the last training step, as a line

    def line(self, iteration: int, total: int) -> str:
        wall = max(time.perf_counter() - self.started, 1e-9)
        best = " ".join(f"{k} {v:.4f}" for k, v in self.best.items())
        line = (
            f"iteration {iteration}/{total} | best {best} | "
            f"{self.evaluations / wall:.2f} evals/s | {self.tokens / wall:.0f} tok/s"
        )
        return line if self.train is None else f"{line} | {self.train}"

    @property
    def busy_fraction(self) -> float:
        """Share of the wall clock the generator spent generating."""
        return self.generate_seconds / max(time.perf_counter() - self.started, 1e-9)


@dataclass
class Campaign:
    """Everything one run of a campaign works with."""

    config: CampaignConfig
    problem: Problem
    store: Store
    campaign_id: int
    sandbox: Sandbox
    limits: Limits
    seed_id: int
    objectives: list[str]
    population: Population
    seen: set[str]  # code hashes evaluated already: duplicates are never evaluated twice
    progress: Progress = field(default_factory=Progress)
    last_program_id: int = 0
    trainer: Trainer | None = None  # set when the campaign trains (train_every > 0)


def open_campaign(store: Store, config: CampaignConfig, problem: Problem) -> int:
    name = config.name or problem.name
    existing = store.get_campaign(name)
    if existing is None:
        campaign_id = store.create_campaign(name, problem.name, config.to_dict(), config.seed)
    else:
        if existing.problem != problem.name:
            raise UserError(
                f"campaign {name!r} in {store.where} runs problem {existing.problem!r}, "
                f"not {problem.name!r}; pick another --name"
            )
        campaign_id = existing.id
        store.record_event(campaign_id, "resumed", {"config": config.to_dict()})
    store.set_campaign_status(campaign_id, "running")
    return campaign_id


def ensure_seed(
    store: Store, campaign_id: int, problem: Problem, sandbox: Sandbox, limits: Limits
) -> ProgramRecord:
    """The seed program, evaluated and stored once per campaign (never again on resume)."""
    seeds = store.programs(campaign_id, origin="seed", limit=1)
    if seeds:
        return seeds[0]
    evaluation = evaluate(problem, problem.seed_program, sandbox, limits)
    program_id = store.add_program(
        campaign_id,
        problem.seed_program,
        status=evaluation.status,
        scores=dict(evaluation.scores),
        raw=dict(evaluation.raw),
        error=evaluation.reason,
        origin="seed",
        eval_seconds=evaluation.seconds,
        metrics={"artifacts": dict(evaluation.artifacts)},
        the_seed=True,
    )
    record = store.program(program_id)
    assert record is not None
    return record


def run_campaign(
    config: CampaignConfig,
    store: Store,
    problem: Problem,
    *,
    generator: Generator | None = None,
    on_progress: Callable[[int, Progress], None] | None = None,
) -> int:
    """Run (or resume) the campaign up to `config.iterations` iterations; return its id.

    A run that fails or is interrupted before it records an iteration of an existing campaign
    leaves the campaign's status as it was: a finished campaign whose extension could not
    start its model is still finished, not failed."""
    before = store.get_campaign(config.name or problem.name)
    done_before = store.iterations_done(before.id) if before is not None else 0
    if generator is None and done_before < config.iterations:
        check_backend(config)  # before the campaign is touched
    campaign_id = open_campaign(store, config, problem)
    owns_generator = generator is None
    try:
        with Sandbox(workers=config.sandbox_workers) as sandbox:
            campaign = prepare(config, store, problem, campaign_id, sandbox)
            done = store.iterations_done(campaign_id)
            if done < config.iterations:
                campaign.trainer = start_trainer(
                    config, store, campaign_id, config.name or problem.name, campaign.objectives
                )
                if generator is None and campaign.trainer is not None:
                    generator = trainer_generator(config, campaign.trainer)
                elif generator is None:
                    generator = base_generator(config)
                evolve(campaign, generator, done, on_progress)
        store.set_campaign_status(campaign_id, "finished")
    except KeyboardInterrupt:
        _settle_status(store, campaign_id, "stopped", before, done_before)
        raise
    except BaseException:
        _settle_status(store, campaign_id, "failed", before, done_before)
        raise
    finally:
        if owns_generator and generator is not None:
            generator.close()
    return campaign_id


def _settle_status(
    store: Store, campaign_id: int, status: str, before: CampaignRecord | None, done_before: int
) -> None:
    """`status` for a run that ended early, unless it recorded nothing of an existing campaign:
    that one keeps the status it had before this run."""
    if before is not None and store.iterations_done(campaign_id) == done_before:
        status = before.status
    store.set_campaign_status(campaign_id, status)


def prepare(
    config: CampaignConfig, store: Store, problem: Problem, campaign_id: int, sandbox: Sandbox
) -> Campaign:
    """The seed stored once, and the population and code hashes loaded from the database."""
    limits = Limits(
        wall_seconds=config.time_limit or float(problem.time_limit),
        memory_mb=int(problem.memory_mb),
    )
    seed = ensure_seed(store, campaign_id, problem, sandbox, limits)
    objectives = [o.name for o in problem.objectives]
    campaign = Campaign(
        config,
        problem,
        store,
        campaign_id,
        sandbox,
        limits,
        seed.id,
        objectives,
        Population(objectives),
        set(store.code_hashes(campaign_id)),
    )
    refresh_population(campaign)
    return campaign


def evolve(
    campaign: Campaign,
    generator: Generator,
    first_iteration: int,
    on_progress: Callable[[int, Progress], None] | None,
    *,
    overlap: bool = True,
) -> None:
    """Iterations `first_iteration`.. up to the budget. With `overlap` off, each iteration is
    evaluated and stored before the next one generates (a sequential harness, for comparison
    in benchmarks/generator_busy.py)."""
    config = campaign.config
    selection_config, sampling = loop_settings(config)
    with ThreadPoolExecutor(1, thread_name_prefix="evaluate") as evaluator:
        pending: Future[None] | None = None
        for iteration in range(first_iteration, config.iterations):
            version = campaign.trainer.version_id if campaign.trainer else None
            selection, parent, prompt, completions, moving = sample_iteration(
                campaign, generator, iteration, selection_config, sampling
            )
            if pending is not None:
                pending.result()  # the previous iteration is stored before this one
                train(campaign, generator)
            pending = evaluator.submit(
                _store_and_report,
                on_progress,
                campaign,
                iteration,
                selection,
                parent,
                prompt,
                completions,
                moving,
                version,
            )
            if not overlap:
                pending.result()
        if pending is not None:
            pending.result()
            if train(campaign, generator) and on_progress:
                on_progress(config.iterations, campaign.progress)  # show the last step too


def loop_settings(config: CampaignConfig) -> tuple[SelectionConfig, Sampling]:
    """How iterations select parents and sample completions, from the campaign's settings."""
    selection = SelectionConfig(
        islands=config.islands,
        migration_interval=config.migration_interval,
        drafts=min(config.drafts, 4),
    )
    sampling = Sampling(
        temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens
    )
    return selection, sampling


def sample_iteration(
    campaign: Campaign,
    generator: Generator,
    iteration: int,
    selection_config: SelectionConfig,
    sampling: Sampling,
) -> tuple[Selection, ProgramRecord, list[dict[str, str]], list[Completion], list[Any]]:
    """Iteration k up to its evaluation: parent and drafts chosen with the random stream of
    (seed, k), the prompt, the G completions, and the programs migrating after it."""
    config = campaign.config
    rng = np.random.default_rng([config.seed, iteration])
    refresh_population(campaign)
    selection = choose(campaign, iteration, rng, selection_config)
    parent, *drafts = campaign.store.programs_by_ids([selection.parent_id, *selection.draft_ids])
    prompt = build_prompt(campaign.problem, parent, drafts, config.candidates)
    completions = generate(campaign, generator, prompt, sampling, iteration)
    moving = []
    if config.strategy == "evolve" and should_migrate(
        iteration, selection_config.migration_interval
    ):
        moving = migrants(
            campaign.population,
            selection_config.islands,
            selection_config.migrants_per_island,
            rng,
        )
    return selection, parent, prompt, completions, moving


def _store_and_report(
    on_progress: Callable[[int, Progress], None] | None,
    campaign: Campaign,
    iteration: int,
    *args: Any,
) -> None:
    """The evaluation thread's job: evaluate and store an iteration, then report it at once
    (not when the next generation ends, which on a CPU is minutes later)."""
    evaluate_and_store(campaign, iteration, *args)
    if on_progress:
        on_progress(iteration + 1, campaign.progress)


def train(campaign: Campaign, generator: Generator) -> bool:
    """Training steps while enough unused groups wait (the generator is idle meanwhile: it may
    share the weights being trained): one in the steady state, more when a resumed run finds
    the groups a killed one recorded but did not train on; True when any ran."""
    if campaign.trainer is None:
        return False
    ran = False
    while (metrics := maybe_train(campaign.trainer, generator)) is not None:
        campaign.progress.train = metrics.line()
        ran = True
    return ran


def choose(
    campaign: Campaign, iteration: int, rng: np.random.Generator, config: SelectionConfig
) -> Selection:
    if campaign.config.strategy == "best-of-n":
        # The baseline: the same prompt every time, so evolution's gain can be measured.
        return Selection(island=0, parent_id=campaign.seed_id, draft_ids=())
    return select(campaign.population, iteration, rng, config)


def generate(
    campaign: Campaign,
    generator: Generator,
    prompt: list[dict[str, str]],
    sampling: Sampling,
    iteration: int,
) -> list[Completion]:
    for attempt in range(1, GENERATION_RETRIES + 1):
        started = time.perf_counter()
        try:
            completions = generator.generate([prompt], campaign.config.group_size, sampling)[0]
        except GenerationError as exc:
            campaign.store.record_event(
                campaign.campaign_id,
                "generation_failed",
                {"iteration": iteration, "attempt": attempt, "reason": str(exc)},
            )
            if attempt == GENERATION_RETRIES:
                raise UserError(f"generation failed {attempt} times; last: {exc}") from None
            time.sleep(2**attempt)
            continue
        completions = [storable(c) for c in completions]
        campaign.progress.generate_seconds += time.perf_counter() - started
        campaign.progress.tokens += sum(len(c.token_ids) for c in completions)
        return completions
    raise AssertionError("unreachable")


def evaluate_and_store(
    campaign: Campaign,
    iteration: int,
    selection: Selection,
    parent: ProgramRecord,
    prompt: list[dict[str, str]],
    completions: Sequence[Completion],
    moving: Sequence[tuple[int, int]],
    policy_version_id: int | None = None,
) -> None:
    m = campaign.config.candidates
    # Parse every rollout; decide which candidates are new code worth evaluating.
    slots: list[list[tuple[int, str, str | None, str | None]]] = []  # (index, outcome, hash/reason)
    fresh: dict[str, str] = {}  # code hash -> code, in first-seen order
    parse_notes: list[tuple[str, str | None]] = []
    for completion in completions:
        parsed = {c.index: c for c in parse_completion(completion.text, m, parent.code)}
        rollout_slots = []
        errors = []
        for index in range(1, m + 1):
            candidate = parsed.get(index)
            if candidate is None or candidate.code is None:
                reason = candidate.error if candidate else f"no candidate {index} in the completion"
                rollout_slots.append((index, "unparsed", None, reason))
                errors.append(f"{index}: {reason}")
            elif "\x00" in candidate.code:
                rollout_slots.append((index, "unparsed", None, "the code contains a NUL byte"))
                errors.append(f"{index}: NUL byte")
            else:
                digest = code_hash(candidate.code)
                if digest in campaign.seen or digest in fresh:
                    rollout_slots.append((index, "duplicate", digest, None))
                else:
                    fresh[digest] = candidate.code
                    rollout_slots.append((index, "new", digest, None))
        parsed_count = sum(1 for s in rollout_slots if s[1] != "unparsed")
        status = "ok" if parsed_count == m else ("partial" if parsed_count else "none")
        parse_notes.append((status, "; ".join(errors)[:500] or None))
        slots.append(rollout_slots)

    evaluations = dict(
        zip(
            fresh,
            evaluate_many(
                campaign.problem, list(fresh.values()), campaign.sandbox, campaign.limits
            ),
            strict=True,
        )
    )
    rollouts = []
    for completion, rollout_slots, (status, error) in zip(
        completions, slots, parse_notes, strict=True
    ):
        candidates = []
        for index, outcome, digest, reason in rollout_slots:
            if outcome == "new":
                assert digest is not None
                candidates.append(
                    CandidateRecord(
                        index, "new", _new_program(fresh[digest], evaluations[digest]), digest
                    )
                )
            else:
                candidates.append(CandidateRecord(index, outcome, None, digest, reason))
        rollouts.append(
            RolloutRecord(
                completion.text,
                completion.token_ids,
                completion.logprobs,
                completion.finish_reason,
                status,
                error,
                candidates,
            )
        )
    campaign.store.record_iteration(
        campaign.campaign_id,
        iteration=iteration,
        island=selection.island,
        parent_id=selection.parent_id,
        draft_ids=selection.draft_ids,
        prompt=prompt,
        prompt_token_ids=completions[0].prompt_token_ids if completions else None,
        rollouts=rollouts,
        policy_version_id=policy_version_id,
        migrations=moving,
    )
    campaign.seen.update(fresh)
    progress = campaign.progress
    progress.iterations += 1
    progress.evaluations += len(fresh)
    for evaluation in evaluations.values():
        if evaluation.status == "ok":
            for name, value in evaluation.scores.items():
                progress.best[name] = max(progress.best.get(name, 0.0), value)


def refresh_population(campaign: Campaign) -> None:
    """Append the programs stored since the last refresh (by this or any other process)."""
    ids, islands, valid, scores, hashes = campaign.store.program_vectors(
        campaign.campaign_id, campaign.objectives, after_id=campaign.last_program_id
    )
    if not len(ids):
        return
    campaign.population.extend(ids, islands, scores, valid=valid, code_hashes=hashes)
    if valid.any():
        best = campaign.progress.best
        for name, value in zip(campaign.objectives, scores[valid].max(axis=0), strict=True):
            best[name] = max(best.get(name, 0.0), float(value))
    campaign.last_program_id = int(ids[-1])


def _new_program(code: str, evaluation: Evaluation) -> NewProgram:
    return NewProgram(
        code=code,
        status=evaluation.status,
        scores=dict(evaluation.scores),
        raw=dict(evaluation.raw),
        error=evaluation.reason,
        eval_seconds=evaluation.seconds,
        metrics={"artifacts": dict(evaluation.artifacts)},
    )


def summary_json(store: Store, campaign_id: int) -> dict[str, Any]:
    summary = store.summary(campaign_id)
    return {
        "programs": summary.programs,
        "valid_programs": summary.valid_programs,
        "evaluations": summary.evaluations,
        "groups": summary.groups,
        "trajectories": summary.trajectories,
        "policy_versions": summary.policy_versions,
        "tokens": summary.tokens,
        "best": summary.best,
    }


# Workers: several processes, on any machines, taking iterations of one campaign -------------


def run_worker(
    config: CampaignConfig,
    store: Store,
    problem: Problem,
    worker: str,
    *,
    lease_seconds: float = 900.0,
    poll_seconds: float = 2.0,
    generator: Generator | None = None,
    on_progress: Callable[[int, Progress], None] | None = None,
) -> int:
    """Take iterations of the campaign until its budget is recorded; return how many this
    worker recorded.

    Each iteration is claimed in the database first (`Store.claim_iteration`), so workers never
    run the same one, and one whose worker died is taken over once its claim is older than
    `lease_seconds`. The random stream of iteration k still depends only on (seed, k). Before
    each iteration the worker loads the newest policy version a `vpo train --follow` process
    recorded; it never trains itself.
    """
    campaign_id = open_campaign_shared(store, config, problem)
    name = config.name or problem.name
    owns_generator = generator is None
    done = 0
    loaded: int | None = None
    with Sandbox(workers=config.sandbox_workers) as sandbox:
        campaign = prepare(config, store, problem, campaign_id, sandbox)
        selection_config, sampling = loop_settings(config)
        try:
            while True:
                iteration = store.claim_iteration(
                    campaign_id, worker, budget=config.iterations, lease_seconds=lease_seconds
                )
                if iteration is None:
                    if store.open_claims(campaign_id) == 0:
                        break  # every iteration is recorded
                    time.sleep(poll_seconds)  # others are still working; one may die
                    continue
                try:
                    latest = store.latest_policy(campaign_id)
                    if generator is None or (latest is not None and latest.id != loaded):
                        generator = _worker_generator(config, name, latest, generator)
                        loaded = None if latest is None else latest.id
                    selection, parent, prompt, completions, moving = sample_iteration(
                        campaign, generator, iteration, selection_config, sampling
                    )
                    evaluate_and_store(
                        campaign,
                        iteration,
                        selection,
                        parent,
                        prompt,
                        completions,
                        moving,
                        loaded,
                    )
                except UserError as error:
                    if "already recorded" not in str(error):
                        store.release_claim(campaign_id, iteration, worker)
                        raise
                    # Our lease ran out and another worker recorded this iteration first.
                    store.record_event(
                        campaign_id, "iteration_lost", {"iteration": iteration, "worker": worker}
                    )
                    continue
                except BaseException:
                    store.release_claim(campaign_id, iteration, worker)
                    raise
                done += 1
                if on_progress:
                    on_progress(iteration + 1, campaign.progress)
        finally:
            if owns_generator and generator is not None:
                generator.close()
    if store.iterations_done(campaign_id) >= config.iterations:
        store.set_campaign_status(campaign_id, "finished")
    return done


def open_campaign_shared(store: Store, config: CampaignConfig, problem: Problem) -> int:
    """The campaign by name, created by whichever worker comes first."""
    name = config.name or problem.name
    for _ in range(3):
        existing = store.get_campaign(name)
        if existing is not None:
            if existing.problem != problem.name:
                raise UserError(
                    f"campaign {name!r} in {store.where} runs problem {existing.problem!r}, "
                    f"not {problem.name!r}"
                )
            return existing.id
        try:
            return store.create_campaign(name, problem.name, config.to_dict(), config.seed)
        except UserError:
            continue  # another worker created it a moment ago
    raise UserError(f"could not create or find campaign {name!r} in {store.where}")


def _worker_generator(
    config: CampaignConfig, campaign_name: str, latest: Any, current: Generator | None
) -> Generator:
    """A generator sampling from the newest policy version (the base model before any)."""
    from pathlib import Path

    if latest is None:
        return current if current is not None else base_generator(config)
    folder = Path(latest.path)
    if config.backend == "openai":
        # A shared server: the version becomes an adapter there, loaded by whichever worker
        # comes first and sampled from by name.
        generator = current if current is not None else base_generator(config)
        serve_adapter(generator, campaign_name, latest.step, folder)
        return generator
    merged = folder.with_name(folder.name + "-merged")
    if not (folder / "config.json").exists() and merged.exists():
        folder = merged  # a LoRA version: the trainer also wrote it merged for the workers
    if current is None and config.backend != "transformers":
        current = base_generator(config)  # vllm: start the engine once, then reload weights
    reload = getattr(current, "reload_weights", None)
    if reload is not None:
        reload(str(folder))
        return current  # type: ignore[return-value]
    if current is not None:
        current.close()
    return make_generator("transformers", str(folder))
