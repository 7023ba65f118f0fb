"""A campaign's vLLM engine on CPU gets the KV cache the campaign can fill, not a fixed 4 GiB
(issue 57: the demo's 4 GiB cache was 9 times what its sequences could hold), and takes no
longer sequence than the campaign sends."""

from __future__ import annotations

import pytest
from conftest import require_vllm

from harness.config.files import load_toml
from harness.config.settings import build
from harness.llm.choice import base_generator, kv_cache_tokens, longest_sequence
from harness.llm.vllm_backend import KV_CACHE_MARGIN, kv_bytes_per_token, kv_cache_size
from trainer.models import resolve_model


def test_the_demo_needs_a_quarter_of_the_old_cache() -> None:
    """Four iterations in flight, each one prompt of at most 8,192 tokens (its four rollouts
    share it) and four completions of 160: 35,328 tokens, 1.01 GiB of Qwen-coder in fp32."""
    config = build(load_toml("examples/demo.toml"))
    assert longest_sequence(config) == 160 + 8192
    assert kv_cache_tokens(config) == 4 * (8192 + 4 * 160)
    folder = resolve_model("qwen-coder")
    assert kv_bytes_per_token(folder, "float32") == 2 * 24 * 2 * 64 * 4
    assert kv_bytes_per_token(folder, "bfloat16") == 2 * 24 * 2 * 64 * 2
    gib = kv_cache_size(folder, "float32", kv_cache_tokens(config))
    assert gib == pytest.approx(35_328 * 24_576 * KV_CACHE_MARGIN / 2**30)
    assert gib < 1.1


def test_an_untrained_campaign_without_a_context_keeps_the_models_length() -> None:
    config = build({"problem": "circle_packing"})
    assert longest_sequence(config) is None
    bounded = build({"problem": "circle_packing", "context_tokens": 2048, "max_tokens": 256})
    assert longest_sequence(bounded) == 2048
    in_flight = 8  # the vllm backend's default concurrency
    assert kv_cache_tokens(bounded) == in_flight * (2048 - 256 + 4 * 256)


def test_a_campaigns_engine_is_sized_by_its_need(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_vllm()
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU vLLM sizes its cache from the GPU's memory")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    settings = {
        "problem": "circle_packing", "model": tiny_model, "backend": "vllm", "concurrency": 2,
        "max_tokens": 64, "context_tokens": 512, "training": {"train_every": 2},
    }  # fmt: skip
    config = build(settings)
    generator = base_generator(config)
    try:
        assert generator.context_tokens() == 512
        cache = generator.engine.llm_engine.vllm_config.cache_config  # type: ignore[attr-defined]
        dtype = str(generator.engine.llm_engine.model_config.dtype).split(".")[-1]  # type: ignore[attr-defined]
        expected = kv_cache_size(tiny_model, dtype, kv_cache_tokens(config))
        assert cache.kv_cache_memory_bytes == int(expected * 2**30)
    finally:
        generator.close()
