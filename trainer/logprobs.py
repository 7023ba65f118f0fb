"""Log-probs of completion tokens: the trainer's view of what the sampler drew.

A rollout's tokens were drawn from softmax(logits / T) cut to its top_k tokens (when set),
then to the top-p nucleus of those, and renormalised (vLLM's order; every backend reports the
log-prob of that distribution). The trainer's policy is the uncut softmax(logits / T); for the
PPO ratio it compares the two on the same footing:

    log mu_theta(a | s) = log pi_theta(a | s) - log Z_theta(s),   Z = the mass the cuts keep
    Z = Z_k * N_p,   Z_k = sum of pi_theta over the top_k tokens,
                     N_p = mass of the top-p nucleus of pi_theta / Z_k over those tokens

so a group sampled by the weights being trained has ratio mu_theta / mu_sampler = 1 up to
rounding, and a stale one has the ratio the change of weights made. Z carries no gradient: the
gradient is the usual one of log pi_theta, weighted by the ratio.

The logits are computed from the last hidden states chunk by chunk, each chunk recomputed in
the backward pass (the 49k-vocabulary logits of SmolLM2 would otherwise dominate memory:
8 x 256 tokens of them are 400 MB in fp32, and autograd would keep them all).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from trainer.prompt_attention import LAYOUT, PREFIX_SHARED, install, layout

# Row = (prompt ids, completion ids, the sampler's log-probs of the completion or None).
Row = tuple[list[int], list[int], list[float] | None]
# The nucleus is looked for among this many top tokens first (as the transformers sampler does);
# only positions whose top tokens hold less than top_p are sorted in full.
NUCLEUS_SEARCH = 1024
# Positions whose nucleus reaches past NUCLEUS_SEARCH are sorted this many at a time: a sort of a
# whole chunk of near-flat positions took 25 bytes a position and vocabulary entry (values,
# int64 indices, exp, cumsum), 7.3 GiB for 2,048 positions of Qwen's 152k vocabulary; in groups
# the chunk's peak is its logits' (12 bytes with the backward pass), as when top_p is 1.
NUCLEUS_SORT_ROWS = 64


class TokenLogprobs(nn.Module):
    """A causal LM as one module whose forward returns the per-token log-probs of the
    completions (and the nucleus log-mass): the decoder and the chunked vocabulary projection
    run inside one forward, so DDP and FSDP see every parameter used and reduce its gradient.

    Only integer tensors go in (FSDP's mixed precision casts floating inputs)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        _backbone_and_head(model)  # a model without a decoder and head is refused here
        install(model)  # SDPA models attend to packed rows without an L x L mask

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        predict_positions: Tensor,
        completion_ids: Tensor,
        temperature: float = 1.0,
        top_p: float = 1.0,
        logit_chunk: int = 2048,
        segments: Tensor | None = None,
        position_ids: Tensor | None = None,
        rollout_rows: Tensor | None = None,
        top_k: int = 0,
    ) -> tuple[Tensor, Tensor | None]:
        """(R, C) log pi(a | s) at temperature T, and, when top_p < 1 or top_k is set, (R, C)
        log Z(s), the mass each position keeps once cut to its top_k tokens and then to the
        top-p nucleus of those (no gradient); None when neither cuts.

        A row per rollout (`token_batch`: R = N), or packed rows (`pack_batch`: `segments`,
        `position_ids` and `rollout_rows` given), each one prompt and several completions
        under the prompt-sharing attention (`prompt_attention`) or, for eager attention, a
        block mask built here from `segments`."""
        backbone, head = _backbone_and_head(self.model)
        if segments is None:
            hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        elif attention_kind(self.model) == PREFIX_SHARED:
            # A 4D mask is taken as given: a placeholder, as the layout says who sees whom.
            placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=input_ids.device)
            hidden = backbone(
                input_ids=input_ids,
                attention_mask=placeholder,
                position_ids=position_ids,
                **{LAYOUT: layout(segments)},
            ).last_hidden_state
            rows = rollout_rows
        else:
            mask = block_mask(segments, attention_kind(self.model))
            hidden = backbone(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids
            ).last_hidden_state
            rows = rollout_rows
        # The state at position p predicts token p + 1: gather the ones that predict completions
        # (flat indices, so a packed row's shared states are not copied per rollout).
        width = hidden.shape[1]
        flat = (rows.unsqueeze(-1) * width + predict_positions).reshape(-1)
        states = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)  # (R * C, H)
        flat_targets = completion_ids.reshape(-1)
        pieces = []
        chunked = states.shape[0] > logit_chunk
        for start in range(0, states.shape[0], logit_chunk):
            chunk = slice(start, start + logit_chunk)
            arguments = (head, states[chunk], flat_targets[chunk], temperature, top_p, top_k)
            # Recomputing a chunk in the backward pass frees its logits meanwhile; with one
            # chunk there is nothing to free and the recomputation would be wasted.
            if chunked and torch.is_grad_enabled():
                pieces.append(checkpoint(_chunk_logprobs, *arguments, use_reentrant=False))
            else:
                pieces.append(_chunk_logprobs(*arguments))
        both = torch.cat(pieces, dim=1).float()  # (2, N * C)
        values = both[0].reshape(completion_ids.shape)
        cut = top_p < 1.0 or top_k > 0
        mass = both[1].detach().reshape(completion_ids.shape) if cut else None
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
    *,
    top_k: int = 0,
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
        batch.get("segments"),
        batch.get("position_ids"),
        batch.get("rollout_rows"),
        top_k,
    )


# Attention implementations that run packed rows: the prompt-sharing one, and those that take
# an arbitrary 4D mask.
PACKABLE = (PREFIX_SHARED, "sdpa", "eager")


def attention_kind(model: Any) -> str:
    """The attention implementation of `model` (through wrappers): "sdpa", "eager", ..."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "model", inner) if isinstance(inner, TokenLogprobs) else inner
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return str(getattr(base.config, "_attn_implementation", None) or "eager")


def block_mask(segments: Tensor, kind: str) -> Tensor:
    """(N, 1, L, L) attention mask of packed rows from their (N, L) segments (-1 padding, 0 the
    prompt, k >= 1 completion k): a token sees the earlier tokens of the prompt and of its own
    completion, so each completion reads the prompt as if it were alone with it. A padding
    position sees itself only (its state is never used; a row of -inf would give NaN). Boolean
    for SDPA (True: attend), additive for eager attention."""
    length = segments.shape[1]
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)
    causal = torch.ones(length, length, dtype=torch.bool, device=segments.device).tril()
    allowed = causal & (key != -1) & ((key == 0) | (key == query))
    allowed |= torch.eye(length, dtype=torch.bool, device=segments.device) & (query == -1)
    allowed = allowed.unsqueeze(1)
    if kind == "sdpa":
        return allowed
    blocked = torch.zeros(allowed.shape, dtype=torch.float32, device=segments.device)
    return blocked.masked_fill(~allowed, torch.finfo(torch.float32).min)


def _is_scorer(model: Any) -> bool:
    return isinstance(getattr(model, "module", model), TokenLogprobs)


def _chunk_logprobs(
    head: Any, states: Tensor, targets: Tensor, temperature: float, top_p: float, top_k: int
) -> Tensor:
    logits = head(states).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if top_p >= 1.0 and not 0 < top_k < logp.shape[-1]:
        return torch.stack([chosen, torch.zeros_like(chosen)])
    with torch.no_grad():
        mass = cut_log_mass(logp.detach(), top_p, top_k)
    return torch.stack([chosen, mass])


def cut_log_mass(logp: Tensor, top_p: float, top_k: int = 0) -> Tensor:
    """(B,) log of the mass a sampler keeps of log-probs (B, V) that cuts them to their top_k
    tokens (0: none) and then to the top-p nucleus of those, renormalised (vLLM's order): the
    normaliser of the distribution it draws from. With top_k, torch.topk finds the tokens and
    nothing the size of the vocabulary is sorted."""
    if not 0 < top_k < logp.shape[-1]:
        return nucleus_log_mass(logp, top_p) if top_p < 1.0 else torch.zeros_like(logp[:, 0])
    top = _top_k_logp(logp, top_k)
    kept = top.logsumexp(dim=-1)  # log Z_k
    if top_p >= 1.0:
        return kept
    return kept + _kept_mass(top - kept.unsqueeze(-1), top_p).log()  # + log N_p


def _top_k_logp(logp: Tensor, top_k: int) -> Tensor:
    """(B, k') the top_k log-probs of each row, descending, and any others tied with its k-th
    (vLLM keeps every token at or above the k-th value); a row with fewer ties than the widest
    is padded with -inf."""
    top = logp.topk(top_k + 1, dim=-1).values
    kth = top[:, top_k - 1 : top_k]
    if bool((top[:, -1:] == kth).any()):
        top = logp.topk(int((logp >= kth).sum(dim=-1).max()), dim=-1).values
    else:
        top = top[:, :top_k]
    return top.masked_fill(top < kth, float("-inf"))


def nucleus_log_mass(logp: Tensor, top_p: float) -> Tensor:
    """(B,) log of the mass of the smallest set of top tokens whose mass reaches top_p, for
    log-probs (B, V): the normaliser of the distribution a top-p sampler draws from."""
    top = logp.topk(min(NUCLEUS_SEARCH, logp.shape[-1]), dim=-1).values
    mass = _kept_mass(top, top_p)
    wide = top.exp().sum(dim=-1) < top_p
    for rows in wide.nonzero().squeeze(-1).split(NUCLEUS_SORT_ROWS):
        mass[rows] = _kept_mass(logp[rows].sort(dim=-1, descending=True).values, top_p)
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


# Pack = (prompt ids, the completions' ids, each completion's sampler log-probs or None).
Pack = tuple[list[int], list[list[int]], list[list[float] | None]]


def pack_batch(packs: Sequence[Pack], pad: int = 0, device: Any = "cpu") -> dict[str, Tensor]:
    """Packed rows: each pack's prompt once, then its completions one after another, with the
    positions each token has in its own rollout (a completion starts where the prompt ends) and
    the segments `block_mask` turns into the mask. The per-rollout tensors are token_batch's,
    one row per completion in the packs' order; `rollout_rows` says which packed row holds it.
    Exact: every completion token sees what it sees in its own row (the prompt and its own
    earlier tokens), at the same positions, so the log-probs and their gradients are the
    per-row path's up to rounding; the prompt runs once per pack, not once per completion."""
    width = max(len(prompt) + sum(len(c) for c in completions) for prompt, completions, _ in packs)
    completions = [c for _, cs, _ in packs for c in cs]
    longest = max(max((len(c) for c in completions), default=0), 1)
    n, r = len(packs), len(completions)
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    position_ids = torch.zeros((n, width), dtype=torch.long)
    segments = torch.full((n, width), -1, dtype=torch.long)
    rollout_rows = torch.zeros(r, dtype=torch.long)
    completion_ids = torch.zeros((r, longest), dtype=torch.long)
    completion_mask = torch.zeros((r, longest), dtype=torch.bool)
    positions = torch.zeros((r, longest), dtype=torch.long)
    sampler = torch.zeros((r, longest), dtype=torch.float32)
    has_sampler = torch.zeros(r, dtype=torch.bool)
    rollout = 0
    for row, (prompt, pack, logprobs) in enumerate(packs):
        if not prompt:
            raise ValueError("a rollout needs its prompt tokens to be trained on")
        size = len(prompt)
        input_ids[row, :size] = torch.tensor(prompt)
        position_ids[row, :size] = torch.arange(size)
        segments[row, :size] = 0
        start = size
        for k, (completion, sampled) in enumerate(zip(pack, logprobs, strict=True), start=1):
            end = start + len(completion)
            rollout_rows[rollout] = row
            if completion:
                input_ids[row, start:end] = torch.tensor(completion)
                position_ids[row, start:end] = torch.arange(size, size + len(completion))
                segments[row, start:end] = k
                completion_ids[rollout, : len(completion)] = torch.tensor(completion)
                completion_mask[rollout, : len(completion)] = True
                # the prompt's last state predicts the first token, then the completion's own
                positions[rollout, 0] = size - 1
                positions[rollout, 1 : len(completion)] = torch.arange(start, end - 1)
            if sampled is not None:
                sampler[rollout, : len(sampled)] = torch.tensor(sampled)
                has_sampler[rollout] = True
            start = end
            rollout += 1
    return {
        "input_ids": input_ids.to(device),
        "attention_mask": (segments != -1).long().to(device),
        "segments": segments.to(device),
        "position_ids": position_ids.to(device),
        "rollout_rows": rollout_rows.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "predict_positions": positions.to(device),
        "sampler_logprobs": sampler.to(device),
        "has_sampler": has_sampler.to(device),
    }


def plan_passes(
    rows: Sequence[Row], order: Sequence[int], micro_batch: int, *, shared: bool
) -> list[list[list[int]]]:
    """The step's passes (forward and backward), each a list of packs of row indices, at most
    `micro_batch` rollouts a pass. With `shared`, rows with the same prompt go in one pack
    (at most `micro_batch` of them: a bigger group is split evenly, its prompt run once per
    pack),
    the packs longest first and as many in a pass as fit; otherwise every row is its own pack,
    in `order`."""
    if not shared:
        return [
            [[i] for i in order[start : start + micro_batch]]
            for start in range(0, len(order), micro_batch)
        ]
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        by_prompt.setdefault(tuple(rows[i][0]), []).append(i)
    packs = []
    for same in by_prompt.values():
        count = -(-len(same) // micro_batch)  # packs as even as can be: no lone rollout
        bounds = [len(same) * k // count for k in range(count + 1)]
        packs.extend(same[a:b] for a, b in itertools.pairwise(bounds))
    packs.sort(key=lambda pack: -(len(rows[pack[0]][0]) + sum(len(rows[i][1]) for i in pack)))
    plan: list[list[list[int]]] = []
    room = 0
    for pack in packs:
        if len(pack) > room:
            plan.append([])
            room = micro_batch
        plan[-1].append(pack)
        room -= len(pack)
    return plan


def pass_batch(
    rows: Sequence[Row], packs: Sequence[Sequence[int]], pad: int, device: Any
) -> dict[str, Tensor]:
    """The token batch of one pass: packed rows when a pack holds several rollouts, a row per
    rollout when none does; an empty pass (this process has run out) is one token of weight 0."""
    if not packs:
        return token_batch([([pad], [pad], None)], pad, device)
    if all(len(pack) == 1 for pack in packs):
        return token_batch([rows[pack[0]] for pack in packs], pad, device)
    return pack_batch(
        [
            (rows[pack[0]][0], [rows[i][1] for i in pack], [rows[i][2] for i in pack])
            for pack in packs
        ],
        pad,
        device,
    )
