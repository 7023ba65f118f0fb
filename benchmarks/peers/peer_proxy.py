"""A token-counting proxy between one harness run and an OpenAI-compatible endpoint.

Every harness of benchmarks/peers.py reaches the model only through one of these, so that all of
them are counted alike, sample alike and stop at the same budget:

- POST .../chat/completions is forwarded with the run's sampling written over the request's
  (temperature, top_p and max_tokens set; `seed` and `max_completion_tokens` removed: a harness
  that sends one fixed seed with every request would get the same completion for the same
  prompt, and the server's own randomness is what every harness should draw from), and the
  reply's usage.completion_tokens is added to the run's spend;
- a chat request that arrives once the spend has reached the budget is answered HTTP 400
  ("token budget spent ...") and never forwarded; one admitted before that is finished, so a
  run overshoots by at most what it had in flight. 400 rather than 429: a client retries a 429;
- every other path (/v1/models, /tokenize, vLLM's LoRA loading routes) is forwarded as it is;
- each chat request is one line of a JSONL log: when it started and ended, its HTTP status,
  its prompt and completion tokens, and the spend after it (`read_calls` reads it back); each
  answered one is also a line of `exchanges.jsonl` beside it, the messages as sent and the
  model's answers, to read what a harness asked for and what the model wrote.

    ledger = Ledger(budget=8000, log=Path("calls.jsonl"))
    with proxy("http://127.0.0.1:8000/v1", ledger, Sampling(0.8, 0.95, 1024)) as url:
        ...  # the harness talks to `url`; ledger.spent, ledger.calls, ledger.in_flight
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

CHARS_PER_TOKEN = 3  # the estimate for a reply without usage (the openai backend's, too)
UPSTREAM_TIMEOUT_S = 1200.0  # a long completion on a CPU; the harness's own timeout cuts first


@dataclass(frozen=True)
class Sampling:
    """What every chat request of every harness is sent with, whatever the harness asked."""

    temperature: float
    top_p: float
    max_tokens: int

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        sent = {k: v for k, v in body.items() if k not in ("seed", "max_completion_tokens")}
        sent.update(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens)
        return sent


class Ledger:
    """What one run spent, written by the proxy's request threads and read by the driver."""

    def __init__(self, budget: int, log: Path) -> None:
        self.budget = budget
        self.log = log
        self.spent = 0  # completion tokens of the answered requests
        self.calls = 0  # chat requests answered by the model (HTTP 200)
        self.failed = 0  # chat requests the model's server refused or failed
        self.refused = 0  # chat requests refused here, the budget being spent
        self.in_flight = 0
        self.last_change = time.time()
        self._lock = threading.Lock()

    @property
    def spent_out(self) -> bool:
        return self.spent >= self.budget

    def admit(self) -> bool:
        """True, counting the request in flight, while the budget is not spent."""
        with self._lock:
            if self.spent_out:
                self.refused += 1
                return False
            self.in_flight += 1
            self.last_change = time.time()
            return True

    def settle(
        self, started: float, status: int, reply: dict[str, Any] | None, sent: dict[str, Any]
    ) -> None:
        """Book a finished request: its tokens when the model answered, one log line, and the
        exchange (what was `sent`, what came back) where the model answered."""
        prompt, completion, estimated = usage_of(reply) if status == 200 else (0, 0, False)
        with self._lock:
            self.in_flight -= 1
            if status == 200:
                self.calls += 1
                self.spent += completion
            else:
                self.failed += 1
            now = self.last_change = time.time()
            line = {
                "start": round(started, 4),
                "end": round(now, 4),
                "status": status,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "estimated": estimated,
                "spent": self.spent,
            }
            with self.log.open("a") as out:
                out.write(json.dumps(line) + "\n")
            if status == 200:
                exchange = {"end": line["end"], "messages": sent.get("messages"),
                            "answers": answers_of(reply)}  # fmt: skip
                with self.log.with_name("exchanges.jsonl").open("a") as out:
                    out.write(json.dumps(exchange) + "\n")

    def refusal(self) -> dict[str, Any]:
        message = (
            f"token budget spent: {self.spent} of {self.budget} completion tokens "
            "(benchmarks/peers.py's proxy); this run is over"
        )
        return {"error": {"message": message, "type": "budget_exhausted", "code": 400}}


def usage_of(reply: dict[str, Any] | None) -> tuple[int, int, bool]:
    """(prompt tokens, completion tokens, estimated): from `usage`, else a character estimate."""
    usage = (reply or {}).get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        prompt = usage.get("prompt_tokens")
        return (prompt if isinstance(prompt, int) else 0), usage["completion_tokens"], False
    texts = answers_of(reply)
    return 0, sum(len(text) // CHARS_PER_TOKEN + 1 for text in texts), True


def answers_of(reply: dict[str, Any] | None) -> list[str]:
    return [
        str((choice.get("message") or {}).get("content") or "")
        for choice in (reply or {}).get("choices") or []
        if isinstance(choice, dict)
    ]


def upstream_root(base_url: str) -> str:
    """The endpoint without its trailing /v1: every path a client asks for is appended to it."""
    parts = urlsplit(base_url.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.path.endswith("/v1"):
        raise ValueError(f"the model's URL must be http(s)://HOST[:PORT]/.../v1, not {base_url!r}")
    return base_url.rstrip("/")[: -len("/v1")]


@contextmanager
def proxy(
    upstream: str, ledger: Ledger, sampling: Sampling, api_key: str | None = None
) -> Iterator[str]:
    """Serve on 127.0.0.1 for as long as the block runs; yields the base URL (ending /v1).

    `api_key`, when given, is what the upstream is sent; otherwise the client's own
    Authorization header goes through."""
    root = upstream_root(upstream)
    client = httpx.Client(timeout=httpx.Timeout(UPSTREAM_TIMEOUT_S, connect=10.0))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._forward("GET", None)

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._forward("POST", data)
                return
            try:
                body = json.loads(data)
            except ValueError:
                self._send(400, {"error": {"message": "the request is not JSON"}})
                return
            if body.get("stream"):
                self._send(400, {"error": {"message": "this proxy does not stream; send it "
                                           "with stream false"}})  # fmt: skip
                return
            if not ledger.admit():
                self._send(400, ledger.refusal())
                return
            started, status, reply, sent = time.time(), 502, None, sampling.apply(body)
            try:
                status, raw = self._upstream("POST", json.dumps(sent).encode())
                reply = json.loads(raw) if status == 200 else None
                self._send_raw(status, raw)
            except (httpx.HTTPError, ValueError) as error:
                self._send(502, {"error": {"message": f"the model's server: {error}"}})
            finally:
                ledger.settle(started, status, reply, sent)

        def _forward(self, method: str, data: bytes | None) -> None:
            try:
                status, raw = self._upstream(method, data)
            except httpx.HTTPError as error:
                self._send(502, {"error": {"message": f"the model's server: {error}"}})
                return
            self._send_raw(status, raw)

        def _upstream(self, method: str, data: bytes | None) -> tuple[int, bytes]:
            headers = {"Content-Type": "application/json"}
            auth = f"Bearer {api_key}" if api_key else self.headers.get("Authorization")
            if auth:
                headers["Authorization"] = auth
            response = client.request(method, root + self.path, content=data, headers=headers)
            return response.status_code, response.content

        def _send(self, status: int, body: dict[str, Any]) -> None:
            self._send_raw(status, json.dumps(body).encode())

        def _send_raw(self, status: int, raw: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        client.close()


def read_calls(log: Path) -> list[dict[str, Any]]:
    """The proxy's log of one run, in the order the requests ended."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
