"""What every generator backend takes and returns; no backend library is imported here."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}


class GenerationError(Exception):
    """A generation request failed after the backend's own retries (an endpoint down, a
    timeout, a refusal). The message is one line.

    Not a UserError: the campaign records the iteration as skipped, with this message as its
    reason, and goes on; it stops only after `max_failures` iterations in a row failed.
    `permanent` says that sending the same request again cannot succeed (a prompt longer than
    the model takes, a request the server refuses with a 4xx).
    """

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


# Every sampling knob besides temperature, top-k and top-p, switched off: what the trainer's PPO
# ratio models is softmax(logits / T) cut to the top_k tokens, then to the top-p nucleus, nothing
# else. A knob a request leaves unset is filled in by vLLM (`vllm serve`, and `vllm.LLM` when it
# builds the parameters) from the model's generation_config.json (Qwen2.5 Instruct: top_k 20,
# repetition_penalty 1.05): the sampler then draws from, and reports log-probs of, a
# distribution the trainer never computes. top_k is off unless the request sets one; -1 is
# "off" in every vLLM version (0 is too in recent ones; older ones refuse it).
UNMODELLED_OFF: dict[str, float] = {
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.8  # 0 samples greedily
    top_p: float = 0.95
    max_tokens: int = 1024
    # Only the top_k most likely tokens are drawn from (0: all), cut before top_p as vLLM
    # does: the nucleus is looked for among them. vLLM's CPU sampler finds them without the
    # sort of the whole vocabulary that top_p < 1 costs at every token.
    top_k: int = 0
    seed: int | None = None  # the same seed, prompts and n give the same completions
    # Seconds a call may run before it is cut and fails with a GenerationError (None: no
    # limit): at a server each attempt of a request, in process the whole call, checked
    # between decode steps. A campaign sets it from `call_timeout`.
    timeout: float | None = None


@dataclass(frozen=True)
class Deadline:
    """When an in-process call must stop (on time.monotonic()'s clock), and its limit in
    seconds. The backend checks it between decode steps: a step already running is finished,
    then the call fails and the engine is free for the next one."""

    at: float
    seconds: float

    @classmethod
    def start(cls, sampling: Sampling) -> Deadline | None:
        """The deadline of a call starting now (None: `sampling` sets no limit)."""
        if sampling.timeout is None:
            return None
        return cls(time.monotonic() + sampling.timeout, sampling.timeout)

    def passed(self) -> bool:
        return time.monotonic() > self.at

    def error(self, progress: str) -> GenerationError:
        """What a call stopped here fails with; `progress` says how far it got."""
        return GenerationError(
            f"generation stopped at its limit of {self.seconds:g} s (call_timeout), {progress}"
        )


@dataclass(frozen=True)
class Completion:
    text: str  # the completion only, without the stop marker
    # Completion token ids as sampled, the stop token included when finish_reason is "stop"
    # (the policy has to learn to stop); empty when an endpoint does not return ids.
    token_ids: tuple[int, ...]
    # Log-prob of each token in token_ids under the distribution it was sampled from
    # (temperature, top-k and top-p applied; greedy decoding reports the untempered model's);
    # None where the backend does not give them.
    logprobs: tuple[float, ...] | None
    finish_reason: str  # "stop" or "length"
    prompt_token_ids: tuple[int, ...] | None
    # The completion tokens a server reported (its `usage`, shared among the request's
    # choices) where it returned no ids; budgets and counts use it then.
    reported_tokens: int | None = None
    reported_prompt_tokens: int | None = None  # the request's prompt tokens, from its usage

    @property
    def num_tokens(self) -> int:
        """The tokens it generated: its ids, else what the server reported, else 0."""
        return len(self.token_ids) if self.token_ids else (self.reported_tokens or 0)


_SURROGATES = re.compile("[\ud800-\udfff]")


def storable(completion: Completion) -> Completion:
    """The completion with lone UTF-16 surrogates (which an endpoint's JSON can carry, and
    neither UTF-8 nor a database can hold) replaced by U+FFFD."""
    if not _SURROGATES.search(completion.text):
        return completion
    return replace(completion, text=_SURROGATES.sub("\ufffd", completion.text))


class Weights(Protocol):
    """A policy version the trainer saved, in whichever form a generator loads it."""

    @property
    def name(self) -> str:
        """Unique per campaign and step: a server serves the adapter under it."""
        ...

    def model_folder(self) -> str:
        """A Hugging Face folder of the whole model, a LoRA adapter merged in."""
        ...

    def adapter_folder(self) -> str:
        """The folder of the LoRA adapter; a UserError when the version is whole weights."""
        ...

    def tensors(self, dtype: Any) -> Iterable[tuple[str, Any]] | None:
        """The whole weights as (name, tensor) pairs in torch dtype `dtype`, straight from the
        trainer's memory, for an engine in the trainer's process; None where only the folders
        hold them (a version a worker found recorded, a sharded trainer)."""
        ...

    def supersedes(self, name: str) -> bool:
        """Whether the version served as `name` may be unloaded once this one is loaded."""
        ...


class Generator(Protocol):
    backend: str
    model: str  # what the user asked for, e.g. "smollm2" or a folder
    # True: one `generate` call with many prompts batches them in this process (transformers,
    # vllm); False: each prompt is its own request to a server, sent concurrently by the caller.
    in_process: bool

    def context_tokens(self) -> int | None:
        """How many tokens the model takes, prompt and completion together (its config's
        context length, or a server's `max_model_len`); None when it cannot be known."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens of the chat-templated prompt `messages`, as `generate` would send them (an
        estimate, rounded up, where the backend has no tokenizer to ask)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        """n completions for each prompt, in prompt order."""
        ...

    def load_weights(self, weights: Weights) -> None:
        """Sample from the policy version `weights` from now on."""
        ...

    def close(self) -> None: ...


# Markers that end an assistant turn in common chat templates. A converted GGUF may name the
# wrong eos in its tokenizer, so the in-process backends stop at any of these that exist.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, eos: int | list[int] | None) -> set[int]:
    """The token ids that end a completion: the model's eos plus known end-of-turn markers."""
    stops = {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        stops.add(tokenizer.eos_token_id)
    vocab = tokenizer.get_vocab()
    stops.update(vocab[marker] for marker in END_OF_TURN if marker in vocab)
    # Some GGUF tokenizers name the start-of-turn marker as eos; stopping there is never right.
    for marker in ("<|im_start|>", "<start_of_turn>"):
        stops.discard(vocab.get(marker, -1))
    return stops


def context_length(config: Any) -> int | None:
    """The context length a Hugging Face model config declares (None when it names none)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def answer_start(messages: Sequence[Message]) -> str:
    """What a conversation has already put in the assistant's mouth: the content of a final
    assistant message, which the answer continues (a prefilled `<candidate_1>`), else ""."""
    if messages and messages[-1].get("role") == "assistant":
        return messages[-1].get("content") or ""
    return ""


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> list[int]:
    """Token ids of the chat-templated prompt, ending where the assistant's answer starts, or,
    when the last message is the assistant's, inside that message (its content continued:
    the template's trailing whitespace is cut, so a start should end in a visible character)."""
    started = bool(answer_start(messages))
    text = tokenizer.apply_chat_template(
        list(messages),
        tokenize=False,
        add_generation_prompt=not started,
        continue_final_message=started,
    )
    # The template already wrote any bos it wants; the tokenizer must not add a second one.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def request_ids(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Sequence[Message]],
    n: int,
    sampling: Sampling,
) -> list[list[int]]:
    """What an in-process backend's `generate` opens with: the request checked, then each
    prompt as the token ids of its chat template."""
    check_request(prompts, n, sampling)
    return [chat_prompt_ids(tokenizer, messages) for messages in prompts]


def decoded(
    tokenizer: PreTrainedTokenizerBase,
    tokens: Sequence[int],
    logprobs: Sequence[float] | None,
    finish: str,
    prompt: Sequence[int],
    stops: set[int],
    start: str = "",
) -> Completion:
    """A sampled completion as an in-process backend returns it: its text leaves out the stop
    token that ended it, its token ids keep it (a step trains on the model ending its turn).
    The text opens with `start`, the answer's prefilled opening (`answer_start`), which is in
    the prompt's tokens and not in the completion's, so that the text reads as the whole
    answer."""
    ends_in_stop = finish == "stop" and bool(tokens) and tokens[-1] in stops
    visible = list(tokens[:-1] if ends_in_stop else tokens)
    text = tokenizer.decode(visible, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return Completion(
        text=start + text,
        token_ids=tuple(tokens),
        logprobs=None if logprobs is None else tuple(logprobs),
        finish_reason=finish,
        prompt_token_ids=tuple(prompt),
    )


def check_request(prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling) -> None:
    """Reject requests no backend can serve, with the same message everywhere."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if sampling.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {sampling.max_tokens}")
    if not 0.0 < sampling.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {sampling.top_p}")
    top_k = sampling.top_k
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a whole number >= 0 (0: off), got {top_k!r}")
    if sampling.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {sampling.temperature}")
    if sampling.timeout is not None and not sampling.timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {sampling.timeout}")
    for messages in prompts:
        if not messages:
            raise ValueError("a prompt needs at least one message")
