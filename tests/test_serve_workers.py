"""Workers sharing one `vllm serve`, with a trainer that loads each policy version into it as a
LoRA adapter: the README's recipe for generation on a server, run as a user runs it.

The server is the session's (conftest.tiny_server, docs/scale.md's recipe): the tiny random
Llama (a real vLLM engine in seconds per request where SmolLM2 takes minutes on a CPU); its
served name is the model's folder, so workers and the trainer name the same model.
`tests/test_llm.py` checks the adapter calls themselves.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    Served,
    check_invariants,
    finish,
    start_vpo,
    versions_sampled_from,
    wait_for_campaign,
)

from harness.config.training import KEEP_VERSIONS
from harness.llm.openai_backend import OpenAIGenerator

GROUP_SIZE = 2
SAMPLED = ("--group-size", str(GROUP_SIZE), "--max-tokens", "32")


@pytest.fixture
def client(served: Served) -> Iterator[OpenAIGenerator]:
    """For looking at what the server holds (`served` unloads every adapter afterwards, so each
    test starts from the base model alone)."""
    generator = OpenAIGenerator(served.model, base_url=served.base_url, api_key_env=served.key_env)
    try:
        yield generator
    finally:
        generator.close()


def served_versions(client: OpenAIGenerator, campaign: str) -> set[str]:
    from harness.learning.publish import served_versions as versions

    return set(versions(client, campaign))


def on_server(served: Served) -> tuple[str, ...]:
    return (
        "--backend", "openai", "--base-url", served.base_url, "--api-key-env", served.key_env,
        "--model", served.model,
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_workers_sharing_the_server_follow_the_trainers_lora_versions(
    served: Served, client: OpenAIGenerator, tmp_path: Path
) -> None:
    """Two `vpo worker --backend openai` on one server and a `vpo train --follow --lora`: each
    version the trainer records is loaded into the server and sampled by name, and a worker
    started later samples from the newest."""
    url, budget, every = f"sqlite:///{tmp_path / 'w.db'}", 8, 2

    def worker(name: str, iterations: int) -> subprocess.Popen[str]:
        return start_vpo(
            "worker", "humaneval:0", "--db", url, "--name", "w", "--id", name,
            "--iterations", str(iterations), *on_server(served), *SAMPLED,
        )  # fmt: skip

    workers = [worker(f"w{i}", budget) for i in range(2)]
    wait_for_campaign(url)
    trainer = start_vpo(
        "train", "--db", url, "--name", "w", "--follow", "--train-every", str(every),
        "--lora", "--lr", "1e-3", "--out", str(tmp_path / "policies"), "--poll", "0.5",
    )  # fmt: skip
    for process in workers:
        finish(process)
    assert f"{budget // every} steps" in finish(trainer)
    check_invariants(url, budget, every, unique_code=False)
    # Workers on a server load adapters: no merged copy of each version is written (and the
    # newest KEEP_VERSIONS stay on disk, with any version a worker in flight samples from).
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == [
        f"step-{s:06d}" for s in range(budget // every - KEEP_VERSIONS + 1, budget // every + 1)
    ]
    finish(worker("late", budget + 1))
    newest = f"w-step-{budget // every:06d}"
    # The newest version is served, and at most the one before it besides (a version may never
    # have been loaded, when no worker sampled between it and the next).
    loaded = served_versions(client, "w")
    assert newest in loaded
    assert loaded <= {newest, f"w-step-{budget // every - 1:06d}"}
    latest, sampled = versions_sampled_from(url, budget)
    assert latest is not None and latest.step == budget // every
    assert sampled == {latest.id}


@pytest.mark.timeout(600)
def test_a_campaign_trains_on_server_samples_and_loads_each_version(
    served: Served, client: OpenAIGenerator, tmp_path: Path
) -> None:
    """`vpo run --backend openai --train-every 2 --lora`: one process samples from the server,
    trains on what it returned, and loads each new version into it; a resumed run loads the
    last version again and goes on from it."""
    url = f"sqlite:///{tmp_path / 'w.db'}"

    def run(iterations: int) -> str:
        args = [
            "run", "humaneval:0", "--db", url, "--name", "w", "--iterations", str(iterations),
            "--train-every", "2", "--lora", "--lr", "1e-3", *on_server(served), *SAMPLED,
        ]  # fmt: skip
        return finish(start_vpo(*args))

    run(4)
    assert served_versions(client, "w") == {"w-step-000001", "w-step-000002"}
    for name in client.served_adapters():
        client.unload_adapter(name)  # as if the server had restarted
    run(6)
    check_invariants(url, 6, 2, unique_code=False)
    assert served_versions(client, "w") == {"w-step-000002", "w-step-000003"}


def test_a_full_weights_follower_is_refused_for_a_server_campaign(
    served: Served, tmp_path: Path
) -> None:
    """Workers on a server can only take adapters: a follower without --lora says so in one
    line before it trains."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    args = [
        "worker", "humaneval:0", "--db", url, "--name", "w", "--iterations", "2",
        *on_server(served), *SAMPLED,
    ]  # fmt: skip
    finish(start_vpo(*args))
    follower = start_vpo(
        "train", "--db", url, "--name", "w", "--follow", "--train-every", "2",
        "--out", str(tmp_path / "policies"), "--poll", "0.5",
    )  # fmt: skip
    _, err = follower.communicate(timeout=300)
    assert follower.returncode != 0
    assert "lora" in err.lower() and "Traceback" not in err
