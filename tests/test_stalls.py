"""No model call can wedge a run: every generator call ends by its wall-clock limit.

A real local server that misbehaves (never answers, stops halfway through its answer, trickles
a byte at a time in its headers or its body) holds no request past `call_timeout`: the attempt
is cut, its connection closed, it is tried `retries + 1` times, and the call fails in one line
naming the limit; a campaign records those iterations as skipped and stops after
`max_failures`. The in-process backends stop between decode steps and stay usable. Every wait
for an outcome is a thread joined with a generous bound: the test asserts that the call ended,
never how fast.
"""

from __future__ import annotations

import json
import math
import select
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import require_vllm
from sqlalchemy import select as query
from sqlalchemy.orm import Session

from harness.cli import main
from harness.config.errors import UserError
from harness.config.settings import IN_PROCESS_CALL_TIMEOUT, SERVER_CALL_TIMEOUT, build
from harness.evolution.generation import loop_settings
from harness.evolution.loop import run_campaign
from harness.llm import GenerationError, Sampling, make_generator
from harness.llm.base import check_request
from harness.llm.openai_backend import OpenAIGenerator
from harness.store import Store
from harness.store.models import RolloutGroup
from problems.circle_packing import CirclePacking

PROMPT = [{"role": "user", "content": "Say hi."}]
MODES = ("silent", "partial", "trickle_headers", "trickle_body")
ENDED = 60.0  # seconds: how long a test waits for a call that should end in a few


class Stalling:
    """A server that lists model "m" and misbehaves on every chat request as `mode` says:
    `silent` never answers, `partial` sends its headers and the start of its body and stops,
    `trickle_headers` and `trickle_body` send a byte every half second forever. It counts the
    requests it saw and the connections their clients closed."""

    def __init__(self) -> None:
        self.mode = "silent"
        self.url = ""
        self.attempts = 0
        self.hangups = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def count(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)

    def settled(self, what: str, expected: int) -> int:
        """The count `what` once it reaches `expected` (its handler threads lag the client),
        or whatever it is after a while."""
        waited = 0.0
        while getattr(self, what) < expected and waited < 10.0:
            time.sleep(0.05)
            waited += 0.05
        return getattr(self, what)


def _handler(server: Stalling) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = json.dumps({"object": "list", "data": [{"id": "m", "owned_by": "x"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            server.count("attempts")
            if server.mode == "silent":
                self._until_hangup()
            elif server.mode == "partial":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"choices": [')
                self.wfile.flush()
                self._until_hangup()
            elif server.mode == "trickle_headers":
                self._trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", b"a")
            else:
                self._trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n[", b" ")

        def _until_hangup(self) -> None:
            """Hold the connection, answering nothing, until the client closes it."""
            while not server.stop.is_set():
                if select.select([self.connection], [], [], 0.1)[0]:
                    try:
                        closed = self.connection.recv(1) == b""
                    except OSError:
                        closed = True
                    if closed:
                        server.count("hangups")
                        return

        def _trickle(self, start: bytes, byte: bytes) -> None:
            try:
                self.wfile.write(start)
                while not server.stop.wait(0.5):
                    self.wfile.write(byte)
                    self.wfile.flush()
            except OSError:  # the client closed the connection
                server.count("hangups")
            self.close_connection = True

    return Handler


@pytest.fixture
def stalling() -> Iterator[Stalling]:
    server = Stalling()
    http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    server.url = f"http://127.0.0.1:{http.server_address[1]}/v1"
    try:
        yield server
    finally:
        server.stop.set()
        http.shutdown()
        http.server_close()
        thread.join()


def ended(call: Callable[[], Any]) -> BaseException | Any:
    """What `call` returned or raised, run in a thread that must end within ENDED seconds."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 - handed to the test to judge
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(ENDED)
    assert not thread.is_alive(), f"the call was still running after {ENDED:g} s"
    return outcome[0]


@pytest.mark.parametrize("mode", MODES)
def test_a_stalled_request_is_cut_at_call_timeout_and_tried_retries_plus_one_times(
    stalling: Stalling, mode: str
) -> None:
    stalling.mode = mode
    generator = OpenAIGenerator("m", base_url=stalling.url, api_key_env="", retries=1, backoff=0.1)
    try:
        error = ended(lambda: generator.generate([PROMPT], 1, Sampling(max_tokens=16, timeout=2)))
    finally:
        generator.close()
    assert isinstance(error, GenerationError) and not error.permanent
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{stalling.url}/chat/completions: 2 attempts failed; the last: ")
    # The second attempt gets what is left of the call's (retries + 1) x call_timeout.
    assert message.endswith(
        "no whole answer by the call's limit, 4 s ((retries + 1) x call_timeout)"
    )
    assert stalling.settled("attempts", 2) == 2
    # Each attempt was cancelled, its connection closed, not left waiting on the server.
    assert stalling.settled("hangups", 2) == 2


def test_call_timeout_0_is_the_backends_default_and_a_campaign_passes_it_on(
    stalling: Stalling, tiny_model: str
) -> None:
    server = OpenAIGenerator("m", base_url=stalling.url, api_key_env="")
    in_process = make_generator("transformers", tiny_model, dtype="float32")
    try:
        for generator, default in (
            (server, SERVER_CALL_TIMEOUT),
            (in_process, IN_PROCESS_CALL_TIMEOUT),
        ):
            assert loop_settings(build(), generator).sampling.timeout == default
            given = build({"call_timeout": 7})
            assert loop_settings(given, generator).sampling.timeout == 7
    finally:
        server.close()
        in_process.close()


def test_without_retries_one_attempt_is_cut(stalling: Stalling) -> None:
    generator = OpenAIGenerator("m", base_url=stalling.url, api_key_env="", retries=0)
    try:
        error = ended(lambda: generator.generate([PROMPT], 2, Sampling(timeout=1)))
    finally:
        generator.close()
    assert isinstance(error, GenerationError)
    assert str(error) == (
        f"{stalling.url}/chat/completions: 1 attempt failed; the last: "
        "no whole answer within 1 s (call_timeout)"
    )
    assert stalling.settled("attempts", 1) == 1


def test_a_campaign_against_a_server_that_never_answers_skips_and_stops(
    stalling: Stalling, tmp_path: Path
) -> None:
    """Through the campaign's own settings and generator: each iteration is skipped with the
    limit as its reason, and max_failures in a row end the campaign instead of a hang."""
    config = build(
        {"backend": "openai", "base_url": stalling.url, "api_key_env": "", "model": "m"},
        {"iterations": 8, "group_size": 2, "candidates": 1, "concurrency": 2},
        {"retries": 0, "call_timeout": 1, "max_failures": 3},
    )

    def run() -> int:
        with Store.open(tmp_path / "c.db") as store:
            return run_campaign(config, store, CirclePacking())

    error = ended(run)
    assert isinstance(error, UserError)
    assert str(error).startswith("4 iterations in a row produced nothing (max_failures 3)")
    assert "no whole answer within 1 s (call_timeout)" in str(error) and "\n" not in str(error)
    with Store.open(tmp_path / "c.db", create=False) as store:
        campaign = store.get_campaign("circle_packing")
        assert campaign is not None and campaign.status == "failed"
        reasons = skipped_reasons(store, campaign.id)
    assert (
        reasons
        == [
            f"generation failed: {stalling.url}/chat/completions: 1 attempt failed; the last: "
            "no whole answer within 1 s (call_timeout)"
        ]
        * 4
    )
    assert stalling.settled("attempts", 4) == 4  # retries 0: one request per iteration


def skipped_reasons(store: Store, campaign_id: int) -> list[str | None]:
    with Session(store.engine) as session:
        return list(
            session.scalars(
                query(RolloutGroup.skipped)
                .where(RolloutGroup.campaign_id == campaign_id)
                .order_by(RolloutGroup.iteration)
            )
        )


def test_transformers_stops_between_decode_steps_and_stays_usable(tiny_model: str) -> None:
    generator = make_generator("transformers", tiny_model, dtype="float32")
    try:
        # A limit no forward pass can meet: the call stops at its first check, however fast.
        cut = Sampling(max_tokens=4000, timeout=1e-6)
        error = ended(lambda: generator.generate([PROMPT, PROMPT], 2, cut))
        assert isinstance(error, GenerationError)
        assert str(error).startswith("generation stopped at its limit of 1e-06 s (call_timeout)")
        groups = generator.generate([PROMPT], 2, Sampling(max_tokens=4, seed=1))
        assert [len(group) for group in groups] == [2]
    finally:
        generator.close()


def test_vllm_aborts_the_call_between_engine_steps_and_stays_usable(tiny_model: str) -> None:
    require_vllm()
    from harness.llm.vllm_backend import VLLMGenerator

    generator = VLLMGenerator(tiny_model, max_model_len=1024, kv_cache_gib=0.25, dtype="float32")
    try:
        cut = Sampling(max_tokens=512, timeout=1e-6)
        error = ended(lambda: generator.generate([PROMPT, PROMPT], 2, cut))
        assert isinstance(error, GenerationError)
        assert str(error) == (
            "generation stopped at its limit of 1e-06 s (call_timeout), 0 of 2 prompts done"
        )
        # The aborted requests are gone: the next call gets its own completions only.
        assert not generator.engine.llm_engine.has_unfinished_requests()
        groups = generator.generate([PROMPT], 2, Sampling(max_tokens=4, seed=1))
        assert [len(group) for group in groups] == [2]
    finally:
        generator.close()


@pytest.mark.parametrize(
    "value,words",
    [
        (-5, "'call_timeout' must be a whole number of seconds from 0 to 86400"),
        (86401, "'call_timeout' must be a whole number of seconds from 0 to 86400"),
        (1.5, "'call_timeout' must be a whole number, got 1.5"),
        ("ten", "'call_timeout' must be a whole number, got 'ten'"),
    ],
)
def test_bad_call_timeouts_are_refused_in_one_line(value: object, words: str) -> None:
    with pytest.raises(UserError) as info:
        build({"call_timeout": value})
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("flag", ["-1", "100000"])
def test_a_bad_call_timeout_flag_stops_vpo_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, flag: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "circle_packing", "--db", str(tmp_path / "c.db"), "--call-timeout", flag])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'call_timeout' must be a whole number of seconds" in err and err.count("\n") == 1


@pytest.mark.parametrize("timeout", [0.0, -1.0, math.nan])
def test_a_sampling_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be > 0 seconds or None"):
        check_request([PROMPT], 1, Sampling(timeout=timeout))
