"""The campaign against its engine: where a campaign's time goes, and what the engine alone
gives on the same requests.

    python benchmarks/loop_speed.py [--models qwen-coder,smollm2] [--concurrency 1,8]
        [--trained 8] [--tokens 6000] [--sweep 1,2,4,8,16] [--replay-groups 16]
        [--no-cache-engine] [--sequential 8] [--out FILE.md]

Per model, one in-process vLLM engine, loaded once (not on the clock), runs on oscillator1
(compact candidates, G = 4, m = 3, two drafts, max_tokens 160, temperature 1, the grid's
settings):

1. an untrained campaign at each `--concurrency` (groups a batch: one engine call each), up to
   `--tokens` generated tokens, on a fresh SQLite database through `run_campaign`; with
   `--sequential C` also one at concurrency C whose batches are evaluated before the next
   generates (no overlap);
2. the engine alone on the same requests: the stored rollouts of each campaign replayed
   (`LLM.generate` on their prompt token ids, each rollout forced to its stored length, the
   campaign's sampling, log-probs as the campaign asks them), in the campaign's own batches;
   and the first `--replay-groups` groups of the largest-batch campaign replayed at each
   `--sweep` size, to find the engine's best batch on this machine. With `--no-cache-engine`
   the sweep is repeated on a second engine started without prefix caching (vLLM's default is
   on: the statement opens every prompt);
3. a campaign that trains (VPO, LoRA rank 16, lr 1e-4, m = 3, a step on each batch's groups,
   each batch sampled by the newest version) at each `--trained` concurrency, on the same
   engine, last (its versions change the engine's weights).

A campaign's speed is its tokens over the wall of its loop: the sum of the periods its `stages`
events record (harness/observation/time_split.py), from its first selection to its last step, so
neither the sandbox's start nor the seed's evaluation counts; the split by stage comes from the
same events. The engine's speed is the replayed tokens over the wall of the `generate` calls.

Targets (issue 45): an untrained campaign at >= 0.8 of the engine at its own batch; the default
batch within 0.8 of the engine's best; a trained campaign at >= 0.6 of the untrained one at the
same batch. Prints the tables and writes them to benchmarks/results/loop_speed.md. Nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reporting import publish  # noqa: E402

from harness.config.settings import DEFAULT_CONCURRENCY, CampaignSettings, build  # noqa: E402
from harness.evaluation.sandbox import Sandbox  # noqa: E402
from harness.evolution.loop import evolve, open_campaign, prepare, run_campaign  # noqa: E402
from harness.observation.time_split import EVENT, split  # noqa: E402
from harness.store import Store  # noqa: E402
from problems.registry import load as load_problem  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "loop_speed.md"
PROBLEM = "equation_discovery:oscillator1"
# The grid's settings (benchmarks/results/discovery.md), the arms' VPO settings.
CAMPAIGN = {
    "problem": PROBLEM,
    "form": "compact",
    "drafts": 2,
    "group_size": 4,
    "candidates": 3,
    "max_tokens": 160,
    "temperature": 1.0,
    "iterations": 100_000,  # never binds: the token budget ends each run
    "backend": "vllm",
}
TRAINING = {
    "advantage": "vpo",
    "lora": True,
    "lora_rank": 16,
    "learning_rate": 1e-4,
    "kl_beta": 0.0,
    "micro_batch": 4,
    "format_reward": "whole",
    "overlong_buffer": 32,
}
# The campaign's nucleus (`top_p`'s default), which the replay samples with too.
TOP_P = CampaignSettings().top_p
TARGET_CAMPAIGN = 0.8
TARGET_BATCH = 0.8
TARGET_TRAINED = 0.6


@dataclass
class Run:
    """One campaign: its label, batch, tokens, loop wall, split, and stored requests."""

    label: str
    concurrency: int
    trained: bool
    tokens: int
    wall: float
    split: dict[str, Any]
    steps: int = 0
    requests: list[list[tuple[list[int], int]]] = field(default_factory=list)  # per group
    engine: float | None = None  # tok/s of the engine alone on these requests, these batches

    @property
    def speed(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


def campaign(
    generator: Any,
    folder: Path,
    label: str,
    concurrency: int,
    tokens: int,
    *,
    trained: bool = False,
    overlap: bool = True,
) -> Run:
    """One campaign up to `tokens`, on a fresh database, through the loop `vpo run` runs."""
    settings = {**CAMPAIGN, "concurrency": concurrency, "token_budget": tokens}
    if trained:
        settings |= {**TRAINING, "train_every": concurrency}
    config = build(settings | {"model": generator.model})
    problem = load_problem(PROBLEM)
    path = folder / f"{label}.db"
    with Store.open(path) as store:
        if overlap:
            campaign_id = run_campaign(config, store, problem, generator=generator)
        else:  # the same loop, each batch stored before the next generates
            with Sandbox(workers=config.sandbox_workers) as sandbox:
                campaign_id = open_campaign(store, config, problem)
                evolve(prepare(config, store, problem, campaign_id, sandbox), generator, None,
                       overlap=False)  # fmt: skip
        events = [e.payload for e in store.events(campaign_id, EVENT)]
        requests = [
            [(list(group["prompt_token_ids"] or []), t["num_tokens"]) for t in trajectories]
            for group, trajectories in store.iter_trajectory_groups(campaign_id)
            if trajectories
        ]
        steps = len(store.policies(campaign_id))
    total = split(events)
    return Run(
        label,
        concurrency,
        trained,
        total.tokens,
        total.wall,
        total.as_json(),
        steps,
        requests,
    )


def replay(
    engine: Any, groups: list[list[tuple[list[int], int]]], per_call: int, top_p: float = TOP_P
) -> float:
    """The engine alone on these requests, `per_call` groups a `generate` call, sampled as the
    campaign samples (temperature, `top_p`, one log-prob a token, a seed per rollout): tok/s."""
    from vllm import SamplingParams

    prompts, params = [], []
    calls: list[tuple[list[Any], list[Any]]] = []
    for start in range(0, len(groups), per_call):
        prompts, params = [], []
        for group in groups[start : start + per_call]:
            for ids, length in group:
                prompts.append({"prompt_token_ids": ids})
                params.append(
                    SamplingParams(
                        temperature=CAMPAIGN["temperature"],
                        top_p=top_p,
                        max_tokens=max(length, 1),
                        min_tokens=max(length, 1),
                        ignore_eos=True,
                        logprobs=0,
                        seed=len(params),
                    )
                )
        calls.append((prompts, params))
    tokens, wall = 0, 0.0
    for prompts, params in calls:
        started = time.perf_counter()
        outputs = engine.generate(prompts, params, use_tqdm=False)
        wall += time.perf_counter() - started
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    return tokens / wall if wall > 0 else 0.0


def one_model(model: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from harness.llm.vllm_backend import VLLMGenerator

    started = time.perf_counter()
    generator = VLLMGenerator(model)
    load = time.perf_counter() - started
    print(f"{model}: engine up in {load:.0f} s", flush=True)
    runs: list[Run] = []
    sweep: dict[str, dict[int, float]] = {}
    result_beside: dict[int, float] = {}
    try:
        for c in args.concurrency:
            runs.append(campaign(generator, folder, f"{model}-c{c}", c, args.tokens))
            _say(runs[-1])
        for c in args.sequential:
            runs.append(
                campaign(generator, folder, f"{model}-c{c}-seq", c, args.tokens, overlap=False)
            )
            _say(runs[-1])
        for run in runs:
            generator.engine.reset_prefix_cache()  # as a fresh campaign finds it
            run.engine = replay(generator.engine, run.requests, run.concurrency)
            print(f"  engine alone on {run.label}'s requests: {run.engine:.1f} tok/s", flush=True)
        widest = max((r for r in runs if not r.label.endswith("-seq")), key=lambda r: r.concurrency)
        groups = widest.requests[: args.replay_groups]
        sweep["prefix caching on (vLLM's default)"] = _sweep(generator.engine, groups, args.sweep)
        for busy in args.beside:
            first = groups[: widest.concurrency]  # one call
            result_beside[busy] = beside(generator.engine, first, widest.concurrency, busy)
            print(f"  {busy} busy processes beside: {result_beside[busy]:.1f} tok/s", flush=True)
        for c in args.trained:
            runs.append(
                campaign(generator, folder, f"{model}-c{c}-vpo", c, args.tokens, trained=True)
            )
            _say(runs[-1])
    finally:
        generator.close()
    if args.no_cache_engine:  # after the first is closed: two engines do not share a process
        plain = VLLMGenerator(model, enable_prefix_caching=False)
        try:
            sweep["prefix caching off"] = _sweep(plain.engine, groups, args.sweep)
        finally:
            plain.close()
    return {
        "model": model,
        "load": load,
        "runs": runs,
        "sweep": sweep,
        "swept": len(groups),
        "beside": {"batch": widest.concurrency, **result_beside},
    }


def _burn(stop: Any) -> None:
    """One core's worth of single-threaded numpy, as a fit in the sandbox is."""
    import numpy as np

    values = np.random.default_rng(0).random((200, 200))
    while not stop.is_set():
        values = np.sin(values) + 0.1


def beside(engine: Any, groups: list, per_call: int, busy: int) -> float:
    """The engine alone on these requests with `busy` CPU-bound processes running meanwhile
    (evaluation beside generation): tok/s."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    burners = [context.Process(target=_burn, args=(stop,)) for _ in range(busy)]
    for burner in burners:
        burner.start()
    try:
        time.sleep(2.0)  # started and burning
        engine.reset_prefix_cache()
        return replay(engine, groups, per_call)
    finally:
        stop.set()
        for burner in burners:
            burner.join()


def _sweep(engine: Any, groups: list, sizes: list[int]) -> dict[int, float]:
    found = {}
    for size in sizes:
        engine.reset_prefix_cache()
        found[size] = replay(engine, groups, size)
        print(f"  {size} groups a call: {found[size]:.1f} tok/s", flush=True)
    return found


def _say(run: Run) -> None:
    print(
        f"  {run.label}: {run.tokens} tokens in {run.wall:.0f} s of loop, {run.speed:.1f} tok/s; "
        f"{run.split['line']}",
        flush=True,
    )


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    default = DEFAULT_CONCURRENCY["vllm"]
    lines = [
        "# The campaign against its engine: throughput and where the time goes",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "- command: `python benchmarks/loop_speed.py " + " ".join(sys.argv[1:]) + "`",
        f"- environment: {_environment()}",
        f"- {PROBLEM}, compact candidates, G = 4, m = 3, two drafts, max_tokens 160, "
        f"temperature 1; each campaign up to {args.tokens} tokens on a fresh database; the "
        "trained ones: VPO, LoRA rank 16, lr 1e-4, a step on each batch's groups, each batch "
        "sampled by the newest version; one run each",
        "- campaign tok/s: tokens over the wall of its loop (its `stages` events); engine "
        "tok/s: the campaign's stored rollouts replayed through `LLM.generate` in its batches, "
        "each forced to its stored length",
        "",
    ]
    for result in results:
        lines += _model_tables(result, default)
    return "\n".join(lines) + "\n"


def _model_tables(result: dict[str, Any], default: int) -> list[str]:
    model, runs = result["model"], result["runs"]
    lines = [
        f"## {model} (engine started in {result['load']:.0f} s, not on the clock)",
        "",
        "| campaign | groups a batch | tokens | loop s | campaign tok/s | engine tok/s, same "
        "batches | campaign / engine | generating | training + publishing | waiting | "
        "evaluating (beside) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    untrained = {r.concurrency: r for r in runs if not r.trained and not r.label.endswith("-seq")}
    for run in runs:
        loop, beside = run.split["loop"], run.split["beside"]

        def share(stages: dict[str, Any], *names: str) -> str:
            total = sum(stages.get(n, {}).get("share", 0.0) for n in names)
            cores = [stages[n]["cores"] for n in names if stages.get(n, {}).get("cores")]
            busy = f" ({cores[0]:.1f} cores)" if len(cores) == 1 else ""
            return f"{total:.0%}{busy}"

        kind = "trained (VPO)" if run.trained else "untrained"
        if run.label.endswith("-seq"):
            kind += ", sequential"
        ratio = f"**{run.speed / run.engine:.2f}**" if run.engine else "-"
        lines.append(
            f"| {kind} | {run.concurrency} | {run.tokens} | {run.wall:.0f} | {run.speed:.1f} | "
            f"{f'{run.engine:.1f}' if run.engine else '-'} | {ratio} | "
            f"{share(loop, 'generating')} | {share(loop, 'training', 'publishing')} | "
            f"{share(loop, 'waiting')} | {share(beside, 'evaluating')} |"
        )
    lines.append("")
    for name, found in result["sweep"].items():
        best = max(found, key=found.get)
        lines += [
            f"The engine alone on the first {result['swept']} groups of the widest campaign, "
            f"{name}:",
            "",
            "| groups a call | " + " | ".join(str(k) for k in found) + " |",
            "|---|" + "---:|" * len(found),
            "| tok/s | "
            + " | ".join(f"**{v:.1f}**" if k == best else f"{v:.1f}" for k, v in found.items())
            + " |",  # fmt: skip
            "",
        ]
    crowd = {k: v for k, v in result.get("beside", {}).items() if k != "batch"}
    if crowd:
        lines += [
            f"The engine alone on the first {result['beside']['batch']} of them in one call, with "
            "CPU-bound processes beside it (single-threaded numpy, as a fit in the sandbox):",
            "",
            "| processes beside | " + " | ".join(str(k) for k in crowd) + " |",
            "|---|" + "---:|" * len(crowd),
            "| tok/s | " + " | ".join(f"{v:.1f}" for v in crowd.values()) + " |",
            "",
        ]
    lines += _verdicts(result, untrained, default)
    return lines


def _verdicts(result: dict[str, Any], untrained: dict[int, Run], default: int) -> list[str]:
    lines = []
    base = untrained.get(default)
    if base is not None and base.engine:
        ratio = base.speed / base.engine
        lines.append(
            f"- untrained campaign at the default batch ({default}) at {ratio:.2f} of the engine "
            f"at that batch (target >= {TARGET_CAMPAIGN}): "
            f"{'met' if ratio >= TARGET_CAMPAIGN else 'missed'}"
        )
    found = next(iter(result["sweep"].values()), {})
    if default in found:
        best = max(found.values())
        ratio = found[default] / best
        lines.append(
            f"- the engine at the default batch ({default}) at {ratio:.2f} of its best on this "
            f"machine, at {max(found, key=found.get)} groups a call (target >= {TARGET_BATCH}): "
            f"{'met' if ratio >= TARGET_BATCH else 'missed'}"
        )
    for run in result["runs"]:
        twin = untrained.get(run.concurrency)
        if run.trained and twin is not None and twin.speed:
            ratio = run.speed / twin.speed
            lines.append(
                f"- trained campaign at batch {run.concurrency} ({run.steps} steps) at "
                f"{ratio:.2f} of the untrained one (target >= {TARGET_TRAINED}): "
                f"{'met' if ratio >= TARGET_TRAINED else 'missed'}"
            )
    lines.append("")
    lines.append(
        "Where each campaign's loop spent its time (shares of its wall; cores in brackets):"
    )
    lines.append("")
    for run in result["runs"]:
        lines.append(f"- {run.label}: {run.split['line']}")
    lines.append("")
    return lines


def _environment() -> str:
    import torch

    shown = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "VLLM_CPU_KVCACHE_SPACE")
    found = [f"{name}={os.environ[name]}" for name in shown if name in os.environ]
    return ", ".join([f"torch {torch.__version__}", *found])


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen-coder,smollm2")
    parser.add_argument("--concurrency", type=_numbers, default=[1, 8], help="untrained batches")
    parser.add_argument("--trained", type=_numbers, default=[8], help="trained batches")
    parser.add_argument("--sequential", type=_numbers, default=[], help="batches, no overlap")
    parser.add_argument("--tokens", type=int, default=6000, help="tokens per campaign")
    parser.add_argument("--sweep", type=_numbers, default=[1, 2, 4, 8, 16])
    parser.add_argument("--replay-groups", type=int, default=16)
    parser.add_argument("--no-cache-engine", action="store_true")
    parser.add_argument(
        "--beside", type=_numbers, default=[0, 1], help="busy processes beside a replay"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if (
        not args.concurrency
        or min(args.concurrency + args.trained + args.sweep) < 1
        or (args.beside and min(args.beside) < 0)
    ):
        parser.error("--concurrency, --trained and --sweep take whole numbers >= 1")
    results = []
    with tempfile.TemporaryDirectory(prefix="vpo-loop-speed-") as folder:
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            results.append(one_model(model, args, Path(folder)))
    publish(args.out, report(results, args))


if __name__ == "__main__":
    main()
