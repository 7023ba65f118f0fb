"""One training step at the harness's shapes: the shared-prompt step against a row per
rollout and TRL's GRPOTrainer, on the same tokens.

    python benchmarks/train_step_speed.py [--model qwen-coder] [--training lora full]
        [--shapes 400x60x4 1000x60x8 ...] [--row-micro-batch 2] [--steps 1] [--limit 900]
        [--no-trl]

A campaign trains on groups of G completions of one prompt: long prompts (the statement, the
parent, several drafts: P = 400 to 4,000 tokens) and short completions (C = 30 to 300). For
each shape P x C x G: one group of fixed random token ids (generation costs nothing, and all
three train on exactly the same tokens), two reward objectives, KL to the frozen reference with
beta 1e-3, one AdamW step. The shared step packs up to `--micro-batch` (8) rollouts a pass; the
per-row step and TRL take `--row-micro-batch` rows a pass, each row carrying the prompt, so
fewer fit (Qwen-coder at P = 1,000, G = 8 in fp32: 8 rows a pass were killed for memory on
24 GiB):

- shared: `trainer.train.train_step` as campaigns run it (`shared_prompt`, the default): the
  prompt runs forward and backward once, packed with the completions under a block mask;
- per-row: the same step with `shared_prompt=False`, every rollout its own row (the step
  before issue 32);
- TRL 1.16.0 `GRPOTrainer` with a `rollout_func` that returns the same fixed tokens (TRL's hook
  for bring-your-own generation), `num_generations` G, one optimiser step per generation batch,
  timed by a callback around the step; TRL puts the prompt in every row.

fp32 master weights; bf16 only where the CPU multiplies it natively (`preferred_dtype`), and TRL
is given the same dtype. Each cell: the median over `--steps` timed steps after one untimed
step, in a process of its own, with that process's peak resident memory; a run past `--limit`
seconds is stopped and shown as such. TRL runs in its own virtual environment (made once in
/tmp/vpo-trl-venv when `--trl-python` is not given). Prints a table and writes it to
benchmarks/results/train_step_speed.md.
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
SHAPES = ("400x60x4", "1000x60x8")
MICRO_BATCH = 8
METHODS = ("shared", "per-row", "TRL")
# At P = 1,000, C = 60, G = 8 (issue 32): the shared step at least this many times as fast.
TARGETS = {"per-row": 2.5, "TRL": 3.0}
HEADLINE = (1000, 60, 8)

Shape = tuple[int, int, int]


def parse_shape(text: str) -> Shape:
    try:
        prompt, completion, group = (int(part) for part in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a shape is PxCxG (e.g. 1000x60x8), not {text!r}"
        ) from None
    if min(prompt, completion, group) < 1:
        raise argparse.ArgumentTypeError(f"every part of a shape is >= 1, not {text!r}")
    return prompt, completion, group


def fixed_tokens(vocab: int, shape: Shape) -> tuple[list[int], list[list[int]]]:
    import random

    prompt_tokens, completion_tokens, group = shape
    rng = random.Random(0)
    # Ordinary text tokens (skip the first 100 ids: the special tokens live there).
    prompt = [rng.randrange(100, vocab) for _ in range(prompt_tokens)]
    completions = [
        [rng.randrange(100, vocab) for _ in range(completion_tokens)] for _ in range(group)
    ]
    return prompt, completions


def peak_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def ours(
    folder: str,
    steps: int,
    lora: bool,
    shape: Shape,
    shared: bool,
    micro_batch: int,
    warmup: int = 1,
) -> list[float]:
    import numpy as np
    import torch

    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    policy = Policy.load(folder, PolicyConfig(lr=1e-6, lora=lora, lora_rank=16))
    prompt, completions = fixed_tokens(len(policy.tokenizer), shape)
    size = len(completions)
    config = TrainConfig(
        micro_batch=micro_batch, shared_prompt=shared, max_tokens=shape[0] + shape[1]
    )
    rng = np.random.default_rng(0)
    seconds = []
    for step in range(steps + warmup):
        group = Group(
            rollouts=[Rollout(prompt, c) for c in completions],
            scores=rng.random((size, 1, 2)),
            mask=np.ones((size, 1), dtype=bool),
        )
        started = time.perf_counter()
        metrics = train_step(policy, [group], config, generator=torch.Generator().manual_seed(step))
        if metrics.unshared != (0 if shared else size) or metrics.trained != size:
            raise SystemExit(f"the step ran another path than asked: {metrics}")
        if step >= warmup:
            seconds.append(time.perf_counter() - started)
    return seconds


def trl_side(
    folder: str,
    steps: int,
    lora: bool,
    dtype: str,
    shape: Shape,
    micro_batch: int,
    warmup: int = 1,
) -> list[float]:
    """Runs under TRL's environment."""
    import dataclasses
    import random

    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt, completions = fixed_tokens(len(tokenizer), shape)
    group = len(completions)

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {
            "prompt_ids": [prompt for _ in prompts],
            "completion_ids": [completions[i % group] for i in range(len(prompts))],
            "logprobs": [[-1.0] * shape[1] for _ in prompts],
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

    settings: dict[str, Any] = {
        "output_dir": tempfile.mkdtemp(prefix="vpo-trl-"),
        # G rows a step, micro_batch of them a pass (a generation batch of G)
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": group // micro_batch,
        "num_generations": group,
        "max_completion_length": shape[1],
        "max_steps": steps + warmup,
        "learning_rate": 1e-6,
        "beta": 1e-3,
        "use_cpu": True,
        "bf16": dtype == "bfloat16",
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "model_init_kwargs": {"dtype": "float32"},
    }
    names = {field.name for field in dataclasses.fields(GRPOConfig)}
    if "max_prompt_length" in names:
        settings["max_prompt_length"] = None  # the whole prompt, as ours
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    clock = Clock()
    trainer = GRPOTrainer(
        model=folder,
        reward_funcs=[objective_one, objective_two],
        args=GRPOConfig(**settings),
        train_dataset=Dataset.from_dict({"prompt": ["pack circles"] * 64}),
        processing_class=tokenizer,
        rollout_func=rollout,
        peft_config=peft_config,
        callbacks=[clock],
    )
    trainer.train()
    return clock.seconds[warmup:]


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
    parser.add_argument("--model", nargs="+", default=["qwen-coder"], help="embedded models")
    parser.add_argument("--training", nargs="+", choices=("lora", "full"), default=["lora"])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=None, help="PxCxG")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per cell")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed steps before the timed ones (1; 0 for long steps, whose first-call costs"
        " are a small share)",
    )
    parser.add_argument("--limit", type=float, default=900.0, help="seconds a cell may take")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--micro-batch", type=int, default=MICRO_BATCH, help="rollouts a pass of the shared step"
    )
    parser.add_argument(
        "--row-micro-batch",
        type=int,
        default=MICRO_BATCH,
        help="rows a pass of the per-row step and TRL's (each row holds the prompt: fewer fit)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the table is written")
    parser.add_argument("--trl-python", default=None)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--side", choices=("shared", "per-row", "TRL"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--shape", type=parse_shape, help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or not args.limit > 0 or min(args.micro_batch, args.row_micro_batch) < 1:
        parser.error("--steps and the micro-batches must be >= 1 and --limit > 0")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.side:
        rows = min(args.row_micro_batch, args.shape[2])
        if args.side == "TRL":
            if args.shape[2] % rows:
                parser.error(f"TRL needs G a multiple of --row-micro-batch ({rows})")
            seconds = trl_side(
                args.folder, args.steps, args.lora, args.dtype, args.shape, rows, args.warmup
            )
        elif args.side == "shared":
            seconds = ours(
                args.folder, args.steps, args.lora, args.shape, True, args.micro_batch, args.warmup
            )
        else:
            seconds = ours(args.folder, args.steps, args.lora, args.shape, False, rows, args.warmup)
        print(json.dumps({"seconds": seconds, "peak_gib": peak_gib()}))
        return

    import torch

    from trainer.models import ModelError, preferred_dtype, resolve_model

    dtype = str(preferred_dtype("cpu")).split(".")[-1]
    methods = [m for m in args.methods if not (m == "TRL" and args.no_trl)]
    shapes = args.shapes or [parse_shape(s) for s in SHAPES]
    here = Path(__file__).resolve()
    rows = []
    for model in args.model:
        try:
            folder = resolve_model(model)
        except ModelError as error:
            raise SystemExit(f"train_step_speed: {error}") from None
        for training in args.training:
            for shape in shapes:
                common = ["--folder", folder, "--steps", str(args.steps), "--dtype", dtype]
                common += ["--warmup", str(args.warmup)]
                common += ["--shape", "x".join(map(str, shape))]
                common += ["--micro-batch", str(args.micro_batch)]
                common += ["--row-micro-batch", str(args.row_micro_batch)]
                common += ["--lora"] if training == "lora" else []
                cells = {}
                for method in methods:
                    python = trl_python(args.trl_python) if method == "TRL" else sys.executable
                    command = [str(python), str(here), "--side", method, *common]
                    cells[method] = run_side(command, args.limit)
                rows.append((model, training, shape, cells))
                print(rows[-1], flush=True)
    write(args, rows, dtype, torch.__version__, methods)


def run_side(command: list[str], limit: float) -> dict[str, Any]:
    """The side's seconds and peak memory; {"stopped": limit} when it ran past the limit,
    {"killed": why} when it was killed (for memory)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"stopped": limit}
    if done.returncode == -9:  # the kernel's OOM killer, as nothing else here sends SIGKILL
        return {"killed": "out of memory"}
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command[:5])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write(
    args: argparse.Namespace,
    rows: list[Any],
    dtype: str,
    torch_version: str,
    methods: list[str],
) -> None:
    command = " ".join(sys.argv[1:])
    lines = [
        "# One training step at the harness's shapes: shared prompt, a row per rollout, TRL",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch_version}, "
        f"dtype {dtype}",
        f"- command: `python benchmarks/train_step_speed.py {command}`",
        f"- work per step: one group, P prompt tokens and G completions of C tokens, two "
        f"objectives, beta 1e-3, one AdamW step; the shared step packs up to {args.micro_batch} "
        f"rollouts a pass, the per-row step and TRL take {args.row_micro_batch} rows a pass; "
        "LoRA r = 16 "
        f"(all linear layers); median of {args.steps} timed step(s) after {args.warmup} "
        "untimed; "
        "tok/s = G x C completion tokens per second; peak = the process's resident memory",
        "",
        "| model | training | P | C | G | "
        + " | ".join(f"{m} s/step | {m} peak GiB" for m in methods)
        + " | shared tok/s | vs per-row | vs TRL |",
        "|---|---|---:|---:|---:|" + "---:|---:|" * len(methods) + "---:|---:|---:|",
    ]
    verdicts = []
    for model, training, shape, cells in rows:
        medians = {m: _median(cells[m]) for m in methods}
        parts = []
        for method in methods:
            cell = cells[method]
            if "stopped" in cell:
                parts += [f"> {cell['stopped']:.0f}", "-"]
            elif "killed" in cell:
                parts += ["killed", cell["killed"]]
            else:
                parts += [f"{medians[method]:.1f}", f"{cell['peak_gib']:.1f}"]
        shared = medians.get("shared")
        tokens = shape[1] * shape[2]
        rate = f"**{tokens / shared:.0f}**" if shared else "-"
        ratios = []
        for other in ("per-row", "TRL"):
            value = medians.get(other)
            if shared and value:
                ratios.append(f"{value / shared:.1f}x")
                if shape == HEADLINE:
                    verdicts.append((model, training, other, value / shared))
            else:  # a stopped cell's limit also held the model's load and the untimed step
                ratios.append("-")
        lines.append(
            f"| {model} | {training} | {shape[0]} | {shape[1]} | {shape[2]} | "
            + " | ".join(parts)
            + f" | {rate} | {ratios[0]} | {ratios[1]} |"
        )
    if verdicts:
        lines.append("")
        for model, training, other, ratio in verdicts:
            target = TARGETS[other]
            met = "meets" if ratio >= target else "misses"
            lines.append(
                f"Target at P = {HEADLINE[0]}, C = {HEADLINE[1]}, G = {HEADLINE[2]} ({model}, "
                f"{training}): the shared step at least {target}x {other}; {ratio:.1f}x here, "
                f"which {met} it."
            )
    if any("stopped" in cell for *_, cells in rows for cell in cells.values()):
        lines += [
            "",
            "> N: stopped after N s (`--limit`), which held the model's load and any untimed "
            "step as well as the timed one(s); no ratio is given for it.",
        ]
    publish(args.out, "\n".join(lines) + "\n")


def _median(cell: dict[str, Any]) -> float | None:
    return statistics.median(cell["seconds"]) if cell.get("seconds") else None


if __name__ == "__main__":
    main()
