"""Seconds and peak memory of one training step on the embedded models, campaign-sized rollouts.

    python benchmarks/train_step_memory.py [--models qwen-coder smollm2] [--micro-batch 1 8]

The work: one group of G = 8 rollouts, each a prompt of 700 tokens and a completion of 256
(what `vpo run circle_packing` prompts hold, and `make demo`'s --max-tokens), m = 3 candidates
and three objectives with random scores, the sampler's log-probs given (as vLLM gives them, so
the old log-probs are not recomputed), temperature 0.8 and top-p 0.95 as the campaign samples,
KL to the reference with beta 1e-3, one AdamW step: `trainer.train.train_step` as `vpo run
--train-every` calls it. LoRA r = 16 by default (`--full`: full fine-tuning as well).

Each configuration runs in a fresh process: the peak is that process's maximum resident set
(model loading included), beside the resident memory of the loaded policy; one that passes
`--max-gib` is stopped and reported so. Seconds: the median over `--steps` steps after one
untimed step. Prints a table and writes it to benchmarks/results/train_step_memory.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train_step_memory.md"
PROMPT_TOKENS, COMPLETION_TOKENS, GROUP, CANDIDATES, OBJECTIVES = 700, 256, 8, 3, 3


def resident_mib(pid: int | str = "self") -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # the process has just ended
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one_configuration(model: str, micro_batch: int, lora: bool, steps: int) -> dict[str, float]:
    """Runs in its own process."""
    import random

    import numpy as np
    import torch

    from trainer.loss import LossConfig
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    policy = Policy.load(model, PolicyConfig(lr=1e-5, lora=lora, lora_rank=16))
    loaded = resident_mib()
    rng = random.Random(0)
    # Ordinary text tokens: both tokenizers keep their special tokens outside this range.
    vocab = min(len(policy.tokenizer), 150_000)
    prompt = [rng.randrange(100, vocab) for _ in range(PROMPT_TOKENS)]
    config = TrainConfig(
        micro_batch=micro_batch,
        temperature=0.8,
        top_p=0.95,
        loss=LossConfig(beta=1e-3),
    )
    scores = np.random.default_rng(0)
    seconds = []
    for step in range(steps + 1):
        rollouts = [
            Rollout(
                prompt,
                [rng.randrange(100, vocab) for _ in range(COMPLETION_TOKENS)],
                logprobs=[-2.0] * COMPLETION_TOKENS,
            )
            for _ in range(GROUP)
        ]
        group = Group(
            rollouts=rollouts,
            scores=scores.random((GROUP, CANDIDATES, OBJECTIVES)),
            mask=np.ones((GROUP, CANDIDATES), dtype=bool),
        )
        started = time.perf_counter()
        train_step(policy, [group], config, generator=torch.Generator().manual_seed(step))
        if step:
            seconds.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": statistics.median(seconds), "peak_mib": peak, "loaded_mib": loaded}


def run_side(command: list[str], max_gib: float) -> dict[str, float]:
    """One configuration in its own process; stopped once it holds more than `max_gib`."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        side = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        while side.poll() is None:
            if resident_mib(side.pid) > max_gib * 1024:
                side.kill()
                side.wait()
                return {"stopped_gib": max_gib}
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        if side.returncode != 0:
            raise SystemExit(f"{' '.join(command[2:])} failed:\n{err.read()[-3000:]}")
        return json.loads(out.read().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["qwen-coder", "smollm2"], help="names resolve_model takes"
    )
    parser.add_argument("--micro-batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--full", action="store_true", help="full fine-tuning as well as LoRA")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per row")
    parser.add_argument(
        "--max-gib",
        type=float,
        default=12.0,
        help="stop a configuration whose resident memory passes this (GiB; default 12), so "
        "that a large micro-batch cannot take a shared machine's memory",
    )
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lora", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        result = one_configuration(args.models[0], args.micro_batch[0], bool(args.lora), args.steps)
        print(json.dumps(result))
        return

    import torch

    from trainer.models import preferred_dtype, resolve_model

    rows = []
    for model, lora, micro_batch in itertools.product(
        args.models, (True, False) if args.full else (True,), args.micro_batch
    ):
        resolve_model(model)  # convert once, outside the measured processes
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--side",
            "--models",
            model,
            "--micro-batch",
            str(micro_batch),
            "--lora",
            str(int(lora)),
            "--steps",
            str(args.steps),
        ]
        result = run_side(command, args.max_gib)
        rows.append((model, "LoRA r=16" if lora else "full", micro_batch, result))
        print(rows[-1], flush=True)
    tokens = GROUP * COMPLETION_TOKENS
    dtype = str(preferred_dtype("cpu")).split(".")[-1]
    lines = [
        "# One training step on the embedded models: seconds and peak memory",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, torch {torch.__version__}, "
        f"fp32 master weights, autocast {dtype}; load average at the end "
        f"{os.getloadavg()[0]:.1f} (other work on the machine slows every row)",
        f"- command: `python benchmarks/train_step_memory.py --models {' '.join(args.models)} "
        f"--micro-batch {' '.join(map(str, args.micro_batch))}"
        f"{' --full' if args.full else ''} --steps {args.steps} --max-gib {args.max_gib:g}`",
        f"- work per step: {GROUP} rollouts of {PROMPT_TOKENS} prompt + {COMPLETION_TOKENS} "
        f"completion tokens ({tokens} completion tokens), m = {CANDIDATES}, {OBJECTIVES} "
        "objectives, KL beta 1e-3, one AdamW step; median of the timed steps after one untimed",
        "",
        "| model | training | micro_batch | s/step | completion tok/s | peak RSS | loaded policy |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, name, micro_batch, result in rows:
        if "stopped_gib" in result:
            lines.append(
                f"| {model} | {name} | {micro_batch} | - | - | "
                f"over {result['stopped_gib']:g} GiB (stopped) | - |"
            )
            continue
        lines.append(
            f"| {model} | {name} | {micro_batch} | {result['seconds']:.1f} | "
            f"{tokens / result['seconds']:.0f} | {result['peak_mib'] / 1024:.2f} GiB | "
            f"{result['loaded_mib'] / 1024:.2f} GiB |"
        )
    publish(RESULTS, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
