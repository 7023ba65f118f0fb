"""The policy loss, the policy (full and LoRA, save and resume) and one training step."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.advantages import compute_advantages
from trainer.logprobs import completion_logprobs, token_batch
from trainer.loss import LossConfig, policy_loss
from trainer.measures import pool_diversity
from trainer.policy import Policy, PolicyConfig
from trainer.train import Group, Rollout, TrainConfig, train_step

# -- loss ---------------------------------------------------------------------------------------


def test_loss_is_minus_advantage_weighted_logprob_at_ratio_one() -> None:
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([2.0, -1.0])
    loss, parts = policy_loss(logprobs, logprobs.detach(), advantages, mask)
    # ratio 1 everywhere: pg = -A per token; token-mean over 3 tokens: (-2 - 2 + 1) / 3
    assert loss.item() == pytest.approx(-1.0)
    assert parts.tokens == 3 and parts.clipped == 0
    loss.backward()
    # d loss / d logp = -A / tokens on real tokens, 0 on padding
    expected = torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)


def test_clip_and_dual_clip_bound_the_loss() -> None:
    old = torch.zeros(1, 4)
    # ratios e^1 = 2.7 and e^-1 = 0.37, e^2 = 7.4 (past the dual clip of 3)
    new = torch.tensor([[1.0, -1.0, 2.0, 2.0]], requires_grad=True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    positive, _ = policy_loss(new, old, torch.tensor([1.0]), mask, total_tokens=1)
    # A > 0: min(r, 1.2) for r > 1.2 -> each token contributes -1.2; r = 0.37 contributes -0.37
    assert positive.item() == pytest.approx(-(1.2 + math.exp(-1) + 1.2 + 1.2))
    negative, parts = policy_loss(new, old, torch.tensor([-1.0]), mask, total_tokens=1)
    # A < 0: max(r, 0.8) * 1, capped at dual clip 3: 2.72, 0.8, 3, 3
    assert negative.item() == pytest.approx(math.e + 0.8 + 3.0 + 3.0)
    assert parts.clipped == 4


def test_k3_kl_is_zero_at_the_reference_and_positive_elsewhere() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    zero = torch.zeros(1)
    _, same = policy_loss(logprobs, logprobs, zero, mask, ref_logprobs=logprobs)
    assert same.kl == pytest.approx(0.0)
    loss, parts = policy_loss(
        logprobs, logprobs, zero, mask, ref_logprobs=logprobs - 0.5, config=LossConfig(beta=0.1)
    )
    k3 = math.exp(-0.5) + 0.5 - 1
    assert parts.kl == pytest.approx(2 * k3)
    assert loss.item() == pytest.approx(0.1 * k3)


def test_loss_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="clip"):
        LossConfig(clip=1.5)
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(dual_clip=0.5)


# -- groups and advantages ---------------------------------------------------------------------


def corner_group(prompt: list[int], completions: list[list[int]]) -> Group:
    """Rollout 0 covers both corners of a 2-objective front; the others do not."""
    scores = np.zeros((len(completions), 2, 2))
    scores[0] = [[1.0, 0.0], [0.0, 1.0]]
    for i in range(1, len(completions)):
        scores[i] = [[0.5, 0.5], [0.5, 0.5]]
    return Group(
        rollouts=[Rollout(prompt, c) for c in completions],
        scores=scores,
        mask=np.ones((len(completions), 2), dtype=bool),
    )


def test_groups_refuse_bad_shapes_and_values() -> None:
    with pytest.raises(ValueError, match="scores"):
        Group([Rollout([1], [2])], np.zeros((1, 2)), np.ones((1, 2), dtype=bool))
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite and >= 0"):
            Group([Rollout([1], [2])], np.full((1, 1, 1), bad), np.ones((1, 1), dtype=bool))
    # Above 1 is a score beyond the best known value: a record, and a valid reward.
    Group([Rollout([1], [2])], np.full((1, 1, 1), 1.3), np.ones((1, 1), dtype=bool))
    with pytest.raises(ValueError, match="rollouts"):
        Group([], np.zeros((1, 1, 1)), np.ones((1, 1), dtype=bool))


def test_advantages_batch_groups_of_different_shapes() -> None:
    a = corner_group([1, 2], [[3], [4], [5]])
    b = Group(
        [Rollout([1], [2]), Rollout([1], [3])],
        np.array([[[0.1]], [[0.9]]]),
        np.ones((2, 1), dtype=bool),
    )
    result = compute_advantages([a, b], TrainConfig(num_weights=2000), torch.Generator())
    assert len(result.per_rollout) == 5
    assert result.per_rollout[0] > 0 > result.per_rollout[1]
    assert result.per_rollout[3:] == pytest.approx([-1.0, 1.0], abs=1e-4)
    with pytest.raises(ValueError, match="one candidate"):
        compute_advantages([a], TrainConfig(advantage="grpo"))


def test_a_steps_pool_diversity_is_over_each_groups_real_candidates() -> None:
    scores = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]]])  # (G, m, d)
    mask = np.array([[True, True], [True, False]])
    # real vectors: (1,0), (0,1), (1,0): distances 2, 0, 2 -> mean 4/3
    assert pool_diversity(scores[mask]) == pytest.approx(4 / 3)
    group = Group([Rollout([1], [2]), Rollout([1], [3])], scores, mask)
    assert compute_advantages([group], TrainConfig()).diversity == pytest.approx([4 / 3])


# -- the policy and the step on a tiny model ---------------------------------------------------


def tiny_groups(policy: Policy, count: int = 2) -> list[Group]:
    tokenizer = policy.tokenizer
    prompt = tokenizer("Pack circles in a square.")["input_ids"]
    completions = [tokenizer(text)["input_ids"] for text in ("a b c d", "x y", "circle", "z z z")]
    return [corner_group(prompt, completions) for _ in range(count)]


def weights_of(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}


def test_completion_logprobs_match_a_plain_forward_pass(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(reference=False))
    group = tiny_groups(policy, 1)[0]
    config = TrainConfig(logit_chunk=3, temperature=0.7)
    rows = [(list(r.prompt_ids), list(r.completion_ids), None) for r in group.rollouts]
    batch = token_batch(rows, device=policy.device)
    with torch.no_grad():
        chunked = completion_logprobs(policy.model, batch, config.temperature, config.logit_chunk)
        for row, (prompt, completion, _) in enumerate(rows):
            ids = torch.tensor([prompt + completion])
            logits = policy.model(ids).logits[0, len(prompt) - 1 : -1] / 0.7
            expected = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
            assert torch.allclose(chunked[row, : len(completion)], expected, atol=1e-5)


def test_a_step_moves_the_weights_and_favours_the_diverse_rollout(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2))
    groups = tiny_groups(policy)
    before = weights_of(policy)
    config = TrainConfig(micro_batch=3, logit_chunk=4)
    rows = [(list(r.prompt_ids), list(r.completion_ids), None) for r in groups[0].rollouts]
    batch = token_batch(rows, device=policy.device)
    with torch.no_grad():
        old = completion_logprobs(policy.model, batch, config.temperature, config.logit_chunk)
    metrics = train_step(policy, groups, config, generator=torch.Generator().manual_seed(0))
    after = weights_of(policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics.step == policy.step == 1
    assert metrics.tokens == 2 * sum(len(r.completion_ids) for r in groups[0].rollouts)
    assert metrics.zero_std_fraction == 0.0
    assert metrics.set_score == pytest.approx((0.75 + 3 * 0.5) / 4, abs=0.02)
    assert metrics.diversity > 0
    assert math.isfinite(metrics.loss) and metrics.kl == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        new = completion_logprobs(policy.model, batch, config.temperature, config.logit_chunk)
    # The rollout covering both corners gained probability; the compromises lost it.
    gain = ((new - old) * batch["completion_mask"]).sum(dim=1)
    assert gain[0] > 0 and (gain[1:] < 0).all()


@pytest.mark.parametrize("advantage", ["maxrl", "rw_grpo"])
def test_single_candidate_baselines_train_towards_the_best_rollout(
    tiny_model: str, advantage: str
) -> None:
    """MaxRL and random-weighting GRPO take a real step: rollout 0 beats the others on both
    objectives, so under any weighting it gains probability."""
    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2, reference=False))
    group = tiny_groups(policy, 1)[0]
    scores = np.full((len(group.rollouts), 1, 2), 0.2)
    scores[0] = [[0.9, 0.8]]
    single = Group(group.rollouts, scores, np.ones((len(group.rollouts), 1), dtype=bool))
    config = TrainConfig(advantage=advantage, loss=LossConfig(beta=0.0))
    rows = [(list(r.prompt_ids), list(r.completion_ids), None) for r in single.rollouts]
    batch = token_batch(rows, device=policy.device)
    with torch.no_grad():
        old = completion_logprobs(policy.model, batch, config.temperature, config.logit_chunk)
    before = weights_of(policy)
    metrics = train_step(policy, [single], config, generator=torch.Generator().manual_seed(1))
    assert math.isfinite(metrics.loss) and metrics.zero_std_fraction == 0.0
    assert any(not torch.equal(before[k], v) for k, v in weights_of(policy).items())
    with torch.no_grad():
        new = completion_logprobs(policy.model, batch, config.temperature, config.logit_chunk)
    gain = ((new - old) * batch["completion_mask"]).sum(dim=1)
    assert gain[0] > 0 and (gain[1:] < 0).all()


def test_all_equal_groups_only_feel_the_kl(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2))
    group = tiny_groups(policy, 1)[0]
    flat = Group(group.rollouts, np.full(group.scores.shape, 0.5), group.mask)
    metrics = train_step(policy, [flat], TrainConfig(loss=LossConfig(beta=0.0)))
    assert metrics.zero_std_fraction == 1.0
    assert metrics.grad_norm == 0.0


def test_rollouts_with_zero_advantage_are_skipped_without_changing_the_step(
    tiny_model: str,
) -> None:
    """A flat group beside a real one: skipping the flat group's rollouts gives the same
    gradient (KL off) as running them, and a step of flat groups only runs nothing and moves
    nothing. (Adam's first step is about lr * sign(gradient), so the weights themselves differ
    where bfloat16 rounding of differently padded micro-batches flips a near-zero component.)"""
    norms = []
    for skip in (False, True):
        policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2, reference=False))
        real, other = tiny_groups(policy)
        flat = Group(other.rollouts, np.full(other.scores.shape, 0.5), other.mask)
        config = TrainConfig(loss=LossConfig(beta=0.0), skip_zero_advantage=skip, micro_batch=2)
        metrics = train_step(
            policy, [flat, real], config, generator=torch.Generator().manual_seed(0)
        )
        assert metrics.rollouts == 8 and metrics.trained == (4 if skip else 8)
        assert metrics.tokens == 2 * sum(len(r.completion_ids) for r in real.rollouts)
        norms.append(metrics.grad_norm)
    assert norms[0] > 0 and norms[1] == pytest.approx(norms[0], rel=1e-2)

    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2))
    before = weights_of(policy)
    flat = Group(real.rollouts, np.zeros(real.scores.shape), real.mask)
    metrics = train_step(policy, [flat, flat], TrainConfig())
    assert metrics.trained == 0 and metrics.grad_norm == 0.0 and metrics.step == 1
    assert metrics.mean_ratio == 1.0 and "weights unchanged" in metrics.line()
    assert all(torch.equal(before[k], v) for k, v in weights_of(policy).items())


def test_sampler_logprobs_are_required_when_asked_for(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(reference=False))
    with pytest.raises(ValueError, match="log-probs"):
        train_step(policy, tiny_groups(policy, 1), TrainConfig(old_logprobs="sampler"))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_save_and_resume_keep_weights_optimiser_and_step(
    tiny_model: str, tmp_path: Path, lora: bool
) -> None:
    # fp32: the resumed model's logits are compared with a merged fp32 copy's, outside autocast
    config = PolicyConfig(lr=1e-2, lora=lora, lora_rank=4, precision="float32")
    policy = Policy.load(tiny_model, config)
    groups = tiny_groups(policy)
    train_step(policy, groups)
    folder = policy.save(tmp_path / "step-000001")
    assert (folder / "policy.json").exists() and (folder / "optimizer.pt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left

    resumed = Policy.resume(folder)
    assert resumed.step == 1 and resumed.config.lora == lora
    for name, value in weights_of(policy).items():
        assert torch.equal(value, weights_of(resumed)[name]), name
    # The optimiser state came back: the next step is the same from either copy.
    generator = torch.Generator().manual_seed(5)
    train_step(policy, groups, generator=generator)
    train_step(resumed, groups, generator=torch.Generator().manual_seed(5))
    for name, value in weights_of(policy).items():
        assert torch.allclose(value, weights_of(resumed)[name], atol=1e-6), name
    assert resumed.step == 2

    merged = resumed.save_merged(tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(merged)
    ids = torch.tensor([groups[0].rollouts[0].prompt_ids])
    with torch.no_grad():
        expected = resumed.model(ids).logits
        assert torch.allclose(model(ids).logits, expected, atol=1e-4)


def test_lora_trains_only_the_adapter_and_its_reference_is_the_base(tiny_model: str) -> None:
    policy = Policy.load(tiny_model, PolicyConfig(lr=1e-2, lora=True, lora_rank=4))
    trainable = {k for k, v in policy.model.named_parameters() if v.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    groups = tiny_groups(policy)
    train_step(policy, groups)
    metrics = train_step(policy, groups)
    # After a step the policy left the base: the KL to the reference is positive.
    assert metrics.kl > 0


def test_resume_of_a_folder_that_is_not_a_policy_says_so(tmp_path: Path) -> None:
    from trainer.models import ModelError

    with pytest.raises(ModelError, match="not a saved policy"):
        Policy.resume(tmp_path)


def test_gpu_check_says_why_it_skips_without_cuda() -> None:
    """`benchmarks/gpu_check.sh` is for CUDA machines; elsewhere one line and success."""
    import subprocess
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script runs its steps instead")
    script = Path(__file__).parents[1] / "benchmarks" / "gpu_check.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert done.stdout.strip().startswith("gpu_check: skipped: torch ")
    assert "sees no CUDA device" in done.stdout and done.stderr == ""
