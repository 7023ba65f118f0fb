"""How a policy learns, wherever it is trained (inside a campaign, beside workers, offline on a
campaign's groups, by RL on an answer problem): `TrainSettings`, which a campaign holds whole as
its `training`; `Sampling`, what a step needs to know of the model and its rollouts; and the
offline and answer-problem commands' settings around them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.config.values import TRAINING, check_float, require, setting
from trainer.estimators import MEASURED, NAMES, SINGLE_CANDIDATE, one_of

# The estimators and what each takes: trainer/estimators.py, the one table (it imports no
# torch, so reading a config never does).
ADVANTAGES = NAMES
SINGLE_CANDIDATE_ADVANTAGES = SINGLE_CANDIDATE
# The reward rules that take a named choice, each choice with what it pays: one entry per rule.
# TrainSettings checks a value against it, `vpo train` checks its flags with it, and
# tests/test_config.py ties each choice to the setting's help and to docs/training.md.
# harness/learning/rewards.py applies them (`to_group`, `references`, `set_scores`).
REWARD_CHOICES: dict[str, dict[str, str]] = {
    "duplicate_reward": {
        "zero": "a candidate repeating its parent or a stored program earns nothing",
        "keep": "it earns that program's scores",
    },
    "format_reward": {
        "partial": "a rollout whose m candidates did not all parse scores its parsed ones",
        "whole": "it scores nothing",
    },
    "reward_reference": {
        "none": "the set score is absolute, as in the VPO paper",
        "parent": "the gain over the parent's vector under each weighting",
        "island": "the gain over the front its island held before the group",
        "campaign": "the gain over the front the campaign held before the group",
    },
    "vector": {
        "objectives": "a step trains on the campaign's objectives",
        "cases": "on its problem's separate cases",
    },
    "gain": {
        "clipped": "a rollout earns its gain over the reference, 0 at worst",
        "signed": "its gain or its loss",
    },
}
OLD_LOGPROBS = ("auto", "sampler", "recompute")
GRADIENT_CHECKPOINTING = ("auto", "on", "off")  # trainer.policy's, without importing torch
SWITCHES = ("auto", "on", "off")
# Policy versions kept on disk: the newest (a resume needs its optimiser state), a worker's or
# server's previous one, and one to spare (harness/learning/publish.py, docs/training.md).
KEEP_VERSIONS = 3
# The embedded SmolLM2-135M-Instruct; any HF id or folder works.
DEFAULT_MODEL = "smollm2"
# What a rollout is paid by (harness/learning/rewards.py `to_group`): offline training on a
# campaign's groups scores them by the campaign's rules.
REWARD_RULES = (*REWARD_CHOICES, "overlong_buffer", "slot_cost")


def unknown_choice(rule: str, value: str) -> str | None:
    """Why `value` is no choice of the reward rule `rule` (`rule must be a or b, not 'c'`), or
    None: the settings and `vpo train`'s flags say it so."""
    choices = tuple(REWARD_CHOICES[rule])
    return None if value in choices else f"{rule} must be {one_of(choices)}, not {value!r}"


@dataclass(frozen=True)
class Sampling:
    """What a step needs beside `TrainSettings`: the model a policy starts from, how its
    rollouts were sampled (log-probs are of logits / temperature within the top_k tokens and
    then the nucleus top_p, as the sampler's were), the longest prompt + completion it trains
    on, and the seed. A campaign's comes from its own settings (`CampaignSettings.sampling`)."""

    model: str = DEFAULT_MODEL
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    # A longer rollout's completion is cut (and counted).
    sequence_tokens: int = 4096
    seed: int = 0


@dataclass(frozen=True)
class TrainSettings:
    """How a policy learns, wherever it is trained: inside a campaign (the [training] section of
    its file, `CampaignSettings.training`), beside workers (`vpo train --follow`), offline on a
    campaign's groups (`vpo train --db`), by RL on an answer problem (`vpo train --problem`).
    Each field made with `setting` is a flag of `vpo run` and, unless `campaign_only`, of
    `vpo train`."""

    # One policy step after every `train_every` new groups (0: never); with --follow, the
    # groups each step takes.
    train_every: int = setting(
        0, "one training step after every K new groups ({default}: no training)", group=TRAINING
    )
    advantage: str = setting(
        "vpo",
        f"the advantage estimator: {one_of(NAMES)} ({{default}}; docs/training.md)",
        group=TRAINING,
    )
    learning_rate: float = setting(
        1e-6, "learning rate ({default})", flag="--lr", group=TRAINING
    )  # the VPO paper's full fine-tuning rate
    lora: bool = setting(False, "train a LoRA adapter", group=TRAINING)
    lora_rank: int = setting(16, "LoRA rank ({default})", group=TRAINING)
    lora_layers: int = setting(
        0,
        "the LoRA adapter on the model's top N decoder layers only, so the backward pass stops "
        "at the lowest of them ({default}: every layer)",
        group=TRAINING,
    )
    kl_beta: float = setting(
        1e-3, "KL weight ({default})", group=TRAINING
    )  # weight of the k3 KL to the initial policy
    dirichlet_weights: int = 100  # K weight vectors per group (VPO)
    dirichlet_alpha: float = 1.0
    micro_batch: int = setting(8, "rollouts per forward/backward pass ({default})", group=TRAINING)
    # Rollouts whose advantage is exactly 0 (flat groups) skip the forward/backward; a step of
    # only those takes no optimiser step (trainer.train.TrainConfig.skip_zero_advantage).
    skip_zero_advantage: bool = True
    # Each group's prompt runs forward and backward once for all its rollouts (packed under a
    # block mask), not once per rollout (trainer.train.TrainConfig.shared_prompt).
    shared_prompt: bool = setting(
        True,
        "train every rollout in a row of its own, its prompt run once per rollout (default: "
        "each group's prompt runs once for all its rollouts; the same step)",
        group=TRAINING,
    )
    gradient_checkpointing: str = setting(
        "auto",
        "recompute layer activations in the backward pass: auto (from 1B parameters), on or "
        "off ({default})",
        group=TRAINING,
    )
    # The reward of a candidate that repeats its parent or a stored program: "zero" (it earns
    # nothing, so RL does not learn that copying is safe) or "keep" (that program's scores).
    duplicate_reward: str = setting(
        "zero",
        "reward of a candidate repeating its parent or a stored program: zero or keep ({default})",
        group=TRAINING,
    )
    # A rollout whose m candidates did not all parse: "partial" (its parsed candidates score, as
    # in the VPO paper) or "whole" (it scores nothing: a set reward takes the best candidate's
    # score, so "partial" pays a rollout of one good candidate what it pays one of m, and the
    # format can drift; benchmarks/results/discovery.md).
    format_reward: str = setting(
        "partial",
        "reward of a rollout whose m candidates did not all parse: partial (its parsed ones "
        "score) or whole (nothing) ({default})",
        group=TRAINING,
    )
    # Soft overlong punishment (after DAPO, Yu et al. 2025, arXiv 2503.14476): a completion
    # longer than max_tokens - this loses a share of every score, linearly, all of it at the
    # limit; 0: off. Without it, a set reward that favours longer expressions grows the answers
    # into the limit (benchmarks/results/discovery_vpo_256_tokens.md).
    overlong_buffer: int = setting(
        0,
        "tokens before max_tokens where a longer completion starts to lose its scores, "
        "linearly, all of them at the limit (DAPO's soft overlong punishment); 0: off "
        "({default})",
        group=TRAINING,
    )
    # What a group's set score is measured against (vpo, entropic): "none" (the VPO paper's
    # absolute scores: a stored family earns its score again each time it is rewritten),
    # "parent" (the gain over the parent's vector under each weighting), "island" or
    # "campaign" (the R2 gain over the front its island or the campaign held before the
    # group). harness/learning/rewards.py.
    reward_reference: str = setting(
        "none",
        "a set score measured against: none (absolute, as in the VPO paper), parent, island "
        "or campaign (the gain over the front it held) ({default})",
        group=TRAINING,
    )
    # The score vector a step trains on: the campaign's objectives, or its problem's cases
    # (problems.api.Problem.cases: separate pieces of the task, whose parts trade off where
    # two fits of one equation move together; GRPO and Multi-RLVR take their mean).
    vector: str = setting(
        "objectives",
        "the score vector a step trains on: objectives, or cases (the problem's separate "
        "cases, where it has them) ({default})",
        group=TRAINING,
    )
    # What a rollout earns against its reference: the gain clipped at 0 (a set that does no
    # better than its parent earns 0, however far below it falls) or signed (the gain or the
    # loss, so rollouts that do not beat their parent still rank: a denser signal where 93%
    # of rollouts gain nothing, benchmarks/results/discovery_46.md).
    gain: str = setting(
        "clipped",
        "what a rollout earns against its reward_reference: clipped (the gain, 0 at worst) or "
        "signed (the gain or the loss) ({default})",
        group=TRAINING,
    )
    # Each rollout loses this times the share of its m candidate slots that brought nothing
    # (missing, unparsed, lazy, failed, or a repeat within the rollout); 0: off.
    slot_cost: float = setting(
        0.0,
        "a rollout's loss for its share of wasted slots (unparsed, lazy, failed, repeated) "
        "({default}: off)",
        group=TRAINING,
    )
    # entropic: KL(q || uniform) of each group's weights q = softmax(beta R) (TTT-Discover's
    # ln 2, arXiv 2601.16175).
    kl_budget: float = setting(
        0.6931471805599453,
        "the entropic advantage's KL(q || uniform) per group (default: ln 2)",
        group=TRAINING,
    )
    # Rollouts a campaign stores before its first step, which then takes all of them
    # (DecAEvolve and PiT-PO wait for about 200 samples); 0: the first step after K groups.
    warmup_samples: int = setting(
        0,
        "rollouts stored before the first training step, which then takes them all "
        "({default}: none)",
        group=TRAINING,
        campaign_only=True,
    )
    # The PPO ratio's old log-probs: "auto" (the sampler's where a rollout has them, so the clip
    # acts on groups an older policy version sampled; recomputed elsewhere), "sampler" (required)
    # or "recompute" (the current weights': ratio 1, the clip never acts).
    old_logprobs: str = setting(
        "auto",
        "the PPO ratio's old log-probs: auto, sampler or recompute ({default})",
        group=TRAINING,
    )
    sample_after_step: str = setting(
        "auto",
        "wait for the step on a batch before sampling the next, so that each batch is sampled "
        "by the newest version: auto (on for in-process backends), on or off ({default})",
        group=TRAINING,
        campaign_only=True,
    )
    # A step on the groups the run's last batch left (the run's newest version): on by default,
    # so the policy a campaign leaves has learnt from all it harvested; off, they wait, and
    # `vpo run --extend` trains on them before its first batch (no rollout of this run samples
    # that version: make demo's last step was 110 s of 662, seed 0, 2026-12-07).
    final_step: bool = setting(
        True,
        "skip the step on the last batch's groups, whose version no rollout of this run samples "
        "(an extended run takes it before its first batch)",
        group=TRAINING,
        campaign_only=True,
    )
    policy_dir: str | None = setting(
        None,
        "where policy versions are saved (default: beside the database)",
        group=TRAINING,
        campaign_only=True,
    )
    keep_versions: int = setting(
        KEEP_VERSIONS,
        "policy versions kept on disk, the newest, beside any in use ({default}; 0: all)",
        group=TRAINING,
        campaign_only=True,
    )

    def __post_init__(self) -> None:
        for key in ("learning_rate", "kl_beta", "slot_cost", "kl_budget", "dirichlet_alpha"):
            check_float(key, getattr(self, key))
        require(self.train_every >= 0, "train_every", "a whole number >= 0 (0: no training)")
        require(self.advantage in ADVANTAGES, "advantage", one_of(ADVANTAGES))
        require(self.lora_rank >= 1, "lora_rank", "a whole number >= 1")
        require(self.lora_layers >= 0, "lora_layers", "a whole number >= 0 (0: every layer)")
        require(self.dirichlet_weights >= 1, "dirichlet_weights", "a whole number >= 1")
        require(self.micro_batch >= 1, "micro_batch", "a whole number >= 1")
        for rule, choices in REWARD_CHOICES.items():
            require(getattr(self, rule) in choices, rule, one_of(tuple(choices)))
        require(self.overlong_buffer >= 0, "overlong_buffer", "a whole number >= 0 (0: off)")
        require(
            self.gain == "clipped" or self.reward_reference != "none",
            "gain",
            "clipped unless reward_reference is parent, island or campaign (a signed gain is "
            "measured against something)",
        )
        require(self.warmup_samples >= 0, "warmup_samples", "a whole number >= 0 (0: none)")
        measured = self.train_every and (self.reward_reference != "none" or self.slot_cost > 0)
        require(
            not measured or self.advantage in MEASURED,
            "advantage",
            f"{one_of(MEASURED)} when reward_reference or slot_cost is set",
        )
        require(self.old_logprobs in OLD_LOGPROBS, "old_logprobs", ", ".join(OLD_LOGPROBS))
        require(
            self.keep_versions >= 0, "keep_versions", "a whole number >= 0 (0: keep every version)"
        )
        require(
            self.gradient_checkpointing in GRADIENT_CHECKPOINTING,
            "gradient_checkpointing",
            ", ".join(GRADIENT_CHECKPOINTING),
        )
        require(self.sample_after_step in SWITCHES, "sample_after_step", ", ".join(SWITCHES))


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
    sampling: Sampling = Sampling()
    steps: int | None = None  # default: one pass over the groups
    groups_per_step: int = 8


# Maze prompts are ~700 tokens: 8 rows of them need ~20 GB on a CPU, so 2 rows a pass.
ANSWER_TRAINING = TrainSettings(micro_batch=2)


@dataclass(frozen=True)
class AnswerSettings:
    """`vpo train --problem`: RL on an answer problem (harness/learning/answers.py)."""

    out: Path
    training: TrainSettings = ANSWER_TRAINING
    sampling: Sampling = Sampling()  # its temperature is also the sampling one
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
