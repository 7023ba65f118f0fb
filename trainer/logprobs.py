"""Log-probs of completion tokens: the trainer's view of what the sampler drew.

A rollout's tokens were drawn from softmax(logits / T) cut to the top-p nucleus and
renormalised (both backends report the log-prob of that distribution). The trainer's policy
is the uncut softmax(logits / T); for the PPO ratio it compares the two on the same footing:

    log mu_theta(a | s) = log pi_theta(a | s) - log Z_theta(s),   Z = mass of the top-p nucleus

so a group sampled by the weights being trained has ratio mu_theta / mu_sampler = 1 up to
rounding, and a stale one has the ratio the change of weights made. Z carries no gradient: the
gradient is the usual one of log pi_theta, weighted by the ratio.

The logits are computed from the last hidden states chunk by chunk, each chunk recomputed in
the backward pass (the 49k-vocabulary logits of SmolLM2 would otherwise dominate memory:
8 x 256 tokens of them are 400 MB in fp32, and autograd would keep them all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# Row = (prompt ids, completion ids, the sampler's log-probs of the completion or None).
Row = tuple[list[int], list[int], list[float] | None]
# The nucleus is looked for among this many top tokens first (as the transformers sampler does);
# only positions whose top tokens hold less than top_p are sorted in full.
NUCLEUS_SEARCH = 1024


class TokenLogprobs(nn.Module):
    """A causal LM as one module whose forward returns the per-token log-probs of the
    completions (and the nucleus log-mass): the decoder and the chunked vocabulary projection
    run inside one forward, so DDP and FSDP see every parameter used and reduce its gradient.

    Only integer tensors go in (FSDP's mixed precision casts floating inputs)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        _backbone_and_head(model)  # a model without a decoder and head is refused here

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        predict_positions: Tensor,
        completion_ids: Tensor,
        temperature: float = 1.0,
        top_p: float = 1.0,
        logit_chunk: int = 2048,
    ) -> tuple[Tensor, Tensor | None]:
        """(N, C) log pi(a | s) at temperature T, and, when top_p < 1, (N, C) log Z(s), the mass
        of each position's top-p nucleus (no gradient); None when top_p is 1."""
        backbone, head = _backbone_and_head(self.model)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # The state at position p predicts token p + 1: gather the ones that predict completions.
        index = predict_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        states = hidden.gather(1, index).reshape(-1, hidden.shape[-1])  # (N * C, H)
        flat_targets = completion_ids.reshape(-1)
        pieces = []
        chunked = states.shape[0] > logit_chunk
        for start in range(0, states.shape[0], logit_chunk):
            chunk = slice(start, start + logit_chunk)
            arguments = (head, states[chunk], flat_targets[chunk], temperature, top_p)
            # Recomputing a chunk in the backward pass frees its logits meanwhile; with one
            # chunk there is nothing to free and the recomputation would be wasted.
            if chunked and torch.is_grad_enabled():
                pieces.append(checkpoint(_chunk_logprobs, *arguments, use_reentrant=False))
            else:
                pieces.append(_chunk_logprobs(*arguments))
        both = torch.cat(pieces, dim=1).float()  # (2, N * C)
        values = both[0].reshape(completion_ids.shape)
        mass = both[1].detach().reshape(completion_ids.shape) if top_p < 1.0 else None
        return values, mass


def completion_logprobs(
    model: Any, batch: dict[str, Tensor], temperature: float, logit_chunk: int = 2048
) -> Tensor:
    """(N, C) log-probs of the completion tokens under `model` at temperature T (uncut)."""
    return token_logprobs(model, batch, temperature, 1.0, logit_chunk)[0]


def token_logprobs(
    model: Any,
    batch: dict[str, Tensor],
    temperature: float,
    top_p: float,
    logit_chunk: int = 2048,
) -> tuple[Tensor, Tensor | None]:
    """TokenLogprobs' forward on a token batch; `model` is a causal LM (through a peft wrapper
    if there is one) or a TokenLogprobs module, wrapped by DDP or FSDP or not."""
    module = model if _is_scorer(model) else TokenLogprobs(model)
    return module(
        batch["input_ids"],
        batch["attention_mask"],
        batch["predict_positions"],
        batch["completion_ids"],
        temperature,
        top_p,
        logit_chunk,
    )


def _is_scorer(model: Any) -> bool:
    return isinstance(getattr(model, "module", model), TokenLogprobs)


def _chunk_logprobs(
    head: Any, states: Tensor, targets: Tensor, temperature: float, top_p: float
) -> Tensor:
    logits = head(states).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if top_p >= 1.0:
        return torch.stack([chosen, torch.zeros_like(chosen)])
    with torch.no_grad():
        mass = nucleus_log_mass(logp.detach(), top_p)
    return torch.stack([chosen, mass])


def nucleus_log_mass(logp: Tensor, top_p: float) -> Tensor:
    """(B,) log of the mass of the smallest set of top tokens whose mass reaches top_p, for
    log-probs (B, V): the normaliser of the distribution a top-p sampler draws from."""
    top = logp.topk(min(NUCLEUS_SEARCH, logp.shape[-1]), dim=-1).values
    mass = _kept_mass(top, top_p)
    wide = top.exp().sum(dim=-1) < top_p
    if bool(wide.any()):
        mass[wide] = _kept_mass(logp[wide].sort(dim=-1, descending=True).values, top_p)
    return mass.log()


def _kept_mass(sorted_logp: Tensor, top_p: float) -> Tensor:
    probs = sorted_logp.exp()
    kept = (probs.cumsum(dim=-1) - probs) < top_p  # the first token is always kept
    return (probs * kept).sum(dim=-1)


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder (hidden states, no logits) and the vocabulary projection of a causal LM,
    through a peft wrapper if there is one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    backbone = base.get_decoder() if hasattr(base, "get_decoder") else None
    if backbone is None or head is None:
        raise ValueError(f"{type(base).__name__} exposes no decoder and output embeddings")
    if getattr(base.config, "final_logit_softcapping", None):
        raise ValueError(f"{type(base).__name__} soft-caps its logits, which is not supported")
    return backbone, head


def cut(
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    max_tokens: int,
) -> Row:
    """A rollout as a row of at most `max_tokens` tokens: the completion is cut at its end, to
    nothing when the prompt alone fills `max_tokens` (the prompt is never cut: the completion
    is what the model is trained to write after all of it). The caller counts the rows it cut
    (`StepMetrics.cut_rollouts`) and skips a step left without a completion token. Sampler
    log-probs that are not one finite number per completion token are dropped (None)."""
    prompt = list(prompt_ids)
    completion = list(completion_ids)
    sampled = None
    if logprobs is not None and len(logprobs) == len(completion):
        sampled = [float(v) for v in logprobs]
        if not all(math.isfinite(v) for v in sampled):
            sampled = None
    room = max(max_tokens - len(prompt), 0)
    if len(completion) > room:
        completion = completion[:room]
        sampled = None if sampled is None else sampled[:room]
    if not prompt:
        raise ValueError("a rollout needs its prompt tokens to be trained on")
    return prompt, completion, sampled


def token_batch(rows: Sequence[Row], pad: int = 0, device: Any = "cpu") -> dict[str, Tensor]:
    """Right-padded prompt + completion rows, where each completion token is predicted, and
    the sampler's log-probs (`has_sampler` marks the rows that have them)."""
    width = max(len(p) + len(c) for p, c, _ in rows)
    longest = max(max(len(c) for _, c, _ in rows), 1)
    n = len(rows)
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    completion_ids = torch.zeros((n, longest), dtype=torch.long)
    completion_mask = torch.zeros((n, longest), dtype=torch.bool)
    positions = torch.zeros((n, longest), dtype=torch.long)
    sampler = torch.zeros((n, longest), dtype=torch.float32)
    has_sampler = torch.zeros(n, dtype=torch.bool)
    for row, (prompt, completion, logprobs) in enumerate(rows):
        length = len(prompt) + len(completion)
        input_ids[row, :length] = torch.tensor(prompt + completion)
        attention[row, :length] = 1
        if completion:
            completion_ids[row, : len(completion)] = torch.tensor(completion)
            completion_mask[row, : len(completion)] = True
            positions[row, : len(completion)] = torch.arange(
                len(prompt) - 1, len(prompt) - 1 + len(completion)
            )
        if logprobs is not None:
            sampler[row, : len(logprobs)] = torch.tensor(logprobs)
            has_sampler[row] = True
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": attention.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "predict_positions": positions.to(device),
        "sampler_logprobs": sampler.to(device),
        "has_sampler": has_sampler.to(device),
    }
