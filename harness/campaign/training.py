"""The bridge to trainer/: one training setup for every way the policy is trained, with groups
from the store as tensors.

    policy, step = load_policy(settings)                  # TrainSettings -> what a step needs
    metrics = take_step(policy, step, groups, seed=1)

Inside a campaign, one step on the oldest unused groups after every K new ones:

    trainer = start_trainer(config, store, campaign_id, name, objectives)  # None: no training
    generator = trainer_generator(config, trainer)                  # sees the policy's weights
    ...
    metrics = maybe_train(trainer, generator)                       # between two generations

Beside workers, `follow` does the same as groups come in (`vpo train --follow`); offline,
`train_offline` learns from every group of a campaign (`vpo train --db`); on an answer
problem, harness/campaign/answers.py samples its own groups (`vpo train --problem`).

A step reads the groups from the database (token ids and every candidate's score vector),
trains, saves the policy version (weights or adapter, optimiser state, step counter) in
`policy_dir/step-NNNNNN`, then marks the groups and adds the `policy_version` row in one
transaction, and finally publishes the weights to the generator (`publish`). A kill
before that transaction leaves the groups unused and the version unrecorded: the resumed run
loads the last recorded version and trains the same step again, so each group trains once and
the versions stay contiguous. Then the versions older than the newest `keep_versions` that no
worker or server may still read are removed (harness/campaign/publish.py `prune_versions`).

A step that changed no weight (its gradient norm was not finite, or no completion token was
left within the training length) saves and publishes nothing: its groups are marked with the
reason and the step is an event (`Store.record_skipped_step`), and the next step takes its
number again. Groups train oldest first; fewer than K left at the end of a campaign wait for
the next step of an extended run (`untrained_note` says so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness import faults
from harness.campaign.publish import (
    check_trainable_endpoint,
    prune_versions,
    publish,
    safe_name,
    step_name,
)
from harness.config.errors import UserError
from harness.config.settings import DEFAULT_CONCURRENCY, CampaignConfig, build
from harness.config.training import FOLLOW_EVERY, OfflineSettings, TrainSettings
from harness.records import CampaignRecord, TrainingGroup

if TYPE_CHECKING:
    from harness.llm import Generator
    from harness.store import Store
    from trainer.distributed import Parallel
    from trainer.policy import Policy
    from trainer.train import Group, StepMetrics, TrainConfig


def load_policy(
    settings: TrainSettings,
    *,
    resume: str | None = None,
    device: str | None = None,
    parallel: Parallel | None = None,
) -> tuple[Policy, TrainConfig]:
    """The policy to train and the config of its step: the version saved in folder `resume`,
    else `settings.model` afresh (with a frozen reference only when the KL term is on). A
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
    torch.manual_seed(settings.seed)
    try:
        if resume is None:
            config = PolicyConfig(
                lr=settings.learning_rate,
                lora=settings.lora,
                lora_rank=settings.lora_rank,
                reference=settings.kl_beta > 0,
                gradient_checkpointing=settings.gradient_checkpointing,
                device=device,
            )
            policy = Policy.load(settings.model, config, parallel=parallel)
        else:
            policy = Policy.resume(resume, device=device, parallel=parallel)
    except (ModelError, ParallelError) as error:
        raise UserError(str(error)) from None
    step = TrainConfig(
        advantage=settings.advantage,
        num_weights=settings.dirichlet_weights,
        alpha=settings.dirichlet_alpha,
        loss=LossConfig(beta=settings.kl_beta),
        micro_batch=settings.micro_batch,
        temperature=settings.temperature,
        top_p=settings.top_p,
        old_logprobs=settings.old_logprobs,
        max_tokens=settings.sequence_tokens,
        skip_zero_advantage=settings.skip_zero_advantage,
        shared_prompt=settings.shared_prompt,
    )
    return policy, step


def take_step(
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
    every: int
    objectives: list[str]
    candidates: int
    seed: int
    policy: Policy
    config: TrainConfig
    folder: Path
    name: str  # the campaign's, for naming adapters on a server
    version_id: int | None = None
    # The first version whose weights differ from the starting ones (its step trained some
    # rollout): the rollouts it and later versions sample count as sampled by trained weights.
    changed_from: int | None = None
    duplicate_reward: str = "zero"  # see TrainSettings
    format_reward: str = "partial"  # see TrainSettings
    overlong_buffer: int = 0  # see TrainSettings
    max_tokens: int = 0  # the campaign's, where the overlong punishment ends
    # `vpo train --follow` only: also write each LoRA version merged, for workers that load
    # whole weights (not for workers on a server, which load the adapter).
    write_merged: bool = True
    keep_versions: int = 0  # the newest versions kept on disk (0: all); see CampaignConfig


def policy_folder(config: CampaignConfig, store: Store, campaign_name: str) -> Path:
    """`policy_dir`, or beside a SQLite file (`runs/x.db` -> `runs/x.policies/NAME`), or
    `./policies/NAME` for a server database."""
    if config.policy_dir:
        return Path(config.policy_dir).expanduser()
    url = store.engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        database = Path(url.database)
        return database.with_name(database.stem + ".policies") / safe_name(campaign_name)
    return Path("policies") / safe_name(campaign_name)


def start_trainer(
    config: CampaignConfig,
    store: Store,
    campaign_id: int,
    campaign_name: str,
    objectives: list[str],
    parallel: Parallel | None = None,
) -> CampaignTrainer | None:
    """The policy of the campaign: its last recorded version, else `config.model` afresh."""
    if not config.train_every:
        return None
    latest = store.latest_policy(campaign_id)
    changed = store.first_changed_policy(campaign_id)
    policy, step = load_policy(
        config.training(), resume=None if latest is None else latest.path, parallel=parallel
    )
    if latest is not None and policy.step != latest.step:
        raise UserError(
            f"policy version {latest.step} at {latest.path} holds step {policy.step}; "
            "the folder was changed after it was recorded"
        )
    return CampaignTrainer(
        store=store,
        campaign_id=campaign_id,
        every=config.train_every,
        objectives=objectives,
        candidates=config.candidates,
        seed=config.seed,
        policy=policy,
        config=step,
        folder=policy_folder(config, store, campaign_name),
        name=campaign_name,
        version_id=None if latest is None else latest.id,
        changed_from=None if changed is None else changed.id,
        duplicate_reward=config.duplicate_reward,
        format_reward=config.format_reward,
        overlong_buffer=config.overlong_buffer,
        max_tokens=config.max_tokens,
        keep_versions=config.keep_versions,
    )


def resolve_backend(config: CampaignConfig) -> CampaignConfig:
    """`config` with backend "auto" made concrete: vllm where it is installed, else
    transformers, saying so in one line on stderr (the stored campaign keeps "auto")."""
    import importlib.util

    if config.backend != "auto":
        return config
    if importlib.util.find_spec("vllm") is not None:
        return dataclasses.replace(config, backend="vllm")
    logging.getLogger(__name__).warning(
        "vpo: vLLM is not installed, so generation uses the slower transformers backend "
        "(make install installs vLLM)"
    )
    return dataclasses.replace(config, backend="transformers")


def check_backend(config: CampaignConfig) -> None:
    """What can be known about `config`'s backend without starting it: its library is
    installed, its API key is set. A campaign checks this before it touches its database
    row, so a bad backend leaves the campaign as it was. (Loading the model or reaching the
    server can still fail later; `run_campaign` then restores the campaign's status.)"""
    import importlib.util

    if config.backend == "openai":
        from harness.llm.openai_backend import auth_headers

        auth_headers(config.api_key_env)
    elif config.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        from harness.llm.vllm_backend import INSTALL_HINT

        raise UserError(INSTALL_HINT)


def base_generator(config: CampaignConfig) -> Generator:
    """The generator `config` names, sampling from the base model."""
    from harness.llm import make_generator

    config = resolve_backend(config)
    options: dict[str, Any] = {}
    if config.backend == "openai":
        options = {
            "base_url": config.base_url,
            "api_key_env": config.api_key_env,
            "retries": config.retries,
            # Connections to the server: as many as the campaign keeps requests in flight.
            "concurrency": config.concurrency or DEFAULT_CONCURRENCY["openai"],
        }
    elif config.backend == "vllm":
        # The engine's own seed draws every request that names none: without the campaign's,
        # two campaigns that differ only in `seed` sample the same completions.
        options = {"seed": config.seed}
    return make_generator(config.backend, config.model, **options)


def trainer_generator(config: CampaignConfig, trainer: CampaignTrainer) -> Generator:
    """A generator that samples from the trainer's current weights."""
    config = resolve_backend(config)
    if config.backend == "transformers":
        from harness.llm.transformers_backend import TransformersGenerator

        # The same model object: every optimiser step is visible to the next generation.
        return TransformersGenerator(
            config.model, hf_model=trainer.policy.model, tokenizer=trainer.policy.tokenizer
        )
    generator = base_generator(config)
    try:
        if config.backend == "openai":
            check_trainable_endpoint(generator)
        if trainer.version_id is not None:
            folder = trainer.folder / step_name(trainer.policy.step)
            publish(trainer.policy, generator, folder, campaign_name=trainer.name)
    except BaseException:
        generator.close()
        raise
    return generator


def maybe_train(trainer: CampaignTrainer, generator: Generator | None) -> StepMetrics | None:
    """One step on the oldest `every` unused groups when that many wait; None otherwise. A step
    that changed nothing (`metrics.skipped`) is recorded as skipped, with its groups, and
    neither saved nor published. On several processes (`vpo train --follow` under torchrun) the
    main one reads the groups and records the version; each trains on its share."""
    store = trainer.store
    parallel = trainer.policy.parallel
    stored = None
    if parallel.main and store.untrained_count(trainer.campaign_id) >= trainer.every:
        stored = store.untrained_groups(trainer.campaign_id, trainer.every)
    stored = parallel.broadcast(stored)
    if stored is None:
        return None
    groups = [
        to_group(
            g,
            trainer.objectives,
            trainer.candidates,
            trainer.duplicate_reward,
            format_reward=trainer.format_reward,
            overlong=(trainer.overlong_buffer, trainer.max_tokens),
        )
        for g in stored
    ]
    groups = [g for g in groups if g is not None][parallel.rank :: parallel.world]
    step = trainer.policy.step + 1
    # The Dirichlet draws of step s depend only on (seed, s): a resumed run redoes them exactly.
    seed = int.from_bytes(hashlib.sha256(f"{trainer.seed}:{step}".encode()).digest()[:8], "big")
    metrics = take_step(trainer.policy, trainer.config, groups, seed=seed >> 1)
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
        return metrics
    faults.point("train_step")  # the weights moved in memory, nothing saved
    folder = trainer.policy.save(trainer.folder / step_name(metrics.step))
    faults.point("train_saved")  # saved, not recorded
    if parallel.main:
        trainer.version_id = store.record_train_step(
            trainer.campaign_id,
            step=metrics.step,
            path=str(folder),
            metrics=metrics.as_dict(),
            group_ids=[g.id for g in stored],
        )
    trainer.version_id = parallel.broadcast(trainer.version_id)
    if metrics.trained and trainer.changed_from is None:
        trainer.changed_from = trainer.version_id
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
        keep = trainer.keep_versions
        prune_versions(trainer.folder, metrics.step, keep, shared=shared, sampled_from=in_flight)
    return metrics


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
    every = overrides.get("train_every") or stored.train_every or FOLLOW_EVERY
    changes = {**overrides, "train_every": every, "backend": "transformers"}
    config = build(campaign.config, changes, where="the campaign's settings")
    on_server = stored.backend == "openai"
    if on_server and not config.lora:
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
    taken = skipped = 0
    while steps is None or taken < steps:
        metrics = maybe_train(trainer, None)
        if metrics is not None:
            taken += metrics.skipped is None
            skipped += metrics.skipped is not None
            say(metrics.line())
            continue
        done = store.iterations_done(campaign.id) >= config.iterations
        # Every group is in; fewer than `every` are left unused.
        if parallel.broadcast(done and store.open_claims(campaign.id) == 0):
            break
        time.sleep(poll)
    also = f" ({skipped} more skipped, see above)" if skipped else ""
    say(f"{taken} steps{also}; the last policy version is step {trainer.policy.step}")
    note = untrained_note(store, campaign.id, every) if parallel.main else None
    if note is not None:
        say(note)
    return taken


def untrained_note(store: Store, campaign_id: int, every: int) -> str | None:
    """One line on the groups no step took, for the end of a campaign's training (fewer than
    `every` came in after its last step); None when none waits. They are the oldest unused
    groups, so the first step of an extended run takes them."""
    waiting = store.untrained_count(campaign_id)
    if not waiting:
        return None
    them = "them" if waiting > 1 else "it"
    return (
        f"{waiting} group{'s' if waiting > 1 else ''} not trained: fewer than train_every "
        f"({every}) came in after the last step; extending the campaign trains {them} first"
    )


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
    """Fine-tune `settings.training.model` on the campaign's groups (all of them, in iteration
    order, cycling when `steps` asks for more) and write a model folder any backend loads.
    `max_tokens`: the campaign's, for the overlong punishment."""
    import json

    from trainer.distributed import Parallel

    objectives = store.objectives(campaign_id)
    groups = [
        g
        for g in (
            to_group(
                t,
                objectives,
                candidates,
                settings.training.duplicate_reward,
                versions=False,
                format_reward=settings.training.format_reward,
                overlong=(settings.training.overlong_buffer, max_tokens),
            )
            for t in store.training_groups(campaign_id)
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
    training = settings.training
    policy, config = load_policy(training, parallel=parallel)
    history = []
    for index in range(steps):
        # Each process takes its share of each batch; the wrapper sums the gradients.
        share = batches[index % len(batches)][rank::processes]
        seed = training.seed * 1_000_003 + index
        metrics = take_step(policy, config, share, seed=seed)
        history.append(metrics)
        if on_step is not None and parallel.main:
            on_step(metrics)
    out = policy.save_merged(settings.out)  # every process gives its shards; the main writes
    if parallel.main:
        report = {
            "campaign_id": campaign_id,
            "database": store.where,
            "base_model": training.model,
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
    """A settings dataclass for a report: its `training` spread among its own fields, paths
    as text."""
    flat = {k: v for k, v in asdict(settings).items() if k != "training"}
    flat |= asdict(settings.training)
    return {k: str(v) if isinstance(v, Path) else v for k, v in flat.items()}


def overlong_penalty(length: int, buffer: int, max_tokens: int) -> float:
    """The share of its scores a completion of `length` tokens loses: 0 up to
    max_tokens - buffer, then linearly to 1 at max_tokens (0 when buffer is 0)."""
    if buffer <= 0 or max_tokens <= 0:
        return 0.0
    return min(max(length - (max_tokens - buffer), 0) / buffer, 1.0)


def to_group(
    stored: TrainingGroup,
    objectives: list[str],
    candidates: int,
    duplicate_reward: str = "zero",
    *,
    versions: bool = True,
    format_reward: str = "partial",
    overlong: tuple[int, int] = (0, 0),
) -> Group | None:
    """The (G, m, d) score matrix and mask of a stored group; slots without a program are
    masked out, so they never enter the max (a failed program's zeros are kept: per-objective
    partial credit is part of the vector reward). With `duplicate_reward` "zero", a lazy
    candidate (its parent or a stored program repeated) scores zeros; its stored evaluation is
    untouched. With `format_reward` "whole", a rollout whose m candidates did not all parse has
    every slot masked out: it scores nothing. `overlong` (buffer, max_tokens), a soft overlong
    punishment after DAPO's: a completion of L tokens past max_tokens - buffer loses the share
    (L - max_tokens + buffer) / buffer of every score, all of them at the limit (scores stay
    >= 0, so DAPO's additive -1 becomes a factor). `versions` off: the trained
    policy's steps are not the campaign's policy versions (offline training starts a model of
    its own), so the rollouts' versions are left out."""
    from trainer.train import Group, Rollout

    if not stored.rollouts:
        return None
    scores = np.zeros((len(stored.rollouts), candidates, len(objectives)))
    mask = np.zeros((len(stored.rollouts), candidates), dtype=bool)
    for i, rollout in enumerate(stored.rollouts):
        slots = rollout.candidates[:candidates]
        whole = not (format_reward == "whole" and (len(slots) < candidates or None in slots))
        for j, slot in enumerate(slots if whole else ()):
            if slot is None:
                continue
            mask[i, j] = True
            lazy = j < len(rollout.lazy) and rollout.lazy[j]
            if not (lazy and duplicate_reward == "zero"):
                scores[i, j] = [slot.get(name, 0.0) for name in objectives]
        scores[i] *= 1 - overlong_penalty(len(rollout.token_ids), *overlong)
    return Group(
        rollouts=[
            Rollout(
                r.prompt_token_ids, r.token_ids, r.logprobs, r.sampled_step if versions else None
            )
            for r in stored.rollouts
        ],
        scores=scores,
        mask=mask,
    )
