"""How a policy learns, wherever it is trained (inside a campaign, beside workers, offline on a
campaign's groups, by RL on an answer problem), and the offline and answer-problem commands'
settings. `CampaignConfig` takes its training defaults from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrainSettings:
    """How a policy learns, wherever it is trained: inside a campaign, beside workers
    (`vpo train --follow`), offline on a campaign's groups, by RL on an answer problem. Its
    defaults are also the campaign's."""

    model: str = "smollm2"  # the embedded SmolLM2-135M-Instruct; any HF id or folder works
    # vpo | entropic | grpo | multi_rlvr | max_at_k | gdpo | maxrl | rw_grpo
    advantage: str = "vpo"
    learning_rate: float = 1e-6  # the VPO paper's full fine-tuning rate
    lora: bool = False  # train a LoRA adapter instead of every weight
    lora_rank: int = 16
    kl_beta: float = 1e-3  # weight of the k3 KL to the initial policy
    dirichlet_weights: int = 100  # K weight vectors per group (VPO)
    dirichlet_alpha: float = 1.0
    micro_batch: int = 8  # rollouts per forward/backward pass
    temperature: float = 1.0  # what the rollouts were sampled at: log-probs are of logits / T
    top_p: float = 1.0  # the nucleus they were sampled with (the PPO ratio compares the same)
    # The PPO ratio's old log-probs: "auto" (the sampler's where a rollout has them, so the clip
    # acts on groups an older policy version sampled; recomputed elsewhere), "sampler" (required)
    # or "recompute" (the current weights': ratio 1, the clip never acts).
    old_logprobs: str = "auto"
    # Longest prompt + completion trained on; a longer rollout's completion is cut (and counted).
    sequence_tokens: int = 4096
    seed: int = 0
    # The reward of a candidate that repeats its parent or a stored program: "zero" (it earns
    # nothing, so RL does not learn that copying is safe) or "keep" (that program's scores).
    duplicate_reward: str = "zero"
    # A rollout whose m candidates did not all parse: "partial" (its parsed candidates score, as
    # in the VPO paper) or "whole" (it scores nothing: a set reward takes the best candidate's
    # score, so "partial" pays a rollout of one good candidate what it pays one of m, and the
    # format can drift; benchmarks/results/discovery.md).
    format_reward: str = "partial"
    # Soft overlong punishment (after DAPO, Yu et al. 2025, arXiv 2503.14476): a completion
    # longer than max_tokens - this loses a share of every score, linearly, all of it at the
    # limit; 0: off. Without it, a set reward that favours longer expressions grows the answers
    # into the limit (benchmarks/results/discovery_vpo_256_tokens.md).
    overlong_buffer: int = 0
    # What a group's set score is measured against (vpo, entropic): "none" (the VPO paper's
    # absolute scores: a stored family earns its score again each time it is rewritten),
    # "parent" (the gain over the parent's vector under each weighting), "island" or
    # "campaign" (the R2 gain over the front its island or the campaign held before the
    # group). harness/learning/rewards.py.
    reward_reference: str = "none"
    # Each rollout loses this times the share of its m candidate slots that brought nothing
    # (missing, unparsed, lazy, failed, or a repeat within the rollout); 0: off.
    slot_cost: float = 0.0
    # entropic: KL(q || uniform) of each group's weights q = softmax(beta R) (TTT-Discover's
    # ln 2, arXiv 2601.16175).
    kl_budget: float = 0.6931471805599453
    # Rollouts a campaign stores before its first step, which then takes all of them
    # (DecAEvolve and PiT-PO wait for about 200 samples); 0: the first step after K groups.
    warmup_samples: int = 0
    # Rollouts whose advantage is exactly 0 (flat groups) skip the forward/backward; a step of
    # only those takes no optimiser step (trainer.train.TrainConfig.skip_zero_advantage).
    skip_zero_advantage: bool = True
    # Each group's prompt runs forward and backward once for all its rollouts (packed under a
    # block mask), not once per rollout (trainer.train.TrainConfig.shared_prompt).
    shared_prompt: bool = True
    # Activation checkpointing of the decoder layers: "auto" (on from 1B parameters), on, off.
    gradient_checkpointing: str = "auto"


# A LoRA adapter learns through far fewer weights: `vpo train --lora` starts from this rate.
LORA_LEARNING_RATE = 1e-5
# Prompts hold the parent and drafts: room for them beside a campaign's completions in the
# training length, which is max_tokens + this; a campaign that trains builds no longer prompt
# (harness/evolution/generation.py `prompt_budget`), so its steps take every rollout whole.
PROMPT_ROOM_TOKENS = 8192


def trained_temperature(sampled: float) -> float:
    """The temperature a step divides the logits by for rollouts sampled at `sampled`:
    greedy sampling (0) is trained as if at a small temperature."""
    return max(sampled, 1e-3)


# `vpo train --follow`: groups per step when neither its flag nor the campaign says.
FOLLOW_EVERY = 4


@dataclass(frozen=True)
class OfflineSettings:
    """`vpo train --db`: fine-tune on every group a campaign recorded (learning.offline)."""

    out: Path
    training: TrainSettings = TrainSettings()
    steps: int | None = None  # default: one pass over the groups
    groups_per_step: int = 8


# Maze prompts are ~700 tokens: 8 rows of them need ~20 GB on a CPU, so 2 rows a pass.
ANSWER_TRAINING = TrainSettings(micro_batch=2)


@dataclass(frozen=True)
class AnswerSettings:
    """`vpo train --problem`: RL on an answer problem (harness/learning/answers.py)."""

    out: Path
    training: TrainSettings = ANSWER_TRAINING  # its temperature is also the sampling one
    steps: int = 20
    prompts_per_step: int = 4
    group_size: int = 8
    candidates: int = 3  # m answers per completion
    max_tokens: int = 512
    eval_temperature: float = 0.7  # the paper's evaluation temperature
    eval_prompts: int = 20  # held-out instances (the paper: 100)
    eval_generations: int = 10  # completions per held-out prompt (the paper: 10 x m = 30)
    eval_every: int = 0  # 0: before and after training only
    train_size: int = 1000  # training instances cycled through (the paper: 1000)
