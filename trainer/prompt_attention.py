"""Attention over packed rows without a mask over the whole row: the prompt runs causally on its
own, and the rest of the row (each completion, then padding) attends to the row's keys under a
mask of (L - P) x L rows: a completion sees the prompt and its own earlier tokens.

A packed row (`logprobs.pack_batch`) holds one prompt of P tokens and then G completions, L
tokens in all. Under a dense block mask every layer compares all L tokens with each other,
masked pairs included; here the prompt's P rows take SDPA's causal kernel (no mask, P^2 / 2)
and only the completions' rows carry a mask. The result is the block mask's, up to float32
rounding (a completion token sees the same keys at the same positions); the same idea is Prefix
Grouper's (arXiv 2506.05433). Both calls are 4D: SDPA's fused CPU kernel takes nothing else,
and a 3D call falls back to the unfused one (twice the step's time, measured).

Measured on SmolLM2 (LoRA, bf16 CPU, one step of one group, `benchmarks/train_step_speed.py`):
at P = 1,000, G = 8 the same time as the dense mask with C = 60 and 7% less with C = 300. What
remains at long completions is the masked completions-against-row kernel; giving each completion
only the prompt's keys and its own (copies of the prompt's keys per completion, or per-completion
calls) measured slower on 2 cores.

It runs as a transformers attention implementation, `PREFIX_SHARED`, that a model takes in
place of "sdpa" (`install`): without a layout it is SDPA, unchanged, so generation and rows of
their own are as before; with one (the `LAYOUT` keyword, which the decoder hands on to every
attention layer, also when a checkpointed layer is recomputed) it takes the path above.
"""

from __future__ import annotations

import functools
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
    outputs = []
    for b, (prompt, spans) in enumerate(rows):
        # SDPA's fused CPU kernel takes 4D inputs only: a 3D call falls back to the unfused one.
        q, k, v = query[b : b + 1], key[b : b + 1], value[b : b + 1]  # (1, H, L, D)
        head = _attend(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], None, dropout, scaling)
        if prompt == q.shape[2]:
            outputs.append(head)
            continue
        # The rest of the row (completions, then padding) against every key of the row, under
        # a mask of (L - P) x L: a completion sees the prompt and its own earlier tokens.
        mask = _rest_mask(prompt, tuple(spans), q.shape[2], str(q.device))
        tail = _attend(q[:, :, prompt:], k, v, mask, dropout, scaling)
        outputs.append(torch.cat([head, tail], dim=2))
    return torch.cat(outputs).transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=32)
def _rest_mask(prompt: int, spans: tuple[tuple[int, int], ...], width: int, device: str) -> Tensor:
    """Who the rows after the prompt see: the prompt, and their own completion's earlier tokens;
    padding sees the prompt only (its output is dropped, and no row is all -inf). Built once
    per row shape, not once per layer (every layer of a forward asks for the same masks)."""
    segment = torch.zeros(width, dtype=torch.long)
    for j, (start, end) in enumerate(spans, start=1):
        segment[start:end] = j
    rest = segment[prompt:]
    position = torch.arange(width)
    own = (rest.view(-1, 1) == segment.view(1, -1)) & (rest.view(-1, 1) > 0)
    causal = position.view(1, -1) <= position[prompt:].view(-1, 1)
    sees = (segment.view(1, -1) == 0) & (position.view(1, -1) < prompt) | (own & causal)
    return sees.to(device).view(1, 1, width - prompt, width)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, scaling: float | None
) -> Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling
    )


AttentionInterface.register(PREFIX_SHARED, prefix_shared_attention)
# Rows of their own get SDPA's masks (generation, the per-row path, padding).
AttentionMaskInterface.register(PREFIX_SHARED, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
