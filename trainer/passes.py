"""The forward and backward passes of one training step, one micro-batch each, and what they
measured (the loss parts, the sampler's log-prob gap, the rollouts too far apart)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from trainer.activations import fit_logit_chunk
from trainer.logprobs import (
    Row,
    completion_logprobs,
    pass_batch,
    token_logprobs,
)
from trainer.loss import policy_loss
from trainer.policy import Policy


class Passes:
    """The forward and backward passes of one step, one micro-batch each, and what they
    measured: the loss parts summed, the gap between the sampler's log-probs and the current
    weights' on the rollouts those weights sampled, and the rollouts too far apart."""

    def __init__(
        self,
        policy: Policy,
        config: Any,  # the step's trainer.train.TrainConfig
        rows: Sequence[Row],
        rollouts: Sequence[Any],  # its trainer.train.Rollout, each with its version
        advantages: Sequence[float],
        total_tokens: int,
    ) -> None:
        self.policy, self.config, self.rows, self.rollouts = policy, config, rows, rollouts
        self.advantages, self.total_tokens = advantages, total_tokens
        self.pad = policy.tokenizer.pad_token_id or 0
        self.sums = {"loss": 0.0, "policy": 0.0, "kl": 0.0, "clipped": 0.0, "ratio": 0.0}
        self.gap, self.gap_tokens, self.mismatched = 0.0, 0, 0
        self.checkpointed = 0  # passes that recomputed their activations in the backward pass

    def run(self, packs: Sequence[Sequence[int]], *, last: bool) -> None:
        policy, config, parallel = self.policy, self.config, self.policy.parallel
        chosen = [i for pack in packs for i in pack]
        batch = pass_batch(self.rows, packs, self.pad, policy.device)
        chunk = fit_logit_chunk(policy, config.logit_chunk, batch["completion_ids"].numel())
        if chosen and policy.checkpoint_pass(batch, chunk):
            self.checkpointed += 1
        # The wrapper reduces the gradients after the last pass only.
        with parallel.gradient_sync(policy.scorer, last), policy.autocast():
            logprobs, log_mass = token_logprobs(
                policy.scorer, batch, config.temperature, config.top_p, chunk, top_k=config.top_k
            )
        ref = None
        if policy.has_reference and config.loss.beta > 0:
            with torch.no_grad(), policy.reference_scorer() as reference, policy.autocast():
                ref = completion_logprobs(reference, batch, config.temperature, chunk)
        old = self._old_logprobs(batch, logprobs.detach(), log_mass, chosen)
        values = torch.tensor(
            [self.advantages[i] for i in chosen] or [0.0],
            dtype=logprobs.dtype,
            device=logprobs.device,
        )
        loss, parts = policy_loss(
            logprobs,
            old,
            values,
            batch["completion_mask"],
            ref_logprobs=ref,
            config=config.loss,
            total_tokens=self.total_tokens,
        )
        # The wrappers average the processes' gradients; the loss is already a share of the
        # whole step's token mean, so they are to be summed.
        weight = parallel.world if chosen else 0.0
        with parallel.gradient_sync(policy.scorer, last):
            (loss * weight).backward()
        if chosen:
            self.sums["loss"] += float(loss.detach())
            self.sums["policy"] += parts.policy
            self.sums["kl"] += parts.kl
            self.sums["clipped"] += parts.clipped
            self.sums["ratio"] += parts.ratio

    def _old_logprobs(
        self, batch: dict[str, Tensor], current: Tensor, log_mass: Tensor | None, chosen: list[int]
    ) -> Tensor:
        """The PPO ratio's old log-probs: the sampler's where a rollout has them and they are
        of the distribution it was drawn from, else the current weights'."""
        # The sampler reported log mu_old = log pi_old - log Z_old (top-k and top-p
        # renormalised); adding log Z_theta makes logprobs - old = log mu_theta - log mu_old,
        # and leaves the KL alone.
        sampled = batch["sampler_logprobs"]
        if log_mass is not None:
            sampled = sampled + log_mass
        # Rollouts the current weights sampled: both log-probs are of one distribution, apart
        # by rounding alone. One far beyond that was drawn from another distribution (a server
        # that applied top_k or a repetition penalty); its ratio would be off on every token,
        # so its old log-probs are recomputed, as for a rollout without sampler log-probs.
        has = batch["has_sampler"]
        step = self.policy.step
        fresh = has & torch.tensor(
            [self.rollouts[i].version == step for i in chosen] or [False], device=has.device
        )
        tokens = batch["completion_mask"] & fresh.unsqueeze(-1)
        gaps, row_gaps = sampler_gaps(current, sampled, tokens)
        off = row_gaps > self.config.mismatch_gap
        self.gap += float(gaps.sum())
        self.gap_tokens += int(tokens.sum())
        self.mismatched += int(off.sum())
        return torch.where((has & ~off).unsqueeze(-1), sampled, current)


def sampler_gaps(logprobs: Tensor, sampled: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """|trainer - sampler| log-prob of each token `tokens` marks, 0 elsewhere (N, C), and each
    row's mean of it over its marked tokens (N,), 0 for a row with none."""
    gaps = (logprobs - sampled).abs() * tokens
    return gaps, gaps.sum(dim=-1) / tokens.sum(dim=-1).clamp(min=1)
