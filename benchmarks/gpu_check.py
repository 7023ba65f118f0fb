"""VPO training steps on a CUDA device with the transformers backend: the check a GPU machine runs.

    bash benchmarks/gpu_check.sh [--model NAME|DIR] [--random-init] [--steps 4]
                                 [--groups 4] [--group-size 8] [--tokens 256]

For full fine-tuning and for LoRA (r=16) in turn: load the policy on `cuda`, take `--steps`
optimiser steps on synthetic groups (random prompt and completion tokens, random reward vectors
of 3 candidates x 2 objectives), and check that every loss is finite and the weights changed.
Prints the seconds per step (the first, which warms the kernels up, apart), completion tokens per
second and peak GPU memory, and writes the table to benchmarks/results/gpu_check.md (or
$GPU_CHECK_OUT). Exits 1 when a check fails, 0 with one line saying why when there is no CUDA.

`--model` defaults to the embedded SmolLM2-135M-Instruct. `--random-init` keeps the model's
architecture and tokenizer (a folder with config.json and the tokenizer files is enough) but
starts from random weights: for a machine the weights cannot reach.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results" / "gpu_check.md"


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


def check(name: str, lora: bool, args: argparse.Namespace) -> dict:
    import torch

    from trainer.policy import Policy, PolicyConfig
    from trainer.train import TrainConfig, train_step

    torch.cuda.reset_peak_memory_stats()
    policy = Policy.load(name, PolicyConfig(lr=1e-5 if lora else 1e-6, lora=lora, device="cuda"))
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trained[:: max(1, len(trained) // 8)]]
    vocab = policy.model.get_input_embeddings().num_embeddings
    config = TrainConfig(micro_batch=args.group_size)
    generator = torch.Generator().manual_seed(0)
    metrics = []
    for step in range(args.steps):
        groups = synthetic_groups(args.groups, args.group_size, args.tokens, vocab, step)
        torch.cuda.synchronize()
        metrics.append(train_step(policy, groups, config, generator=generator))
        torch.cuda.synchronize()
    after = [p.detach() for p in trained[:: max(1, len(trained) // 8)]]
    changed = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    seconds = [m.seconds for m in metrics[1:]] or [metrics[0].seconds]
    return {
        "mode": f"LoRA r={policy.config.lora_rank}" if lora else "full fine-tuning",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()

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
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"written to {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
