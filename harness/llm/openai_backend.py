"""Any OpenAI-compatible chat endpoint: `vllm serve`, a llama.cpp server, a hosted API.

The key is read from an environment variable at start-up and kept only in the HTTP client's
headers; it is never written anywhere. Token ids come back only from vLLM servers (which are
asked for them); log-probs come back where the server gives them. For the sampling log-probs an
RL step needs, start vLLM with `--logprobs-mode processed_logprobs`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from harness.errors import UserError
from harness.llm.base import Completion, GenerationError, Message, Sampling, check_request

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIGenerator:
    backend = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 600.0,
        concurrency: int = 8,
        logprobs: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        """Talk to `model` at `base_url` (default $OPENAI_BASE_URL, else OpenAI's API).

        `api_key_env` names the variable that holds the key; None or "" for a server without
        one. `concurrency` prompts are in flight at once; `extra_body` is merged into every
        request (server-specific sampling options, a LoRA adapter's name as `model`, ...).
        """
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.concurrency = max(1, concurrency)
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise UserError(
                    f"the openai backend reads its API key from ${api_key_env}, which is not set; "
                    "set it, or pass an empty api_key_env for a server without a key"
                )
            headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        self.server = self._check_server()

    def _check_server(self) -> str:
        """Fail now, with a user error, if the endpoint is unreachable, refuses the key or does
        not serve the model; returns who serves it ("vllm", "llamacpp", "openai", ... or "")."""
        try:
            response = self.client.get("/models", timeout=10.0)
        except httpx.HTTPError as error:
            self.client.close()
            raise UserError(
                f"cannot reach {self.base_url} ({_describe(error)}); is the server running?"
            ) from None
        if response.status_code in (401, 403):
            self.client.close()
            raise UserError(
                f"{self.base_url} refused the API key (HTTP {response.status_code}); "
                "check the key in the variable named by api_key_env"
            )
        if response.status_code >= 400:
            return ""  # some servers have no model list; generation will tell
        try:
            models = {entry["id"]: entry.get("owned_by", "") for entry in response.json()["data"]}
        except (ValueError, KeyError, TypeError):
            return ""
        if self.model not in models:
            served = ", ".join(sorted(models)[:10]) or "nothing"
            self.client.close()
            raise UserError(
                f"{self.base_url} does not serve model {self.model!r}; it serves {served}"
            )
        return str(models[self.model])

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        check_request(prompts, n, sampling)
        with ThreadPoolExecutor(min(self.concurrency, len(prompts) or 1)) as pool:
            return list(pool.map(lambda messages: self._complete(messages, n, sampling), prompts))

    def _complete(
        self, messages: Sequence[Message], n: int, sampling: Sampling
    ) -> list[Completion]:
        completions: list[Completion] = []
        # Some servers (llama.cpp) answer fewer than n choices; ask again for the rest.
        while len(completions) < n:
            body: dict[str, Any] = {
                "model": self.model,
                "messages": list(messages),
                "n": n - len(completions),
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens,
            }
            if sampling.seed is not None:
                body["seed"] = sampling.seed + len(completions)
            if self.logprobs:
                body["logprobs"] = True
            if self.server == "vllm":
                body["return_token_ids"] = True  # a vLLM extension; other servers reject it
            body.update(self.extra_body)
            reply = self._post("/chat/completions", body)
            choices = reply.get("choices") or []
            if not choices:
                raise GenerationError(f"{self.base_url} answered with no choices")
            prompt_ids = reply.get("prompt_token_ids")
            completions.extend(_completion(choice, prompt_ids) for choice in choices)
        return completions[:n]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as error:
            raise GenerationError(f"{self.base_url}{path}: {_describe(error)}") from None
        if response.status_code >= 400:
            raise GenerationError(
                f"{self.base_url}{path} answered HTTP {response.status_code}: "
                f"{_server_message(response)}"
            )
        try:
            return response.json()
        except ValueError:
            raise GenerationError(f"{self.base_url}{path} answered with invalid JSON") from None

    def close(self) -> None:
        self.client.close()


def _completion(choice: dict[str, Any], prompt_ids: list[int] | None) -> Completion:
    entries = (choice.get("logprobs") or {}).get("content")
    logprobs = tuple(float(entry["logprob"]) for entry in entries) if entries else None
    token_ids = tuple(choice.get("token_ids") or ())
    return Completion(
        text=(choice.get("message") or {}).get("content") or "",
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        prompt_token_ids=tuple(prompt_ids) if prompt_ids else None,
    )


def _describe(error: httpx.HTTPError) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _server_message(response: httpx.Response) -> str:
    """The error text a server put in its body, on one line."""
    try:
        payload = response.json()
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        message = error.get("message", error) if isinstance(error, dict) else error
    except ValueError:
        message = response.text
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else response.reason_phrase
