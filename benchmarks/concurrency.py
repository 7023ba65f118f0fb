"""Tokens/s over the wall of `vpo run` on the embedded model: the old default (transformers,
one iteration at a time) against vLLM with 1, 4 and 8 iterations in flight.

    python benchmarks/concurrency.py [--iterations 16] [--group-size 8] [--max-tokens 128]
        [--runs transformers:1,vllm:1,vllm:4,vllm:8] [--model smollm2]

Each run is a whole `vpo run circle_packing` in its own process on a fresh SQLite database,
timed from start to exit: model loading, the seed's evaluation and every iteration's
evaluation and storage are on the clock, as for a user. Same seed, problem, G, m and
max_tokens for every run; tokens are those the database recorded. The ratio is against the
first run. Prints a table and writes it to benchmarks/results/concurrency.md; nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

from harness.cli.flags import add_protocol, protocol_flags  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "concurrency.md"
DEFAULT_RUNS = "transformers:1,vllm:1,vllm:4,vllm:8"
# The campaign settings of every run (flags as `vpo run` takes them), this benchmark's values.
PROTOCOL = {"iterations": 16, "group_size": 8, "max_tokens": 128, "model": "smollm2", "seed": 0}


def run(backend: str, concurrency: int, args: argparse.Namespace, folder: Path) -> dict:
    db = folder / f"{backend}-{concurrency}.db"
    command = [
        sys.executable, "-m", "harness.cli", "run", "circle_packing", "--db", str(db),
        "--backend", backend, "--concurrency", str(concurrency),
        *protocol_flags(args, PROTOCOL),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{backend} x{concurrency} failed: {done.stderr.strip()[-500:]}")
    tokens = int(re.search(r"tokens: (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    iterations = int(re.search(r"iterations: (\d+)", done.stdout).group(1))  # type: ignore[union-attr]
    return {"wall": wall, "tokens": tokens, "iterations": iterations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol(parser, PROTOCOL)
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="backend:concurrency, ...")
    args = parser.parse_args()
    plan = [(b, int(c)) for b, c in (item.split(":") for item in args.runs.split(","))]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vpo-concurrency-") as folder:
        for backend, concurrency in plan:
            r = run(backend, concurrency, args, Path(folder))
            rows.append((backend, concurrency, r))
            print(
                f"{backend} x{concurrency}: {r['wall']:.1f} s, {r['tokens']} tokens, "
                f"{r['tokens'] / r['wall']:.1f} tok/s",
                flush=True,
            )
    base = rows[0][2]["tokens"] / rows[0][2]["wall"]
    lines = [
        "# `vpo run` throughput: iterations in flight, by backend",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "- command: `python benchmarks/concurrency.py " + " ".join(sys.argv[1:]) + "`",
        f"- circle_packing on {args.model}, {args.iterations} iterations of G = "
        f"{args.group_size} rollouts, max_tokens {args.max_tokens}, seed {args.seed}; each "
        "run a whole "
        "`vpo run` process on a fresh database, timed from start to exit (model loading "
        "and evaluation included); one run each",
        "",
        "| backend | iterations in flight | wall s | tokens | tok/s over the wall | "
        "ratio | iterations/hour |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, concurrency, r in rows:
        rate = r["tokens"] / r["wall"]
        lines.append(
            f"| {backend} | {concurrency} | {r['wall']:.1f} | {r['tokens']} | {rate:.1f} | "
            f"**{rate / base:.2f}x** | {3600 * r['iterations'] / r['wall']:.0f} |"
        )
    publish(RESULTS, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
