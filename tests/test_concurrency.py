"""Many iterations in flight: batched generation, skipped iterations with their reasons, the
campaign that stops after too many in a row, and a run killed with eight in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import campaign_invariants, check_invariants
from sqlalchemy import select
from sqlalchemy.orm import Session

from harness.config.errors import UserError
from harness.config.settings import build
from harness.evolution.loop import run_campaign
from harness.llm import Completion, Message, Sampling, Weights, make_generator
from harness.llm.choice import base_generator
from harness.store import Store
from harness.store.models import RolloutGroup
from problems.circle_packing import CirclePacking


class Recording:
    """A real generator whose calls are counted: how many prompts each generate call got."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.backend, self.model, self.in_process = inner.backend, inner.model, inner.in_process
        self.calls: list[int] = []

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        self.calls.append(len(prompts))
        return self.inner.generate(prompts, n, sampling)

    def context_tokens(self) -> int | None:
        return self.inner.context_tokens()

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.inner.count_tokens(messages)

    def load_weights(self, weights: Weights) -> None:
        self.inner.load_weights(weights)

    def close(self) -> None:
        self.inner.close()


def groups_of(store: Store, campaign_id: int) -> list[RolloutGroup]:
    with Session(store.engine) as session:
        return list(
            session.scalars(
                select(RolloutGroup)
                .where(RolloutGroup.campaign_id == campaign_id)
                .order_by(RolloutGroup.iteration)
            )
        )


def test_an_in_process_backend_gets_the_prompts_of_a_batch_in_one_call(
    tiny_model: str, tmp_path: Path
) -> None:
    config = build(
        {"model": tiny_model, "iterations": 6, "group_size": 2, "max_tokens": 24},
        {"concurrency": 4, "candidates": 2},
    )
    generator = Recording(make_generator("transformers", tiny_model))
    with Store.open(tmp_path / "c.db") as store:
        campaign_id = run_campaign(config, store, CirclePacking(), generator=generator)
        campaign_invariants(store, campaign_id, 6, 2, 2)
        groups = groups_of(store, campaign_id)
    assert generator.calls == [4, 2]
    # Iterations 0-3 were chosen before any was stored (the seed and its copies on the other
    # three islands: programs 1-4); 4 and 5 after the first batch.
    assert {g.population["upto"] for g in groups[:4]} == {4}
    assert all(g.skipped is None for g in groups)


def test_a_prompt_that_cannot_fit_skips_its_iteration_and_too_many_stop_the_run(
    tiny_model: str, tmp_path: Path
) -> None:
    db = tmp_path / "c.db"
    command = [
        sys.executable, "-m", "harness.cli", "run", "circle_packing", "--db", str(db),
        "--model", tiny_model, "--backend", "transformers", "--iterations", "10",
        "--group-size", "2", "--max-tokens", "32", "--context-tokens", "400",
        "--max-failures", "3",
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]  # the campaign failed
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith("vpo: error: 3 iterations in a row produced nothing (max_failures 3)")
    assert "prompt too long: the prompt needs" in error and "budget is 368" in error
    with Store.open(db, create=False) as store:
        campaign = store.get_campaign("circle_packing")
        assert campaign is not None and campaign.status == "failed"
        groups = groups_of(store, campaign.id)
        campaign_invariants(store, campaign.id, 3, 2, 3)
    assert [g.iteration for g in groups] == [0, 1, 2]
    assert all(g.skipped and g.skipped.startswith("prompt too long") for g in groups)
    # `vpo db stats` counts them and shows why.
    stats = subprocess.run(
        [sys.executable, "-m", "harness.cli", "db", "stats", "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = json.loads(stats.stdout)
    assert report["skipped"] == 3 and report["groups"] == 3
    assert [s["iteration"] for s in report["last_skipped"]] == [2, 1, 0]
    assert report["last_skipped"][0]["reason"] == groups[2].skipped


class Script:
    """An OpenAI-compatible server whose first `failures` chat requests fail with `status`."""

    def __init__(self, failures: int, status: int = 500, message: str = "overloaded") -> None:
        self.failures, self.status, self.message = failures, status, message
        self.requests = 0
        self.lock = threading.Lock()


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    script = Script(0)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            model = {"id": "m", "object": "model", "owned_by": "scripted", "max_model_len": 8192}
            self._send(200, {"object": "list", "data": [model]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self.path.endswith("/chat/completions"):
                self._send(404, {"error": {"message": "Not Found"}})
                return
            with script.lock:
                script.requests += 1
                fail = script.requests <= script.failures
            if fail:
                self._send(script.status, {"error": {"message": script.message}})
                return
            text = "<candidate_1>\n```python\ndef construct_packing(n):\n    return []\n```\n"
            choices = [
                {"index": i, "message": {"role": "assistant", "content": text + str(i)},
                 "finish_reason": "stop"}
                for i in range(body.get("n", 1))
            ]  # fmt: skip
            self._send(200, {"choices": choices})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", script
    finally:
        server.shutdown()
        server.server_close()


def server_config(url: str, **changes: Any) -> Any:
    settings = {
        "backend": "openai", "base_url": url, "api_key_env": "", "model": "m",
        "iterations": 8, "group_size": 2, "candidates": 1, "retries": 0, "concurrency": 4,
    }  # fmt: skip
    return build(settings, changes)


def test_failed_requests_skip_their_iterations_and_the_campaign_goes_on(
    scripted: tuple[str, Script], tmp_path: Path
) -> None:
    url, script = scripted
    script.failures = 3
    config = server_config(url)
    generator = Recording(base_generator(config))
    with Store.open(tmp_path / "c.db") as store:
        campaign_id = run_campaign(config, store, CirclePacking(), generator=generator)
        groups = groups_of(store, campaign_id)
        assert store.get_campaign("circle_packing").status == "finished"  # type: ignore[union-attr]
    # One request per prompt, all of a batch at once; each failure costs only its iteration.
    assert generator.calls == [1] * 8 and script.requests == 8
    skipped = [g for g in groups if g.skipped]
    assert len(groups) == 8 and len(skipped) == 3
    assert all("HTTP 500" in g.skipped and "overloaded" in g.skipped for g in skipped)  # type: ignore[operator]
    assert all(g.population is not None for g in groups)


def test_a_refused_request_is_final_and_too_many_in_a_row_stop_the_campaign(
    scripted: tuple[str, Script], tmp_path: Path
) -> None:
    url, script = scripted
    script.failures, script.status = 10**6, 400
    script.message = "This model's maximum context length is 8192 tokens"
    config = server_config(url, retries=3, max_failures=5)
    with Store.open(tmp_path / "c.db") as store:
        with pytest.raises(UserError, match=r"^8 iterations in a row produced nothing") as info:
            run_campaign(config, store, CirclePacking())
        campaign = store.get_campaign("circle_packing")
        assert campaign is not None and campaign.status == "failed"
        groups = groups_of(store, campaign.id)
    assert "generation failed: permanent:" in str(info.value)
    # A 400 is never retried: one request per iteration, two batches of four.
    assert script.requests == 8 and len(groups) == 8
    assert all(g.skipped and "permanent" in g.skipped for g in groups)


@pytest.mark.timeout(900)
def test_a_run_killed_with_eight_iterations_in_flight_resumes_whole(
    tiny_model: str, tmp_path: Path
) -> None:
    """The torture test's invariants, with batches of eight: kills inside a commit (mid-batch),
    inside a training step and between saving and recording a version, then a clean finish."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    budget, every = 24, 2
    command = [
        sys.executable, "-m", "harness.cli", "run", "circle_packing", "--db", url,
        "--name", "w", "--model", tiny_model, "--backend", "transformers",
        "--concurrency", "8", "--iterations", str(budget), "--group-size", "2",
        "--max-tokens", "24", "--train-every", str(every), "--lr", "1e-3",
        "--policy-dir", str(tmp_path / "policies"),
    ]  # fmt: skip
    # Commits 3 and 2 fall inside a batch of eight; a resumed run trains on the groups waiting
    # for it before its first batch, so each training fault is reached in its round (the step
    # fault before any new iteration is stored).
    faults = ["iteration_commit:3", "train_step:1", "iteration_commit:2", "train_saved:1"]
    faults += ["train_commit:1"]
    done = []
    for fault in faults:
        env = {**os.environ, "VPO_FAULT": fault}
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
        with Store.open(url, create=False) as store:
            campaign = store.get_campaign("w")
            assert campaign is not None
            done.append(budget - len(store.missing_iterations(campaign.id, budget)))
    # Kills inside a batch after 2 commits, inside the resumed run's first step (nothing new
    # stored), inside a batch after 1 commit (the step before it done).
    assert done[:3] == [2, 2, 3]
    final = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    # The run ends with what each version sampled, and the share trained weights sampled.
    printed = final.stdout + final.stderr
    assert "what each policy version sampled" in printed
    assert "sampled by trained weights: " in printed
    state = check_invariants(url, budget, every)
    assert state["steps"] == budget // every
