"""Peak memory per process of one training step of a ~276M-parameter Llama: one process against
two sharing the model with FSDP2 or holding whole copies with DDP, with and without gradient
checkpointing.

    python benchmarks/train_memory_sharded.py [--steps 1] [--max-gib 10]

The model: a random-weight Llama saved once by `trainer.models.save_tiny_llama` (hidden 1024,
MLP 2816, 20 layers, 16 attention heads and 4 key-value heads, tied embeddings, SmolLM2's
tokenizer of 49,152 tokens). The work: two groups of G = 4 rollouts, each a prompt of 64 tokens
and a completion of 192 random ordinary tokens, no sampler log-probs (so the old log-probs are
recomputed), m = 2 candidates and two objectives with random scores, no KL term (beta 0, no
reference model), micro-batch 8, one full fine-tuning AdamW step: `trainer.train.train_step`.
On two processes (`torchrun --nproc_per_node 2`, gloo) each passes its own group, as `vpo
train` under torchrun does; on one, the process passes both.

Each configuration runs in fresh processes (two under torchrun): a process's peak is its
maximum resident set (`ru_maxrss`, model loading included), beside its resident memory once
the policy is loaded (wrapped, before the first step); a row shows the largest over the ranks.
A run in which any process passes `--max-gib` is stopped and reported so. Seconds: the median
over `--steps` timed steps after one untimed step (which also allocates Adam's moments). Prints
a table and writes it to benchmarks/results/train_memory_sharded.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402
from train_step_memory import resident_mib  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "train_memory_sharded.md"
MODEL = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
}
GROUPS, GROUP, PROMPT_TOKENS, COMPLETION_TOKENS, CANDIDATES, OBJECTIVES = 2, 4, 64, 192, 2, 2
MICRO_BATCH = 8
# (configuration, processes, sharding, gradient checkpointing)
CONFIGURATIONS = [
    ("one process", 1, "none", "off"),
    ("one process, checkpointing", 1, "none", "on"),
    ("FSDP2", 2, "fsdp", "off"),
    ("FSDP2, checkpointing", 2, "fsdp", "on"),
    ("DDP", 2, "ddp", "off"),
]
THREADS = {1: 2, 2: 1}  # OMP_NUM_THREADS by process count: the machine's 2 cores either way


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (torchrun's workers)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The parent is the 2nd field after the parenthesised command name.
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def one_configuration(folder: str, sharding: str, checkpointing: str, steps: int) -> dict:
    """Runs in its own process (one rank of a torchrun launch, or alone)."""
    import random

    import numpy as np
    import torch

    from trainer.distributed import Parallel
    from trainer.loss import LossConfig
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    parallel = Parallel.join(sharding)
    policy = Policy.load(
        folder,
        PolicyConfig(lr=1e-5, reference=False, gradient_checkpointing=checkpointing),
        parallel=parallel,
    )
    loaded = resident_mib()
    rng = random.Random(0)  # the same rollouts on every rank: each then takes its own share
    vocab = len(policy.tokenizer)  # SmolLM2's special tokens lie below 100
    scores = np.random.default_rng(0)
    config = TrainConfig(
        micro_batch=MICRO_BATCH, skip_zero_advantage=False, loss=LossConfig(beta=0.0)
    )
    seconds = []
    for step in range(steps + 1):
        groups = [
            Group(
                rollouts=[
                    Rollout(
                        [rng.randrange(100, vocab) for _ in range(PROMPT_TOKENS)],
                        [rng.randrange(100, vocab) for _ in range(COMPLETION_TOKENS)],
                        logprobs=None,
                    )
                    for _ in range(GROUP)
                ],
                scores=scores.random((GROUP, CANDIDATES, OBJECTIVES)),
                mask=np.ones((GROUP, CANDIDATES), dtype=bool),
            )
            for _ in range(GROUPS)
        ]
        mine = groups[parallel.rank :: parallel.world]
        started = time.perf_counter()
        train_step(policy, mine, config, generator=torch.Generator().manual_seed(step))
        if step:
            seconds.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "rank": parallel.rank,
        "world": parallel.world,
        "sharding": parallel.sharding,
        "checkpointing": policy.checkpointing,
        "seconds": statistics.median(seconds),
        "peak_mib": peak,
        "loaded_mib": loaded,
    }


def run_side(command: list[str], threads: int, max_gib: float) -> list[dict] | dict:
    """One configuration in its own processes (each rank's JSON line); stopped once any of them
    holds more than `max_gib`."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        # A session of its own, so that the launcher and its workers are stopped together.
        side = subprocess.Popen(
            command, stdout=out, stderr=err, text=True, env=env, start_new_session=True
        )
        while side.poll() is None:
            if max(resident_mib(pid) for pid in descendants(side.pid)) > max_gib * 1024:
                os.killpg(side.pid, signal.SIGKILL)
                side.wait()
                return {"stopped_gib": max_gib}
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        if side.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{err.read()[-6000:]}")
        results = [json.loads(line) for line in out.read().splitlines() if line.startswith("{")]
        return sorted(results, key=lambda result: result["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1, help="timed steps per row (default 1)")
    parser.add_argument(
        "--max-gib",
        type=float,
        default=10.0,
        help="stop a configuration one of whose processes passes this resident memory (GiB; "
        "default 10), so that a run cannot take a shared machine's memory",
    )
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--sharding", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", default="off", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        result = one_configuration(args.folder, args.sharding, args.checkpointing, args.steps)
        print(json.dumps(result), flush=True)
        return

    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    from trainer.models import preferred_dtype, save_tiny_llama

    rows = []
    with tempfile.TemporaryDirectory(prefix="vpo-sharded-") as folder:
        save_tiny_llama(folder, **MODEL)  # once, outside the measured processes
        with torch.device("meta"):
            shape = LlamaForCausalLM(AutoConfig.from_pretrained(folder))
        parameters = sum(p.numel() for p in shape.parameters())
        vocab = shape.config.vocab_size
        for name, processes, sharding, checkpointing in CONFIGURATIONS:
            side = [
                str(Path(__file__).resolve()),
                "--side",
                "--folder",
                folder,
                "--sharding",
                sharding,
                "--checkpointing",
                checkpointing,
                "--steps",
                str(args.steps),
            ]
            if processes == 1:
                command = [sys.executable, *side]
            else:
                command = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",  # a free port, not 29500, which another run may hold
                    "--nproc_per_node",
                    str(processes),
                    *side,
                ]
            started = time.perf_counter()
            result = run_side(command, THREADS[processes], args.max_gib)
            rows.append((name, processes, sharding, checkpointing, result))
            print(f"{name}: {time.perf_counter() - started:.0f} s {result}", flush=True)

    rollouts = GROUPS * GROUP
    lines = [
        "# Peak memory per process of one training step: one process, FSDP2 and DDP on two",
        "",
        f"- command: `python benchmarks/train_memory_sharded.py --steps {args.steps} "
        f"--max-gib {args.max_gib:g}`",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.machine()}, "
        f"torch {torch.__version__}, gloo; fp32 master weights, autocast "
        f"{str(preferred_dtype('cpu')).split('.')[-1]}; load average at the end "
        f"{os.getloadavg()[0]:.1f} (the machine is shared: the seconds are rough)",
        f"- model: random-weight Llama, {parameters / 1e6:.1f}M parameters "
        f"({parameters * 4 / 2**20:.0f} MiB in fp32): hidden {MODEL['hidden_size']}, MLP "
        f"{MODEL['intermediate_size']}, {MODEL['num_hidden_layers']} layers, "
        f"{MODEL['num_attention_heads']} heads / {MODEL['num_key_value_heads']} key-value heads, "
        f"vocabulary {vocab}, tied embeddings",
        f"- step: {GROUPS} groups of G = {GROUP} rollouts, each {PROMPT_TOKENS} prompt + "
        f"{COMPLETION_TOKENS} completion tokens ({rollouts * (PROMPT_TOKENS + COMPLETION_TOKENS)} "
        f"tokens, {rollouts * COMPLETION_TOKENS} completion tokens, over all processes); "
        f"m = {CANDIDATES}, {OBJECTIVES} objectives, old log-probs recomputed, no KL term "
        f"(beta 0, no reference), micro-batch {MICRO_BATCH}, full fine-tuning, one AdamW step; "
        "on two processes each takes one group",
        f"- threads: OMP_NUM_THREADS={THREADS[1]} for one process, {THREADS[2]} per process for "
        "two (torchrun); TOKENIZERS_PARALLELISM=false",
        f"- peak RSS: `ru_maxrss` of each process (model loading included), the largest over the "
        "ranks; loaded: resident memory once the policy is loaded and wrapped, before the first "
        f"step; above: peak - loaded; s/step: median of {args.steps} timed step(s) after one "
        "untimed (which allocates Adam's moments)",
        "- the weights load as a memory map of the safetensors file (fp32 kept in place), "
        'resident only once read: "loaded" holds none of them on one process (they come '
        'in with the first forward, ~1,050 MiB of "above"), this rank\'s shard on FSDP2 '
        "(`fully_shard` copies it), all of them on DDP (its wrap broadcasts rank 0's)",
        "",
        "| configuration | processes | sharding | checkpointing | peak RSS per process (MiB) "
        "| loaded (MiB) | peak above loaded (MiB) | s/step | peak / row 1 |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    first = None
    for name, processes, sharding, checkpointing, result in rows:
        if isinstance(result, dict):
            lines.append(
                f"| {name} | {processes} | {sharding} | {checkpointing} | over "
                f"{result['stopped_gib']:g} GiB (stopped) | - | - | - | - |"
            )
            continue
        peak = max(rank["peak_mib"] for rank in result)
        loaded = max(rank["loaded_mib"] for rank in result)
        above = max(rank["peak_mib"] - rank["loaded_mib"] for rank in result)
        seconds = max(rank["seconds"] for rank in result)
        first = first or peak
        lines.append(
            f"| {name} | {processes} | {sharding} | {checkpointing} | {peak:.0f} | {loaded:.0f} "
            f"| {above:.0f} | {seconds:.1f} | {peak / first:.2f} |"
        )
    publish(RESULTS, "\n".join(lines) + "\n")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
