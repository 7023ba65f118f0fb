"""The bridge to trainer/: one training setup for every way the policy is trained, with groups
from the store as tensors.

    policy, train_config = load_policy(settings, sampling)  # -> what a step needs
    metrics = seeded_step(policy, train_config, groups, seed=1)

Inside a campaign, one step on the oldest unused groups after every K new ones:

    trainer = start_trainer(config, store, campaign_id, name, objectives)  # None: no training
    generator = trainer_generator(config, trainer)                  # sees the policy's weights
    ...
    metrics = train_next_version(trainer, generator)                       # between two generations

Beside workers, `follow` does the same as groups come in (`vpo train --follow`); offline,
`train_offline` learns from every group of a campaign (`vpo train --db`); on an answer
problem, harness/learning/answers.py samples its own groups (`vpo train --problem`).

A step reads the groups from the database (token ids and every candidate's score vector),
trains, saves the policy version (weights or adapter, optimiser state, step counter) in
`policy_dir/step-NNNNNN`, then marks the groups and adds the `policy_version` row in one
transaction, and finally publishes the weights to the generator (`publish`). A kill
before that transaction leaves the groups unused and the version unrecorded: the resumed run
loads the last recorded version and trains the same step again, so each group trains once and
the versions stay contiguous. Then the versions older than the newest `keep_versions` that no
worker or server may still read are removed (harness/learning/publish.py `prune_versions`).

A step that changed no weight (its gradient norm was not finite, or no completion token was
left within the training length) saves and publishes nothing: its groups are marked with the
reason and the step is an event (`Store.record_skipped_step`), and the next step takes its
number again. Groups train oldest first; fewer than K left at the end of a campaign wait for
the next step of an extended run (`untrained_note` says so).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness import faults
from harness.config import allocator
from harness.config.errors import UserError
from harness.config.settings import CampaignSettings
from harness.config.training import Sampling, TrainSettings
from harness.learning.publish import (
    check_trainable_endpoint,
    prune_versions,
    publish,
    safe_name,
    step_name,
)
from harness.learning.rewards import references, to_group
from harness.llm.choice import base_generator, resolve_backend
from harness.observation.ledger import Ledger, timed
from harness.records import CASE_PREFIX

if TYPE_CHECKING:
    from harness.llm import Generator
    from harness.records import PolicyVersion, TrainingGroup
    from harness.store import Store
    from problems.api import Problem
    from trainer.distributed import Parallel
    from trainer.policy import Policy
    from trainer.train import Group, StepMetrics, TrainConfig


def load_policy(
    settings: TrainSettings,
    sampling: Sampling,
    *,
    resume: str | None = None,
    device: str | None = None,
    parallel: Parallel | None = None,
) -> tuple[Policy, TrainConfig]:
    """The policy to train and the config of its step: the version saved in folder `resume`,
    else `sampling.model` afresh (with a frozen reference only when the KL term is on). A
    model that cannot be loaded is a UserError."""
    import torch

    from trainer.distributed import Parallel, ParallelError
    from trainer.loss import LossConfig
    from trainer.models import ModelError
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import TrainConfig

    parallel = parallel or Parallel()
    if parallel.active:
        device = parallel.device
    # A LoRA adapter's initial A matrices are random: the same on every process (FSDP shards
    # each process's own copy) and in every run of the same seed.
    torch.manual_seed(sampling.seed)
    try:
        if resume is None:
            config = PolicyConfig(
                lr=settings.learning_rate,
                lora=settings.lora,
                lora_rank=settings.lora_rank,
                lora_layers=settings.lora_layers,
                reference=settings.kl_beta > 0,
                gradient_checkpointing=settings.gradient_checkpointing,
                device=device,
            )
            policy = Policy.load(sampling.model, config, parallel=parallel)
        else:
            policy = Policy.resume(resume, device=device, parallel=parallel)
    except (ModelError, ParallelError) as error:
        raise UserError(str(error)) from None
    step = TrainConfig(
        advantage=settings.advantage,
        kl_budget=settings.kl_budget,
        signed_gain=settings.gain == "signed",
        num_weights=settings.dirichlet_weights,
        alpha=settings.dirichlet_alpha,
        loss=LossConfig(beta=settings.kl_beta),
        micro_batch=settings.micro_batch,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        old_logprobs=settings.old_logprobs,
        max_tokens=sampling.sequence_tokens,
        skip_zero_advantage=settings.skip_zero_advantage,
        shared_prompt=settings.shared_prompt,
    )
    return policy, step


def seeded_step(
    policy: Policy,
    config: TrainConfig,
    groups: Sequence[Group],
    *,
    seed: int,
) -> StepMetrics:
    """One optimisation step on `groups`, its random draws (the Dirichlet weights) seeded by
    `seed`; groups the step cannot take are a UserError naming the step."""
    import torch

    from trainer.train import train_step

    number = policy.step + 1
    rng = torch.Generator().manual_seed(seed)
    try:
        return train_step(policy, groups, config, generator=rng)
    except ValueError as error:
        raise UserError(f"training step {number}: {error}") from None


@dataclass
class CampaignTrainer:
    """The policy a campaign trains: where its groups come from and its versions go."""

    store: Store
    campaign_id: int
    settings: TrainSettings  # its train_every, reward rules and versions kept among them
    objectives: list[str]
    candidates: int
    max_tokens: int  # the campaign's, where the overlong punishment ends
    seed: int
    policy: Policy
    config: TrainConfig
    folder: Path
    name: str  # the campaign's, for naming adapters on a server
    version: PolicyVersion | None = None  # the newest recorded; None: the starting weights
    # The first version whose weights differ from the starting ones (its step trained some
    # rollout): the rollouts it and later versions sample count as sampled by trained weights.
    changed_from: PolicyVersion | None = None
    # `vpo train --follow` only: also write each LoRA version merged, for workers that load
    # whole weights (not for workers on a server, which load the adapter).
    write_merged: bool = True


def stored_cases(problem: Problem, setting: str) -> list[str]:
    """The names `problem`'s cases are stored under (harness.records.CASE_PREFIX); a one-line
    UserError naming `setting` when it has none."""
    if not problem.cases:
        raise UserError(f"{setting}: {problem.name} has no cases (problems.api.Problem.cases)")
    return [CASE_PREFIX + case.name for case in problem.cases]


def trained_vector(settings: TrainSettings, problem: Problem) -> list[str]:
    """The score names a step trains on (`[training] vector`): the problem's objectives, or its
    cases as stored (harness.records.CASE_PREFIX); UserError for cases a problem lacks."""
    if settings.vector == "objectives" or not settings.train_every:
        return [o.name for o in problem.objectives]
    return stored_cases(problem, '[training] vector = "cases"')


def checked_cases(config: CampaignSettings, problem: Problem) -> list[str]:
    """The vector the campaign trains on (`trained_vector`), once the problem is found to have
    the cases its settings use (lexicase selection too): one-line UserError otherwise."""
    if config.parent_selection == "lexicase":
        stored_cases(problem, 'parent_selection = "lexicase"')
    return trained_vector(config.training, problem)


def policy_folder(config: CampaignSettings, store: Store, campaign_name: str) -> Path:
    """`policy_dir`, or beside a SQLite file (`runs/x.db` -> `runs/x.policies/NAME`), or
    `./policies/NAME` for a server database."""
    if config.training.policy_dir:
        return Path(config.training.policy_dir).expanduser()
    url = store.engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        database = Path(url.database)
        return database.with_name(database.stem + ".policies") / safe_name(campaign_name)
    return Path("policies") / safe_name(campaign_name)


def start_trainer(
    config: CampaignSettings,
    store: Store,
    campaign_id: int,
    campaign_name: str,
    objectives: list[str],
    parallel: Parallel | None = None,
) -> CampaignTrainer | None:
    """The policy of the campaign: its last recorded version, else `config.model` afresh."""
    if not config.training.train_every:
        return None
    latest = store.latest_policy(campaign_id)
    changed = store.first_changed_policy(campaign_id)
    policy, train_config = load_policy(
        config.training,
        config.sampling(),
        resume=None if latest is None else latest.path,
        parallel=parallel,
    )
    if latest is not None and policy.step != latest.step:
        raise UserError(
            f"policy version {latest.step} at {latest.path} holds step {policy.step}; "
            "the folder was changed after it was recorded"
        )
    return CampaignTrainer(
        store=store,
        campaign_id=campaign_id,
        settings=config.training,
        objectives=objectives,
        candidates=config.candidates,
        max_tokens=config.max_tokens,
        seed=config.seed,
        policy=policy,
        config=train_config,
        folder=policy_folder(config, store, campaign_name),
        name=campaign_name,
        version=latest,
        changed_from=changed,
    )


def trainer_generator(config: CampaignSettings, trainer: CampaignTrainer) -> Generator:
    """A generator that samples from the trainer's current weights."""
    config = resolve_backend(config)
    if config.backend == "transformers":
        from harness.llm.transformers_backend import TransformersGenerator

        # The same model object: every optimiser step is visible to the next generation.
        return TransformersGenerator(
            config.model,
            hf_model=trainer.policy.model,
            tokenizer=trainer.policy.tokenizer,
            context=trainer.policy.generation_context,
        )
    generator = base_generator(config)
    try:
        if config.backend == "openai":
            check_trainable_endpoint(generator)
        if trainer.version is not None:
            folder = trainer.folder / step_name(trainer.policy.step)
            publish(trainer.policy, generator, folder, campaign_name=trainer.name)
    except BaseException:
        generator.close()
        raise
    return generator


def train_next_version(
    trainer: CampaignTrainer, generator: Generator | None, ledger: Ledger | None = None
) -> StepMetrics | None:
    """One step on the oldest `every` unused groups when that many wait; None otherwise. A step
    that changed nothing (`metrics.skipped`) is recorded as skipped, with its groups, and
    neither saved nor published. On several processes (`vpo train --follow` under torchrun) the
    main one reads the groups and records the version; each trains on its share. `ledger`
    times the step (reading the groups, the step, saving and recording it: `training`) and
    the publishing (the weights into the engine, old versions pruned)."""
    with timed(ledger, "training"):
        found = _step(trainer)
    if found is None:
        return None
    metrics, folder = found
    if folder is None:
        return metrics
    with timed(ledger, "publishing"):
        _publish_version(trainer, generator, metrics, folder)
    return metrics


def _step(trainer: CampaignTrainer) -> tuple[StepMetrics, Path | None] | None:
    """The step on the oldest waiting groups, saved and recorded, with its folder (None for a
    step that changed nothing); None when too few groups wait."""
    store = trainer.store
    parallel = trainer.policy.parallel
    stored, against = None, {}
    if parallel.main:
        stored = _waiting_groups(trainer)
        if stored is not None:
            against = references(
                store,
                trainer.campaign_id,
                stored,
                trainer.objectives,
                trainer.settings.reward_reference,
            )
    stored, against = parallel.broadcast((stored, against))
    if stored is None:
        return None
    allocator.release()  # what generating freed, before the step's peak
    groups = [
        to_group(
            g,
            trainer.objectives,
            trainer.candidates,
            trainer.settings,
            max_tokens=trainer.max_tokens,
            reference=against.get(g.id),
        )
        for g in stored
    ]
    groups = [g for g in groups if g is not None][parallel.rank :: parallel.world]
    step = trainer.policy.step + 1
    # The Dirichlet draws of step s depend only on (seed, s): a resumed run redoes them exactly.
    seed = int.from_bytes(hashlib.sha256(f"{trainer.seed}:{step}".encode()).digest()[:8], "big")
    metrics = seeded_step(trainer.policy, trainer.config, groups, seed=seed >> 1)
    allocator.release()  # and what the step freed
    if metrics.skipped is not None:
        # Every process skipped (the norm and the token count are the whole step's).
        if parallel.main:
            store.record_skipped_step(
                trainer.campaign_id,
                step=metrics.step,
                reason=metrics.skipped,
                metrics=metrics.as_dict(),
                group_ids=[g.id for g in stored],
            )
        parallel.barrier()
        return metrics, None
    faults.point("train_step")  # the weights moved in memory, nothing saved
    folder = trainer.policy.save(trainer.folder / step_name(metrics.step))
    faults.point("train_saved")  # saved, not recorded
    if parallel.main:
        trainer.version = store.record_train_step(
            trainer.campaign_id,
            step=metrics.step,
            path=str(folder),
            metrics=metrics.as_dict(),
            group_ids=[g.id for g in stored],
        )
    trainer.version = parallel.broadcast(trainer.version)
    if metrics.trained and trainer.changed_from is None:
        trainer.changed_from = trainer.version
    return metrics, folder


def _waiting_groups(trainer: CampaignTrainer) -> list[TrainingGroup] | None:
    """The groups the next step takes: the oldest `every` waiting ones; before the first
    version, with `warmup_samples`, nothing until that many rollouts wait, then all of them
    (the first update learns from every sample of the warm-up). None: not yet."""
    store, campaign = trainer.store, trainer.campaign_id
    warmup, every = trainer.settings.warmup_samples, trainer.settings.train_every
    if warmup and trainer.version is None:
        if store.untrained_rollouts(campaign) < warmup:
            return None
        return store.untrained_groups(campaign, None) or None
    if store.untrained_count(campaign) < every:
        return None
    return store.untrained_groups(campaign, every)


def _publish_version(
    trainer: CampaignTrainer, generator: Generator | None, metrics: StepMetrics, folder: Path
) -> None:
    """A recorded version into the engine (when it changed weights the engine holds), and
    the versions no reader may need any longer pruned."""
    parallel = trainer.policy.parallel
    store = trainer.store
    if generator is None or metrics.trained or not generator.in_process:
        # A step that trained nothing left the weights as an in-process engine holds them: no
        # reload. (A server gets each version under its name, which workers look up.)
        publish(
            trainer.policy,
            generator,
            folder,
            campaign_name=trainer.name,
            write_merged=trainer.write_merged,
        )
    if parallel.main:  # versions a worker or server reads stay while they may be in use
        shared = generator is None or not generator.in_process
        in_flight = store.version_at_oldest_claim(trainer.campaign_id)  # a worker's, if any
        keep = trainer.settings.keep_versions
        prune_versions(trainer.folder, metrics.step, keep, shared=shared, sampled_from=in_flight)


def untrained_note(store: Store, campaign_id: int, every: int) -> str | None:
    """One line on the groups no step took, for the end of a campaign's training (fewer than
    `every` came in after its last step); None when none waits. They are the oldest unused
    groups, so the first step of an extended run takes them."""
    waiting = store.untrained_count(campaign_id)
    if not waiting:
        return None
    them = "them" if waiting > 1 else "it"
    why = (
        "the campaign takes no final step (final_step off)"
        if waiting >= every
        else f"fewer than train_every ({every}) came in after the last step"
    )
    return (
        f"{waiting} group{'s' if waiting > 1 else ''} not trained: {why}; extending the "
        f"campaign trains {them} first"
    )
