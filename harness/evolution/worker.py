"""Workers: several processes, on any machines, taking iterations of one campaign.

`vpo worker` runs `run_worker`: the same iterations as `campaign.evolve`, each claimed in the
database first so no two workers run one, sampled from the newest policy version a
`vpo train --follow` process recorded. Workers never train.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from harness.config.errors import UserError
from harness.config.settings import CampaignSettings
from harness.evaluation.sandbox import Sandbox
from harness.evolution.generation import FailureStreak, LoopConfig, loop_settings, sample_batch
from harness.evolution.iteration import SampledIteration
from harness.evolution.loop import prepare
from harness.evolution.recording import evaluate_and_store
from harness.evolution.run import CampaignRun
from harness.learning.publish import SavedVersion
from harness.llm import Generator, make_generator
from harness.llm.choice import base_generator, resolve_backend
from harness.observation.ledger import Ledger, batch_payload
from harness.observation.progress import Progress
from harness.observation.time_split import EVENT
from harness.records import PolicyVersion
from harness.store import Store
from problems.api import Problem

VERSION_TRIES = 5  # loads of a version pruned meanwhile, each retried with a newer one


def run_worker(
    config: CampaignSettings,
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
    version: PolicyVersion | None = None  # the one the generator samples from; None: the base
    with Sandbox(workers=config.sandbox_workers) as sandbox:
        run = prepare(config, store, problem, campaign_id, sandbox)
        streak = FailureStreak(config.max_failures)
        try:
            while True:
                generator, version = _newest(store, campaign_id, config, name, generator, version)
                settings = loop_settings(config, generator)
                claimed = _claim(store, campaign_id, worker, config, settings, lease_seconds)
                if not claimed:
                    if store.open_claims(campaign_id) == 0:
                        break  # every iteration is recorded
                    time.sleep(poll_seconds)  # others are still working; one may die
                    continue
                batch = _run_batch(run, generator, claimed, settings, version, worker)
                for sampled in batch:
                    done += 1
                    if on_progress:
                        on_progress(sampled.iteration + 1, run.progress)
                streak.update(batch)  # the stored ones; a skipped iteration is stored too
                if streak.reached:
                    raise streak.error()
        finally:
            if owns_generator and generator is not None:
                generator.close()
    if store.iterations_done(campaign_id) >= config.iterations:
        store.set_campaign_status(campaign_id, "finished")
    return done


def _run_batch(
    run: CampaignRun,
    generator: Generator,
    claimed: list[int],
    settings: LoopConfig,
    version: PolicyVersion | None,
    worker: str,
) -> list[SampledIteration]:
    """The claimed iterations sampled, evaluated and stored; those this worker stored. On an
    error the claims of the iterations not stored are given back at once."""
    store, campaign_id = run.store, run.campaign_id
    stored: list[SampledIteration] = []
    lost: list[int] = []

    def on_lost(sampled: SampledIteration) -> None:
        # Our lease ran out and another worker recorded the iteration first.
        lost.append(sampled.iteration)
        payload = {"iteration": sampled.iteration, "worker": worker}
        store.record_event(campaign_id, "iteration_lost", payload)

    # One thread does it all: its stages follow one another, all on the loop's side.
    ledger, started = Ledger(time.process_time), time.perf_counter()
    try:
        batch = sample_batch(run, generator, claimed, settings, version, ledger)
        stored.extend(evaluate_and_store(run, batch, lost=on_lost, ledger=ledger))
        tokens = sum(c.num_tokens for sampled in batch for c in sampled.completions)
        wall = time.perf_counter() - started
        payload = batch_payload([s.iteration for s in stored], tokens, wall, ledger.take(), {})
        store.record_event(campaign_id, EVENT, payload | {"worker": worker})
        run.progress.time.add(payload)
    except BaseException:
        finished = {s.iteration for s in stored} | set(lost)
        for iteration in claimed:
            if iteration not in finished:
                store.release_claim(campaign_id, iteration, worker)
        raise
    return stored


def _claim(
    store: Store,
    campaign_id: int,
    worker: str,
    config: CampaignSettings,
    settings: LoopConfig,
    lease_seconds: float,
) -> list[int]:
    """Up to `concurrency` iterations claimed for `worker` (fewer near the end of the budget)."""
    claimed: list[int] = []
    while len(claimed) < settings.concurrency:
        iteration = store.claim_iteration(
            campaign_id, worker, budget=config.iterations, lease_seconds=lease_seconds
        )
        if iteration is None:
            break
        claimed.append(iteration)
    return claimed


def open_campaign_shared(store: Store, config: CampaignSettings, problem: Problem) -> int:
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


def _newest(
    store: Store,
    campaign_id: int,
    config: CampaignSettings,
    campaign_name: str,
    generator: Generator | None,
    loaded: PolicyVersion | None,
) -> tuple[Generator, PolicyVersion | None]:
    """The generator sampling from the newest policy version, and that version (None: the base
    model, before any); `loaded` is the version `generator` samples from now.

    A version can vanish while a slow worker loads it: the trainer keeps only the newest few
    (`keep_versions`), so several steps taken meanwhile prune it. A load that fails while a
    newer version has been recorded is retried with that one (up to VERSION_TRIES times)."""
    failures = 0
    while True:
        latest = store.latest_policy(campaign_id)
        current = latest is None or (loaded is not None and latest.step == loaded.step)
        if generator is not None and current:
            return generator, loaded
        try:
            generator = _worker_generator(config, campaign_name, latest, generator)
            return generator, latest
        except Exception:
            failures += 1
            newer = store.latest_policy(campaign_id)
            moved = latest is not None and newer is not None and newer.step != latest.step
            if failures >= VERSION_TRIES or not moved:
                raise


def _worker_generator(
    config: CampaignSettings,
    campaign_name: str,
    latest: PolicyVersion | None,
    current: Generator | None,
) -> Generator:
    """A generator sampling from the newest policy version (the base model before any).

    A shared server takes the version as an adapter (loaded by whichever worker comes first);
    an in-process engine reloads its weights; a transformers model is loaded from the folder."""
    if latest is None:
        return current if current is not None else base_generator(config)
    version = SavedVersion(Path(latest.path), latest.step, campaign_name)
    config = resolve_backend(config)
    if current is None and config.backend == "transformers":
        return make_generator("transformers", version.model_folder())
    generator = current if current is not None else base_generator(config)
    generator.load_weights(version)
    return generator
