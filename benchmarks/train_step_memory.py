"""Seconds and peak memory of one training step on the embedded models, campaign-sized rollouts.

    python benchmarks/train_step_memory.py [--models qwen-coder smollm2] [--micro-batch 1 8]
        [--checkpointing auto off] [--completion-tokens 256] [--cgroup-gib 4]

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

`--cgroup-gib N` runs each configuration in a memory cgroup of its own limited to N GiB (root
and a writable cgroup memory controller, v1 or v2): the machine short of memory as a shared
one is, where the kernel kills a process past the limit. It shows what activation
checkpointing "auto" does (trainer/activations.py): it reads the limit and recomputes the
passes that would not fit, where "off" is killed (`--out` names another table for it).
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


def one_configuration(
    model: str,
    micro_batch: int,
    lora: bool,
    steps: int,
    checkpointing: str = "auto",
    completion_tokens: int = COMPLETION_TOKENS,
) -> dict[str, float]:
    """Runs in its own process."""
    import random

    import numpy as np
    import torch

    from trainer.loss import LossConfig
    from trainer.policy import Policy, PolicyConfig
    from trainer.train import Group, Rollout, TrainConfig, train_step

    policy = Policy.load(
        model,
        PolicyConfig(lr=1e-5, lora=lora, lora_rank=16, gradient_checkpointing=checkpointing),
    )
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
    seconds, checkpointed, passes = [], 0, 0
    for step in range(steps + 1):
        rollouts = [
            Rollout(
                prompt,
                [rng.randrange(100, vocab) for _ in range(completion_tokens)],
                logprobs=[-2.0] * completion_tokens,
            )
            for _ in range(GROUP)
        ]
        group = Group(
            rollouts=rollouts,
            scores=scores.random((GROUP, CANDIDATES, OBJECTIVES)),
            mask=np.ones((GROUP, CANDIDATES), dtype=bool),
        )
        started = time.perf_counter()
        metrics = train_step(policy, [group], config, generator=torch.Generator().manual_seed(step))
        checkpointed += metrics.checkpointed
        passes += -(-GROUP // micro_batch)
        if step or not steps:
            seconds.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "seconds": statistics.median(seconds),
        "peak_mib": peak,
        "loaded_mib": loaded,
        "recomputed": f"{checkpointed}/{passes}",
        # What "auto" weighed for the last pass it recomputed: its estimate, the memory free.
        "weighed": policy.recomputed_memory,
    }


class Cgroup:
    """A memory cgroup of its own, limited to `gib`, that a child process joins."""

    def __init__(self, gib: float) -> None:
        limit = str(int(gib * 2**30))
        name = f"vpo-train-step-{os.getpid()}"
        v1 = Path("/sys/fs/cgroup/memory")
        try:
            if v1.is_dir():
                self.folder = v1 / name
                self.folder.mkdir()
                (self.folder / "memory.limit_in_bytes").write_text(limit)
            else:
                self.folder = Path("/sys/fs/cgroup") / name
                self.folder.mkdir()
                (self.folder / "memory.max").write_text(limit)
                (self.folder / "memory.swap.max").write_text("0")
        except OSError as error:
            raise SystemExit(
                f"--cgroup-gib needs root and a writable cgroup memory controller: {error}"
            ) from error

    def join(self) -> None:  # in the child, before it runs anything
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        self.folder.rmdir()


def run_side(
    command: list[str], max_gib: float, cgroup_gib: float | None = None
) -> dict[str, float]:
    """One configuration in its own process (in a cgroup of `cgroup_gib` when given); stopped
    once it holds more than `max_gib`."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cgroup = Cgroup(cgroup_gib) if cgroup_gib else None
    try:
        return _run_side(command, max_gib, env, cgroup)
    finally:
        if cgroup is not None:
            cgroup.remove()


def _run_side(
    command: list[str], max_gib: float, env: dict[str, str], cgroup: Cgroup | None
) -> dict[str, float]:
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        side = subprocess.Popen(
            command,
            stdout=out,
            stderr=err,
            text=True,
            env=env,
            preexec_fn=cgroup.join if cgroup else None,
        )
        while side.poll() is None:
            if resident_mib(side.pid) > max_gib * 1024:
                side.kill()
                side.wait()
                return {"stopped_gib": max_gib}
            time.sleep(0.2)
        out.seek(0)
        err.seek(0)
        if side.returncode == -9 and cgroup is not None:  # the kernel's OOM killer
            return {"killed": 1.0}
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
    parser.add_argument(
        "--checkpointing",
        nargs="+",
        default=["auto"],
        choices=["auto", "on", "off"],
        help="gradient_checkpointing settings to run (default auto)",
    )
    parser.add_argument(
        "--completion-tokens",
        type=int,
        default=COMPLETION_TOKENS,
        help=f"tokens of each rollout's answer (default {COMPLETION_TOKENS})",
    )
    parser.add_argument(
        "--cgroup-gib",
        type=float,
        default=None,
        help="run each configuration in a memory cgroup limited to this many GiB (root)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the table's file")
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lora", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.completion_tokens < 1:
        parser.error(f"--completion-tokens must be >= 1, not {args.completion_tokens}")
    if args.cgroup_gib is not None and args.cgroup_gib <= 0:
        parser.error(f"--cgroup-gib must be > 0, not {args.cgroup_gib:g}")
    if args.side:
        result = one_configuration(
            args.models[0],
            args.micro_batch[0],
            bool(args.lora),
            args.steps,
            args.checkpointing[0],
            args.completion_tokens,
        )
        print(json.dumps(result))
        return

    import torch

    from trainer.models import preferred_dtype, resolve_model

    rows = []
    for model, lora, micro_batch, checkpointing in itertools.product(
        args.models, (True, False) if args.full else (True,), args.micro_batch, args.checkpointing
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
            "--checkpointing",
            checkpointing,
            "--completion-tokens",
            str(args.completion_tokens),
        ]
        result = run_side(command, args.max_gib, args.cgroup_gib)
        rows.append((model, "LoRA r=16" if lora else "full", micro_batch, checkpointing, result))
        print(rows[-1], flush=True)
    tokens = GROUP * args.completion_tokens
    limited = f" --cgroup-gib {args.cgroup_gib:g}" if args.cgroup_gib else ""
    other = "" if args.out == RESULTS else f" --out {args.out}"
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
        f"{' --full' if args.full else ''} --steps {args.steps} --max-gib {args.max_gib:g} "
        f"--checkpointing {' '.join(args.checkpointing)} --completion-tokens "
        f"{args.completion_tokens}{limited}{other}`",
        *(
            [f"- each configuration in a memory cgroup of {args.cgroup_gib:g} GiB"]
            if args.cgroup_gib
            else []
        ),
        f"- work per step: {GROUP} rollouts of {PROMPT_TOKENS} prompt + {args.completion_tokens} "
        f"completion tokens ({tokens} completion tokens), m = {CANDIDATES}, {OBJECTIVES} "
        "objectives, KL beta 1e-3, one AdamW step; "
        + (
            "median of the timed steps after one untimed"
            if args.steps
            else "one step, timed (the policy's first: a probe of its activations included)"
        ),
        "",
        "| model | training | micro_batch | checkpointing | passes recomputed | auto's estimate "
        "/ free | s/step | completion tok/s | peak RSS | loaded policy |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model, name, micro_batch, checkpointing, result in rows:
        start = f"| {model} | {name} | {micro_batch} | {checkpointing} |"
        if "stopped_gib" in result:
            lines.append(
                f"{start} - | - | - | - | over {result['stopped_gib']:g} GiB (stopped) | - |"
            )
            continue
        if "killed" in result:
            lines.append(
                f"{start} - | - | - | - | killed by the kernel at the cgroup's limit | - |"
            )
            continue
        weighed = result.get("weighed")
        weighed = f"{weighed[0] / 2**30:.2f} / {weighed[1] / 2**30:.2f} GiB" if weighed else "-"
        lines.append(
            f"{start} {result['recomputed']} | {weighed} | {result['seconds']:.1f} | "
            f"{tokens / result['seconds']:.0f} | {result['peak_mib'] / 1024:.2f} GiB | "
            f"{result['loaded_mib'] / 1024:.2f} GiB |"
        )
    publish(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
