"""Several `vpo worker` processes and one `vpo train --follow` on one campaign, as a user runs
them: real subprocesses on a real database (PostgreSQL started by the test setup, and SQLite),
then the invariants that concurrency must not break."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    check_invariants,
    finish,
    start_vpo,
    versions_sampled_from,
    wait_for_campaign,
)

from harness.store import Store

GROUP_SIZE = 2


def worker(url: str, model: str, budget: int, name: str, *extra: str) -> subprocess.Popen[str]:
    return start_vpo(
        "worker", "circle_packing", "--db", url, "--name", "w", "--model", model,
        "--iterations", str(budget), "--group-size", str(GROUP_SIZE), "--max-tokens", "24",
        "--id", name, *extra,
    )  # fmt: skip


@pytest.mark.postgres
def test_three_workers_and_a_follower_on_postgresql(
    postgres_url: str, tiny_model: str, tmp_path: Path
) -> None:
    _workers_and_follower(postgres_url, tiny_model, tmp_path)


def _workers_and_follower(url: str, model: str, tmp_path: Path) -> None:
    budget, every = 12, 2
    # Each worker claims two iterations at a time and generates them in one call.
    workers = [
        worker(url, model, budget, f"w{i}", "--backend", "transformers", "--concurrency", "2")
        for i in range(3)
    ]
    wait_for_campaign(url)  # the trainer needs the campaign the first worker creates
    trainer = start_vpo(
        "train", "--db", url, "--name", "w", "--follow", "--train-every", str(every),
        "--out", str(tmp_path / "policies"), "--model", model, "--lr", "1e-3", "--poll", "0.5",
    )  # fmt: skip
    done = [finish(w) for w in workers]
    trained = finish(trainer)
    assert sum(int(out.rsplit(":", 1)[1].split()[0]) for out in done) == budget
    assert f"{budget // every} steps" in trained
    state = check_invariants(url, budget, every, unique_code=False)
    # Each worker's batches record their stages, every one on the worker's own thread.
    with Store.open(url) as store:
        (campaign,) = store.campaigns()
        timed = [e.payload for e in store.events(campaign.id, "stages")]
    assert sorted(k for p in timed for k in p["iterations"]) == list(range(budget))
    assert timed and {p["worker"] for p in timed} <= {"w0", "w1", "w2"}
    assert all({"generating", "evaluating", "storing"} <= set(p["loop"]) for p in timed)

    # A worker that starts later samples from the newest version the trainer recorded.
    finish(worker(url, model, budget + 2, "late"))
    latest, sampled = versions_sampled_from(url, budget)
    assert latest is not None and latest.step == state["latest"]
    assert sampled == {latest.id}


def test_a_killed_workers_iteration_is_taken_over(tiny_model: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    budget = 6
    # The default backend (vLLM here), four iterations claimed and generated at a time.
    first = worker(url, tiny_model, budget, "doomed", "--lease", "2", "--concurrency", "4")
    # Kill it once it holds a claim it has not recorded.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with Store.open(url, create=False) as store:
                campaign = store.get_campaign("w")
                if campaign and store.open_claims(campaign.id):
                    break
        except Exception:
            pass
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    with Store.open(url, create=False) as store:
        assert store.open_claims(store.get_campaign("w").id) >= 1  # left behind
    finish(worker(url, tiny_model, budget, "heir", "--lease", "2", "--concurrency", "4"))
    check_invariants(url, budget, None, unique_code=False)


def test_claims_are_handed_out_once_and_taken_over_when_stale(db_url: str) -> None:
    with Store.open(db_url) as store:
        campaign = store.create_campaign("w", "circle_packing", {}, 0)
        taken = [store.claim_iteration(campaign, f"w{i}", budget=3, lease_seconds=60)
                 for i in range(4)]  # fmt: skip
        assert taken == [0, 1, 2, None]
        assert store.open_claims(campaign) == 3
        store.release_claim(campaign, 1, "someone else")  # not theirs: nothing happens
        store.release_claim(campaign, 1, "w1")
        assert store.claim_iteration(campaign, "w9", budget=3, lease_seconds=60) is None
        assert store.open_claims(campaign) == 2
        # Stale claims (a lease of 0 s) are taken over, lowest iteration first.
        assert store.claim_iteration(campaign, "w9", budget=3, lease_seconds=0) == 0
        with pytest.raises(Exception, match="no campaign"):
            store.claim_iteration(campaign + 99, "w", budget=3, lease_seconds=1)


@pytest.mark.parametrize(
    "args,words",
    [
        (("worker", "circle_packing"), "give --db"),
        (("worker", "maze", "--db", "x.db"), "answer problem"),
        (("worker", "circle_packing", "--db", "{db}", "--train-every", "2"), "workers do not"),
        (("train", "--problem", "maze", "--follow"), "--follow trains beside workers"),
        (("train", "--db", "x.db"), "--out is required"),
        (("worker", "circle_packing", "--db", "{db}", "--lease", "0"), "positive number"),
    ],
)
def test_worker_and_follow_errors_are_one_line(
    args: tuple[str, ...], words: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "w.db")
    process = start_vpo(*(a.replace("{db}", db) for a in args), cwd=tmp_path)
    _, err = process.communicate(timeout=120)
    assert process.returncode != 0
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


class _Racing(Store):
    """A store on which the trainer records version 2 (and prunes version 1) right after a
    worker has read that version 1 is the newest: the race a slow worker loses."""

    newer: Path

    def latest_policy(self, campaign_id: int):  # type: ignore[no-untyped-def]
        latest = super().latest_policy(campaign_id)
        if latest is not None and latest.step == 1:
            self.record_train_step(campaign_id, step=2, path=str(self.newer), metrics={},
                                   group_ids=[])  # fmt: skip
        return latest


def test_a_worker_whose_version_was_pruned_while_it_loaded_takes_the_newer_one(
    tiny_model: str, tmp_path: Path
) -> None:
    from harness.config.settings import CampaignSettings
    from harness.evolution.worker import _newest

    config = CampaignSettings(model=tiny_model, backend="transformers")
    with _Racing.open(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.newer = Path(tiny_model)
        campaign = store.create_campaign("w", "circle_packing", {}, 0)
        gone = str(tmp_path / "policies" / "step-000001")  # pruned: never on disk here
        store.record_train_step(campaign, step=1, path=gone, metrics={}, group_ids=[])
        generator, loaded = _newest(store, campaign, config, "w", None, None)
        try:
            assert loaded == store.latest_policy(campaign)  # version 2
            assert store.latest_policy(campaign).step == 2
        finally:
            generator.close()


def test_a_worker_whose_newest_version_is_missing_stops_with_one_line(
    tiny_model: str, tmp_path: Path
) -> None:
    from harness.config.errors import UserError
    from harness.config.settings import CampaignSettings
    from harness.evolution.worker import _newest

    config = CampaignSettings(model=tiny_model, backend="transformers")
    with Store.open(f"sqlite:///{tmp_path / 'w.db'}") as store:
        campaign = store.create_campaign("w", "circle_packing", {}, 0)
        gone = str(tmp_path / "policies" / "step-000001")
        store.record_train_step(campaign, step=1, path=gone, metrics={}, group_ids=[])
        with pytest.raises(UserError, match="step-000001' does not exist"):
            _newest(store, campaign, config, "w", None, None)
