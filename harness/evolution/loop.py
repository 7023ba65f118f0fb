"""The campaign loop, top to bottom: select -> prompt -> generate -> parse -> evaluate -> store.

One iteration picks a parent (and drafts) on one island, builds one prompt, samples G rollouts
of `candidates` candidates each, classifies them (`iteration`), evaluates the new ones
in the sandbox and stores the group, its rollouts and programs in one transaction. Iterations
run `concurrency` at a time (`harness.evolution.generation`: one batched generate call in process,
concurrent requests to a server), and a batch generates while the one before it is evaluated
and stored by a background thread, so the generator is not idle while candidates run.

The database is the checkpoint: the iterations done are the recorded groups (a skipped
iteration is a group too, with its reason), the random stream of iteration k depends only on
(seed, k), and a killed run loses at most the iterations in flight; the resumed run does the
numbers below the budget that have no group.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from harness.config.errors import UserError
from harness.config.settings import CampaignSettings
from harness.evaluation.calls import Limits
from harness.evaluation.evaluate import evaluate
from harness.evaluation.sandbox import Sandbox
from harness.evolution.budgets import Spend, counts_spend, stored_spend
from harness.evolution.generation import FailureStreak, describe, loop_settings, sample_batch
from harness.evolution.iteration import (
    SampledIteration,
    new_program,
)
from harness.evolution.novelty import Novelty
from harness.evolution.population import Population
from harness.evolution.recording import evaluate_and_store
from harness.evolution.run import CampaignRun, refresh_population
from harness.learning.steps import (
    checked_cases,
    start_trainer,
    stored_cases,
    train_next_version,
    trainer_generator,
    untrained_note,
)
from harness.learning.trackers import check_installed, open_reporter
from harness.llm import Generator
from harness.llm.choice import base_generator, check_backend
from harness.observation.ledger import Ledger, LoopClock, batch_payload
from harness.observation.progress import Progress
from harness.observation.time_split import EVENT
from harness.records import CampaignRecord, ProgramRecord
from harness.store import Store
from problems.api import Compact, Problem

log = logging.getLogger(__name__)


def open_campaign(store: Store, config: CampaignSettings, problem: Problem) -> int:
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
    store: Store,
    campaign_id: int,
    problem: Problem,
    sandbox: Sandbox,
    limits: Limits,
    islands: int = 1,
) -> ProgramRecord:
    """The seed program, evaluated and stored once per campaign (never again on resume), with
    a copy on each of the other `islands`."""
    seeds = store.programs(campaign_id, origin="seed", limit=1)
    if seeds:
        return seeds[0]
    evaluation = evaluate(problem, problem.seed_program, sandbox, limits)
    seed = new_program(problem.seed_program, evaluation)
    program_id = store.add_program(campaign_id, seed, the_seed=True, islands=islands)
    record = store.program(program_id)
    assert record is not None
    return record


def run_campaign(
    config: CampaignSettings,
    store: Store,
    problem: Problem,
    *,
    generator: Generator | None = None,
    on_progress: Callable[[int, Progress], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> int:
    """Run (or resume) the campaign up to `config.iterations` iterations; return its id.
    `say` hears one line on how it generates (backend, model, iterations in flight, prompt
    budget) once the generator is up.

    A run that fails or is interrupted before it records an iteration of an existing campaign
    leaves the campaign's status as it was: a finished campaign whose extension could not
    start its model is still finished, not failed."""
    before = store.get_campaign(config.name or problem.name)
    done_before = store.iterations_done(before.id) if before is not None else 0
    counted = before is not None and counts_spend(config)
    spend = stored_spend(store, before.id) if counted else Spend()
    stop = spend.stop_reason(config)
    if stop is not None and before is not None and done_before < config.iterations:
        if say:
            say(stop)  # nothing to do until the budget is raised: no model to load
        return before.id
    check_installed(config.report_to)
    if generator is None and done_before < config.iterations:
        check_backend(config)  # before the campaign is touched
    trained_on = checked_cases(config, problem)  # before the campaign is touched
    campaign_id = open_campaign(store, config, problem)
    owns_generator = generator is None
    run: CampaignRun | None = None
    stopped: str | None = None  # the budget that ended the run before its iterations
    try:
        with Sandbox(workers=config.sandbox_workers) as sandbox:
            run = prepare(config, store, problem, campaign_id, sandbox)
            run.spend = spend if counts_spend(config) else None
            name = config.name or problem.name
            run.reporter = open_reporter(config, store, campaign_id, name, run.objectives)
            if run.reporter is not None and say:
                say(f"reporting to {', '.join(config.report_to)} in {run.reporter.folder}")
            if store.missing_iterations(campaign_id, config.iterations):
                run.trainer = start_trainer(config, store, campaign_id, name, trained_on)
                if generator is None and run.trainer is not None:
                    generator = trainer_generator(config, run.trainer)
                elif generator is None:
                    generator = base_generator(config)
                stopped = evolve(run, generator, on_progress, say=say)
            elif (
                config.training.train_every
                and config.training.final_step
                and store.untrained_count(campaign_id) >= config.training.train_every
            ):
                # Killed after recording its last iteration, before training on the last
                # groups: train on them now (no generator to start, nothing left to sample).
                run.trainer = start_trainer(config, store, campaign_id, name, trained_on)
                if train_waiting_groups(run, None) and on_progress:
                    on_progress(config.iterations, run.progress)
            if config.training.train_every:
                # The groups after the last step wait for an extended run (a step is worth its
                # cost only when rollouts are sampled from it): say how many.
                note = untrained_note(store, campaign_id, config.training.train_every)
                if note is not None:
                    (say or log.info)(note)
        store.set_campaign_status(campaign_id, "finished", stopped)
    except KeyboardInterrupt:
        _settle_status(store, campaign_id, "stopped", before, done_before)
        raise
    except BaseException:
        _settle_status(store, campaign_id, "failed", before, done_before)
        raise
    finally:
        if run is not None and run.reporter is not None:
            run.reporter.close()
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
    config: CampaignSettings, store: Store, problem: Problem, campaign_id: int, sandbox: Sandbox
) -> CampaignRun:
    """The seed stored once, and the population and code hashes loaded from the database."""
    limits = Limits(
        wall_seconds=config.time_limit or float(problem.time_limit),
        memory_mb=int(problem.memory_mb),
    )
    compact = compact_form(config, problem)
    islands = config.islands if config.strategy == "evolve" else 1
    seed = ensure_seed(store, campaign_id, problem, sandbox, limits, islands)
    objectives = [o.name for o in problem.objectives]
    run = CampaignRun(
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
        Novelty(problem.entry, problem.family, config.near_duplicate),
        compact=compact,
    )
    if config.parent_selection == "lexicase":
        run.cases = Population(stored_cases(problem, 'parent_selection = "lexicase"'))
    refresh_population(run)
    return run


def compact_form(config: CampaignSettings, problem: Problem) -> Compact | None:
    """The problem's compact form when the config asks for it (None for whole programs); a
    problem without one is a one-line error."""
    if config.form != "compact":
        return None
    if problem.compact is None:
        raise UserError(
            f"problem {problem.name} has no compact form: its candidates are whole programs"
            ' (form = "program")'
        )
    return problem.compact


def evolve(
    run: CampaignRun,
    generator: Generator,
    on_progress: Callable[[int, Progress], None] | None,
    *,
    overlap: bool = True,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """The iterations below the budget not recorded yet, `concurrency` at a time: a batch
    generates while the one before it is evaluated and stored (each iteration in its own
    transaction), and training steps run between batches. With `overlap` off a batch is
    stored before the next generates (a sequential harness, for benchmarks/generator_busy.py).

    A campaign that trains and samples after each step (`sample_after_step`, the default for
    in-process backends) stores a batch and takes the steps its groups allow before the next
    batch generates, so every batch is sampled by the newest version; otherwise the next batch
    generates while the one before is evaluated, and is sampled one step behind. Returns the
    line of the budget that stopped it before its iterations, else None.
    """
    config = run.config
    settings = loop_settings(config, generator)
    after_step = run.trainer is not None and sample_after_step(config, generator)
    if say:
        line = describe(generator, settings)
        if run.trainer is not None:
            order = "after the steps on the batch before" if after_step else "one step behind"
            line = f"{line}; each batch sampled {order}"
        say(line)
    todo = run.store.missing_iterations(run.campaign_id, config.iterations)
    streak = FailureStreak(config.max_failures)
    width = settings.concurrency
    # Tokens generated so far, the batches of this run counted as they are sampled.
    spent = run.store.summary(run.campaign_id).tokens if config.token_budget else 0
    stopped: str | None = None
    # Where each batch's time goes (harness/observation/time_split.py): the loop's stages on this
    # thread, the evaluation thread's beside them, one `stages` event per batch.
    clock = LoopClock()
    with ThreadPoolExecutor(1, thread_name_prefix="evaluate") as evaluator:
        clock.watch(evaluator.submit(threading.get_ident).result())
        pending: Future[None] | None = None
        if after_step and todo:
            # Groups a run before this one left untrained (`final_step` off, or a kill before
            # its step): the first batch is sampled after the steps on them, as every other is.
            train_waiting_groups(run, generator, clock.ledger)
        for start in range(0, len(todo), width):
            stopped = budget_stop(run, spent)
            if stopped is not None:
                if say:
                    say(stopped)  # the batch in flight is stored below
                break
            if after_step and pending is not None:  # the steps this batch allows, before the next
                with clock.stage("waiting"):
                    pending.result()
                pending = None
                train_waiting_groups(run, generator, clock.ledger)
            version = run.trainer.version if run.trainer else None
            batch = sample_batch(
                run, generator, todo[start : start + width], settings, version, clock.ledger
            )
            tokens = sum(c.num_tokens for sampled in batch for c in sampled.completions)
            spent += tokens
            if run.spend is not None:
                run.spend.add(batch)  # counted once sampled: it is stored below
            if pending is not None:
                with clock.stage("waiting"):
                    pending.result()  # the batch before is stored before this one
                train_waiting_groups(run, generator, clock.ledger)
            streak.update(batch)
            wall, loop = clock.period()
            timing = batch_payload([s.iteration for s in batch], tokens, wall, loop, {})
            run.progress.time.add(timing)  # its evaluation's stages once done
            pending = evaluator.submit(_store_and_report, run, batch, on_progress, timing)
            if streak.reached:
                pending.result()  # the skipped iterations are recorded, with their reasons
                raise streak.error()
            if not overlap:
                with clock.stage("waiting"):
                    pending.result()
        if pending is not None:
            with clock.stage("waiting"):
                pending.result()
            trained = run.config.training.final_step and train_waiting_groups(
                run, generator, clock.ledger
            )
            wall, loop = clock.period()  # the last wait and steps: a period of no batch
            last = batch_payload([], 0, wall, loop, {})
            run.store.record_event(run.campaign_id, EVENT, last)
            run.progress.time.add(last)
            if trained and on_progress:
                # The last step too, at the last iteration stored (a budget may stop early).
                done = run.store.iterations_done(run.campaign_id)
                on_progress(done, run.progress)
    return stopped


def budget_stop(run: CampaignRun, spent: int) -> str | None:
    """Why no new batch may start: the generated tokens reached `token_budget` (`spent`, this
    run's batches counted as sampled), or a budget on what the campaign paid; else None."""
    config = run.config
    if config.token_budget and spent >= config.token_budget:
        return f"token budget spent: {spent} of {config.token_budget} tokens generated"
    return run.spend.stop_reason(config) if run.spend else None


def sample_after_step(config: CampaignSettings, generator: Generator) -> bool:
    """Whether each batch waits for the steps on the one before it. `auto`: yes where the
    engine shares the trainer's process (its cores, or its GPU), which idles while a step runs
    either way, so waiting costs only the overlap of one batch's evaluation with the next
    one's generation; no for a server."""
    if config.training.sample_after_step == "auto":
        return generator.in_process
    return config.training.sample_after_step == "on"


def _store_and_report(
    run: CampaignRun,
    batch: Sequence[SampledIteration],
    on_progress: Callable[[int, Progress], None] | None,
    timing: dict[str, Any] | None = None,
) -> None:
    """The evaluation thread's job: evaluate a batch and store its iterations, reporting each
    at once (not when the next generation ends, which on a CPU is minutes later); then the
    batch's `timing` (its loop stages, `batch_payload`) with this thread's stages added."""
    ledger = Ledger()
    for sampled in evaluate_and_store(run, batch, ledger=ledger):
        with ledger.stage("reporting"):
            if run.reporter is not None:
                run.reporter.iteration(run.progress)
            if on_progress:
                on_progress(sampled.iteration + 1, run.progress)
    if timing is not None:  # the batch's stages, for `vpo status` and the progress line
        beside = ledger.take()
        run.store.record_event(run.campaign_id, EVENT, {**timing, "beside": beside})
        run.progress.time.add({"beside": beside})


def train_waiting_groups(
    run: CampaignRun, generator: Generator | None, ledger: Ledger | None = None
) -> bool:
    """Training steps while enough unused groups wait (the generator is idle meanwhile: it may
    share the weights being trained): one in the steady state, more when a resumed run finds
    the groups a killed one recorded but did not train on; True when any ran. A step that
    changed no weight is said once, as a warning with its reason, and then only counted on
    the progress line; the campaign goes on."""
    if run.trainer is None:
        return False
    ran = False
    while (metrics := train_next_version(run.trainer, generator, ledger)) is not None:
        ran = True
        if metrics.skipped is not None:
            run.progress.steps_skipped += 1
            log.warning("vpo: training %s", metrics.line())
            continue
        run.progress.train = metrics.line()
        if run.reporter is not None:
            run.reporter.train_step(metrics)
    return ran
