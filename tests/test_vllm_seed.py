"""The campaign's seed reaches the in-process vLLM engine: without it every campaign on the same
prompts sampled the same completions, whatever its seed (found when the discovery benchmark's
three seeds of the untrained arm came out token for token alike)."""

from __future__ import annotations

from conftest import require_vllm

from harness.config.settings import build
from harness.llm import Sampling
from harness.llm.choice import base_generator

PROMPT = [{"role": "user", "content": "Write a function that adds two numbers, please."}]
UNSEEDED = Sampling(temperature=1.0, top_p=1.0, max_tokens=8)  # as a campaign asks


def test_campaigns_of_other_seeds_sample_other_completions(tiny_model: str) -> None:
    require_vllm()
    samples: dict[int, list[list[tuple[int, ...]]]] = {}
    for seed in (0, 1, 0):
        config = build(
            {"problem": "circle_packing", "model": tiny_model, "backend": "vllm", "seed": seed}
        )
        generator = base_generator(config)
        try:
            group = generator.generate([PROMPT], 4, UNSEEDED)[0]
        finally:
            generator.close()
        samples.setdefault(seed, []).append([c.token_ids for c in group])
    assert samples[0][0] == samples[0][1]  # the same seed: the same completions
    assert samples[0][0] != samples[1][0]
