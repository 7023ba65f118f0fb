"""The server samples what the trainer models: docs/scale.md's `vllm serve` recipe, run as
written, returns log-probs of the distribution the trainer computes, and the trainer sets aside
the log-probs of a server that samples another one.

The server is the session's (conftest.tiny_server): the recipe's command read from the page,
serving the tiny random Llama whose generation_config.json holds Qwen2.5 Instruct's sampling
defaults (top_k 20, repetition_penalty 1.05). A server that applies them draws from the top 20 of
a nearly flat distribution over 49k tokens, about 7 nats a token away from what the trainer
computes, where rounding leaves well under 1e-3. Only what cannot run here changes
(conftest.served_here): the model (the tiny one, served under its folder's name, as the page
asks), the key, `--tensor-parallel-size` (one CPU), and a CPU's flags (`--dtype float32
--enforce-eager`, a fixed KV cache) with a host, port and context length.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import QWEN_DEFAULTS, Served, documented_server

from harness.llm import Sampling
from harness.llm.base import UNMODELLED_OFF, Completion
from harness.llm.openai_backend import SERVER_FLAGS, OpenAIGenerator
from trainer import train
from trainer.policy import Policy, PolicyConfig
from trainer.train import Group, Rollout, StepMetrics, TrainConfig

# The campaign's temperature and top-p.
SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_tokens=24, seed=3)
STEP = TrainConfig(temperature=0.8, top_p=0.95, micro_batch=4)
PROMPTS = [
    [{"role": "user", "content": "Write a function that packs circles."}],
    [{"role": "user", "content": "Say something short."}],
]


def test_the_recipe_has_the_flags_the_trainer_needs() -> None:
    _, arguments = documented_server()
    pairs = list(zip(arguments, arguments[1:], strict=False))
    for flag, value in zip(SERVER_FLAGS[::2], SERVER_FLAGS[1::2], strict=True):
        assert (flag, value) in pairs, f"docs/scale.md's vllm serve lacks {flag} {value}"


def sample(served: Served, **extra_body: object) -> list[Completion]:
    """4 completions of each prompt through the openai backend, `extra_body` in each request."""
    generator = OpenAIGenerator(
        served.model,
        base_url=served.base_url,
        api_key_env=served.key_env,
        extra_body=extra_body,
    )
    try:
        groups = generator.generate(PROMPTS, 4, SAMPLING)
    finally:
        generator.close()
    completions = [c for group in groups for c in group]
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in completions)
    return completions


def step_on(model: str, completions: list[Completion]) -> StepMetrics:
    """One training step of `model` in fp32 on `completions` as rollouts it sampled itself."""
    # fp32, as the server computes
    policy = Policy.load(model, PolicyConfig(lr=1e-3, reference=False, precision="float32"))
    rollouts = [Rollout(c.prompt_token_ids or (), c.token_ids, c.logprobs, 0) for c in completions]
    scores = np.random.default_rng(0).uniform(size=(len(rollouts), 1, 2))
    group = Group(rollouts, scores, np.ones((len(rollouts), 1), dtype=bool))
    return train.train_step(policy, [group], STEP, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def warnings_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> pytest.LogCaptureFixture:
    """Warnings caught; the trainer's once-per-process warning may be said again."""
    monkeypatch.setattr(train, "_mismatch_said", False)
    caplog.set_level(logging.WARNING, logger="trainer.train")
    return caplog


def said_by_the_trainer(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "trainer.train"]


@pytest.mark.timeout(600)
def test_the_server_reports_the_log_probs_the_trainer_recomputes(
    served: Served, warnings_said: pytest.LogCaptureFixture
) -> None:
    """The backend's requests, the server's sampling and the trainer's log-probs agree: a step
    on rollouts the same weights sampled has a fresh gap of rounding, and keeps them all."""
    metrics = step_on(served.model, sample(served))
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0 and metrics.sampler_fraction == 1.0
    assert metrics.clip_fraction == 0.0
    assert said_by_the_trainer(warnings_said) == []


@pytest.mark.timeout(600)
def test_a_client_that_leaves_the_knobs_out_gets_no_model_defaults(served: Served) -> None:
    """`--generation-config vllm`: a request without top_k or repetition_penalty (null is how
    vLLM reads "not given") is not sampled with the model's top_k 20 and penalty 1.05."""
    left_out = {knob: None for knob in UNMODELLED_OFF}
    metrics = step_on(served.model, sample(served, **left_out))
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0


@pytest.mark.timeout(600)
def test_a_server_sampling_with_qwens_defaults_is_set_aside_and_said_once(
    served: Served, warnings_said: pytest.LogCaptureFixture
) -> None:
    """Rollouts sampled with top_k 20 and repetition_penalty 1.05 (what a server without
    `--generation-config vllm` applies to a client that leaves them out) are far beyond
    rounding: the step uses recomputed log-probs for them (ratio 1), counts them, and warns
    once, naming the server's settings."""
    knobs = {"top_k": QWEN_DEFAULTS["top_k"], "repetition_penalty": 1.05}
    completions = sample(served, **knobs)
    metrics = step_on(served.model, completions)
    assert metrics.fresh_gap is not None and metrics.fresh_gap > 1.0
    assert metrics.mismatched == len(completions) and metrics.sampler_fraction == 0.0
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-6) and metrics.clip_fraction == 0.0
    step_on(served.model, completions)
    (said,) = said_by_the_trainer(warnings_said)  # two steps, one warning
    assert "--generation-config vllm" in said.getMessage()
    assert "server's sampling settings" in said.getMessage()
