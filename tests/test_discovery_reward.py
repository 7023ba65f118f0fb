"""The discovery reward: a set score measured against what the campaign holds (the parent, the
island's or the campaign's front), a cost for every wasted candidate slot, TTT-Discover's
entropic advantage, and the warm-up before the first step. Each checked against a plain
reference written here with loops, on random inputs and on hand-made groups."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from itertools import product

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.training import TrainSettings
from harness.learning.rewards import references, to_group, wasted_slots
from harness.records import TrainingGroup, TrainingRollout
from harness.store import Store
from trainer.advantages import (
    compute_advantages,
    entropic_advantages,
    entropic_beta,
    set_scores,
    vpo_advantages,
)
from trainer.train import Group, Rollout, TrainConfig


def plain_set_scores(
    scores, mask, weights, reference=None, reference_mask=None, cost=None, signed=False
):
    """E_w[max(0, max_c w . r_c - max_p w . ref_p)] - cost, one number at a time (`signed`:
    the gain without the max(0, ...))."""
    batch, group, m, _ = scores.shape
    out = np.zeros((batch, group))
    for b, g in product(range(batch), range(group)):
        total = 0.0
        for w in weights[b]:
            real = [float(w @ scores[b, g, c]) for c in range(m) if mask[b, g, c]]
            best = max(real) if real else 0.0
            if reference is not None:
                known = [
                    float(w @ reference[b, p])
                    for p in range(reference.shape[1])
                    if reference_mask[b, p]
                ]
                best = best - (max(known) if known else 0.0)
                best = best if signed else max(0.0, best)
            total += best
        out[b, g] = total / len(weights[b]) - (0.0 if cost is None else cost[b, g])
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(0, 4),
    st.integers(0, 2**31 - 1),
)
def test_the_set_score_against_a_reference_is_the_r2_gain(batch, group, m, d, rows, seed):
    """Exact against the loop on random (B, G, m, d) inputs, masks, reference fronts (some
    rows masked, some groups with none) and costs."""
    rng = np.random.default_rng(seed)
    scores = rng.random((batch, group, m, d))
    mask = rng.random((batch, group, m)) < 0.7
    weights = rng.dirichlet(np.ones(d), size=(batch, 5))
    reference = rng.random((batch, max(rows, 1), d))
    reference_mask = rng.random((batch, max(rows, 1))) < (0.8 if rows else 0.0)
    cost = rng.random((batch, group)) * 0.1
    as_tensor = torch.from_numpy
    for signed in (False, True):  # the gain clipped at 0, and the gain or the loss
        got = set_scores(
            as_tensor(scores),
            as_tensor(mask),
            weights=as_tensor(weights),
            reference=as_tensor(reference),
            reference_mask=as_tensor(reference_mask),
            cost=as_tensor(cost),
            signed=signed,
        )
        expected = plain_set_scores(
            scores, mask, weights, reference, reference_mask, cost, signed=signed
        )
        assert np.allclose(got.numpy(), expected, atol=1e-12)
    absolute = set_scores(as_tensor(scores), as_tensor(mask), weights=as_tensor(weights))
    assert np.allclose(absolute.numpy(), plain_set_scores(scores, mask, weights), atol=1e-12)
    # A reference of no rows (an island that held nothing yet) is the absolute score.
    empty = set_scores(
        as_tensor(scores),
        as_tensor(mask),
        weights=as_tensor(weights),
        reference=torch.zeros((batch, 0, d), dtype=torch.float64),
    )
    assert torch.equal(empty, absolute)


def test_a_set_that_only_restates_the_front_earns_nothing() -> None:
    front = torch.tensor([[[0.9, 0.1], [0.1, 0.9]]], dtype=torch.float64)
    scores = torch.tensor(
        [[[[0.9, 0.1], [0.1, 0.9]], [[0.5, 0.5], [0.6, 0.6]], [[0.95, 0.2], [0.0, 0.0]]]],
        dtype=torch.float64,
    )
    mask = torch.ones(1, 3, 2, dtype=torch.bool)
    gains = set_scores(scores, mask, reference=front, num_weights=2000).squeeze(0)
    assert gains[0] == 0  # the front itself
    # (0.6, 0.6) is above the chord between the front's points for middle weightings; (0.5,
    # 0.5) on it adds nothing: a linear weighting pays only what lifts the front's hull.
    assert gains[1] > 0
    lone = set_scores(scores[:, 1:2, :1], mask[:, 1:2, :1], reference=front, num_weights=2000)
    assert lone.item() == 0
    assert gains[2] > 0  # (0.95, 0.2) dominates (0.9, 0.1)
    advantages, _ = vpo_advantages(scores, mask, reference=front, num_weights=2000)
    assert advantages[0, 0] < 0 < advantages[0, 2]


def test_a_signed_gain_ranks_the_rollouts_that_do_not_beat_their_parent() -> None:
    """Parent (0.5, 0.5): a rollout below it by 0.1 everywhere, one that repeats it, one with
    no real candidate and one above it by 0.1. Clipped, the first three earn 0 alike; signed,
    each earns its difference under every weighting, so they rank."""
    parent = torch.tensor([[[0.5, 0.5]]], dtype=torch.float64)
    scores = torch.tensor(
        [[[[0.4, 0.4]], [[0.5, 0.5]], [[0.0, 0.0]], [[0.6, 0.6]]]], dtype=torch.float64
    )
    mask = torch.tensor([[[True], [True], [False], [True]]])
    clipped = set_scores(scores, mask, reference=parent, num_weights=50)
    signed = set_scores(scores, mask, reference=parent, num_weights=50, signed=True)
    assert clipped.squeeze(0).tolist() == pytest.approx([0.0, 0.0, 0.0, 0.1])
    assert signed.squeeze(0).tolist() == pytest.approx([-0.1, 0.0, -0.5, 0.1])
    config = TrainConfig(advantage="vpo", signed_gain=True)
    groups = [
        Group(
            rollouts=[Rollout((1,), (2,), None)] * 4,
            scores=scores[0].numpy(),
            mask=mask[0].numpy(),
            reference=parent[0].numpy(),
        )
    ]
    advantages = compute_advantages(groups, config).per_rollout
    assert advantages[2] < advantages[0] < advantages[1] < advantages[3]
    flat = compute_advantages(groups, TrainConfig(advantage="vpo")).per_rollout
    assert flat[0] == flat[1] == flat[2] < flat[3]


def plain_entropic(rewards: np.ndarray, budget: float) -> tuple[float, np.ndarray]:
    """beta by plain bisection on KL(softmax(beta r) || uniform), and w - 1."""
    group = len(rewards)

    def kl(beta: float) -> float:
        q = np.exp(beta * (rewards - rewards.max()))
        q /= q.sum()
        return math.log(group) + float(np.sum(q * np.log(np.maximum(q, 1e-300))))

    if np.ptp(rewards) <= 1e-6:
        return 0.0, np.zeros(group)
    low, high = 0.0, 1.0
    while kl(high) < budget and high < 1e12:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (low, middle) if kl(middle) > budget else (middle, high)
    beta = (low + high) / 2
    q = np.exp(beta * (rewards - rewards.max()))
    return beta, q / q.sum() * group - 1


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.floats(0.05, 1.0), st.integers(0, 2**31 - 1))
def test_the_entropic_advantage_matches_a_plain_bisection(group, budget, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.random((3, group))
    rewards[2] = 0.25  # a flat group: exact zeros
    budget = min(budget, 0.9 * math.log(group))  # reachable without ties
    betas = entropic_beta(torch.from_numpy(rewards), budget)
    scores = torch.from_numpy(rewards).reshape(3, group, 1, 1)
    advantages, values = entropic_advantages(
        scores, torch.ones(3, group, 1, dtype=torch.bool), budget=budget, num_weights=1
    )
    assert torch.allclose(values, torch.from_numpy(rewards))
    for row in range(3):
        beta, expected = plain_entropic(rewards[row], budget)
        assert betas[row].item() == pytest.approx(beta, rel=1e-6, abs=1e-9)
        assert np.allclose(advantages[row].numpy(), expected, atol=1e-6)
        assert advantages[row].sum().item() == pytest.approx(0.0, abs=1e-9)
    assert not advantages[2].any()
    # The best rollout of a group gets the largest advantage, more than z-scores give it
    # when the others bunch together below it.
    bunched = torch.tensor([[0.1, 0.11, 0.12, 0.5]], dtype=torch.float64).reshape(1, 4, 1, 1)
    entropic, _ = entropic_advantages(bunched, torch.ones(1, 4, 1, dtype=torch.bool), num_weights=1)
    assert entropic[0].argmax() == 3 and entropic[0, 3] > 1.5


def rollout(candidates, programs, lazy=(), valid=()) -> TrainingRollout:
    return TrainingRollout((1, 2), (3, 4), None, tuple(candidates), tuple(lazy), 0,
                           tuple(programs), tuple(valid))  # fmt: skip


def test_every_slot_counts() -> None:
    """A rollout of one good candidate and two repeats earns less than one whose three
    candidates are distinct and valid; candidates that land on different parts of the front
    earn more than one of them alone; an unparsed, lazy, failed or zero-scoring slot costs the
    same."""
    good, left, right = {"a": 0.8, "b": 0.3}, {"a": 0.9, "b": 0.1}, {"a": 0.1, "b": 0.9}
    front = np.array([[0.5, 0.5]])
    rollouts = (
        rollout([good, good, good], [7, 7, 7], valid=[True] * 3),  # one program, twice repeated
        rollout([good, left, right], [7, 8, 9], valid=[True] * 3),  # distinct, valid
        rollout([good, None, None], [7, None, None], valid=[True, False, False]),  # 2 unparsed
        rollout([good, left, left], [7, 8, 3], lazy=[False, False, True], valid=[True] * 3),
        rollout([good, left, right], [7, 8, 10], valid=[True, True, False]),  # one failed
        rollout([good, left, {"a": 0.0, "b": 0.0}], [7, 8, 11], valid=[True] * 3),  # one scored 0
    )
    assert [wasted_slots(r, 3) for r in rollouts] == [2, 0, 2, 1, 1, 1]
    # Zero on the vector trained on is zero, whatever else the slot scored (a case, say).
    on_a_case = rollout([good, {"a": 0.0, "b": 0.0, "case:r1": 0.4}], [7, 12], valid=[True] * 2)
    assert wasted_slots(on_a_case, 2, ["a", "b"]) == 1
    assert wasted_slots(on_a_case, 2, ["case:r1"]) == 1  # `good` has no case score: 0
    assert wasted_slots(on_a_case, 2) == 0
    rules = TrainSettings(slot_cost=0.1)
    group = to_group(TrainingGroup(1, 0, rollouts), ["a", "b"], 3, rules, reference=front)
    assert group is not None and np.allclose(group.cost, 0.1 * np.array([2, 0, 2, 1, 1, 1]) / 3)
    weights = torch.from_numpy(np.random.default_rng(0).dirichlet([1, 1], size=(1, 4000)))
    earned = set_scores(
        torch.from_numpy(group.scores[None]),
        torch.from_numpy(group.mask[None]),
        weights=weights,
        reference=torch.from_numpy(front[None]),
        cost=torch.from_numpy(group.cost[None]),
    )[0]
    assert earned[1] > earned[0]  # three distinct, valid candidates beat one and two repeats
    assert earned[0] == pytest.approx(earned[2])  # repeats cost what unparsed slots cost
    assert earned[5] < earned[1]  # a valid equation that scores nothing is a wasted slot too
    alone = set_scores(
        torch.from_numpy(group.scores[None, :1, :1]),
        torch.from_numpy(group.mask[None, :1, :1]),
        weights=weights,
        reference=torch.from_numpy(front[None]),
    )[0, 0]
    spread = set_scores(
        torch.from_numpy(group.scores[None, 1:2]),
        torch.from_numpy(group.mask[None, 1:2]),
        weights=weights,
        reference=torch.from_numpy(front[None]),
    )[0, 0]
    assert spread > alone > 0  # the front's two ends add to what the good one adds alone


def test_a_reward_against_a_reference_needs_a_set_estimator() -> None:
    scores = np.ones((2, 1, 2))
    group = Group([Rollout([1], [2]), Rollout([1], [3])], scores, np.ones((2, 1), bool),
                  reference=np.zeros((1, 2)))  # fmt: skip
    with pytest.raises(ValueError, match="vpo or entropic"):
        compute_advantages([group], TrainConfig(advantage="grpo"))
    assert len(compute_advantages([group], TrainConfig(advantage="entropic")).per_rollout) == 2


def test_references_hold_what_was_known_before_each_group(database: str) -> None:
    """On a real campaign (SQLite and PostgreSQL): seed (0.5, 0.5); group 1 (island 0, parent
    the seed) writes A (0.9, 0.1), B (0.1, 0.9) and a failed C; group 2 (island 1, parent A)
    writes D (0.95, 0.2)."""
    store = Store.open(database)
    campaign = store.get_campaign("c")
    assert campaign is not None
    groups = store.training_groups(campaign.id)
    first, second = (g.id for g in groups)
    objectives = ["a", "b"]

    def rows(scope: str) -> dict[int, set[tuple[float, ...]]]:
        found = references(store, campaign.id, groups, objectives, scope)
        return {k: {tuple(map(float, row)) for row in v} for k, v in found.items()}

    assert rows("none") == {}
    assert rows("parent") == {first: {(0.5, 0.5)}, second: {(0.9, 0.1)}}
    # Its own programs and the later ones are not what a group is measured against; the
    # failed C is no front point.
    assert rows("campaign") == {first: {(0.5, 0.5)}, second: {(0.5, 0.5), (0.9, 0.1), (0.1, 0.9)}}
    assert rows("island") == {first: {(0.5, 0.5)}, second: set()}  # island 1 held nothing
    assert [wasted_slots(r, 2) for r in groups[0].rollouts] == [0, 2]
    assert [wasted_slots(r, 2) for r in groups[1].rollouts] == [1]
    store.close()


def test_the_reward_scale_benchmark_reads_a_campaign(database: str, tmp_path) -> None:
    """benchmarks/reward_scale.py on the small campaign: one row per reference, and the
    wasted slots of its three rollouts (0, 2 and 1)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "reward_scale.py"
    spec = importlib.util.spec_from_file_location("benchmark_reward_scale", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "scale.md"
    assert module.main(["--db", database, "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    name = module.label(database)
    assert [row.split(" | ")[:2] for row in rows] == [
        [f"| {name}", scope] for scope in ("parent", "island", "campaign", "none")
    ]
    assert f"{name}: m = 2, 3 rollouts; wasted slots per rollout: 0: 33%, 1: 33%, 2: 33%" in (
        out.read_text()
    )
    # Several campaigns: rows for each, in the order given.
    assert module.main(["--db", database, "--db", database, "--references", "none",
                        "--out", str(out)]) == 0  # fmt: skip
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[1] for row in rows] == ["none", "none"]
    with pytest.raises(SystemExit):
        module.main(["--db", str(tmp_path / "absent.db"), "--out", str(out)])


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"reward_reference": "front"}, "reward_reference"),
        ({"slot_cost": -0.1}, "slot_cost"),
        ({"slot_cost": math.nan}, "slot_cost"),
        ({"kl_budget": 0.0}, "kl_budget"),
        ({"warmup_samples": -1}, "warmup_samples"),
        ({"advantage": "grpo", "candidates": 1, "reward_reference": "parent"}, "vpo or entropic"),
        ({"gain": "signed"}, "gain"),
        ({"gain": "both", "reward_reference": "parent"}, "gain"),
    ],
)
def test_a_bad_reward_setting_is_one_line(settings: dict, words: str) -> None:
    from harness.config.errors import UserError
    from harness.config.settings import build

    with pytest.raises(UserError, match=words) as info:
        build({"problem": "equation_discovery", "train_every": 1, **settings})
    assert "\n" not in str(info.value)


def test_the_first_step_waits_for_the_warm_up_samples_then_takes_them_all(database: str) -> None:
    """The small campaign holds two waiting groups of 2 and 1 rollouts. With warmup_samples 4
    no step may start; with 3 the first step takes both groups; without a warm-up it takes the
    oldest `every`; once a version is recorded the warm-up is over."""
    from harness.learning.steps import CampaignTrainer, _waiting_groups
    from harness.records import PolicyVersion

    store = Store.open(database)
    campaign = store.get_campaign("c")
    assert campaign is not None

    def waiting(
        warmup: int, version: PolicyVersion | None = None, every: int = 1
    ) -> list[int] | None:
        settings = TrainSettings(train_every=every, warmup_samples=warmup)
        trainer = CampaignTrainer(
            store, campaign.id, settings, ["a", "b"], 2, 0, 0, None, None, None, "c",  # type: ignore[arg-type]
            version=version,
        )  # fmt: skip
        found = _waiting_groups(trainer)
        return None if found is None else [g.iteration for g in found]

    assert store.untrained_rollouts(campaign.id) == 3
    assert waiting(4) is None
    assert waiting(3) == [0, 1]
    assert waiting(0) == [0] and waiting(0, every=3) is None
    recorded = PolicyVersion(7, campaign.id, 1, "step-000001", {}, datetime.now(UTC))
    assert waiting(4, version=recorded) == [0]
    store.close()
