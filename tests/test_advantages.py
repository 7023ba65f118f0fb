"""VPO and baseline advantages: exact values on small cases, and properties under hypothesis."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.training import TrainSettings
from trainer.advantages import (
    EPS,
    ESTIMATORS,
    dirichlet,
    gdpo_advantages,
    grpo_advantages,
    max_at_k_advantages,
    maxrl_advantages,
    multi_rlvr_advantages,
    rw_grpo_advantages,
    standardise,
    vpo_advantages,
)
from trainer.estimators import SINGLE_CANDIDATE


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def group_tensors(draw, batch: int, group: int, m: int, d: int):
    values = draw(
        st.lists(
            st.floats(0, 1, allow_nan=False, width=32),
            min_size=batch * group * m * d,
            max_size=batch * group * m * d,
        )
    )
    flags = draw(st.lists(st.booleans(), min_size=batch * group * m, max_size=batch * group * m))
    scores = torch.tensor(values, dtype=torch.float64).reshape(batch, group, m, d)
    mask = torch.tensor(flags).reshape(batch, group, m)
    return scores, mask


@st.composite
def groups(draw, m: int | None = None):
    batch = draw(st.integers(1, 3))
    group = draw(st.integers(2, 6))
    m = draw(st.integers(1, 4)) if m is None else m
    d = draw(st.integers(1, 4))
    return group_tensors(draw, batch, group, m, d)


def test_corner_set_scores_three_quarters_and_the_compromise_point_six() -> None:
    # d = 2: E[max(w, 1 - w)] = 3/4 for the corners, E[w . (0.6, 0.6)] = 0.6 for the compromise.
    scores = torch.tensor(
        [[[[1.0, 0.0], [0.0, 1.0]], [[0.6, 0.6], [0.6, 0.6]]]], dtype=torch.float64
    )
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    advantages, set_scores = vpo_advantages(scores, mask, num_weights=200_000, generator=seeded())
    assert set_scores[0, 0].item() == pytest.approx(0.75, abs=2e-3)
    assert set_scores[0, 1].item() == pytest.approx(0.60, abs=1e-9)
    # Two rollouts: the better one gets +1, the other -1 (population std).
    assert advantages[0].tolist() == pytest.approx([1.0, -1.0], abs=1e-4)


def test_fixed_weights_give_the_exact_set_score() -> None:
    scores = torch.tensor([[[[0.2, 0.9], [0.8, 0.1]], [[0.5, 0.5], [0.0, 0.0]]]])
    mask = torch.tensor([[[True, True], [True, False]]])
    weights = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]])
    _, set_scores = vpo_advantages(scores, mask, weights=weights)
    # rollout 0: max(0.2, 0.8)=0.8, max(0.9, 0.1)=0.9, max(0.55, 0.45)=0.55 -> mean 0.75
    # rollout 1: only (0.5, 0.5) is real: 0.5 under every w
    assert set_scores[0].tolist() == pytest.approx([0.75, 0.5])


def test_masked_candidates_do_not_enter_the_max_and_an_empty_rollout_scores_zero() -> None:
    scores = torch.tensor([[[[0.9, 0.9], [0.1, 0.1]], [[0.9, 0.9], [0.9, 0.9]]]])
    mask = torch.tensor([[[False, True], [False, False]]])
    _, set_scores = vpo_advantages(scores, mask, num_weights=10, generator=seeded())
    assert set_scores[0, 0].item() == pytest.approx(0.1)
    assert set_scores[0, 1].item() == 0.0


@settings(max_examples=60, deadline=None)
@given(groups(m=1))
def test_vpo_with_one_candidate_is_grpo_on_the_mean(data) -> None:
    scores, mask = data
    _, set_scores = vpo_advantages(scores, mask, num_weights=20_000, generator=seeded(1))
    advantages, mean_reward = grpo_advantages(scores, mask, unbiased=False)
    # With m = 1 the max is linear: E_w[w . r] = mean(r), up to Monte-Carlo error.
    assert torch.allclose(set_scores, mean_reward, atol=0.02)
    exact, _ = vpo_advantages(
        scores, mask, weights=torch.full((scores.shape[0], 1, scores.shape[3]), 1 / scores.shape[3])
    )
    # Under the single weight (1/d, ..., 1/d) the set score is the mean exactly.
    assert torch.allclose(exact, advantages, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(groups(), st.randoms(use_true_random=False))
def test_permuting_candidates_and_rollouts_permutes_nothing_else(data, rng) -> None:
    scores, mask = data
    batch, group, m, d = scores.shape
    weights = dirichlet((batch, 16, d), 1.0, seeded(2), scores)
    advantages, set_scores = vpo_advantages(scores, mask, weights=weights)
    candidates = list(range(m))
    rng.shuffle(candidates)
    rollouts = list(range(group))
    rng.shuffle(rollouts)
    shuffled = scores[:, rollouts][:, :, candidates]
    shuffled_mask = mask[:, rollouts][:, :, candidates]
    moved, moved_scores = vpo_advantages(shuffled, shuffled_mask, weights=weights)
    assert torch.allclose(moved, advantages[:, rollouts], atol=1e-9)
    assert torch.allclose(moved_scores, set_scores[:, rollouts], atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 8), st.integers(1, 3), st.integers(1, 4), st.data())
def test_all_equal_groups_give_exact_zeros(batch, group, m, d, data) -> None:
    row = torch.tensor(
        data.draw(st.lists(st.floats(0, 1, width=32), min_size=m * d, max_size=m * d)),
        dtype=torch.float64,
    ).reshape(1, 1, m, d)
    scores = row.expand(batch, group, m, d).clone()
    mask = torch.ones(batch, group, m, dtype=torch.bool)
    for name, estimator in ESTIMATORS.items():
        if m != 1 and name in SINGLE_CANDIDATE:
            continue
        advantages, _ = estimator(scores, mask)
        assert torch.equal(advantages, torch.zeros(batch, group, dtype=advantages.dtype)), name


@settings(max_examples=60, deadline=None)
@given(groups())
def test_advantages_are_finite_zero_mean_and_unit_spread(data) -> None:
    scores, mask = data
    advantages, set_scores = vpo_advantages(scores, mask, num_weights=32, generator=seeded(3))
    assert torch.isfinite(advantages).all()
    assert ((set_scores >= 0) & (set_scores <= 1 + 1e-9)).all()
    for row, scalars in zip(advantages, set_scores, strict=True):
        if torch.count_nonzero(row):
            assert row.mean().item() == pytest.approx(0.0, abs=1e-6)
            # (x - mean) / (std + eps): unit spread, short by eps when the std is tiny
            std = scalars.std(unbiased=False).item()
            expected = std / (std + EPS)
            assert row.std(unbiased=False).item() == pytest.approx(expected, abs=1e-6)


def test_dirichlet_draws_lie_on_the_simplex_and_follow_the_generator() -> None:
    like = torch.zeros(1, dtype=torch.float64)
    for alpha in (1.0, 0.3, 5.0):
        draws = dirichlet((4, 1000, 3), alpha, seeded(4), like)
        assert (draws >= 0).all()
        assert torch.allclose(draws.sum(-1), torch.ones(4, 1000, dtype=torch.float64))
        assert torch.equal(draws, dirichlet((4, 1000, 3), alpha, seeded(4), like))
        # Mean 1/d; variance (1/d)(1 - 1/d)/(d*alpha + 1) for each coordinate.
        assert draws.mean().item() == pytest.approx(1 / 3, abs=0.01)
        assert draws[..., 0].var().item() == pytest.approx((2 / 9) / (3 * alpha + 1), rel=0.1)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet((1, 1, 2), 0.0, None, like)


def test_grpo_uses_the_mean_reward_and_bessel_std() -> None:
    scores = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]]]])
    mask = torch.ones(1, 3, 1, dtype=torch.bool)
    advantages, rewards = grpo_advantages(scores, mask)
    assert rewards[0].tolist() == pytest.approx([0.5, 0.0, 1.0])
    assert advantages[0].tolist() == pytest.approx([0.0, -1.0, 1.0], abs=1e-5)
    with pytest.raises(ValueError, match="m = 1"):
        grpo_advantages(torch.zeros(1, 2, 3, 2), torch.ones(1, 2, 3, dtype=torch.bool))


def test_multi_rlvr_sums_distinct_candidates_only() -> None:
    scores = torch.tensor(
        [[[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.5, 0.5], [0.0, 0.0]]]]
    )
    mask = torch.tensor([[[True, True, True], [True, True, False]]])
    _, rewards = multi_rlvr_advantages(scores, mask)
    # rollout 0: (1,0) counted once, (0,1): 0.5 + 0.5; rollout 1: 0.5 + 0.5 (the third is masked)
    assert rewards[0].tolist() == pytest.approx([1.0, 1.0])


def brute_force_max_at_k(rewards: list[float], k: int) -> list[float]:
    """Each reward's share of the sum over k-subsets of their max, over C(n, k)."""
    n = len(rewards)
    shares = [0.0] * n
    for subset in itertools.combinations(range(n), k):
        best = max(rewards[i] for i in subset)
        for i in subset:
            shares[i] += best
    return [s / math.comb(n, k) for s in shares]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1, width=32), min_size=2, max_size=7), st.data())
def test_max_at_k_matches_brute_force(rewards, data) -> None:
    n = len(rewards)
    k = data.draw(st.integers(1, n))
    scores = torch.tensor(rewards, dtype=torch.float64).reshape(1, n, 1, 1)
    mask = torch.ones(1, n, 1, dtype=torch.bool)
    _, estimate = max_at_k_advantages(scores, mask, k=k)
    assert estimate[0].tolist() == pytest.approx(brute_force_max_at_k(rewards, k), abs=1e-9)
    # The shares add up to k times the expected max of k.
    expected_max = sum(
        max(rewards[i] for i in s) for s in itertools.combinations(range(n), k)
    ) / math.comb(n, k)
    assert estimate.sum().item() == pytest.approx(k * expected_max, abs=1e-9)


def test_gdpo_normalises_each_objective_then_whitens_the_batch() -> None:
    # Objective 1 spans 0..1, objective 2 only 0..0.01; after the per-objective z-norm the
    # rollout that leads on objective 2 counts as much as the one that leads on objective 1.
    scores = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.01]], [[0.0, 0.0]]]])
    mask = torch.ones(1, 3, 1, dtype=torch.bool)
    advantages, _ = gdpo_advantages(scores, mask)
    assert advantages[0, 0].item() == pytest.approx(advantages[0, 1].item(), rel=1e-3)
    assert advantages[0, 2] < 0 < advantages[0, 0]
    assert advantages.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert advantages.std().item() == pytest.approx(1.0, abs=1e-3)
    # GRPO on the mean reward would rank them 0.5 against 0.005.
    grpo, _ = grpo_advantages(scores, mask)
    assert grpo[0, 0] > grpo[0, 1] + 1


def test_bad_shapes_say_what_was_expected() -> None:
    with pytest.raises(ValueError, match=r"\(B, G, m, d\)"):
        vpo_advantages(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        vpo_advantages(torch.zeros(1, 2, 3, 2), torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="weights"):
        vpo_advantages(
            torch.zeros(1, 2, 3, 2),
            torch.ones(1, 2, 3, dtype=torch.bool),
            weights=torch.ones(1, 5, 3),
        )
    with pytest.raises(ValueError, match="k"):
        max_at_k_advantages(torch.zeros(1, 2, 1, 1), torch.ones(1, 2, 1, dtype=torch.bool), k=3)


def test_standardise_of_a_single_rollout_is_zero() -> None:
    assert torch.equal(standardise(torch.tensor([[0.7]])), torch.zeros(1, 1))


def test_maxrl_divides_the_deviation_by_the_group_mean() -> None:
    scores = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]], [[0.5, 0.5]]]])
    mask = torch.ones(1, 4, 1, dtype=torch.bool)
    advantages, rewards = maxrl_advantages(scores, mask)
    assert rewards[0].tolist() == pytest.approx([0.5, 0.0, 1.0, 0.5])
    # mean 0.5: (r - 0.5) / 0.5
    assert advantages[0].tolist() == pytest.approx([0.0, -1.0, 1.0, 0.0], abs=1e-5)
    # A rare success is scaled by 1 / mean, not by the spread: one 0.1 among three zeros
    # (mean 0.025) gets (0.1 - 0.025) / 0.025 = 3, the misses -1.
    rare = torch.tensor([[[[0.1, 0.1]], [[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]]]])
    advantages, _ = maxrl_advantages(rare, mask)
    assert advantages[0].tolist() == pytest.approx([3.0, -1.0, -1.0, -1.0], rel=1e-3)
    zeros, _ = maxrl_advantages(torch.zeros(1, 4, 1, 2), mask)
    assert torch.equal(zeros, torch.zeros(1, 4, dtype=zeros.dtype))
    with pytest.raises(ValueError, match="m = 1"):
        maxrl_advantages(torch.zeros(1, 2, 3, 2), torch.ones(1, 2, 3, dtype=torch.bool))


def test_rw_grpo_is_grpo_on_one_random_weighting_per_group() -> None:
    scores = torch.tensor(
        [[[[1.0, 0.0]], [[0.0, 1.0]], [[0.5, 0.5]]], [[[1.0, 0.0]], [[0.0, 1.0]], [[0.2, 0.2]]]],
        dtype=torch.float64,
    )
    mask = torch.ones(2, 3, 1, dtype=torch.bool)
    weights = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64)
    advantages, rewards = rw_grpo_advantages(scores, mask, weights=weights)
    assert rewards.flatten().tolist() == pytest.approx([0.9, 0.1, 0.5, 0.2, 0.8, 0.2])
    expected, _ = grpo_advantages(
        rewards.reshape(2, 3, 1, 1),
        mask,  # GRPO on the weighted scalar
    )
    assert torch.allclose(advantages, expected)
    # Drawn weights follow the generator, and differ between groups.
    drawn, first = rw_grpo_advantages(scores, mask, generator=seeded(5))
    again, second = rw_grpo_advantages(scores, mask, generator=seeded(5))
    assert torch.equal(drawn, again) and torch.equal(first, second)
    with pytest.raises(ValueError, match=r"weights must be \(B=2, d=2\)"):
        rw_grpo_advantages(scores, mask, weights=torch.ones(3, 2))


def test_a_rollout_of_fewer_whole_candidates_scores_nothing_under_the_whole_format_reward() -> None:
    """VPO's set reward takes the best candidate's score, so with partial credit a rollout of one
    good candidate earns what a rollout of m does; "whole" pays only rollouts whose m parsed."""
    from harness.config.errors import UserError
    from harness.config.settings import build
    from harness.learning.rewards import to_group
    from harness.records import TrainingGroup, TrainingRollout
    from trainer.advantages import compute_advantages
    from trainer.train import TrainConfig

    good, fair = {"a": 0.9, "b": 0.8}, {"a": 0.2, "b": 0.1}
    rollouts = tuple(
        TrainingRollout((1, 2), (3,), None, slots)
        for slots in ((good, None, None), (fair, fair, fair), (None, None, None), (fair, good))
    )
    group = TrainingGroup(1, 1, rollouts)
    partial = to_group(group, ["a", "b"], 3)
    whole = to_group(group, ["a", "b"], 3, TrainSettings(format_reward="whole"))
    assert partial is not None and whole is not None
    assert partial.mask.sum(axis=1).tolist() == [1, 3, 0, 2]
    assert whole.mask.sum(axis=1).tolist() == [0, 3, 0, 0] and whole.scores[0].sum() == 0
    vpo = TrainConfig(advantage="vpo")
    by_partial = compute_advantages([partial], vpo).per_rollout
    by_whole = compute_advantages([whole], vpo).per_rollout
    assert by_partial[0] > by_partial[1]  # one good candidate beats three fair ones
    assert by_whole[1] > 0 > by_whole[0]  # the only whole rollout is the one rewarded
    assert build({"format_reward": "whole"}).training.format_reward == "whole"
    with pytest.raises(UserError, match="format_reward"):
        build({"format_reward": "strict"})


def test_a_completion_near_the_token_limit_loses_its_scores() -> None:
    """A soft overlong punishment: without it a set reward that favours longer expressions grows
    the answers into the limit; with it the longest whole rollout is no longer the best."""
    from harness.config.errors import UserError
    from harness.config.settings import build
    from harness.learning.rewards import overlong_penalty, to_group
    from harness.records import TrainingGroup, TrainingRollout
    from trainer.advantages import compute_advantages
    from trainer.train import TrainConfig

    assert [overlong_penalty(n, 32, 160) for n in (100, 128, 144, 160, 170)] == [0, 0, 0.5, 1, 1]
    assert overlong_penalty(160, 0, 160) == 0  # off
    good, fair = {"a": 0.9, "b": 0.8}, {"a": 0.5, "b": 0.4}
    rollouts = (
        TrainingRollout((1, 2), (3,) * 150, None, (good, good, good)),  # keeps 0.3125
        TrainingRollout((1, 2), (3,) * 60, None, (fair, fair, fair)),  # short: keeps all
        TrainingRollout((1, 2), (3,) * 60, None, (None, None, None)),  # unparsed: nothing
        TrainingRollout((1, 2), (3,) * 160, None, (fair, fair, fair)),  # at the limit
    )
    group = TrainingGroup(1, 1, rollouts)
    plain = to_group(group, ["a", "b"], 3, TrainSettings(format_reward="whole"))
    rules = TrainSettings(format_reward="whole", overlong_buffer=32)
    punished = to_group(group, ["a", "b"], 3, rules, max_tokens=160)
    assert plain is not None and punished is not None
    assert punished.scores[0, 0].tolist() == pytest.approx([0.9 * 0.3125, 0.8 * 0.3125])
    assert punished.scores[1].tolist() == plain.scores[1].tolist()
    assert punished.scores[3].sum() == 0 and punished.mask.tolist() == plain.mask.tolist()
    vpo = TrainConfig(advantage="vpo")
    before = compute_advantages([plain], vpo).per_rollout
    after = compute_advantages([punished], vpo).per_rollout
    assert before[0] > before[1] and before[3] > before[2]  # the long ones were the better
    assert after[1] > after[0] and after[3] == after[2]  # now the short one is; the limit pays 0
    assert build({"overlong_buffer": 32, "max_tokens": 160}).training.overlong_buffer == 32
    with pytest.raises(UserError, match="overlong_buffer"):
        build({"overlong_buffer": 160, "max_tokens": 160})
