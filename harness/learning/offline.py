"""Training outside a campaign's own loop: `vpo train --follow` (a trainer beside `vpo worker`
processes, stepping on the groups they store) and `vpo train --db` (a model of its own, fine-tuned
on every group a campaign recorded)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.errors import UserError
from harness.config.settings import build
from harness.config.training import FOLLOW_EVERY, OfflineSettings
from harness.learning.rewards import references, to_group
from harness.learning.steps import (
    load_policy,
    seeded_step,
    start_trainer,
    train_next_version,
    untrained_note,
)
from harness.learning.trackers import open_reporter
from harness.records import CampaignRecord

if TYPE_CHECKING:
    from harness.store import Store
    from trainer.distributed import Parallel
    from trainer.train import StepMetrics


def follow(
    store: Store,
    campaign: CampaignRecord,
    overrides: Mapping[str, Any],
    *,
    steps: int | None = None,
    poll: float = 2.0,
    say: Callable[[str], None] = print,
    parallel: Parallel | None = None,
) -> int:
    """Train beside a campaign's workers (`vpo train --follow`): a step whenever `train_every`
    new groups wait, each version published for the workers, until the campaign's budget is
    recorded and used (or after `steps` steps); returns the steps taken (a skipped step
    publishes no version and is not counted).

    The settings are the campaign's under `overrides` (None: unset); `train_every` is the
    override's, else the campaign's, else FOLLOW_EVERY. The follower never samples. Under
    torchrun every process runs this: the main one watches the database and speaks."""
    from trainer.distributed import Parallel

    parallel = parallel or Parallel()
    if not parallel.main:
        say = _silent
    stored = build(campaign.config, where="the campaign's settings")
    every = overrides.get("train_every") or stored.training.train_every or FOLLOW_EVERY
    changes = {**overrides, "train_every": every, "backend": "transformers"}
    config = build(campaign.config, changes, where="the campaign's settings")
    on_server = stored.backend == "openai"
    if on_server and not config.training.lora:
        raise UserError(
            f"the workers of campaign {campaign.name!r} sample from a server, which takes new "
            "policy versions only as LoRA adapters: give --lora"
        )
    trainer = start_trainer(
        config, store, campaign.id, campaign.name, store.objectives(campaign.id), parallel
    )
    assert trainer is not None
    # Workers elsewhere read the recorded paths: make them absolute.
    trainer.folder = trainer.folder.resolve()
    # Workers of a campaign on a server load each LoRA version there as an adapter; only
    # in-process workers need it merged into whole weights (a full model's size per version).
    trainer.write_merged = not on_server
    say(
        f"following campaign {campaign.name!r} of {store.where}: a step every {every} new "
        f"groups, versions in {trainer.folder}"
    )
    # The campaign's trackers get the steps and the iterations the workers store, on its run:
    # one process reports for all (workers report to none: processes sharing one wandb or
    # trackio run would collide).
    reporter = (
        open_reporter(config, store, campaign.id, campaign.name, trainer.objectives, False)
        if parallel.main
        else None
    )
    if reporter is not None:
        say(f"reporting to {', '.join(config.report_to)} in {reporter.folder}")
    taken = skipped = 0
    try:
        while steps is None or taken < steps:
            if reporter is not None:
                reporter.iteration(None)  # what the workers stored since, in order
            metrics = train_next_version(trainer, None)
            if metrics is not None:
                taken += metrics.skipped is None
                skipped += metrics.skipped is not None
                say(metrics.line())
                if reporter is not None and metrics.skipped is None:
                    reporter.train_step(metrics)
                continue
            done = store.iterations_done(campaign.id) >= config.iterations
            # Every group is in; fewer than `every` are left unused.
            if parallel.broadcast(done and store.open_claims(campaign.id) == 0):
                break
            time.sleep(poll)
    finally:
        if reporter is not None:
            reporter.iteration(None)
            reporter.close()
    also = f" ({skipped} more skipped, see above)" if skipped else ""
    say(f"{taken} steps{also}; the last policy version is step {trainer.policy.step}")
    note = untrained_note(store, campaign.id, every) if parallel.main else None
    if note is not None:
        say(note)
    return taken


def _silent(_: str) -> None:
    pass


def train_offline(
    store: Store,
    campaign_id: int,
    candidates: int,
    settings: OfflineSettings,
    on_step: Callable[[StepMetrics], None] | None = None,
    parallel: Parallel | None = None,
    max_tokens: int = 0,
) -> list[StepMetrics]:
    """Fine-tune `settings.sampling.model` on the campaign's groups (all of them, in iteration
    order, cycling when `steps` asks for more) and write a model folder any backend loads.
    `max_tokens`: the campaign's, for the overlong punishment."""
    import json

    from trainer.distributed import Parallel

    training = settings.training
    if training.vector == "cases":
        objectives = store.cases(campaign_id)
        if not objectives:
            raise UserError(
                f"campaign {campaign_id} in {store.where} stored no case scores to train on"
                ' (vector = "cases"); use vector = "objectives"'
            )
    else:
        objectives = store.objectives(campaign_id)
    stored = store.training_groups(campaign_id)
    against = references(store, campaign_id, stored, objectives, training.reward_reference)
    groups = [
        g
        for g in (
            to_group(
                t,
                objectives,
                candidates,
                training,
                max_tokens=max_tokens,
                versions=False,
                reference=against.get(t.id),
            )
            for t in stored
        )
        if g is not None
    ]
    if not groups:
        raise UserError(f"campaign {campaign_id} in {store.where} has no groups to train on")
    per_step = max(1, settings.groups_per_step)
    batches = [groups[i : i + per_step] for i in range(0, len(groups), per_step)]
    steps = settings.steps if settings.steps is not None else len(batches)
    parallel = parallel or Parallel()
    rank, processes = parallel.rank, parallel.world
    policy, config = load_policy(training, settings.sampling, parallel=parallel)
    history = []
    for index in range(steps):
        # Each process takes its share of each batch; the wrapper sums the gradients.
        share = batches[index % len(batches)][rank::processes]
        seed = settings.sampling.seed * 1_000_003 + index
        metrics = seeded_step(policy, config, share, seed=seed)
        history.append(metrics)
        if on_step is not None and parallel.main:
            on_step(metrics)
    out = policy.save_merged(settings.out)  # every process gives its shards; the main writes
    if parallel.main:
        report = {
            "campaign_id": campaign_id,
            "database": store.where,
            "base_model": settings.sampling.model,
            "objectives": objectives,
            "groups": len(groups),
            "processes": processes,
            "sharding": parallel.sharding,
            "gradient_checkpointing": policy.checkpointing,
            "settings": settings_json(settings),
            "steps": [m.as_dict() for m in history],
        }
        (out / "vpo-train.json").write_text(json.dumps(report, indent=2) + "\n")
    parallel.barrier()
    return history


def settings_json(settings: Any) -> dict[str, Any]:
    """A settings dataclass for a report: its `training` and `sampling` spread among its own
    fields, paths as text."""
    flat = {k: v for k, v in asdict(settings).items() if k not in ("training", "sampling")}
    flat |= asdict(settings.training) | asdict(settings.sampling)
    return {k: str(v) if isinstance(v, Path) else v for k, v in flat.items()}
