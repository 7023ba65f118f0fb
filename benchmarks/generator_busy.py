"""Generator busy fraction during a real campaign with the embedded model.

    python benchmarks/generator_busy.py [--problem circle_packing] [--iterations 6]
        [--max-tokens 384] [--group-size 4] [--backend transformers] [--model smollm2]

Runs the same campaign twice on fresh SQLite databases with one generator loaded once (model
loading is not on the clock):

- overlapped: `campaign.evolve` as `vpo run` runs it; candidates of iteration k are evaluated
  and stored on a background thread while iteration k+1 generates;
- sequential: the same loop, but each iteration is evaluated and stored before the next one
  generates, as a sequential harness does (`evolve(..., overlap=False)`).

Busy fraction = seconds inside `generator.generate` / wall seconds of the whole loop (from the
first selection to the last stored group). The target for `vpo run` is >= 90%. Both runs use
the same seed, so they see the same first prompt; later prompts differ with what was found.

Prints a table and writes it to benchmarks/results/generator_busy.md. Nothing else should run
on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

from harness.cli.flags import add_protocol, given_settings  # noqa: E402
from harness.config.settings import CampaignSettings, build  # noqa: E402
from harness.evaluation.sandbox import Sandbox  # noqa: E402
from harness.evolution.loop import evolve, open_campaign, prepare  # noqa: E402
from harness.llm import make_generator  # noqa: E402
from harness.store import Store  # noqa: E402
from problems.registry import load as load_problem  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "generator_busy.md"
TARGET = 0.90
# The campaign settings measured (flags as `vpo run` takes them), this benchmark's values.
PROTOCOL = {
    "iterations": 6, "max_tokens": 384, "group_size": 4, "backend": "transformers",
    "model": "smollm2",
}  # fmt: skip


def run(config: CampaignSettings, generator, folder: Path, overlap: bool) -> dict[str, float]:
    problem = load_problem(config.problem)
    path = folder / f"{'overlapped' if overlap else 'sequential'}.db"
    with Store.open(path) as store, Sandbox(workers=config.sandbox_workers) as sandbox:
        campaign_id = open_campaign(store, config, problem)
        campaign = prepare(config, store, problem, campaign_id, sandbox)
        started = time.perf_counter()
        evolve(campaign, generator, None, overlap=overlap)
        wall = time.perf_counter() - started
        summary = store.summary(campaign_id)
    progress = campaign.progress
    return {
        "wall": wall,
        "generate": progress.generate_seconds,
        "busy": progress.generate_seconds / wall,
        "tokens": progress.tokens,
        "evaluations": progress.evaluations,
        "valid": summary.valid_programs - 1,  # not the seed
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="circle_packing")
    add_protocol(parser, PROTOCOL)
    args = parser.parse_args()
    config = build({"problem": args.problem, **given_settings(args, PROTOCOL)}, where="the flags")
    started = time.perf_counter()
    generator = make_generator(args.backend, args.model)
    load = time.perf_counter() - started
    print(f"{args.backend} {args.model} loaded in {load:.1f} s", flush=True)
    rows = {}
    try:
        with tempfile.TemporaryDirectory(prefix="vpo-busy-") as folder:
            for overlap in (True, False):
                name = "overlapped (vpo run)" if overlap else "sequential"
                rows[name] = run(config, generator, Path(folder), overlap)
                r = rows[name]
                print(
                    f"{name:22} busy {100 * r['busy']:5.1f}%  wall {r['wall']:6.1f} s  "
                    f"{r['tokens'] / r['wall']:6.1f} tok/s",
                    flush=True,
                )
    finally:
        generator.close()

    ours = rows["overlapped (vpo run)"]["busy"]
    verdict = "meets" if ours >= TARGET else "misses"
    lines = [
        "# Generator busy fraction during a campaign",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "- command: `python benchmarks/generator_busy.py " + " ".join(sys.argv[1:]) + "`",
        f"- {args.problem}, {args.backend} backend, model {args.model} (loaded once, "
        f"{load:.0f} s, not on the clock), {args.iterations} iterations of G = "
        f"{args.group_size} rollouts x m = {config.candidates} candidates, max_tokens "
        f"{args.max_tokens}, {config.sandbox_workers} sandbox workers",
        "- busy = seconds in `generator.generate` / wall seconds of the loop; one run each, "
        "one after the other in the same process",
        "",
        "| loop | busy | wall s | generating s | tokens | tok/s over the wall | "
        "evaluations | valid programs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | **{100 * r['busy']:.1f}%** | {r['wall']:.1f} | {r['generate']:.1f} | "
            f"{r['tokens']:.0f} | {r['tokens'] / r['wall']:.1f} | {r['evaluations']:.0f} | "
            f"{r['valid']:.0f} |"
        )
    lines += [
        "",
        f"Target: busy >= {100 * TARGET:.0f}% for `vpo run`; this run {verdict} it. On a "
        "machine where generation and the sandbox share the same cores, evaluation running "
        "beside generation also slows generation down: compare tok/s over the wall too.",
    ]
    report = "\n".join(lines) + "\n"
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
