"""Tokens/s of one training step on SmolLM2-135M, beside TRL's GRPOTrainer doing the same work.

    python benchmarks/train_step_speed.py [--steps 3] [--trl-python PATH | --no-trl]

The work, for both: one prompt of 64 tokens, G = 8 completions of 192 tokens each (fixed token
ids, so generation costs nothing and both train on exactly the same tokens), two reward
objectives, KL to the frozen reference with beta 1e-3, one AdamW step; full fine-tuning and
LoRA r = 16 on every linear layer. fp32 master weights; bf16 only where the CPU multiplies it
natively (`trainer.models.preferred_dtype`), and TRL is given the same dtype.

- ours: `trainer.train.train_step` with the VPO advantage (m = 1 here, the same cost as GRPO);
- TRL 1.16.0 `GRPOTrainer` with a `rollout_func` that returns the same fixed completions (TRL's
  hook for bring-your-own generation), two reward functions, `num_generations` 8, one
  optimiser step per generation batch, timed per optimiser step by a callback: its training
  part, since generation is a table lookup.

Each row: the median over `--steps` steps after one untimed step. TRL runs in its own virtual
environment (made once in /tmp/vpo-trl-venv when `--trl-python` is not given), one process per
configuration. Prints a table and writes it to benchmarks/results/train_step_speed.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train_step_speed.md"
TRL_VERSION = "1.16.0"
TRL_VENV = Path(tempfile.gettempdir()) / "vpo-trl-venv"
PROMPT_TOKENS, COMPLETION_TOKENS, GROUP = 64, 192, 8
TARGET = 1.5


def fixed_tokens(vocab: int) -> tuple[list[int], list[list[int]]]:
    import random

    rng = random.Random(0)
    # Ordinary text tokens (skip the first 100 ids: SmolLM2's special tokens live there).
    prompt = [rng.randrange(100, vocab) for _ in range(PROMPT_TOKENS)]
    completions = [
        [rng.randrange(100, vocab) for _ in range(COMPLETION_TOKENS)] for _ in range(GROUP)
    ]
    return prompt, completions


def ours(folder: str, steps: int, lora: bool) -> list[float]:
    import numpy as np
    import torch

    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    policy = Policy.load(folder, PolicyConfig(lr=1e-6, lora=lora, lora_rank=16))
    prompt, completions = fixed_tokens(len(policy.tokenizer))
    rng = np.random.default_rng(0)
    seconds = []
    for step in range(steps + 1):
        group = Group(
            rollouts=[Rollout(prompt, c) for c in completions],
            scores=rng.random((GROUP, 1, 2)),
            mask=np.ones((GROUP, 1), dtype=bool),
        )
        started = time.perf_counter()
        train_step(
            policy,
            [group],
            TrainConfig(micro_batch=GROUP),
            generator=torch.Generator().manual_seed(step),
        )
        if step:
            seconds.append(time.perf_counter() - started)
    return seconds


def trl_side(folder: str, steps: int, lora: bool, dtype: str) -> list[float]:
    """Runs under TRL's environment."""
    import random

    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt, completions = fixed_tokens(len(tokenizer))

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {
            "prompt_ids": [prompt for _ in prompts],
            "completion_ids": [completions[i % GROUP] for i in range(len(prompts))],
            "logprobs": [[-1.0] * COMPLETION_TOKENS for _ in prompts],
        }

    rng = random.Random(0)

    def objective_one(completions: list[Any], **_: Any) -> list[float]:
        return [rng.random() for _ in completions]

    def objective_two(completions: list[Any], **_: Any) -> list[float]:
        return [rng.random() for _ in completions]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.seconds.append(time.perf_counter() - self.started)

    output = tempfile.mkdtemp(prefix="vpo-trl-")
    config = GRPOConfig(
        output_dir=output,
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        max_completion_length=COMPLETION_TOKENS,
        max_steps=steps + 1,
        learning_rate=1e-6,
        beta=1e-3,
        use_cpu=True,
        bf16=dtype == "bfloat16",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    clock = Clock()
    trainer = GRPOTrainer(
        model=folder,
        reward_funcs=[objective_one, objective_two],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["pack circles"] * 64}),
        processing_class=tokenizer,
        rollout_func=rollout,
        peft_config=peft_config,
        callbacks=[clock],
    )
    trainer.train()
    return clock.seconds[1:]


def trl_python(given: str | None) -> Path:
    if given:
        return Path(given)
    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {TRL_VENV} (trl {TRL_VERSION}) once", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "torch==2.13.0"], check=True)
        subprocess.run(
            [*pip, f"trl=={TRL_VERSION}", "transformers==5.17.0", "peft", "accelerate", "datasets"],
            check=True,
        )
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per row")
    parser.add_argument("--trl-python", default=None)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--side", choices=("ours", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        print(json.dumps(trl_side(args.folder, args.steps, args.lora, args.dtype)))
        return
    if args.side == "ours":
        print(json.dumps(ours(args.folder, args.steps, args.lora)))
        return

    import torch

    from trainer.models import EMBEDDED, preferred_dtype, resolve_model

    folder = resolve_model(EMBEDDED)
    dtype = str(preferred_dtype("cpu")).split(".")[-1]
    here = Path(__file__).resolve()
    rows = []
    for lora in (False, True):
        common = ["--folder", folder, "--steps", str(args.steps), "--dtype", dtype]
        common += ["--lora"] if lora else []
        mine = run_side([sys.executable, str(here), "--side", "ours", *common])
        theirs = None
        if not args.no_trl:
            python = trl_python(args.trl_python)
            theirs = run_side([str(python), str(here), "--side", "trl", *common])
        rows.append(("LoRA r=16" if lora else "full", mine, theirs))
        print(rows[-1], flush=True)
    write(args, rows, dtype, torch.__version__)


def run_side(command: list[str]) -> list[float]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command[:4])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write(args: argparse.Namespace, rows: list[Any], dtype: str, torch_version: str) -> None:
    tokens = GROUP * COMPLETION_TOKENS
    lines = [
        "# One training step on SmolLM2-135M: vpo-evolve against TRL's GRPOTrainer",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch_version}, "
        f"dtype {dtype}",
        f"- command: `python benchmarks/train_step_speed.py --steps {args.steps}`",
        f"- work per step: {GROUP} completions x {COMPLETION_TOKENS} tokens after a "
        f"{PROMPT_TOKENS}-token prompt ({tokens} completion tokens), two objectives, beta 1e-3, "
        "one AdamW step; median of the timed steps after one untimed step",
        "",
        "| training | vpo-evolve s/step | tok/s | TRL 1.16 s/step | tok/s | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for name, mine, theirs in rows:
        ours_s = statistics.median(mine)
        if theirs:
            trl_s = statistics.median(theirs)
            ratio = trl_s / ours_s
            verdicts.append(ratio)
            lines.append(
                f"| {name} | {ours_s:.2f} | **{tokens / ours_s:.0f}** | {trl_s:.2f} | "
                f"{tokens / trl_s:.0f} | {ratio:.2f}x |"
            )
        else:
            lines.append(f"| {name} | {ours_s:.2f} | **{tokens / ours_s:.0f}** | - | - | - |")
    if verdicts:
        met = all(v >= TARGET for v in verdicts)
        lines += [
            "",
            f"Target: at least {TARGET}x TRL's tokens/s; this run "
            f"{'meets' if met else 'misses'} it.",
        ]
    report = "\n".join(lines) + "\n"
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
