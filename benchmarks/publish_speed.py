"""How a new policy version reaches the campaign's in-process vLLM engine: from a merged copy
on disk (before) against from the trainer's memory (now).

    python benchmarks/publish_speed.py [--model smollm2 qwen-coder] [--repeats 3]

For each embedded model, in a process of its own: the policy with a LoRA adapter (r = 16, all
linear layers, B drawn at random so that the merge changes every adapted weight) and
`VLLMGenerator` in process, as `vpo run --backend vllm` runs them. Each repeat saves a version
(`Policy.save`: adapter, Adam moments, tokenizer; the same in both) and then publishes it:

- merged copy: what publishing did before: the adapter merged into whole weights in the
  compute dtype, written to `step-NNNNNN-merged`, read by the engine (`reload_weights` from the
  folder), then deleted;
- from memory: `VLLMGenerator.load_weights` with the trainer's policy: the merged tensors go
  one by one from the trainer's memory into the engine's (`reload_weights` with a weights
  iterator); nothing is written.

Reports the median seconds of the publish step and the bytes each version wrote (the saved
version, plus the merged copy before). Prints a table and writes it to
benchmarks/results/publish_speed.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "publish_speed.md"
METHODS = ("merged copy", "from memory")


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def measure(model: str, repeats: int) -> dict:
    """One model's medians, in this process."""
    import torch

    from harness.learning.publish import SavedVersion, merged_folder, remove_folder
    from harness.llm.vllm_backend import VLLMGenerator
    from trainer.policy import Policy, PolicyConfig

    torch.manual_seed(0)
    policy = Policy.load(model, PolicyConfig(lora=True, lora_rank=16, reference=False))
    engine = VLLMGenerator(model, max_model_len=2048, kv_cache_gib=1.0)
    seconds: dict[str, list[float]] = {method: [] for method in METHODS}
    written: dict[str, list[int]] = {method: [] for method in METHODS}
    with tempfile.TemporaryDirectory() as root:
        step = 0
        for _ in range(repeats):
            for method in METHODS:
                step += 1
                for module in policy.model.modules():
                    if hasattr(module, "lora_B"):
                        torch.nn.init.normal_(module.lora_B["default"].weight, std=0.02)
                folder = policy.save(Path(root) / f"step-{step:06d}")
                version_bytes = folder_bytes(folder)
                start = time.perf_counter()
                if method == "merged copy":
                    merged = policy.save_merged(merged_folder(folder), dtype=policy.autocast_dtype)
                    merged_bytes = folder_bytes(merged)
                    engine.reload_weights(str(merged))
                    remove_folder(merged)
                else:
                    merged_bytes = 0
                    engine.load_weights(SavedVersion(folder, step, "bench", policy))
                seconds[method].append(time.perf_counter() - start)
                written[method].append(version_bytes + merged_bytes)
                remove_folder(folder)
    engine.close()
    return {
        "dtype": str(engine_dtype(policy)),
        "parameters": policy.parameter_count,
        "seconds": {m: statistics.median(v) for m, v in seconds.items()},
        "bytes": {m: statistics.median(v) for m, v in written.items()},
    }


def engine_dtype(policy: object) -> str:
    return str(policy.autocast_dtype).removeprefix("torch.")  # type: ignore[attr-defined]


def report(results: dict[str, dict], command: str, repeats: int) -> str:
    any_result = next(iter(results.values()))
    lines = [
        "# A policy version into the in-process vLLM engine: merged copy on disk or from memory",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, "
        f"engine dtype {any_result['dtype']}",
        f"- command: `{command}`",
        f"- LoRA r = 16 on all linear layers; publish s = the median over {repeats} versions "
        "of the time from a saved version to the engine sampling from it; written = the "
        "bytes the version put on disk (the saved version: adapter, Adam moments, tokenizer; "
        "plus the merged copy before)",
        "",
        "| model | merged copy s | from memory s | speed-up | merged copy written | "
        "from memory written |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for model, result in results.items():
        s, b = result["seconds"], result["bytes"]
        lines.append(
            f"| {model} | {s['merged copy']:.2f} | {s['from memory']:.2f} | "
            f"{s['merged copy'] / s['from memory']:.1f}x | {b['merged copy'] / 1e6:,.0f} MB | "
            f"{b['from memory'] / 1e6:,.0f} MB |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2", "qwen-coder"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure this model
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, not {args.repeats}")
    if args.one:
        print(json.dumps(measure(args.one, args.repeats)))
        return
    results = {}
    for model in args.model:
        child = subprocess.run(
            [sys.executable, __file__, "--one", model, "--repeats", str(args.repeats)],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            sys.exit(f"{model}: the measuring process failed: {child.stderr.strip()[-2000:]}")
        results[model] = json.loads(child.stdout.strip().splitlines()[-1])
    command = "python benchmarks/publish_speed.py " + " ".join(sys.argv[1:])
    publish(args.out, report(results, command.strip(), args.repeats))


if __name__ == "__main__":
    main()
