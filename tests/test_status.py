"""`vpo status`: how a campaign is going, over a campaign written through the store with its
clock then set to known times, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import update

from harness.cli import main
from harness.observation import status
from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord, code_hash
from harness.store import Store
from harness.store.models import Campaign, Event, PolicyVersion, RolloutGroup

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# Iterations 0..3 stored 10, 30, 50 and 70 s after the campaign was created: 20 s apart.
STORED_AT = (10, 30, 50, 70)
LAST_RECORD = 95  # seconds after creation
STEP_2 = {
    "step": 2,
    "loss": -0.25,
    "kl": 0.002,
    "grad_norm": 1.5,
    "clip_fraction": 0.1,
    "set_score": 0.6,
    "diversity": 0.3,
    "staleness": 0.5,
}


def _program(code: str, a: float, b: float, status: str = "ok") -> NewProgram:
    return NewProgram(code, status, {"a": a, "b": b}, {"a": a * 10, "b": b * 10})


def _rollout(tokens: int, *candidates: CandidateRecord) -> RolloutRecord:
    return RolloutRecord("text", list(range(tokens)), None, "stop", "ok", None, candidates)


def _group(iteration: int, parent: int, *rollouts: RolloutRecord) -> NewGroup:
    return NewGroup(iteration, 0, parent, (), [{"role": "user", "content": "go"}], None, rollouts)


def fill(db_url: str) -> str:
    """Seed (0.5, 0.8); iteration 0: A (0.6, 0.1), an invalid one, an unparsed slot;
    iteration 1: a timeout, a lazy repeat of A; iteration 2: B (0.9, 0.2), a copy of B in
    the same iteration; iteration 3: an error, an unparsed slot. Two training steps. Each
    rollout generates 10 tokens; the budget is 10 iterations."""
    with Store.open(db_url) as store:
        cid = store.create_campaign("c", "toy", {"iterations": 10, "candidates": 2}, 0)
        seed = store.add_program(cid, _program("def f(): return 0", 0.5, 0.8), the_seed=True)
        a = _program("def f(): return 1", 0.6, 0.1)
        b = _program("def f(): return 2", 0.9, 0.2)
        slots = [
            [
                CandidateRecord(1, "new", a),
                CandidateRecord(2, "new", _program("x", 0, 0, "invalid")),
            ],
            [CandidateRecord(1, "unparsed", reason="no candidate 1")],
            [
                CandidateRecord(1, "new", _program("while 1: pass", 0, 0, "timeout")),
                CandidateRecord(2, "duplicate", code_hash=code_hash(a.code), lazy=True),
            ],
            [
                CandidateRecord(1, "new", b),
                CandidateRecord(2, "duplicate", code_hash=code_hash(b.code)),
            ],
            [
                CandidateRecord(1, "new", _program("1/0", 0, 0, "error")),
                CandidateRecord(2, "unparsed", reason="truncated"),
            ],
        ]
        first = _group(0, seed, _rollout(10, *slots[0]), _rollout(10, *slots[1]))
        store.record_iteration(cid, first)
        for iteration, candidates in enumerate(slots[2:], start=1):
            store.record_iteration(cid, _group(iteration, seed, _rollout(10, *candidates)))
        for step, groups in ((1, [1, 2]), (2, [3])):
            metrics = STEP_2 if step == 2 else {**STEP_2, "step": 1, "loss": 0.5}
            store.record_train_step(
                cid, step=step, path=f"s{step}", metrics=metrics, group_ids=groups
            )
        with store.engine.begin() as connection:
            connection.execute(update(Campaign).values(created_at=T0))
            connection.execute(update(Event).values(created_at=T0))
            newest = max(e.id for e in store.events(cid))
            connection.execute(
                update(Event)
                .where(Event.id == newest)
                .values(created_at=T0 + timedelta(seconds=LAST_RECORD))
            )
            for iteration, seconds in enumerate(STORED_AT):
                connection.execute(
                    update(RolloutGroup)
                    .where(RolloutGroup.iteration == iteration)
                    .values(created_at=T0 + timedelta(seconds=seconds))
                )
    return db_url


@pytest.fixture
def campaign_db(db_url: str) -> str:
    return fill(db_url)


def test_iterations_pace_eta_and_training(campaign_db: str) -> None:
    with Store.open(campaign_db, read_only=True) as store:
        (campaign,) = store.campaigns()
        report = status.report(store, campaign, now=T0 + timedelta(seconds=100))
    assert report["iterations"] == 4 and report["budget"] == 10
    assert report["elapsed_s"] == pytest.approx(LAST_RECORD)
    assert report["seconds_per_iteration"] == pytest.approx(20.0)
    assert report["eta_s"] == pytest.approx(6 * 20.0)  # 6 iterations left at 20 s each
    # Iterations 1..3 in the 60 s from iteration 0 to 3: a rollout of 10 tokens and a new
    # program each (a timeout, B, an error).
    assert report["tokens_per_s"] == pytest.approx(30 / 60)
    assert report["evals_per_s"] == pytest.approx(3 / 60)
    assert report["running"] is True and report["idle_s"] == pytest.approx(5.0)
    assert report["steps"] == 2 and report["last_step"] == STEP_2
    # The counts `vpo status --json` printed before stay.
    assert report["groups"] == 4 and report["policy_versions"] == 2 and report["tokens"] == 50


def test_rejections_by_class_and_best_with_its_iteration(campaign_db: str) -> None:
    with Store.open(campaign_db, read_only=True) as store:
        (campaign,) = store.campaigns()
        report = status.report(store, campaign)
    assert report["candidates"] == 9
    assert report["rejections"] == {
        "unparsed": 2,
        "duplicate": 1,
        "lazy": 1,
        "near": 0,
        "invalid": 1,
        "error": 1,
        "timeout": 1,
    }
    assert report["best"]["a"]["iteration"] == 2 and report["best"]["a"]["score"] == 0.9
    assert report["best"]["b"]["iteration"] == 0 and report["best"]["b"]["program_id"] == 1
    assert report["best"]["a"]["raw"] == pytest.approx(9.0)


def test_a_stopped_or_quiet_campaign_is_not_running(campaign_db: str) -> None:
    with Store.open(campaign_db, read_only=True) as store:
        (campaign,) = store.campaigns()
        quiet = status.report(store, campaign, now=T0 + timedelta(seconds=LAST_RECORD + 400))
    assert quiet["running"] is False and quiet["eta_s"] == pytest.approx(120.0)
    with Store.open(campaign_db) as store:
        store.set_campaign_status(1, "stopped")
        (campaign,) = store.campaigns()
        assert status.progress(store, campaign)["running"] is False


def test_a_campaign_a_budget_finished_early_says_which_and_has_no_time_left(
    campaign_db: str, capsys: pytest.CaptureFixture
) -> None:
    reason = "token budget spent: 60 of 50 tokens generated"
    with Store.open(campaign_db) as store:
        store.set_campaign_status(1, "finished", reason)
        (campaign,) = store.campaigns()
        report = status.progress(store, campaign)
    assert (report["iterations"], report["budget"]) == (4, 10)
    assert report["stopped_by"] == reason and report["eta_s"] is None
    assert main(["status", "--db", campaign_db]) == 0
    printed = capsys.readouterr().out
    assert "stopped by" in printed and "about 2 min" not in printed
    with Store.open(campaign_db) as store:
        store.set_campaign_status(1, "running")  # resumed with a larger budget
        (campaign,) = store.campaigns()
        again = status.progress(store, campaign)
    assert again["stopped_by"] is None and again["eta_s"] == pytest.approx(120.0)


def test_a_table_written_to_a_pipe_is_not_cut_at_80_columns(
    campaign_db: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "cost budget reached: $5.0012 of $5; resume with a larger --max-cost"
    with Store.open(campaign_db) as store:
        store.set_campaign_status(1, "finished", reason)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["status", "--db", campaign_db]) == 0
    assert any(reason in line for line in capsys.readouterr().out.splitlines())
    monkeypatch.setenv("COLUMNS", "80")  # a width the user asked for still holds
    assert main(["status", "--db", campaign_db]) == 0
    printed = capsys.readouterr().out
    assert not any(reason in line for line in printed.splitlines())
    assert max(len(line) for line in printed.splitlines()) <= 80


def test_a_resume_with_a_new_budget_moves_the_eta(campaign_db: str) -> None:
    with Store.open(campaign_db) as store:
        store.record_event(1, "resumed", {"config": {"iterations": 4}})
        (campaign,) = store.campaigns()
        finished = status.progress(store, campaign)
        store.record_event(1, "resumed", {"config": {"iterations": 12}})
        more = status.progress(store, campaign)
    assert finished["budget"] == 4 and finished["eta_s"] is None  # nothing left
    assert more["budget"] == 12 and more["eta_s"] == pytest.approx(8 * 20.0)


def test_vpo_status_json_and_table(campaign_db: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["status", "--db", campaign_db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["iterations"], report["budget"]) == (4, 10)
    assert report["eta_s"] == pytest.approx(120.0)
    assert report["rejections"]["lazy"] == 1 and report["last_step"]["kl"] == 0.002
    for key in ("programs", "valid_programs", "evaluations", "groups", "tokens", "measures"):
        assert key in report  # what `vpo status --json` printed before
    assert main(["status", "--db", campaign_db]) == 0
    printed = capsys.readouterr().out
    assert "4 of 10" in printed and "about 2 min 00 s" in printed
    assert "lazy 1" in printed and "kl 2.00e-03" in printed


def test_no_groups_no_pace() -> None:
    assert status.recent_pace([]) == {
        "seconds_per_iteration": None,
        "tokens_per_s": None,
        "evals_per_s": None,
    }
    one = [(T0, 5, 1)]
    assert status.recent_pace(one)["seconds_per_iteration"] is None
    assert status.eta(None, 3, 10) is None and status.eta(2.0, 10, 10) is None


@given(st.lists(st.integers(0, 10_000), min_size=2, max_size=40), st.integers(0, 100))
def test_the_pace_times_the_iterations_spans_the_window(gaps: list[int], tokens: int) -> None:
    """Whatever the bursts, n iterations at the pace span the window, and the rates are what
    groups 1..n did over that span."""
    times = [T0 + timedelta(seconds=sum(gaps[:i])) for i in range(len(gaps))]
    pace = status.recent_pace([(at, tokens, 2) for at in times])
    span = (times[-1] - times[0]).total_seconds()
    if span == 0:
        assert pace["seconds_per_iteration"] is None
        return
    assert pace["seconds_per_iteration"] * (len(times) - 1) == pytest.approx(span)
    assert pace["tokens_per_s"] * span == pytest.approx(tokens * (len(times) - 1))
    assert pace["evals_per_s"] * span == pytest.approx(2 * (len(times) - 1))


def test_what_each_policy_version_sampled(campaign_db: str, capsys: pytest.CaptureFixture) -> None:
    """Iterations 2 and 3 sampled by version 1 (the others by the starting weights): per
    version its groups, rollouts, parse rate, diversity and best, and the trained share."""
    with Store.open(campaign_db) as store:
        (campaign,) = store.campaigns()
        first = store.policies(campaign.id)[0]
        with store.engine.begin() as connection:
            connection.execute(
                update(RolloutGroup)
                .where(RolloutGroup.iteration >= 2)
                .values(policy_version_id=first.id)
            )
        report = status.report(store, campaign)
        measured = store.iteration_measures(campaign.id)
    start, trained = report["versions"]
    assert (start["step"], start["groups"], start["rollouts"]) == (0, 2, 3)
    assert (trained["step"], trained["groups"], trained["rollouts"]) == (1, 2, 2)
    # Every rollout here says it parsed; the diversity is the mean of its groups'.
    assert start["parse_rate"] == trained["parse_rate"] == 1.0
    for row, iterations in ((start, (0, 1)), (trained, (2, 3))):
        values = [m.pool_diversity for m in measured if m.iteration in iterations]
        values = [v for v in values if v is not None]
        mean = sum(values) / len(values) if values else None
        assert row["pool_diversity"] == (mean if mean is None else pytest.approx(mean))
    assert start["best"] == {"a": 0.6, "b": 0.1}  # A; the seed came from no rollout
    assert trained["best"] == {"a": 0.9, "b": 0.2}  # B
    assert main(["status", "--db", campaign_db]) == 0
    printed = capsys.readouterr().out
    assert "2 of 5 rollouts (40%)" in printed
    assert "what each policy version sampled" in printed


def test_a_version_whose_step_trained_nothing_holds_the_starting_weights(
    campaign_db: str, capsys: pytest.CaptureFixture
) -> None:
    """Step 1's advantages were all 0 (it trained 0 rollouts), step 2 trained 4: the groups
    version 1 sampled came from the starting weights, those of version 2 from changed ones."""
    with Store.open(campaign_db) as store:
        (campaign,) = store.campaigns()
        first, second = store.policies(campaign.id)
        with store.engine.begin() as connection:
            connection.execute(
                update(PolicyVersion)
                .where(PolicyVersion.id == first.id)
                .values(metrics={**first.metrics, "trained": 0})
            )
            connection.execute(
                update(PolicyVersion)
                .where(PolicyVersion.id == second.id)
                .values(metrics={**second.metrics, "trained": 4})
            )
            for version, iterations in ((first, (1, 2)), (second, (3,))):
                connection.execute(
                    update(RolloutGroup)
                    .where(RolloutGroup.iteration.in_(iterations))
                    .values(policy_version_id=version.id)
                )
        assert store.first_changed_policy(campaign.id).id == second.id
        versions = status.report(store, campaign)["versions"]
    assert [(row["step"], row["changed"], row["rollouts"]) for row in versions] == [
        (0, False, 2),
        (1, False, 2),
        (2, True, 1),
    ]
    assert main(["status", "--db", campaign_db]) == 0
    assert "1 of 5 rollouts (20%)" in capsys.readouterr().out
