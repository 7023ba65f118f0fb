"""In-process sampling with a Hugging Face model: the CPU default, and the backend that shares its
weights with the trainer (wrap the trainer's model and tokenizer; updates show up at once).

The decoding loop is written out rather than calling `model.generate`, for three reasons an RL
loop cares about: the log-prob of each sampled token comes from the exact distribution it was
drawn from (temperature, top-k and top-p applied) without keeping a vocab-sized score per step;
the n samples of a prompt share one prefill of the (long) prompt; and rows that finished are
dropped from the batch instead of being computed until the longest one ends.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from harness.config.errors import UserError
from harness.llm.base import (
    Completion,
    Deadline,
    Message,
    Sampling,
    Weights,
    answer_start,
    chat_prompt_ids,
    context_length,
    decoded,
    request_ids,
    stop_token_ids,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Rows decoded together; SmolLM2's KV cache is ~23 KB a token, so 64 rows of 2k tokens is ~3 GB.
DEFAULT_BATCH_ROWS = 64
# Dropping finished rows copies the whole KV cache; do it once a quarter of the batch is idle.
_PRUNE_FRACTION = 0.25


class TransformersGenerator:
    backend = "transformers"
    in_process = True

    def __init__(
        self,
        model: str = "smollm2",
        *,
        hf_model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        dtype: str | None = None,
        device: str | None = None,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        cache_dir: str | None = None,
        context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        """Load `model` (see `trainer.models.resolve_model`), or wrap an already-loaded one.

        With `hf_model` and `tokenizer` given, `model` is only the name reported back, and the
        wrapped model is the one sampled from however it changes (the trainer's, stepped in
        place: `load_weights` has nothing to do); `context` makes what each sampling pass
        runs under (the trainer's `Policy.generation_context`).
        """
        self.context = context or nullcontext
        self.model = model
        self.batch_rows = max(1, batch_rows)
        self.wraps_model = hf_model is not None
        self.dtype, self.device, self.cache_dir = dtype, device, cache_dir
        self._load(model, hf_model, tokenizer)

    def _load(
        self,
        model: str,
        hf_model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        from trainer.models import ModelError, load_model, load_tokenizer

        try:
            tokenizer = tokenizer or load_tokenizer(model, self.cache_dir)
            hf_model = hf_model or load_model(
                model, dtype=self.dtype, device=self.device, cache_dir=self.cache_dir
            )
        except ModelError as error:
            raise UserError(str(error)) from None
        self.tokenizer, self.hf_model = tokenizer, hf_model
        eos = self.hf_model.generation_config.eos_token_id
        self.stops = stop_token_ids(self.tokenizer, eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.stops)

    def load_weights(self, weights: Weights) -> None:
        """Sample from the policy version `weights` from now on: a wrapped model (the
        trainer's) holds it already; otherwise its whole weights replace the loaded model."""
        if self.wraps_model:
            return
        tensors = weights.tensors(next(self.hf_model.parameters()).dtype)
        if tensors is None:
            self._load(weights.model_folder())
            return
        import torch

        with torch.no_grad():
            for name, tensor in tensors:
                self.hf_model.get_parameter(name).copy_(tensor)

    def context_tokens(self) -> int | None:
        return context_length(self.hf_model.config)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return len(chat_prompt_ids(self.tokenizer, messages))

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        import torch

        prompt_ids = request_ids(self.tokenizer, prompts, n, sampling)
        device = next(self.hf_model.parameters()).device
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        rng = torch.Generator(device=device).manual_seed(seed)
        deadline = Deadline.start(sampling)
        completions: list[list[Completion]] = [[] for _ in prompts]
        was_training = self.hf_model.training
        self.hf_model.eval()  # the trainer's model may be in train mode (dropout, no KV cache)
        try:
            for batch in _batches(len(prompts), n, self.batch_rows):
                if deadline is not None and deadline.passed():  # before a prefill, one long pass
                    done = sum(map(len, completions))
                    raise deadline.error(f"{done} of {len(prompts) * n} completions done")
                with self.context():
                    rows = _sample(
                        self.hf_model,
                        [prompt_ids[i] for i, _ in batch],
                        [copies for _, copies in batch],
                        sampling,
                        self.stops,
                        self.pad_id,
                        rng,
                        deadline,
                    )
                owners = [i for i, copies in batch for _ in range(copies)]
                for owner, (tokens, logprobs, finish) in zip(owners, rows, strict=True):
                    completions[owner].append(
                        decoded(
                            self.tokenizer,
                            tokens,
                            logprobs,
                            finish,
                            prompt_ids[owner],
                            self.stops,
                            answer_start(prompts[owner]),
                        )
                    )
        finally:
            self.hf_model.train(was_training)
        return completions

    def close(self) -> None:
        # The weights may be the trainer's; dropping our reference is all we may do.
        self.hf_model = None  # type: ignore[assignment]


def _batches(prompts: int, n: int, rows: int) -> list[list[tuple[int, int]]]:
    """Group (prompt index, copies) so that each batch decodes at most `rows` rows."""
    batches: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    used = 0
    for index in range(prompts):
        left = n
        while left:
            take = min(left, rows - used)
            current.append((index, take))
            used += take
            left -= take
            if used == rows:
                batches.append(current)
                current, used = [], 0
    if current:
        batches.append(current)
    return batches


def sampling_logprobs(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0
) -> torch.Tensor:
    """Log-probs (B, V) of the distribution tokens are drawn from: softmax(logits / T) cut to its
    top_k tokens (0: no cut; every token tied with the k-th stays, as in vLLM), then to the
    smallest set of top tokens whose mass reaches top_p, renormalised; cut tokens get -inf.

    The reference for what `sample_tokens` draws from (tests and the trainer compare with it).
    """
    import torch

    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    if 0 < top_k < logp.shape[-1]:
        kth = logp.topk(top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
        logp = logp - logp.logsumexp(dim=-1, keepdim=True)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    # A token is cut when the tokens ranked above it already hold top_p of the mass.
    cut_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    cut = torch.zeros_like(cut_sorted).scatter(-1, order, cut_sorted)
    logp = logp.masked_fill(cut, float("-inf"))
    return logp - logp.logsumexp(dim=-1, keepdim=True)


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    rng: torch.Generator,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from `sampling_logprobs(logits, ...)`; returns (tokens, logprobs).

    A full sort of a 49k vocabulary per step costs as much as the forward pass on CPU, so the
    nucleus is looked for in the top 1024 tokens first and only rows whose nucleus reaches past
    them are sorted in full; with top_k the nucleus is looked for among the top_k tokens alone,
    and nothing is sorted in full. Draws are inverse-CDF with one uniform per row, which is both
    exact and cheaper than torch.multinomial over the vocabulary.
    """
    import torch

    logp = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)
    uniform = torch.rand((logp.shape[0], 1), generator=rng, device=logp.device)
    if 0 < top_k < logp.shape[1]:
        top_logp, top_ids = _top_k(logp, top_k)
        top_logp = top_logp - top_logp.logsumexp(dim=-1, keepdim=True)  # renormalised to top_k
        return _nucleus_draw(top_logp, top_ids, top_p, uniform)
    if top_p >= 1.0:
        cdf = logp.exp().cumsum(dim=-1)
        pick = torch.searchsorted(cdf, uniform * cdf[:, -1:]).clamp(max=logp.shape[1] - 1)
        return pick.squeeze(1), logp.gather(1, pick).squeeze(1)
    top_logp, top_ids = logp.topk(min(1024, logp.shape[1]), dim=-1)
    tokens, logprobs = _nucleus_draw(top_logp, top_ids, top_p, uniform)
    wide = top_logp.exp().sum(dim=-1) < top_p
    if bool(wide.any()):
        full_logp, full_ids = logp[wide].sort(dim=-1, descending=True)
        tokens[wide], logprobs[wide] = _nucleus_draw(full_logp, full_ids, top_p, uniform[wide])
    return tokens, logprobs


def _top_k(logp: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k log-probs of each row, descending, and their ids; where other tokens tie with
    a row's k-th, they are kept too (vLLM keeps every token at or above the k-th value), and a
    row with fewer ties than the widest is padded with -inf."""
    top_logp, top_ids = logp.topk(top_k + 1, dim=-1)
    kth = top_logp[:, top_k - 1 : top_k]
    if bool((top_logp[:, -1:] == kth).any()):
        width = int((logp >= kth).sum(dim=-1).max())
        top_logp, top_ids = logp.topk(width, dim=-1)
    else:
        top_logp, top_ids = top_logp[:, :top_k], top_ids[:, :top_k]
    return top_logp.masked_fill(top_logp < kth, float("-inf")), top_ids


def _nucleus_draw(
    sorted_logp: torch.Tensor, sorted_ids: torch.Tensor, top_p: float, uniform: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    probs = sorted_logp.exp()
    kept = sorted_logp > float("-inf")  # a top-k cut pads its rows with -inf
    if top_p < 1.0:
        kept &= (probs.cumsum(dim=-1) - probs) < top_p  # the first token is always kept
    probs = probs * kept
    cdf = probs.cumsum(dim=-1)
    mass = cdf[:, -1:]
    last = kept.sum(dim=-1, keepdim=True) - 1
    pick = torch.minimum(torch.searchsorted(cdf, uniform * mass), last)
    token = sorted_ids.gather(1, pick).squeeze(1)
    return token, (sorted_logp.gather(1, pick) - mass.log()).squeeze(1)


def _sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    copies: list[int],
    sampling: Sampling,
    stops: set[int],
    pad_id: int,
    rng: torch.Generator,
    deadline: Deadline | None = None,
) -> list[tuple[list[int], list[float], str]]:
    """Decode copies[i] samples of prompts[i]; returns (tokens, logprobs, finish) per row.
    Past `deadline` no further step is taken (a forward pass cannot be stopped halfway)."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        cache, logits, mask, next_position = _prefill(model, prompts, copies, pad_id)
        stop_ids = torch.tensor(sorted(stops), device=device)

        rows = int(logits.shape[0])
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        live = torch.arange(rows, device=device)  # the row each batch position decodes
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        for step in range(sampling.max_tokens):
            if deadline is not None and deadline.passed():
                raise deadline.error(f"{step} tokens into a batch of {rows} rows")
            if sampling.temperature == 0:
                # Greedy: report the log-prob under the untempered model.
                logp = torch.log_softmax(logits.float(), dim=-1)
                chosen = logp.argmax(dim=-1)
                chosen_logp = logp.gather(1, chosen[:, None]).squeeze(1)
            else:
                chosen, chosen_logp = sample_tokens(
                    logits, sampling.temperature, sampling.top_p, rng, sampling.top_k
                )
            active = ~finished
            for row, token, value in zip(
                live[active].tolist(),
                chosen[active].tolist(),
                chosen_logp[active].tolist(),
                strict=True,
            ):
                tokens[row].append(token)
                logprobs[row].append(value)
            stopped = active & torch.isin(chosen, stop_ids)
            for row in live[stopped].tolist():
                finish[row] = "stop"
            finished |= stopped
            if bool(finished.all()) or step == sampling.max_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            if int(finished.sum()) >= max(1, int(_PRUNE_FRACTION * live.numel())):
                keep = (~finished).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                live, chosen, mask, next_position = (
                    live[keep],
                    chosen[keep],
                    mask[keep],
                    next_position[keep],
                )
                finished = finished[keep]
            out = model(
                input_ids=chosen[:, None],
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            next_position = next_position + 1
    return [(tokens[row], logprobs[row], finish[row]) for row in range(rows)]


def _prefill(
    model: PreTrainedModel, prompts: list[list[int]], copies: list[int], pad_id: int
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run each prompt once; its copies then share the cached prompt. Returns the KV cache,
    the next-token logits, the attention mask and the next position, one row per copy."""
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    width = max(map(len, prompts))
    # Left padding, so every row's next token goes in the same (last) column.
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    expand = torch.repeat_interleave(
        torch.arange(len(prompts), device=device), torch.tensor(copies, device=device)
    )
    cache.batch_select_indices(expand)
    return cache, out.logits[:, -1, :][expand], mask[expand], positions[expand, -1:] + 1
