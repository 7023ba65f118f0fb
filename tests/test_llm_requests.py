"""The openai backend's requests against a real local HTTP server that answers as scripted: which
failures are sent again and after how long, which are final, and what the server says about the
model's context and a prompt's tokens. Waits are recorded, never slept.
"""

from __future__ import annotations

import email.utils
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.llm import GenerationError, Sampling
from harness.llm.base import UNMODELLED_OFF
from harness.llm.openai_backend import OpenAIGenerator, estimate_tokens
from harness.llm.timed_client import BACKOFF_CAP, RETRY_AFTER_CAP, backoff_delay, retry_after

PROMPT = [{"role": "user", "content": "Say hi."}]
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}


@dataclass
class Reply:
    status: int = 200
    payload: dict[str, Any] = field(default_factory=lambda: ANSWER)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Endpoint:
    """A server's script: the replies to POSTs in order (then 200 with one choice), the model
    list it serves, and every POST it received as (path, body); `stop` closes its port."""

    url: str = ""
    stop: Callable[[], None] = lambda: None
    replies: list[Reply] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "m", "owned_by": "x"}])
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    clients: list[OpenAIGenerator] = field(default_factory=list)


def _handler(endpoint: Endpoint) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply(Reply(payload={"object": "list", "data": endpoint.models}))

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            endpoint.requests.append((self.path, body))
            self._reply(endpoint.replies.pop(0) if endpoint.replies else Reply())

        def _reply(self, reply: Reply) -> None:
            data = json.dumps(reply.payload).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    endpoint = Endpoint()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(endpoint))
    server.block_on_close = False
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    endpoint.url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    def stop() -> None:
        server.shutdown()  # returns at once when it already has
        server.server_close()

    endpoint.stop = stop
    try:
        yield endpoint
    finally:
        for generator in endpoint.clients:
            generator.close()
        stop()


@pytest.fixture
def waits() -> list[float]:
    return []


def client(endpoint: Endpoint, waits: list[float], **options: Any) -> OpenAIGenerator:
    """A generator of model "m" on `endpoint` that records its waits in `waits`."""
    generator = OpenAIGenerator(
        "m", base_url=endpoint.url, api_key_env="", sleep=waits.append, **options
    )
    endpoint.clients.append(generator)
    return generator


def error(status: int, message: str, **headers: str) -> Reply:
    return Reply(status, {"error": {"message": message, "code": status}}, headers)


def chats(endpoint: Endpoint) -> int:
    return sum(path == "/v1/chat/completions" for path, _ in endpoint.requests)


def test_a_429_waits_as_long_as_retry_after_says(endpoint: Endpoint, waits: list[float]) -> None:
    endpoint.replies = [error(429, "slow down", **{"Retry-After": "2"})]
    generator = client(endpoint, waits)
    assert generator.generate([PROMPT], 1, Sampling())[0][0].text == "hi"
    assert waits == [2.0] and chats(endpoint) == 2


def test_503_three_times_then_an_answer(endpoint: Endpoint, waits: list[float]) -> None:
    endpoint.replies = [error(503, "model is loading") for _ in range(3)]
    generator = client(endpoint, waits, backoff=0.5)
    assert generator.generate([PROMPT], 1, Sampling())[0][0].text == "hi"
    assert chats(endpoint) == 4
    # No Retry-After: the backoff's own waits, each within its jitter's bound.
    assert len(waits) == 3 and all(0 <= w <= 0.5 * 2**k for k, w in enumerate(waits))


@pytest.mark.parametrize("status", [408, 500, 502, 504])
def test_timeouts_and_server_errors_are_sent_again(
    endpoint: Endpoint, waits: list[float], status: int
) -> None:
    endpoint.replies = [error(status, "try again")]
    assert client(endpoint, waits).generate([PROMPT], 1, Sampling())[0][0].text == "hi"
    assert chats(endpoint) == 2 and len(waits) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_any_other_4xx_is_final_after_one_request(
    endpoint: Endpoint, waits: list[float], status: int
) -> None:
    endpoint.replies = [error(status, "temperature must be positive\nat line 3")]
    generator = client(endpoint, waits)
    with pytest.raises(GenerationError) as caught:
        generator.generate([PROMPT], 1, Sampling())
    assert caught.value.permanent
    assert str(caught.value) == (
        f"{endpoint.url}/chat/completions refused the request, HTTP {status}: "
        "temperature must be positive"
    )
    assert chats(endpoint) == 1 and waits == []


@pytest.mark.parametrize(
    "message",
    [  # vLLM 0.32's words, then llama.cpp's
        "This model's maximum context length is 2048 tokens. However, your prompt contains "
        "3000 input tokens, which exceeds this limit even without any output tokens.",
        "The decoder prompt (length 3000) is longer than the maximum model length of 2048.",
        "the request exceeds the available context size, try increasing it",
    ],
)
def test_a_prompt_longer_than_the_context_is_final_and_says_so(
    endpoint: Endpoint, waits: list[float], message: str
) -> None:
    endpoint.replies = [error(400, message)]
    with pytest.raises(GenerationError) as caught:
        client(endpoint, waits).generate([PROMPT], 1, Sampling(max_tokens=64))
    assert caught.value.permanent
    assert str(caught.value) == (
        "the prompt is too long for the model's context (max_tokens 64 included); "
        f"{endpoint.url}/chat/completions answered HTTP 400: {message}"
    )
    assert chats(endpoint) == 1 and waits == []


def test_when_retries_run_out_the_error_names_the_attempts(
    endpoint: Endpoint, waits: list[float]
) -> None:
    endpoint.replies = [error(500, f"broken {k}") for k in range(10)]
    generator = client(endpoint, waits, retries=2)
    with pytest.raises(GenerationError) as caught:
        generator.generate([PROMPT], 1, Sampling())
    assert not caught.value.permanent
    assert str(caught.value) == (
        f"{endpoint.url}/chat/completions: 3 attempts failed; the last: HTTP 500: broken 2"
    )
    assert chats(endpoint) == 3 and len(waits) == 2  # no wait after the last attempt


def test_retry_after_as_an_http_date(endpoint: Endpoint, waits: list[float]) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    endpoint.replies = [
        error(503, "busy", **{"Retry-After": email.utils.format_datetime(when, usegmt=True)}),
        error(429, "busy", **{"Retry-After": "3600"}),  # an hour: held to the cap
    ]
    assert client(endpoint, waits).generate([PROMPT], 1, Sampling())[0][0].text == "hi"
    # The date has whole seconds and a moment passes before it is read.
    assert 28 <= waits[0] <= 30 and waits[1] == RETRY_AFTER_CAP


def test_retry_after_reads_seconds_and_dates() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after("7", now) == 7.0
    assert retry_after(" 1.5 ", now) == 1.5
    assert retry_after("Wed, 01 Jan 2025 12:00:45 GMT", now) == 45.0
    assert retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now) == 0.0  # already past
    assert retry_after("100000", now) == RETRY_AFTER_CAP
    assert retry_after("-4", now) == 0.0
    for unreadable in (None, "", "soon", "nan", "inf"):
        assert retry_after(unreadable, now) is None  # the backoff's own wait instead


def test_a_refused_connection_is_retried_then_not_permanent(
    endpoint: Endpoint, waits: list[float]
) -> None:
    generator = client(endpoint, waits, retries=3)  # the model check finds the server up
    endpoint.stop()  # now the port is closed: every request is refused
    with pytest.raises(
        GenerationError, match="4 attempts failed; the last: ConnectError"
    ) as caught:
        generator.generate([PROMPT], 1, Sampling())
    assert not caught.value.permanent and len(waits) == 3


def test_backoff_doubles_up_to_the_cap() -> None:
    def highest(low: float, high: float) -> float:
        return high

    delays = [backoff_delay(attempt, 1.0, highest) for attempt in range(9)]
    assert delays == [1, 2, 4, 8, 16, 32, BACKOFF_CAP, BACKOFF_CAP, BACKOFF_CAP]
    assert backoff_delay(10_000, 1.0, highest) == BACKOFF_CAP  # no overflow however long


@given(st.integers(0, 200), st.floats(0, 100))
def test_backoff_is_jittered_within_its_bound(attempt: int, base: float) -> None:
    assert 0 <= backoff_delay(attempt, base) <= min(BACKOFF_CAP, base * 2.0 ** min(attempt, 64))


def test_the_waits_of_one_request_grow_and_stay_under_the_cap(
    endpoint: Endpoint, waits: list[float]
) -> None:
    endpoint.replies = [error(502, "bad gateway") for _ in range(9)]
    generator = client(endpoint, waits, retries=8, backoff=4.0)
    with pytest.raises(GenerationError, match="9 attempts failed"):
        generator.generate([PROMPT], 1, Sampling())
    # Each wait is drawn from [0, bound], the bound doubling from 4 s until it reaches the cap.
    bounds = [min(BACKOFF_CAP, 4.0 * 2**k) for k in range(8)]
    assert bounds == [4, 8, 16, 32, 60, 60, 60, 60]
    assert all(0 <= w <= bound for w, bound in zip(waits, bounds, strict=True))


def test_context_tokens_come_from_the_model_list(endpoint: Endpoint, waits: list[float]) -> None:
    assert client(endpoint, waits).context_tokens() is None  # the server does not say
    endpoint.models = [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]
    assert client(endpoint, waits).context_tokens() == 4096
    assert client(endpoint, waits, context_tokens=1000).context_tokens() == 1000


def test_count_tokens_asks_a_vllm_server(endpoint: Endpoint, waits: list[float]) -> None:
    endpoint.models = [{"id": "m", "owned_by": "vllm", "max_model_len": 4096}]
    generator = client(endpoint, waits)
    endpoint.replies = [Reply(payload={"count": 17, "max_model_len": 4096, "tokens": [1] * 17})]
    assert generator.count_tokens(PROMPT) == 17
    # On the server's root, not under /v1, with the generation prompt as a request has it.
    assert endpoint.requests == [
        ("/tokenize", {"model": "m", "messages": PROMPT, "add_generation_prompt": True})
    ]
    # A failure there falls back to the estimate, and asks again next time.
    endpoint.replies = [error(500, "oops"), Reply(payload={"count": 9})]
    assert generator.count_tokens(PROMPT) == estimate_tokens(PROMPT)
    assert generator.count_tokens(PROMPT) == 9


def test_count_tokens_estimates_elsewhere(endpoint: Endpoint, waits: list[float]) -> None:
    generator = client(endpoint, waits)  # not a vLLM server: nothing to ask
    messages = [{"role": "system", "content": "x" * 10}, {"role": "user", "content": "y" * 20}]
    assert generator.count_tokens(messages) == 10 + 2 * 4  # 30 characters / 3, and 4 a message
    assert endpoint.requests == []
    # A vLLM server without the route is not asked again.
    endpoint.models = [{"id": "m", "owned_by": "vllm"}]
    generator = client(endpoint, waits)
    endpoint.replies = [error(404, "Not Found")]
    assert generator.count_tokens(messages) == generator.count_tokens(messages) == 18
    assert len(endpoint.requests) == 1


def test_a_vllm_server_is_sent_every_sampling_knob_the_trainer_does_not_model_off(
    endpoint: Endpoint, waits: list[float]
) -> None:
    """A field left out is filled in from the model's generation_config.json (Qwen2.5: top_k 20,
    repetition_penalty 1.05), and the trainer's ratio would be off on every token."""
    endpoint.models = [{"id": "m", "owned_by": "vllm"}]
    client(endpoint, waits).generate([PROMPT], 1, Sampling(temperature=0.7, top_p=0.9))
    (_, body), *_ = endpoint.requests
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert {knob: body[knob] for knob in UNMODELLED_OFF} == {
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }


def test_another_server_gets_only_the_knobs_of_openais_api(
    endpoint: Endpoint, waits: list[float]
) -> None:
    client(endpoint, waits).generate([PROMPT], 1, Sampling())  # owned_by "x": not vLLM
    (_, body), *_ = endpoint.requests
    assert body["presence_penalty"] == 0.0 and body["frequency_penalty"] == 0.0
    assert not {"top_k", "min_p", "repetition_penalty"} & set(body)


def test_a_top_k_the_campaign_sets_is_sent_to_any_server(
    endpoint: Endpoint, waits: list[float]
) -> None:
    """vLLM's server takes top_k as an extra field; another server gets it only when set."""
    endpoint.models = [{"id": "m", "owned_by": "vllm"}]
    client(endpoint, waits).generate([PROMPT], 1, Sampling(top_p=1.0, top_k=40))
    (_, body), *_ = endpoint.requests
    assert body["top_k"] == 40 and body["top_p"] == 1.0 and body["min_p"] == 0.0
    endpoint.models = [{"id": "m", "owned_by": "x"}]
    endpoint.requests.clear()
    client(endpoint, waits).generate([PROMPT], 1, Sampling(top_k=40))
    (_, body), *_ = endpoint.requests
    assert body["top_k"] == 40 and "min_p" not in body


def test_an_opened_answer_is_continued_by_vllm_and_dropped_elsewhere(
    endpoint: Endpoint, waits: list[float]
) -> None:
    """A prompt ending in the assistant's opening: vLLM's server is asked to continue it and
    the text starts with it; a server that takes no prefill is asked without it."""
    opened = [*PROMPT, {"role": "assistant", "content": "<candidate_1>"}]
    endpoint.models = [{"id": "m", "owned_by": "vllm"}]
    [[completion]] = client(endpoint, waits).generate([opened], 1, Sampling())
    (_, body), *_ = endpoint.requests
    assert body["messages"] == opened
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert completion.text.startswith("<candidate_1>")
    endpoint.models = [{"id": "m", "owned_by": "x"}]
    endpoint.requests.clear()
    [[completion]] = client(endpoint, waits).generate([opened], 1, Sampling())
    (_, body), *_ = endpoint.requests
    assert body["messages"] == list(PROMPT) and "continue_final_message" not in body
    assert not completion.text.startswith("<candidate_1>")


@pytest.mark.parametrize("top_k", [-1, 2.5, True])
def test_a_bad_top_k_is_refused_before_any_request(
    endpoint: Endpoint, waits: list[float], top_k: Any
) -> None:
    with pytest.raises(ValueError, match="top_k must be a whole number >= 0 \\(0: off\\)"):
        client(endpoint, waits).generate([PROMPT], 1, Sampling(top_k=top_k))
    assert chats(endpoint) == 0


def test_extra_body_still_sets_a_knob(endpoint: Endpoint, waits: list[float]) -> None:
    """What a user asks for in extra_body is sent (the trainer's fresh-gap guard then sees a
    sampler it does not model)."""
    endpoint.models = [{"id": "m", "owned_by": "vllm"}]
    generator = client(endpoint, waits, extra_body={"repetition_penalty": 1.05})
    generator.generate([PROMPT], 1, Sampling())
    (_, body), *_ = endpoint.requests
    assert body["repetition_penalty"] == 1.05 and body["top_k"] == -1


def test_is_not_in_process() -> None:
    assert OpenAIGenerator.in_process is False
