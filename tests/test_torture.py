"""Crash torture: a campaign that trains as it goes (`--train-every`) is killed with SIGKILL ten
times, at random moments and inside its most delicate ones (a database transaction, a training
step, between saving a policy version and recording it), and resumed each time. Afterwards it
must have finished its budget with nothing lost, nothing twice and the trainer's state in step
with its recorded versions.

It runs the transformers backend, one iteration at a time, so that its ten start-ups stay
short; tests/test_concurrency.py kills a run with eight iterations in flight, and
tests/test_workers.py a worker on the default vLLM backend."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import check_invariants

from harness.faults import POINTS
from harness.store import Store
from trainer.policy import Policy

BUDGET, EVERY = 24, 2


@pytest.mark.timeout(900)
def test_a_training_campaign_survives_eight_kills(tiny_model: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    # The tiny model's groups are flat, and a step of flat groups only takes no optimiser step:
    # every step runs here, so the optimiser's step count can be checked against the versions.
    config = tmp_path / "every-step.toml"
    config.write_text("[training]\nskip_zero_advantage = false\n")
    command = [
        sys.executable, "-m", "harness.cli", "run", "circle_packing", "--db", url,
        "--name", "w", "--model", tiny_model, "--backend", "transformers",
        "--config", str(config), "--iterations", str(BUDGET),
        "--group-size", "2", "--max-tokens", "24", "--train-every", str(EVERY),
        "--lr", "1e-3", "--policy-dir", str(tmp_path / "policies"),
    ]  # fmt: skip
    rng = random.Random(20261201)
    # The named points first (so the budget is not spent before they are reached); then kills
    # at a random moment of the work (a start-up takes about ten seconds here: these wait for
    # the run to record an iteration, then kill it within the next 1.5 s); and a few at a
    # random moment of the start-up itself (loading, the seed, the policy).
    # Each timed round also carries a backstop: the run kills itself inside its second iteration
    # commit, so a round records at most one iteration of its own and ends killed however fast
    # the machine is (rounds that outran their timer once spent the budget and exited 0).
    plan: list[tuple[str, object]] = [("fault", point) for point in POINTS]
    # (Twenty rounds, 12 and 4 of these, took three minutes of a 15-minute test suite; each
    # round is a `vpo run` start-up. tests/test_concurrency.py kills mid-batch besides.)
    plan += [("work", rng.uniform(0.0, 1.5)) for _ in range(3)]
    plan += [("start", rng.uniform(0.5, 8.0)) for _ in range(1)]
    rng.shuffle(plan[len(POINTS) :])
    outcomes = []
    progress = []  # iterations recorded after each round
    for kind, what in plan:
        env = dict(os.environ)
        env["VPO_FAULT"] = f"{what}:1" if kind == "fault" else "iteration_commit:2"
        before = _done(url)
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if kind == "start":
            time.sleep(float(what))
        elif kind == "work":
            # Generous: the wait ends at the first record; beside other work on both cores a
            # start-up and the first iteration took over 120 s.
            deadline = time.monotonic() + 480
            while _done(url) == before and process.poll() is None:
                assert time.monotonic() < deadline, "the run recorded nothing in 480 s"
                time.sleep(0.05)
            time.sleep(float(what))
        if kind != "fault":
            process.send_signal(signal.SIGKILL)
        _, err = process.communicate(timeout=300)
        assert process.returncode in (0, -signal.SIGKILL), err[-2000:]
        outcomes.append((kind, what, process.returncode))
        progress.append(_done(url))
    # Every named point was reached and killed the run there.
    assert [rc for kind, _, rc in outcomes if kind == "fault"] == [-signal.SIGKILL] * len(POINTS)
    assert [rc for *_, rc in outcomes] == [-signal.SIGKILL] * len(plan)
    print("iterations recorded after each round:", progress)
    assert progress[-1] < BUDGET  # the kills, not the budget, ended the runs

    final = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-2000:]
    state = check_invariants(url, BUDGET, EVERY)
    assert state["steps"] == BUDGET // EVERY
    with Store.open(url, create=False) as store:
        campaign = store.get_campaign("w")
        assert campaign is not None and campaign.status == "finished"
        latest = store.latest_policy(campaign.id)
    assert latest is not None
    # The optimiser took exactly as many steps as there are recorded versions.
    policy = Policy.resume(latest.path)
    assert policy.step == latest.step == BUDGET // EVERY
    steps = {
        int(torch.as_tensor(s["step"]).item())
        for s in policy.optimizer.state_dict()["state"].values()
    }
    assert steps == {latest.step}


def _done(url: str) -> int:
    try:
        with Store.open(url, create=False) as store:
            campaign = store.get_campaign("w")
            return store.iterations_done(campaign.id) if campaign else 0
    except Exception:  # not created yet
        return 0
