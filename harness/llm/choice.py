"""The generator a campaign's settings name: its backend made concrete ("auto": vllm where it
is installed), what can be checked before it starts (the library, the API key), and the
generator itself, sampling from the base model. A campaign that trains samples from its
trainer's weights instead (harness/learning/steps.py `trainer_generator`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from harness.config.errors import UserError
from harness.config.settings import DEFAULT_CONCURRENCY, CampaignSettings
from harness.llm import make_generator
from harness.llm.base import Generator


def resolve_backend(config: CampaignSettings) -> CampaignSettings:
    """`config` with backend "auto" made concrete: vllm where it is installed, else
    transformers, saying so in one line on stderr (the stored campaign keeps "auto")."""
    import importlib.util

    if config.backend != "auto":
        return config
    if importlib.util.find_spec("vllm") is not None:
        return dataclasses.replace(config, backend="vllm")
    logging.getLogger(__name__).warning(
        "vpo: vLLM is not installed, so generation uses the slower transformers backend "
        "(make install installs vLLM)"
    )
    return dataclasses.replace(config, backend="transformers")


def check_backend(config: CampaignSettings) -> None:
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


def base_generator(config: CampaignSettings) -> Generator:
    """The generator `config` names, sampling from the base model."""
    config = resolve_backend(config)
    options: dict[str, Any] = {}
    if config.backend == "openai":
        options = {
            "base_url": config.base_url,
            "api_key_env": config.api_key_env,
            "retries": config.retries,
            # Connections to the server: as many as the campaign keeps requests in flight.
            "concurrency": config.concurrency or DEFAULT_CONCURRENCY["openai"],
        }
    elif config.backend == "vllm":
        # The engine's own seed draws every request that names none: without the campaign's,
        # two campaigns that differ only in `seed` sample the same completions.
        options = {"seed": config.seed}
        longest = longest_sequence(config)
        if longest is not None:
            # The engine takes no longer sequence than the campaign sends, and on CPU its KV
            # cache holds what the campaign keeps in flight, not a fixed 4 GiB.
            options |= {"max_model_len": longest, "kv_cache_tokens": kv_cache_tokens(config)}
    return make_generator(config.backend, config.model, **options)


def longest_sequence(config: CampaignSettings) -> int | None:
    """The most tokens, prompt and completion, one sequence of the campaign can take: its
    `context_tokens`, or in a campaign that trains its training length (the prompt budget
    keeps every prompt within it); None when only the model bounds it."""
    limits = [config.context_tokens] if config.context_tokens else []
    if config.training.train_every:
        limits.append(config.sampling().sequence_tokens)
    return min(limits) if limits else None


def kv_cache_tokens(config: CampaignSettings) -> int:
    """The tokens the engine's KV cache must hold for the campaign's iterations in flight: per
    iteration one prompt (its G rollouts share it: prefix caching) and G completions, at the
    longest; never less than one longest sequence."""
    longest = longest_sequence(config)
    assert longest is not None
    in_flight = config.concurrency or DEFAULT_CONCURRENCY["vllm"]
    per_iteration = longest - config.max_tokens + config.group_size * config.max_tokens
    return max(longest, in_flight * per_iteration)
