"""Per-evaluation overhead of the sandbox, beside what a fresh interpreter per evaluation costs.

    python benchmarks/sandbox_overhead.py [--runs 200] [--cold-runs 30]

Rows, all measured in this one run on this machine:
- sandbox: `Sandbox(workers=1).run` of `def f(): return 1`, sequentially, after a warm-up; this
  includes the fork, every namespace, the rlimits, the uid switch and the round trip.
- python -c 'import numpy': a fresh interpreter importing numpy, what a harness that starts
  one process per evaluation pays before the candidate even runs.
- python -c pass: a bare interpreter start.

Prints a table and writes it to benchmarks/results/sandbox_overhead.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.evaluation.sandbox import Sandbox  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "sandbox_overhead.md"
TRIVIAL = "def f():\n    return 1\n"


def timed(action: Callable[[], object], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - started)
    return seconds


def p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="sandbox evaluations (default 200)")
    parser.add_argument(
        "--cold-runs", type=int, default=30, help="interpreter starts per row (default 30)"
    )
    args = parser.parse_args()

    with Sandbox(workers=1) as sandbox:
        first = sandbox.run(TRIVIAL, "f")
        assert first.status == "ok" and first.value == 1, first
        timed(lambda: sandbox.run(TRIVIAL, "f"), 20)  # warm-up: page cache, allocator
        sandbox_seconds = timed(lambda: sandbox.run(TRIVIAL, "f"), args.runs)
    # the same environment the zygote gets, so only the start-up differs
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1"}
    rows = [("sandbox (warm fork server, full isolation)", sandbox_seconds)]
    for label, code in (("python -c 'import numpy'", "import numpy"), ("python -c pass", "pass")):
        command = [sys.executable, "-I", "-c", code]
        run = lambda command=command: subprocess.run(command, env=env, check=True)  # noqa: E731
        rows.append((label, timed(run, args.cold_runs)))

    base = statistics.median(sandbox_seconds)
    lines = [
        "| per evaluation | runs | median ms | p90 ms | x sandbox |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, samples in rows:
        median = statistics.median(samples)
        lines.append(
            f"| {label} | {len(samples)} | {median * 1e3:.1f} | {p90(samples) * 1e3:.1f}"
            f" | {median / base:.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    print(f"isolation: {', '.join(first.isolation)}; warnings: {list(first.warnings) or 'none'}")

    command = "python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/sandbox_overhead.py", *sys.argv[1:]]
    )
    report = f"""# Sandbox overhead per evaluation

- date: {datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {platform.machine()},
  Linux {platform.release()}, Python {platform.python_version()}, running as
  {"root" if os.geteuid() == 0 else "a user without privileges"}
- command: `{command}`
- candidate: `def f(): return 1`, one worker, sequential

{table}

Isolation applied to each candidate: {", ".join(first.isolation)}.
Warnings: {"; ".join(first.warnings) or "none"}.
"""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
