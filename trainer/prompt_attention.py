"""Attention over packed rows without a mask as long as the row: the prompt runs causally on its
own, and each completion attends to the prompt's keys and values and to its own earlier tokens.

A packed row (`logprobs.pack_batch`) holds one prompt of P tokens and then G completions. Under
a dense block mask every layer compares all L = P + sum C tokens with each other, masked pairs
included: on a 2-core CPU at P = 1,000, C = 300, G = 8 that attention cost as much as running
the completions in rows of their own. Here the work is P^2 / 2 for the prompt (SDPA's causal
kernel) plus sum C (P + C) for the completions, and nothing of size L x L is built. The result
is the block mask's, up to float32 rounding (a completion token sees the same keys with the
same positions); the same idea is Prefix Grouper's (arXiv 2506.05433).

It runs as a transformers attention implementation, `PREFIX_SHARED`, that a model takes in
place of "sdpa" (`install`): without a layout it is SDPA, unchanged, so generation and rows of
their own are as before; with one (the `LAYOUT` keyword, which the decoder hands on to every
attention layer, also when a checkpointed layer is recomputed) it takes the path above.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

PREFIX_SHARED = "vpo_prefix_shared"
LAYOUT = "prefix_layout"

# Per packed row: the prompt's length and each completion's (start, end) in the row.
Layout = list[tuple[int, list[tuple[int, int]]]]


def install(model: Any) -> bool:
    """Make `model` (through a peft wrapper) attend with PREFIX_SHARED if it uses SDPA; True when
    it now does. Eager and other implementations are left as they are (they take the mask)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = getattr(base.config, "_attn_implementation", None)
    if kind == "sdpa":
        base.config._attn_implementation = PREFIX_SHARED
        kind = PREFIX_SHARED
    return kind == PREFIX_SHARED


def layout(segments: Tensor) -> Layout:
    """The layout of packed rows from their (N, L) segments (0 the prompt, which comes first,
    k >= 1 completion k, -1 padding)."""
    rows: Layout = []
    for row in segments.tolist():
        prompt = sum(1 for s in row if s == 0)
        spans: list[tuple[int, int]] = []
        position = prompt
        while position < len(row) and row[position] > 0:
            end = position
            while end < len(row) and row[end] == row[position]:
                end += 1
            spans.append((position, end))
            position = end
        rows.append((prompt, spans))
    return rows


def prefix_shared_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """(B, L, H, D) attention output of packed rows given `LAYOUT`; SDPA's otherwise."""
    rows: Layout | None = kwargs.pop(LAYOUT, None)
    if rows is None:
        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        return sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    width = query.shape[2]
    outputs = []
    for b, (prompt, spans) in enumerate(rows):
        q, k, v = query[b], key[b], value[b]  # (H, L, D)
        pieces = [_attend(q[:, :prompt], k[:, :prompt], v[:, :prompt], None, dropout, scaling)]
        if spans:
            pieces.extend(_completions(q, k, v, prompt, spans, dropout, scaling))
        used = spans[-1][1] if spans else prompt
        if used < width:
            pieces.append(q.new_zeros(q.shape[0], width - used, q.shape[2]))
        outputs.append(torch.cat(pieces, dim=1))
    return torch.stack(outputs).transpose(1, 2).contiguous(), None


def _completions(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prompt: int,
    spans: list[tuple[int, int]],
    dropout: float,
    scaling: float | None,
) -> list[Tensor]:
    """Each completion's (H, C, D) output, all of them in one batched SDPA call: completion j's
    queries against the prompt's keys and its own, padded to the longest completion."""
    longest = max(end - start for start, end in spans)

    def padded(t: Tensor) -> Tensor:
        return torch.stack([F.pad(t[:, s:e], (0, 0, 0, longest - (e - s))) for s, e in spans])

    n = len(spans)
    keys = torch.cat([k[:, :prompt].expand(n, -1, -1, -1), padded(k)], dim=2)
    values = torch.cat([v[:, :prompt].expand(n, -1, -1, -1), padded(v)], dim=2)
    lengths = torch.tensor([e - s for s, e in spans], device=q.device)
    own = torch.arange(longest, device=q.device)
    sees_own = (own.unsqueeze(0) <= own.unsqueeze(1)) & (own < lengths.view(n, 1, 1))
    mask = torch.cat(
        [torch.ones(n, longest, prompt, dtype=torch.bool, device=q.device), sees_own], dim=2
    )  # a padding query sees the prompt: its output is dropped, and it is never all -inf
    out = _attend(padded(q), keys, values, mask.unsqueeze(1), dropout, scaling)
    return [out[j, :, : e - s] for j, (s, e) in enumerate(spans)]


def _attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, scaling: float | None
) -> Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling
    )


AttentionInterface.register(PREFIX_SHARED, prefix_shared_attention)
# Rows of their own get SDPA's masks (generation, the per-row path, padding).
AttentionMaskInterface.register(PREFIX_SHARED, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
