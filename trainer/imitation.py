"""Imitation of the policy's own chosen samples: the format warm-up's step.

    metrics = imitation_step(policy, rollouts)

Rejection-sampling fine-tuning (STaR, Zelikman et al., arXiv 2203.14465; RAFT, Dong et al.,
arXiv 2304.06767): the policy sampled many completions, a filter kept the ones that did what was
asked (here: every candidate in its tags and parsed), and a step raises their likelihood,

    loss = - token-mean over the kept completions of log pi_theta(token | prefix)

at temperature 1 (the model's own distribution; sampling at T only chose which texts exist).
The texts are the policy's own, token for token, so nothing is trained that it did not write.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from trainer.logprobs import cut, token_batch, token_logprobs
from trainer.policy import Policy
from trainer.train import Rollout


@dataclass(frozen=True)
class ImitationMetrics:
    step: int
    rollouts: int
    tokens: int
    nll: float  # mean negative log-likelihood per completion token, before the step
    grad_norm: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return (
            f"warm-up step {self.step} | {self.rollouts} answers, {self.tokens} tokens | "
            f"nll {self.nll:.3f} | grad {self.grad_norm:.2f} | {self.seconds:.1f} s"
        )


def imitation_step(
    policy: Policy,
    rollouts: Sequence[Rollout],
    *,
    micro_batch: int = 4,
    max_tokens: int = 4096,
    logit_chunk: int = 2048,
) -> ImitationMetrics:
    """One optimiser step raising the likelihood of `rollouts`' completions."""
    if not rollouts:
        raise ValueError("an imitation step needs at least one rollout")
    started = time.perf_counter()
    rows = [cut(r.prompt_ids, r.completion_ids, None, max_tokens) for r in rollouts]
    total = sum(len(completion) for _, completion, _ in rows)
    if total == 0:
        raise ValueError("the rollouts have no completion tokens to learn from")
    policy.model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    nll = 0.0
    for start in range(0, len(rows), micro_batch):
        batch = token_batch(
            rows[start : start + micro_batch], policy.tokenizer.pad_token_id or 0, policy.device
        )
        with policy.autocast():
            logprobs, _ = token_logprobs(policy.scorer, batch, 1.0, 1.0, logit_chunk)
        loss = -(logprobs * batch["completion_mask"]).sum() / total
        loss.backward()
        nll += float(loss.detach())
    parameters = policy.trainable_parameters()
    if policy.config.grad_clip > 0:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, policy.config.grad_clip))
    else:
        grads = [p.grad.norm() for p in parameters if p.grad is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
    if math.isfinite(grad_norm):
        policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    policy.step += 1
    return ImitationMetrics(
        step=policy.step,
        rollouts=len(rows),
        tokens=total,
        nll=nll,
        grad_norm=grad_norm,
        seconds=time.perf_counter() - started,
    )
