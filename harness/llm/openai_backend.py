"""Any OpenAI-compatible chat endpoint: `vllm serve`, a llama.cpp server, a hosted API.

The key is read from an environment variable at start-up and kept only in the HTTP client's
headers; it is never written anywhere. Token ids come back only from vLLM servers (which are
asked for them); log-probs come back where the server gives them. For the sampling log-probs an
RL step needs, start vLLM with the flags in SERVER_FLAGS (docs/scale.md's recipe): log-probs of
the distribution each token was drawn from, and no sampling defaults from the model's
generation_config.json. Each request also sets every sampling knob the trainer does not model
to off (`UNMODELLED_OFF`: top_k, min_p and the penalties; a server that is not vLLM gets only
the penalties, the fields of OpenAI's own API), so a server started otherwise samples right
too; a top_k the campaign sets is sent as it is. `extra_body` can still set them, and then the
trainer's fresh-gap guard sees the mismatch.

A vLLM server started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` also
takes LoRA adapters at run time (`load_weights`, `load_adapter`): each policy version of a
campaign becomes an adapter named after it, sampled from by name, so a server shared by many
workers follows the trainer without a restart.

Each chat request retries on its own: connection errors, timeouts, HTTP 408, 429 and 5xx are sent
again after a backoff with full jitter (or after the server's Retry-After on 429 and 503); any
other 4xx is final at once, and so is a prompt longer than the model's context. An attempt is cut
at `Sampling.timeout` seconds, the call at `retries + 1` times that (harness/llm/timed_client.py).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from harness.config.errors import Unreachable, UserError
from harness.llm.base import (
    UNMODELLED_OFF,
    Completion,
    GenerationError,
    Message,
    Sampling,
    Weights,
    answer_start,
    check_request,
)
from harness.llm.timed_client import (
    CallLimit,
    TimedClient,
    backoff_delay,
    retry_after,
)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
# How servers say a prompt does not fit the model: vLLM ("maximum context length", "longer than
# the maximum model length"), llama.cpp ("exceeds the available context size"), OpenAI
# ("context_length_exceeded"), others ("context window", "too many tokens").
_TOO_LONG = re.compile(
    r"context length|maximum model length|context size|context window|too many tokens"
    r"|prompt is too long",
    re.IGNORECASE,
)
# What `vllm serve` needs beside its model, GPUs and LoRA flags so that the log-probs it returns
# are those of the distribution the trainer models (docs/scale.md's recipe has them, and
# tests/test_server_sampling.py runs that recipe): each sampled token's log-prob after
# temperature, top-k and top-p (the default, raw_logprobs, is of the untempered, uncut model),
# and neutral sampling defaults instead of the model's generation_config.json.
SERVER_FLAGS = ("--logprobs-mode", "processed_logprobs", "--generation-config", "vllm")
# The knobs of UNMODELLED_OFF that OpenAI's own API takes; the others are vLLM's.
OPENAI_KNOBS = ("presence_penalty", "frequency_penalty")
CHARS_PER_TOKEN = 3  # the estimate where no tokenizer can be asked; errs towards more tokens
TOKENS_PER_MESSAGE = 4  # role markers and separators a chat template adds to each message


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The Authorization header from the key in $`api_key_env` (none when that is None or "");
    a UserError when the variable is not set. A campaign checks this before it starts."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise UserError(
            f"the openai backend reads its API key from ${api_key_env}, which is not set; "
            "set it, or pass an empty api_key_env for a server without a key"
        )
    return {"Authorization": f"Bearer {key}"}


class OpenAIGenerator:
    backend = "openai"
    in_process = False  # each prompt is its own request; the campaign sends them concurrently

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
        retries: int = 4,
        backoff: float = 1.0,
        context_tokens: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Talk to `model` at `base_url` (default $OPENAI_BASE_URL, else OpenAI's API).

        `api_key_env` names the variable that holds the key; None or "" for a server without
        one. `concurrency` prompts are in flight at once (in one `generate` call); `extra_body`
        is merged into every request (server-specific sampling options, a LoRA adapter's name
        as `model`, ...). A chat request that fails for a reason that may pass is sent up to
        `retries` more times, waiting about `backoff` seconds, doubling each time (`sleep`
        waits; tests record instead). `context_tokens` overrides the context length the server
        reports (vLLM's `max_model_len`).
        """
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self.concurrency = max(1, concurrency)
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        self.retries = max(0, retries)
        self.backoff = max(0.0, backoff)
        self.sleep = sleep
        # The adapter sampled from (None: the base model), and every adapter this client loaded,
        # by name, with the folder the server reads it from.
        self.adapter: str | None = None
        self.adapters: dict[str, str] = {}
        headers = auth_headers(api_key_env)
        per_read = httpx.Timeout(timeout, connect=10.0)  # a wait for a byte; see TimedClient
        self.client = httpx.Client(  # the model list, tokens and adapters
            base_url=self.base_url,
            headers=headers,
            timeout=per_read,
            limits=httpx.Limits(max_connections=self.concurrency),
        )
        entry = self._check_server()
        # Who serves the model ("vllm", "llamacpp", "openai", ... or "" when unknown).
        self.server = str(entry.get("owned_by") or "")
        served_context = entry.get("max_model_len")
        if context_tokens is None and isinstance(served_context, int) and served_context > 0:
            context_tokens = served_context
        self.context = context_tokens
        self.tokenize = self.server == "vllm"  # until the server says it has no /tokenize
        self.chats = TimedClient(self.base_url, headers, per_read, self.concurrency)

    def _check_server(self) -> dict[str, Any]:
        """Fail now, with a user error, if the endpoint is unreachable, refuses the key or does
        not serve the model; returns the model's entry in the server's list ({} when none)."""
        try:
            response = self.client.get("/models", timeout=10.0)
        except httpx.HTTPError as error:
            self.client.close()
            # Refused or timed out: it may answer later. A URL it cannot speak to never will.
            down = isinstance(error, httpx.NetworkError | httpx.TimeoutException)
            raise (Unreachable if down else UserError)(
                f"cannot reach {self.base_url} ({_describe(error)}); is the server running?"
            ) from None
        if response.status_code in (401, 403):
            self.client.close()
            raise UserError(
                f"{self.base_url} refused the API key (HTTP {response.status_code}); "
                "check the key in the variable named by api_key_env"
            )
        if response.status_code >= 400:
            return {}  # some servers have no model list; generation will tell
        try:
            models = {entry["id"]: entry for entry in response.json()["data"]}
        except (ValueError, KeyError, TypeError):
            return {}
        if self.model not in models:
            served = ", ".join(sorted(models)[:10]) or "nothing"
            self.client.close()
            raise UserError(
                f"{self.base_url} does not serve model {self.model!r}; it serves {served}"
            )
        return models[self.model]

    def context_tokens(self) -> int | None:
        """The `context_tokens` given, else the `max_model_len` the server listed the model
        with at start-up (vLLM does); None where it said nothing."""
        return self.context

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Exact on a vLLM server, which applies the model's chat template (POST /tokenize on
        its root); elsewhere, or when that fails, an estimate rounded up: a token per three
        characters of content plus a few per message."""
        if self.tokenize:
            try:
                response = self.client.post(
                    f"{_server_root(self.base_url)}/tokenize",
                    json={"model": self.model, "messages": list(messages)}
                    | (
                        {"continue_final_message": True, "add_generation_prompt": False}
                        if answer_start(messages)
                        else {"add_generation_prompt": True}
                    ),
                    timeout=30.0,
                )
                if response.status_code == 404:
                    self.tokenize = False  # a server without the route: do not ask again
                elif response.status_code < 400:
                    return int(response.json()["count"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                pass
        return estimate_tokens(messages)

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        check_request(prompts, n, sampling)
        with ThreadPoolExecutor(min(self.concurrency, len(prompts) or 1)) as pool:
            return list(pool.map(lambda messages: self._complete(messages, n, sampling), prompts))

    def _complete(
        self, messages: Sequence[Message], n: int, sampling: Sampling
    ) -> list[Completion]:
        limit = CallLimit.start(sampling.timeout, self.retries)
        completions: list[Completion] = []
        # An opened answer (`answer_start`): a vLLM server continues it; other servers take no
        # prefill, and are asked without it (their answer is then read as it comes).
        start = answer_start(messages) if self.server == "vllm" else ""
        sent = list(messages[:-1]) if answer_start(messages) and not start else list(messages)
        # Some servers (llama.cpp) answer fewer than n choices; ask again for the rest.
        while len(completions) < n:
            body: dict[str, Any] = {
                "model": self.adapter or self.model,
                "messages": list(sent),
                "n": n - len(completions),
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "max_tokens": sampling.max_tokens,
            }
            # A knob left out is filled in from the model's generation_config.json by a server
            # started without `--generation-config vllm`: set them all off.
            body.update(
                UNMODELLED_OFF
                if self.server == "vllm"
                else {knob: UNMODELLED_OFF[knob] for knob in OPENAI_KNOBS}
            )
            if sampling.top_k:  # an extra field vLLM's server takes; OpenAI's API has none
                body["top_k"] = sampling.top_k
            if sampling.seed is not None:
                body["seed"] = sampling.seed + len(completions)
            if self.logprobs:
                body["logprobs"] = True
            if self.server == "vllm":
                body["return_token_ids"] = True  # a vLLM extension; other servers reject it
            if start:
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            body.update(self.extra_body)
            reply = self._chat(body, limit)
            choices = reply.get("choices") or []
            if not choices:
                raise GenerationError(f"{self.base_url} answered with no choices")
            prompt_ids = reply.get("prompt_token_ids")
            usage = reply.get("usage")
            shares = usage_shares(usage, len(choices))
            prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            prompt = prompt if isinstance(prompt, int) and prompt >= 0 else None
            completions.extend(
                _completion(choice, prompt_ids, share, None if prompt_ids else prompt, start)
                for choice, share in zip(choices, shares, strict=True)
            )
        return completions[:n]

    def _chat(self, body: dict[str, Any], limit: CallLimit | None) -> dict[str, Any]:
        response = self._post_retrying("/chat/completions", body, limit)
        if response.status_code == 404 and self.adapter is not None:
            # Another client sharing the server unloaded our adapter (an older version to it):
            # load it again, so this request still samples from the version it is recorded under.
            self._load(self.adapter, self.adapters[self.adapter])
            response = self._post_retrying("/chat/completions", body, limit)
        where = f"{self.base_url}/chat/completions"
        if response.status_code >= 400:
            message = _server_message(response)
            status = f"HTTP {response.status_code}: {message}"
            if response.status_code == 413 or _TOO_LONG.search(message):
                raise GenerationError(
                    f"the prompt is too long for the model's context (max_tokens "
                    f"{body.get('max_tokens')} included); {where} answered {status}",
                    permanent=True,
                )
            raise GenerationError(f"{where} refused the request, {status}", permanent=True)
        return _json(response, where)

    def _post_retrying(
        self, path: str, body: dict[str, Any], limit: CallLimit | None
    ) -> httpx.Response:
        """The server's answer to POST `path` that retrying cannot change: a success or a 4xx
        other than 408 and 429. Connection errors, timeouts, 408, 429 and 5xx are sent again,
        up to `retries` times, within `limit`; then a GenerationError that may pass."""
        where, last = f"{self.base_url}{path}", ""
        for attempt in range(self.retries + 1):
            wait: float | None = None
            try:
                response = self.chats.post(path, body, limit)
            except TimeoutError as cut:  # the limit's, not httpx's wait for a byte
                last = str(cut)
            except httpx.TransportError as error:  # refused, reset, timed out
                last = _describe(error)
            except httpx.HTTPError as error:
                raise GenerationError(f"{where}: {_describe(error)}") from None
            else:
                status = response.status_code
                if status < 400 or (status < 500 and status not in (408, 429)):
                    return response
                last = f"HTTP {status}: {_server_message(response)}"
                if status in (429, 503):
                    wait = retry_after(response.headers.get("Retry-After"))
            if attempt < self.retries:
                wait = wait if wait is not None else backoff_delay(attempt, self.backoff)
                if limit is not None and wait >= limit.left():
                    last += f"; no time for another in the call's {limit.total:g} s"
                    break
                self.sleep(wait)
        attempts = "1 attempt" if attempt == 0 else f"{attempt + 1} attempts"
        raise GenerationError(f"{where}: {attempts} failed; the last: {last}")

    def _request(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self.client.post(path, json=body)
        except httpx.HTTPError as error:
            raise GenerationError(f"{self.base_url}{path}: {_describe(error)}") from None

    # LoRA adapters on a vLLM server

    def check_adapters(self) -> None:
        """Fail now, with a user error, if the server cannot load LoRA adapters at run time.

        It asks the server to load a folder that does not exist: a server that could load
        adapters answers "not found", one that cannot says why (or has no such route)."""
        response = self._request(
            "/load_lora_adapter",
            {"lora_name": "vpo-probe", "lora_path": "/nonexistent/vpo-evolve-probe"},
        )
        if response.status_code < 400:
            self._request("/unload_lora_adapter", {"lora_name": "vpo-probe"})
            return
        self._refuse_if_unsupported(response)

    def load_weights(self, weights: Weights) -> None:
        """Sample from the policy version `weights` from now on: a server takes it only as a
        LoRA adapter, loaded under the version's name (once, whichever client comes first);
        the versions it supersedes are unloaded."""
        self.load_adapter(weights.name, weights.adapter_folder())
        for name in self.served_adapters():
            if weights.supersedes(name):
                self.unload_adapter(name)

    def load_adapter(self, name: str, path: str) -> None:
        """Sample from the LoRA adapter in folder `path`, served as `name`, from now on.

        The server reads `path` from its own file system. A name the server already serves from
        the same folder is used as it is, so every worker sharing the server can call this; a
        name it serves from another folder is an error (two campaigns of one name)."""
        served = self.served_adapters()
        if name not in served:
            self._load(name, path)
        elif served[name] != path:
            raise UserError(
                f"{self.base_url} already serves an adapter named {name!r} from {served[name]}, "
                f"not {path}; give this campaign another name (--name)"
            )
        self.adapters[name] = path
        self.adapter = name

    def unload_adapter(self, name: str) -> None:
        """Free the server of adapter `name`; one already gone is fine (another client)."""
        response = self._request("/unload_lora_adapter", {"lora_name": name})
        if response.status_code >= 400 and response.status_code != 404:
            raise GenerationError(
                f"{self.base_url} could not unload adapter {name!r} (HTTP "
                f"{response.status_code}): {_server_message(response)}"
            )
        self.adapters.pop(name, None)
        if self.adapter == name:
            self.adapter = None

    def served_adapters(self) -> dict[str, str]:
        """The adapters the server holds now, by name, with the folder each came from."""
        models = _json(self._get("/models"), f"{self.base_url}/models").get("data") or []
        return {
            str(entry["id"]): str(entry.get("root") or "")
            for entry in models
            if isinstance(entry, dict) and entry.get("parent") and "id" in entry
        }

    def _get(self, path: str) -> httpx.Response:
        try:
            return self.client.get(path)
        except httpx.HTTPError as error:
            raise GenerationError(f"{self.base_url}{path}: {_describe(error)}") from None

    def _load(self, name: str, path: str) -> None:
        response = self._request("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if response.status_code < 400 or "already been loaded" in _server_message(response):
            return  # another worker loaded it first
        self._refuse_if_unsupported(response)
        raise UserError(
            f"{self.base_url} could not load adapter {name!r} from {path} (HTTP "
            f"{response.status_code}): {_server_message(response)}; the server reads the "
            "folder from its own file system"
        )

    def _refuse_if_unsupported(self, response: httpx.Response) -> None:
        message = _server_message(response)
        if response.status_code == 404 and message == "Not Found":
            raise UserError(
                f"{self.base_url} does not load LoRA adapters at run time; start vllm serve "
                "with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment and --enable-lora"
            )
        if "enable-lora" in message or "LoRA is not enabled" in message:
            raise UserError(
                f"{self.base_url} has LoRA turned off; start vllm serve with --enable-lora "
                "(and --max-lora-rank at least the policy's rank)"
            )
        if response.status_code >= 500:
            raise GenerationError(
                f"{self.base_url} failed loading an adapter (HTTP {response.status_code}): "
                f"{message}"
            )

    def close(self) -> None:
        self.chats.close()
        self.client.close()


def estimate_tokens(messages: Sequence[Message]) -> int:
    """An upper-leaning guess at a chat prompt's tokens where no tokenizer can be asked."""
    characters = sum(len(message.get("content") or "") for message in messages)
    return -(-characters // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def _server_root(base_url: str) -> str:
    """Where a vLLM server mounts its own routes (/tokenize): the base URL without /v1."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def _json(response: httpx.Response, where: str) -> dict[str, Any]:
    if response.status_code >= 400:
        raise GenerationError(
            f"{where} answered HTTP {response.status_code}: {_server_message(response)}"
        )
    try:
        return response.json()
    except ValueError:
        raise GenerationError(f"{where} answered with invalid JSON") from None


def usage_shares(usage: Any, choices: int) -> list[int | None]:
    """The request's reported completion tokens shared among its choices (whole tokens, the
    rest to the first ones), so that budgets count what a server without token ids made;
    None each where it reported none."""
    total = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        return [None] * choices
    share, rest = divmod(total, choices)
    return [share + (i < rest) for i in range(choices)]


def _completion(
    choice: dict[str, Any],
    prompt_ids: list[int] | None,
    reported: int | None = None,
    reported_prompt: int | None = None,
    start: str = "",
) -> Completion:
    entries = (choice.get("logprobs") or {}).get("content")
    logprobs = tuple(float(entry["logprob"]) for entry in entries) if entries else None
    token_ids = tuple(choice.get("token_ids") or ())
    return Completion(
        text=start + ((choice.get("message") or {}).get("content") or ""),
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        prompt_token_ids=tuple(prompt_ids) if prompt_ids else None,
        reported_tokens=None if token_ids else reported,
        reported_prompt_tokens=reported_prompt,
    )


def _describe(error: httpx.HTTPError) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _server_message(response: httpx.Response) -> str:
    """The error text a server put in its body, on one line."""
    try:
        payload = response.json()
        error = payload.get("error", payload) if isinstance(payload, dict) else payload
        if isinstance(error, dict):  # {"error": {"message": ...}}, or FastAPI's {"detail": ...}
            message = error.get("message") or error.get("detail") or error
        else:
            message = error
    except ValueError:
        message = response.text
    lines = str(message).strip().splitlines()
    return lines[0][:300] if lines else response.reason_phrase
