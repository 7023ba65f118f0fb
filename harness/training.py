"""Training inside a campaign: after every K new groups, one step on the newest unused groups.

    trainer = start_trainer(config, store, campaign_id, objectives)   # None when train_every = 0
    generator = trainer_generator(config, trainer)                    # sees the policy's weights
    ...
    metrics = maybe_train(trainer, generator)                         # between two generations

A step reads the groups from the database (token ids and every candidate's score vector),
trains, saves the policy version (weights or adapter, optimiser state, step counter) in
`policy_dir/step-NNNNNN`, then marks the groups and adds the `policy_version` row in one
transaction, and finally publishes the weights to the generator. A kill before that
transaction leaves the groups unused and the version unrecorded: the resumed run loads the last
recorded version and trains the same step again, so each group trains once and the versions
stay contiguous.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness import faults
from harness.config import CampaignConfig
from harness.errors import UserError
from harness.records import TrainingGroup
from harness.store import Store

if TYPE_CHECKING:
    from harness.llm import Generator
    from trainer.policy import Policy
    from trainer.train import Group, StepMetrics, TrainConfig


@dataclass
class Trainer:
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
    # `vpo train --follow` only: also write each LoRA version merged, for workers that load
    # whole weights (not for workers on a server, which load the adapter).
    write_merged: bool = True


def policy_folder(config: CampaignConfig, store: Store, campaign_name: str) -> Path:
    """`policy_dir`, or beside a SQLite file (`runs/x.db` -> `runs/x.policies/NAME`), or
    `./policies/NAME` for a server database."""
    if config.policy_dir:
        return Path(config.policy_dir).expanduser()
    url = store.engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        database = Path(url.database)
        return database.with_name(database.stem + ".policies") / _safe(campaign_name)
    return Path("policies") / _safe(campaign_name)


def start_trainer(
    config: CampaignConfig,
    store: Store,
    campaign_id: int,
    campaign_name: str,
    objectives: list[str],
) -> Trainer | None:
    """The policy of the campaign: its last recorded version, else `config.model` afresh."""
    if not config.train_every:
        return None
    from trainer.loss import LossConfig
    from trainer.models import ModelError
    from trainer.policy import Policy
    from trainer.train import TrainConfig

    latest = store.latest_policy(campaign_id)
    try:
        if latest is None:
            policy = fresh_policy(
                config.model, config.learning_rate, config.lora, config.lora_rank, config.kl_beta
            )
        else:
            policy = Policy.resume(latest.path)
            if policy.step != latest.step:
                raise UserError(
                    f"policy version {latest.step} at {latest.path} holds step {policy.step}; "
                    "the folder was changed after it was recorded"
                )
    except ModelError as error:
        raise UserError(str(error)) from None
    train = TrainConfig(
        advantage=config.advantage,
        num_weights=config.dirichlet_weights,
        alpha=config.dirichlet_alpha,
        loss=LossConfig(beta=config.kl_beta),
        micro_batch=config.micro_batch,
        temperature=max(config.temperature, 1e-3),
        max_tokens=config.max_tokens + 8192,
    )
    return Trainer(
        store=store,
        campaign_id=campaign_id,
        every=config.train_every,
        objectives=objectives,
        candidates=config.candidates,
        seed=config.seed,
        policy=policy,
        config=train,
        folder=policy_folder(config, store, campaign_name),
        name=campaign_name,
        version_id=None if latest is None else latest.id,
    )


def fresh_policy(
    model: str, lr: float, lora: bool, lora_rank: int, kl_beta: float, device: str | None = None
) -> Policy:
    """The starting policy: `model`'s weights, a reference only when the KL term is on; a model
    that cannot be loaded is a UserError."""
    from trainer.models import ModelError
    from trainer.policy import Policy, PolicyConfig

    config = PolicyConfig(
        lr=lr, lora=lora, lora_rank=lora_rank, reference=kl_beta > 0, device=device
    )
    try:
        return Policy.load(model, config)
    except ModelError as error:
        raise UserError(str(error)) from None


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

    options: dict[str, Any] = {}
    if config.backend == "openai":
        options = {"base_url": config.base_url, "api_key_env": config.api_key_env}
    return make_generator(config.backend, config.model, **options)


def trainer_generator(config: CampaignConfig, trainer: Trainer) -> Generator:
    """A generator that samples from the trainer's current weights."""
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
            folder = trainer.folder / _step_name(trainer.policy.step)
            publish(trainer.policy, generator, folder, campaign_name=trainer.name)
    except BaseException:
        generator.close()
        raise
    return generator


def check_trainable_endpoint(generator: Any) -> None:
    """Training from an endpoint needs the sampled token ids (only vLLM returns them) and a
    server that loads each new version as a LoRA adapter."""
    if generator.server != "vllm":
        raise UserError(
            f"training needs the sampled token ids, which only a vLLM server returns; "
            f"{generator.base_url} is served by {generator.server or 'an unknown server'}"
        )
    generator.check_adapters()


def maybe_train(trainer: Trainer, generator: Generator | None) -> StepMetrics | None:
    """One step when `every` unused groups are waiting; None otherwise."""
    import torch

    from trainer.train import train_step

    store = trainer.store
    if store.untrained_count(trainer.campaign_id) < trainer.every:
        return None
    stored = store.untrained_groups(trainer.campaign_id, trainer.every)
    groups = [to_group(g, trainer.objectives, trainer.candidates) for g in stored]
    groups = [g for g in groups if g is not None]
    step = trainer.policy.step + 1
    # The Dirichlet draws of step s depend only on (seed, s): a resumed run redoes them exactly.
    seed = int.from_bytes(hashlib.sha256(f"{trainer.seed}:{step}".encode()).digest()[:8], "big")
    try:
        metrics = train_step(
            trainer.policy,
            groups,
            trainer.config,
            generator=torch.Generator().manual_seed(seed >> 1),
        )
    except ValueError as error:
        raise UserError(f"training step {step}: {error}") from None
    faults.point("train_step")  # the weights moved in memory, nothing saved
    folder = trainer.policy.save(trainer.folder / _step_name(metrics.step))
    faults.point("train_saved")  # saved, not recorded
    trainer.version_id = store.record_train_step(
        trainer.campaign_id,
        step=metrics.step,
        path=str(folder),
        metrics=metrics.as_dict(),
        group_ids=[g.id for g in stored],
    )
    publish(
        trainer.policy,
        generator,
        folder,
        campaign_name=trainer.name,
        write_merged=trainer.write_merged,
    )
    return metrics


@dataclass(frozen=True)
class OfflineSettings:
    out: Path
    model: str
    advantage: str = "vpo"
    steps: int | None = None  # default: one pass over the groups
    groups_per_step: int = 8
    learning_rate: float = 1e-6
    lora: bool = False
    lora_rank: int = 16
    kl_beta: float = 1e-3
    micro_batch: int = 8
    temperature: float = 1.0
    seed: int = 0


def train_offline(
    store: Store,
    campaign_id: int,
    candidates: int,
    settings: OfflineSettings,
    on_step: Any = None,
) -> list[StepMetrics]:
    """Fine-tune `settings.model` on the campaign's groups (all of them, in iteration order,
    cycling when `steps` asks for more) and write a model folder any backend loads."""
    import json

    import torch
    from accelerate import Accelerator

    from trainer.loss import LossConfig
    from trainer.train import TrainConfig, train_step

    objectives = store.objectives(campaign_id)
    groups = [
        g
        for g in (to_group(t, objectives, candidates) for t in store.training_groups(campaign_id))
        if g is not None
    ]
    if not groups:
        raise UserError(f"campaign {campaign_id} in {store.where} has no groups to train on")
    per_step = max(1, settings.groups_per_step)
    batches = [groups[i : i + per_step] for i in range(0, len(groups), per_step)]
    steps = settings.steps if settings.steps is not None else len(batches)
    refuse_sharding()
    # One process unless started by `accelerate launch`; then each takes a share of each batch.
    # Without a GPU, accelerate only joins the processes up when told it runs on CPU.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, processes = accelerator.process_index, accelerator.num_processes
    policy = fresh_policy(
        settings.model,
        settings.learning_rate,
        settings.lora,
        settings.lora_rank,
        settings.kl_beta,
        device=str(accelerator.device),
    )
    config = TrainConfig(
        advantage=settings.advantage,
        loss=LossConfig(beta=settings.kl_beta),
        micro_batch=settings.micro_batch,
        temperature=settings.temperature,
    )
    history = []
    for index in range(steps):
        try:
            metrics = train_step(
                policy,
                batches[index % len(batches)][rank::processes],
                config,
                generator=torch.Generator().manual_seed(settings.seed * 1_000_003 + index),
                accelerator=accelerator,
            )
        except ValueError as error:
            raise UserError(f"training step {index + 1}: {error}") from None
        history.append(metrics)
        if on_step is not None and accelerator.is_main_process:
            on_step(metrics)
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
        return history
    out = policy.save_merged(settings.out)
    report = {
        "campaign_id": campaign_id,
        "database": store.where,
        "base_model": settings.model,
        "objectives": objectives,
        "groups": len(groups),
        "processes": processes,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(settings).items()},
        "steps": [m.as_dict() for m in history],
    }
    (out / "vpo-train.json").write_text(json.dumps(report, indent=2) + "\n")
    accelerator.wait_for_everyone()
    return history


def refuse_sharding() -> None:
    """`accelerate launch` with an FSDP or DeepSpeed config (or flag) tells its processes so in
    the environment; our step sums the gradients by hand over whole copies, and a sharded model
    would need its own save, reference model and LoRA handling, which are not built yet."""
    import os

    for name, variable in (
        ("FSDP", "ACCELERATE_USE_FSDP"),
        ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"),
    ):
        if os.environ.get(variable, "false").lower() == "true":  # as accelerate reads them
            raise UserError(
                f"accelerate's config asks for {name}, which vpo train does not support yet "
                "(every process holds the whole model); use a multi-GPU data parallel config "
                "(`accelerate launch --multi_gpu ...`)"
            )


def publish(
    policy: Policy,
    generator: Generator | None,
    folder: Path,
    *,
    campaign_name: str = "",
    write_merged: bool = True,
) -> None:
    """Make `generator` sample from the policy's current weights, saved in `folder` (on a
    server, as an adapter named after `campaign_name`); with no generator (`vpo train
    --follow`), workers load the folder themselves, so a LoRA version is also written merged
    beside it when `write_merged` (not when they all sample from a server)."""
    if generator is None:
        if policy.config.lora and write_merged:
            policy.save_merged(folder.with_name(folder.name + "-merged"))
        return
    hf_model = getattr(generator, "hf_model", None)
    if hf_model is policy.model:
        return  # in-process transformers: the weights are shared
    if hasattr(generator, "load_adapter"):
        serve_adapter(generator, campaign_name, policy.step, folder)
        return
    reload = getattr(generator, "reload_weights", None)
    if reload is None:
        raise UserError(
            f"the {getattr(generator, 'backend', '?')} backend cannot load new weights; "
            "train with the transformers or vllm backend"
        )
    if policy.config.lora:
        folder = policy.save_merged(folder.with_name(folder.name + "-merged"))
    reload(str(folder))


# A server keeps the newest version and the one before it, for workers still sampling from it.
ADAPTERS_KEPT = 2


def adapter_name(campaign_name: str, step: int) -> str:
    return f"{_safe(campaign_name)}-{_step_name(step)}"


def serve_adapter(generator: Any, campaign_name: str, step: int, folder: Path) -> None:
    """Make an endpoint generator sample from the LoRA policy version `step` saved in `folder`:
    loaded into the server under the version's name (once, whichever worker comes first), with
    the campaign's versions older than the newest ADAPTERS_KEPT unloaded."""
    if not (folder / "adapter_config.json").exists():
        raise UserError(
            f"policy version {step} at {folder} holds full weights, and a server takes new "
            "versions only as LoRA adapters; train with --lora, or give the workers the "
            "transformers or vllm backend"
        )
    generator.load_adapter(adapter_name(campaign_name, step), str(folder.resolve()))
    for served, version in served_versions(generator, campaign_name).items():
        if version <= step - ADAPTERS_KEPT:
            generator.unload_adapter(served)


def served_versions(generator: Any, campaign_name: str) -> dict[str, int]:
    """The campaign's policy versions the generator's server holds: adapter name -> step."""
    prefix = f"{_safe(campaign_name)}-step-"
    return {
        name: int(name[len(prefix) :])
        for name in generator.served_adapters()
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    }


def to_group(stored: TrainingGroup, objectives: list[str], candidates: int) -> Group | None:
    """The (G, m, d) score matrix and mask of a stored group; slots without a program are
    masked out, so they never enter the max (a failed program's zeros are kept: per-objective
    partial credit is part of the vector reward)."""
    from trainer.train import Group, Rollout

    if not stored.rollouts:
        return None
    scores = np.zeros((len(stored.rollouts), candidates, len(objectives)))
    mask = np.zeros((len(stored.rollouts), candidates), dtype=bool)
    for i, rollout in enumerate(stored.rollouts):
        for j, slot in enumerate(rollout.candidates[:candidates]):
            if slot is None:
                continue
            mask[i, j] = True
            scores[i, j] = [slot.get(name, 0.0) for name in objectives]
    return Group(
        rollouts=[Rollout(r.prompt_token_ids, r.token_ids, r.logprobs) for r in stored.rollouts],
        scores=scores,
        mask=mask,
    )


def _step_name(step: int) -> str:
    return f"step-{step:06d}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "campaign"
