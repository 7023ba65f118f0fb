"""Training steps that say what they did (issue 27, items 4 and 6), on real tiny-model
campaigns: one token budget for prompts and training, skipped steps that publish nothing and
are counted, groups trained oldest first, and the groups left at the end said.

The campaigns run the transformers backend on the random 2-layer Llama of conftest.py (a step
in a fraction of a second). The training length is `max_tokens + PROMPT_ROOM_TOKENS`; the
tests lower PROMPT_ROOM_TOKENS to make prompts longer than it, which real campaigns reach with
long parents and drafts.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.orm import Session

from harness.config import settings as config_module
from harness.config.errors import SchemaError
from harness.config.settings import build
from harness.evolution.loop import run_campaign
from harness.evolution.prompts import build_prompt
from harness.observation import status
from harness.observation.progress import Progress
from harness.records import Lineage, NewProgram
from harness.store import Store, migrations
from harness.store.models import RolloutGroup
from problems.circle_packing import SEED_PROGRAM, CirclePacking

MAX_TOKENS = 16  # the least a campaign takes


def settings(model: str, **extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "problem": "circle_packing",
        "model": model,
        "backend": "transformers",
        "group_size": 2,
        "candidates": 2,
        "max_tokens": MAX_TOKENS,
        "top_p": 1.0,  # no nucleus to sort for: the sampler and the step run faster
        "workers": 1,
        "islands": 1,
        "concurrency": 1,
    }
    return base | extra


class Said(logging.Handler):
    """The messages of one logger, whatever `vpo`'s logging setup did to propagation."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    said = Said()
    logger = logging.getLogger("harness.evolution.loop")
    logger.addHandler(said)
    try:
        yield said.lines
    finally:
        logger.removeHandler(said)


def groups_of(store: Store, campaign_id: int) -> list[RolloutGroup]:
    with Session(store.engine) as session:
        return list(
            session.scalars(
                select(RolloutGroup)
                .where(RolloutGroup.campaign_id == campaign_id)
                .order_by(RolloutGroup.iteration)
            )
        )


@pytest.fixture(scope="module")
def harvested(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database whose campaign recorded 3 groups and trained on none."""
    path = tmp_path_factory.mktemp("harvest") / "c.db"
    with Store.open(path) as store:
        run_campaign(build(settings(tiny_model, iterations=3)), store, CirclePacking())
    return path


def harvest(harvested: Path, tmp_path: Path) -> tuple[Store, int]:
    """A copy of the harvested database, opened."""
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{harvested}{suffix}")
        if source.exists():
            shutil.copy(source, tmp_path / f"c.db{suffix}")
    store = Store.open(tmp_path / "c.db")
    campaign_id = store.campaigns()[0].id
    assert [g.train_step for g in groups_of(store, campaign_id)] == [None, None, None]
    return store, campaign_id


def test_prompts_are_held_to_the_training_length(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafts would make every prompt longer than the training length (a step then had no
    completion token left and the campaign failed): the budget drops them instead."""
    from harness.llm.transformers_backend import TransformersGenerator

    problem = CirclePacking()
    store = Store.open(tmp_path / "c.db")
    campaign_id = run_campaign(build(settings(tiny_model, iterations=0)), store, problem)
    [seed] = store.programs(campaign_id, origin="seed")
    for k in range(4):  # long valid programs: drafts beside any parent
        padding = "".join(f"# program {k}, note {i}: a line that takes tokens\n" for i in range(40))
        scores = {"n26": 0.5 + k / 10, "n32": 0.5, "rect21": 0.5}
        store.add_program(
            campaign_id,
            NewProgram(SEED_PROGRAM + padding, "ok", scores, dict.fromkeys(scores, 1.0)),
            Lineage("llm", seed.id),
        )
    programs = store.programs(campaign_id)
    count = TransformersGenerator(tiny_model).count_tokens
    alone = max(count(build_prompt(problem, p, [], 2)) for p in programs)
    with_a_draft = min(
        count(build_prompt(problem, p, [q], 2)) for p in programs for q in programs if q != p
    )
    room = alone + 8
    assert with_a_draft > room + MAX_TOKENS  # any draft would fill the training length
    monkeypatch.setattr(config_module, "PROMPT_ROOM_TOKENS", room)

    config = build(settings(tiny_model, iterations=4, train_every=2, drafts=3))
    said: list[str] = []
    run_campaign(config, store, problem, say=said.append)
    assert store.get_campaign("circle_packing").status == "finished"
    assert f"prompts up to {room} tokens (the training length {room + MAX_TOKENS}" in said[0]
    groups = groups_of(store, campaign_id)
    assert [g.train_step for g in groups] == [1, 1, 2, 2]
    assert all(len(g.prompt_token_ids) <= room for g in groups)
    policies = store.policies(campaign_id)
    assert [p.step for p in policies] == [1, 2]
    assert [p.metrics["cut_rollouts"] for p in policies] == [0, 0]


def test_a_step_with_nothing_left_is_skipped_and_the_campaign_goes_on(
    tiny_model: str,
    harvested: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings: list[str],
) -> None:
    """Groups harvested with prompts longer than today's training length: the step that takes
    them has no completion token left. It is skipped with its reason, said once; its groups are
    not taken again and the next step takes its number."""
    store, campaign_id = harvest(harvested, tmp_path)
    monkeypatch.setattr(config_module, "PROMPT_ROOM_TOKENS", 1)
    said: list[str] = []
    run_campaign(
        build(settings(tiny_model, iterations=3, train_every=2)),
        store,
        CirclePacking(),
        say=said.append,
    )
    assert store.get_campaign("circle_packing").status == "finished"
    assert store.policies(campaign_id) == []
    [skipped] = store.skipped_steps(campaign_id)
    assert skipped["step"] == 1 and skipped["cut_rollouts"] == 4
    assert "no completion token left" in skipped["skipped"]
    groups = groups_of(store, campaign_id)
    assert [g.train_step for g in groups] == [None, None, None]
    assert [g.train_skipped is not None for g in groups] == [True, True, False]
    assert len(warnings) == 1 and "step 1 skipped: no completion token left" in warnings[0]
    assert said == [
        "1 group not trained: fewer than train_every (2) came in after the last step; "
        "extending the campaign trains it first"
    ]
    shown = status.progress(store, store.get_campaign("circle_packing"))
    assert shown["skipped_steps"] == 1 and shown["untrained_groups"] == 1
    assert shown["last_skipped_step"]["skipped"] == skipped["skipped"]

    # With room again, the next step is step 1, on the groups the skipped one did not take.
    monkeypatch.setattr(config_module, "PROMPT_ROOM_TOKENS", 8192)
    run_campaign(build(settings(tiny_model, iterations=4, train_every=2)), store, CirclePacking())
    assert [p.step for p in store.policies(campaign_id)] == [1]
    assert [g.train_step for g in groups_of(store, campaign_id)] == [None, None, 1, 1]


def test_a_non_finite_step_publishes_no_version_and_is_counted(
    tiny_model: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings: list[str],
) -> None:
    """The first step's gradients are made NaN: no optimiser step, no policy version, the
    weights stay finite; the step is counted, and the next one is version 1."""
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def poisoned(parameters: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        parameters = list(parameters)
        calls.append(len(calls))
        if len(calls) == 1:
            for parameter in parameters:
                if parameter.grad is not None:
                    parameter.grad.fill_(math.nan)
        return real(parameters, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", poisoned)
    lines: list[str] = []

    def progress(iteration: int, shown: Progress) -> None:
        lines.append(shown.line(iteration, 4))

    store = Store.open(tmp_path / "c.db")
    # The tiny model's groups are flat: without this no pass runs and no norm is taken.
    config = build(
        settings(tiny_model, iterations=4, train_every=2, skip_zero_advantage=False, kl_beta=0.0)
    )
    campaign_id = run_campaign(config, store, CirclePacking(), on_progress=progress)
    assert len(calls) == 2
    policies = store.policies(campaign_id)
    assert [p.step for p in policies] == [1]
    assert math.isfinite(policies[0].metrics["grad_norm"])
    [skipped] = store.skipped_steps(campaign_id)
    assert skipped["step"] == 1 and skipped["grad_norm"] is None
    assert "non-finite gradient norm (nan)" in skipped["skipped"]
    assert [(g.train_step, g.train_skipped is not None) for g in groups_of(store, campaign_id)] == [
        (None, True),
        (None, True),
        (1, False),
        (1, False),
    ]
    assert status.progress(store, store.get_campaign("circle_packing"))["skipped_steps"] == 1
    assert len(warnings) == 1 and "non-finite gradient norm" in warnings[0]
    assert "1 training step skipped" in lines[-1] and "grad norm" in lines[-1]
    from trainer.policy import Policy

    saved = Policy.resume(policies[0].path)
    assert saved.step == 1
    assert all(torch.isfinite(p).all() for p in saved.model.parameters())


def test_groups_train_oldest_first_and_the_rest_is_said(
    tiny_model: str, harvested: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three groups wait for steps of two: the oldest two train (the newest two used to, and
    the oldest then waited for ever), the third is said at the end, and the rollouts the step
    cut to the training length are counted with its metrics and on the progress line."""
    store, campaign_id = harvest(harvested, tmp_path)
    waiting = groups_of(store, campaign_id)
    rollouts = store.training_groups(campaign_id, limit=2)
    longest = max(len(g.prompt_token_ids) for g in waiting[:2])
    # Room for each prompt of the first two groups and 8 completion tokens.
    monkeypatch.setattr(config_module, "PROMPT_ROOM_TOKENS", longest + 8 - MAX_TOKENS)
    length = longest + 8
    cut = sum(
        len(r.prompt_token_ids) + len(r.token_ids) > length for g in rollouts for r in g.rollouts
    )
    assert cut > 0
    said: list[str] = []
    lines: list[str] = []
    run_campaign(
        build(settings(tiny_model, iterations=3, train_every=2)),
        store,
        CirclePacking(),
        on_progress=lambda iteration, shown: lines.append(shown.line(iteration, 3)),
        say=said.append,
    )
    assert [g.train_step for g in groups_of(store, campaign_id)] == [1, 1, None]
    [policy] = store.policies(campaign_id)
    assert policy.metrics["cut_rollouts"] == cut
    assert f"cut {cut}/4" in lines[-1]
    assert said == [
        "1 group not trained: fewer than train_every (2) came in after the last step; "
        "extending the campaign trains it first"
    ]
    assert status.progress(store, store.get_campaign("circle_packing"))["untrained_groups"] == 1


def at_revision_0001(url: str) -> None:
    """Today's database as revision 0001 left it: no train_skipped column."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE rollout_group DROP COLUMN train_skipped"))
            connection.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    finally:
        engine.dispose()


def test_a_database_at_revision_0001_gains_the_column(db_url: str) -> None:
    from conftest import fill_small_campaign

    fill_small_campaign(db_url)
    at_revision_0001(db_url)
    with pytest.raises(SchemaError, match="is at revision 0001; this vpo-evolve reads revision"):
        Store.open(db_url, read_only=True)
    with Store.open(db_url) as store:
        with store.engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("rollout_group")}
            assert migrations.current(connection) == migrations.head() == "0003"
        assert "train_skipped" in columns
        # Its groups wait for a step as before.
        campaign_id = store.campaigns()[0].id
        assert store.untrained_count(campaign_id) == 2
        assert [g.iteration for g in store.untrained_groups(campaign_id, 1)] == [0]
        store.record_skipped_step(
            campaign_id, step=1, reason="test", metrics={"grad_norm": math.inf}, group_ids=[1]
        )
        assert store.untrained_count(campaign_id) == 1
        assert store.skipped_steps(campaign_id) == [
            {"grad_norm": None, "step": 1, "skipped": "test"}
        ]


def test_rollouts_of_versions_whose_steps_trained_nothing_are_not_counted_as_trained(
    tiny_model: str, tmp_path: Path
) -> None:
    """The random tiny model writes nothing that parses: every reward is 0, so each step
    trains no rollout and records a version holding the starting weights. Neither the progress
    line nor the per-version table counts the rollouts those versions sampled as sampled by
    trained weights."""
    seen: list[Progress] = []
    with Store.open(tmp_path / "c.db") as store:
        campaign_id = run_campaign(
            build(settings(tiny_model, iterations=3, train_every=1)),
            store,
            CirclePacking(),
            on_progress=lambda _, progress: seen.append(progress),
        )
        policies = store.policies(campaign_id)
        assert [p.step for p in policies] == [1, 2, 3]
        assert [p.metrics["trained"] for p in policies] == [0, 0, 0]
        assert store.first_changed_policy(campaign_id) is None
        rows = store.version_measures(campaign_id, ["packing"])
    assert [(row.step, row.changed) for row in rows] == [(0, False), (1, False), (2, False)]
    assert seen[-1].rollouts == 6 and seen[-1].trained == 0
    assert "by trained weights 0/6" in seen[-1].line(3, 3)


def test_the_last_steps_line_names_the_last_iteration_when_a_budget_stops_the_run(
    tiny_model: str, tmp_path: Path
) -> None:
    """A token budget stops a training campaign early: the line of its last step (trained on
    the last batch) names the last iteration stored, not the iteration cap."""
    lines: list[str] = []
    with Store.open(tmp_path / "c.db") as store:
        config = build(settings(tiny_model, iterations=40, train_every=1, token_budget=60))
        campaign_id = run_campaign(
            config,
            store,
            CirclePacking(),
            on_progress=lambda iteration, shown: lines.append(shown.line(iteration, 40)),
        )
        done = store.iterations_done(campaign_id)
    assert 1 <= done < 40
    assert "| step " in lines[-1] and lines[-1].startswith(f"iteration {done}/40 |")


def test_without_a_final_step_the_last_groups_wait_and_an_extension_trains_them_first(
    tiny_model: str, harvested: Path, tmp_path: Path
) -> None:
    """`final_step = false`: the groups of the last batch are left for an extended run, said at
    the end; any run that samples trains the groups waiting for it before its first batch, so
    every batch is sampled after the steps on those before it (the harvested three included)."""
    store, campaign_id = harvest(harvested, tmp_path)
    said: list[str] = []
    config = build(settings(tiny_model, iterations=6, train_every=2, final_step=False))
    run_campaign(config, store, CirclePacking(), say=said.append)
    groups = groups_of(store, campaign_id)
    assert [g.train_step for g in groups] == [1, 1, 2, 2, None, None]
    versions = {p.step: p.id for p in store.policies(campaign_id)}
    assert sorted(versions) == [1, 2]
    # Iteration 4 was sampled by step 1's weights, taken on the harvested groups before it.
    assert [g.policy_version_id for g in groups[3:]] == [versions[1], versions[2], versions[2]]
    assert said[-1] == (
        "2 groups not trained: the campaign takes no final step (final_step off); extending "
        "the campaign trains them first"
    )

    run_campaign(build(settings(tiny_model, iterations=7, train_every=2)), store, CirclePacking())
    groups = groups_of(store, campaign_id)
    assert [g.train_step for g in groups] == [1, 1, 2, 2, 3, 3, None]
    [third] = [p for p in store.policies(campaign_id) if p.step == 3]
    assert groups[6].policy_version_id == third.id
