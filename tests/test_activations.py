"""Activation checkpointing "auto": what a pass keeps for its backward pass is measured, and a
pass that would not fit recomputes its activations instead (trainer/activations.py)."""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

import pytest
import torch

from trainer import activations, train
from trainer.activations import (
    LOGIT_BYTES,
    LOGIT_CHUNK_FLOOR,
    LOGIT_SHARE,
    PROBE_CHUNK,
    fit_logit_chunk,
    free_memory,
    measure_policy,
    saved_bytes,
)
from trainer.logprobs import pack_batch, token_batch, token_logprobs
from trainer.policy import Policy, PolicyConfig
from trainer.train import TrainConfig, train_step


def test_saved_bytes_counts_what_autograd_keeps_and_leaves_the_weights_out() -> None:
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(32, 16))
    # x @ w keeps x (for w's gradient) and w (for x's); tanh keeps its output (64 x 16 floats).
    assert saved_bytes(lambda: torch.tanh(x @ w)) == (64 * 32 + 32 * 16 + 64 * 16) * 4
    skip = {w.untyped_storage().data_ptr()}
    assert saved_bytes(lambda: torch.tanh(x @ w), skip) == (64 * 32 + 64 * 16) * 4
    with torch.no_grad():
        assert saved_bytes(lambda: torch.tanh(x @ w)) == 0


def test_what_saved_bytes_measures_is_freed_after() -> None:
    x = torch.randn(64, 32, requires_grad=True)
    made: list[weakref.ref[torch.Tensor]] = []

    def run() -> None:
        out = torch.tanh(x * 2)  # tanh keeps its own output for the backward pass
        made.append(weakref.ref(out))

    assert saved_bytes(run) > 0
    assert made[0]() is None  # a hook that kept the output would tie it to its node for good


def test_a_storage_freed_and_reused_during_the_run_is_not_counted_once() -> None:
    x = torch.randn(256, 1024, requires_grad=True)

    def run() -> None:
        for scale in (2.0, 3.0, 4.0):  # each output dropped before the next is made
            torch.tanh(x * scale)

    assert saved_bytes(run) == 3 * x.nbytes


def test_free_memory_on_this_machine_is_some_of_its_memory() -> None:
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    free = free_memory(torch.device("cpu"))
    assert free is not None and 0 < free <= total


def real_pass(rows: int, width: int, packed: bool) -> dict[str, torch.Tensor]:
    """A pass's batch: `rows` rows of `width` tokens, each one rollout (a 30-token prompt and
    its completion) or, packed, one 30-token prompt and four completions sharing it."""
    prompt = list(range(10, 40))

    def completion(r: int, length: int) -> list[int]:
        return [(7 * i + r) % 500 + 5 for i in range(length)]

    if packed:
        share = (width - 30) // 4
        return pack_batch(
            [
                (prompt, [completion(r * 4 + k, share) for k in range(4)], [None] * 4)
                for r in range(rows)
            ]
        )
    return token_batch([(prompt, completion(r, width - 30), None) for r in range(rows)])


def pass_bytes(policy: Policy, batch: dict[str, torch.Tensor], logit_chunk: int) -> int:
    """What one real training pass keeps for its backward pass, measured."""
    own = {p.untyped_storage().data_ptr() for p in policy.model.parameters()}

    def run() -> None:
        with torch.enable_grad(), policy.autocast():
            token_logprobs(policy.scorer, batch, 1.0, 1.0, logit_chunk)

    return saved_bytes(run, own)


@pytest.mark.parametrize(("lora", "packed"), [(False, False), (True, False), (False, True)])
def test_the_estimate_fitted_on_one_short_row_holds_for_a_real_pass(
    tiny_model: str, lora: bool, packed: bool
) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(lora=lora, lora_rank=4, reference=False))
    cost = measure_policy(policy, packed)
    batch = real_pass(3, 300, packed)
    rows, width = batch["input_ids"].shape
    positions = int(batch["completion_ids"].numel())
    vocabulary = policy.model.get_output_embeddings().weight.shape[0]
    # Logits in small chunks, recomputed: the decoder's activations alone.
    decoder = cost.bytes(rows, width, positions, 0)
    measured = pass_bytes(policy, batch, PROBE_CHUNK)
    assert 0.8 * measured < decoder < 1.25 * measured
    # Logits in one chunk: kept for the backward pass, and counted in the estimate at their
    # peak (LOGIT_BYTES a position and vocabulary entry), of which autograd keeps the fp32
    # log-softmax (4 bytes) until the backward pass.
    whole = pass_bytes(policy, batch, positions)
    assert whole > 2 * measured
    logits = whole - measured
    assert 3.5 * positions * vocabulary < logits <= 4.5 * positions * vocabulary
    estimate = cost.bytes(rows, width, positions, positions)
    assert estimate == pytest.approx(decoder + LOGIT_BYTES * positions * vocabulary)


def step(policy: Policy, groups: list) -> list[torch.Tensor]:
    metrics = train_step(
        policy, groups, TrainConfig(micro_batch=2), generator=torch.Generator().manual_seed(3)
    )
    return metrics, [p.detach().clone() for p in policy.model.parameters()]


def test_auto_recomputes_the_passes_that_would_not_fit_and_learns_the_same(
    tiny_model: str, caplog: pytest.LogCaptureFixture
) -> None:
    from test_trainer import tiny_groups

    def load(checkpointing: str) -> Policy:
        torch.manual_seed(0)
        config = PolicyConfig(lr=1e-2, reference=False, gradient_checkpointing=checkpointing)
        return Policy.load(tiny_model, config)

    kept = load("auto")
    groups = tiny_groups(kept, 2)
    metrics, plain = step(kept, groups)
    assert metrics.checkpointed == 0 and not kept.model.is_gradient_checkpointing

    short = load("auto")
    # Memory running out on the machine cannot be caused here: it is read as 1 MiB free.
    short.memory_free = lambda device: 1 << 20
    with caplog.at_level(logging.INFO, logger="trainer.train"):
        metrics, recomputed = step(short, groups)
    assert metrics.checkpointed == 4  # every pass: eight rollouts, two a pass
    assert short.model.is_gradient_checkpointing
    assert "activation checkpointing on for 4 of 4 passes" in caplog.text
    # The logit chunk fell to the floor, but each pass predicts fewer positions: none is split,
    # and nothing is said about it.
    assert short.shortened_logit_chunk is None and "logits computed" not in caplog.text
    for a, b in zip(plain, recomputed, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)

    # Memory back: the next step keeps its activations again.
    short.memory_free = free_memory
    metrics, _ = step(short, groups)
    assert metrics.checkpointed == 0 and not short.model.is_gradient_checkpointing


def test_auto_shortens_the_logit_chunk_to_what_memory_holds(
    tiny_model: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(reference=False, gradient_checkpointing="auto"))
    vocabulary = policy.model.get_output_embeddings().weight.shape[0]
    chunk_bytes = LOGIT_BYTES * vocabulary  # a position's share of a chunk's peak
    for free, expected in (
        (None, 2048),  # unknown: as configured
        (int(2048 * chunk_bytes / LOGIT_SHARE) + 1, 2048),  # room for the whole chunk
        (int(300 * chunk_bytes / LOGIT_SHARE) + 1, 300),
        (1 << 20, LOGIT_CHUNK_FLOOR),  # 1 MiB: the floor
    ):
        policy.memory_free = lambda device, free=free: free
        assert fit_logit_chunk(policy, 2048, 4096) == expected
    # Said only for a pass the shorter chunk splits: one of 200 positions is one chunk anyway.
    policy.shortened_logit_chunk = None
    assert fit_logit_chunk(policy, 2048, 200) == LOGIT_CHUNK_FLOOR
    assert policy.shortened_logit_chunk is not None
    policy.shortened_logit_chunk = None
    policy.memory_free = lambda device: int(300 * chunk_bytes / LOGIT_SHARE) + 1
    assert fit_logit_chunk(policy, 2048, 200) == 300 and policy.shortened_logit_chunk is None
    # A step whose passes the shorter chunk splits says so, once (chunked log-probs equal the
    # whole ones: tests/test_trainer.py).
    from test_trainer import tiny_groups

    monkeypatch.setattr(activations, "LOGIT_CHUNK_FLOOR", 4)
    monkeypatch.setattr(train, "_logit_chunk_said", False)
    policy.memory_free = lambda device: 1 << 20
    with caplog.at_level(logging.INFO, logger="trainer.train"):
        step(policy, tiny_groups(policy, 2))
    assert caplog.text.count("logits computed 4 positions a chunk, not logit_chunk 2048") == 1
    off = Policy.load(tiny_model, PolicyConfig(reference=False, gradient_checkpointing="off"))
    off.memory_free = lambda device: 1 << 20
    assert (
        fit_logit_chunk(off, 2048, 4096) == 2048
    )  # "on" and "off" leave the configured chunk alone


def test_on_and_off_are_kept_whatever_the_memory(tiny_model: str) -> None:
    from test_trainer import tiny_groups

    for setting, expected in (("on", 4), ("off", 0)):
        policy = Policy.load(
            tiny_model, PolicyConfig(lr=1e-2, reference=False, gradient_checkpointing=setting)
        )
        policy.memory_free = lambda device: 1 << 20
        metrics, _ = step(policy, tiny_groups(policy, 2))
        assert metrics.checkpointed == expected
        assert policy.activation_cost == {}  # nothing measured where nothing is decided
