"""Long run: a campaign at accelerated pace, watched for leaks.

    python benchmarks/long_run.py [--minutes 30] [--train-every 4]

A random 2-layer Llama with SmolLM2's tokenizer (no download; its output is mostly garbage,
which exercises the parser and the failure paths as much as the happy one), short generations,
a 1 s time limit per call and in-campaign VPO training, for `--minutes` of wall clock. Every
minute it samples the campaign process's resident memory, the resident memory of its whole
process tree (the sandbox's zygote and workers included) and its open file descriptors, then
compares the end with the first sample past a five-minute warm-up and two training steps.

Prints a table and writes it to benchmarks/results/long_run.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

from harness.cli.flags import add_protocol  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "long_run.md"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc/PID/task/*/children."""
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                stack += [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    add_protocol(parser, {"train_every": 4})
    parser.add_argument("--warm-up", type=float, default=5.0, help="minutes")
    args = parser.parse_args()

    from harness.config.settings import build
    from harness.evolution.loop import run_campaign
    from harness.store import Store
    from problems.circle_packing import CirclePacking
    from trainer.models import save_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="vpo-long-run-"))
    model = save_tiny_llama(work / "tiny")
    config = build(
        {
            "problem": "circle_packing",
            "model": model,
            "group_size": 4,
            "candidates": 2,
            "max_tokens": 64,
            "iterations": 10**7,
            "time_limit": 1.0,
            "train_every": args.train_every,
            "learning_rate": 1e-4,
            "workers": 2,
        }
    )
    store = Store.open(work / "long.db")
    me = os.getpid()
    started = time.monotonic()
    samples: list[tuple[float, int, float, float, int]] = []
    latest = {"iteration": 0}
    stop = threading.Event()

    def progress(iteration: int, _progress: object) -> None:
        latest["iteration"] = iteration
        if stop.is_set():
            raise KeyboardInterrupt  # ends the campaign as a user's Ctrl-C would

    def sampler() -> None:
        while not stop.is_set():
            minutes = (time.monotonic() - started) / 60
            processes = tree(me)
            samples.append(
                (
                    minutes,
                    latest["iteration"],
                    rss_mb(me),
                    sum(rss_mb(p) for p in processes),
                    len(os.listdir("/proc/self/fd")),
                )
            )
            if minutes >= args.minutes:
                stop.set()
                return
            stop.wait(60)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        run_campaign(config, store, CirclePacking(), on_progress=progress)
    except KeyboardInterrupt:
        pass
    thread.join()

    # Warm once the optimiser holds its state: past the warm-up and two training steps in.
    trained = 2 * args.train_every
    warm = next((s for s in samples if s[0] >= args.warm_up and s[1] >= trained), samples[-1])
    end = samples[-1]
    after = [s for s in samples if s[0] >= warm[0]]

    def span(column: int) -> str:
        return f"{min(s[column] for s in after):.0f}-{max(s[column] for s in after):.0f}"

    rows = "\n".join(f"| {m:5.1f} | {i} | {r:.0f} | {t:.0f} | {f} |" for m, i, r, t, f in samples)
    counts = store.counts(store.get_campaign("circle_packing").id)
    report = f"""# Long run: memory and open files over time

`python benchmarks/long_run.py --minutes {args.minutes:g} --train-every {args.train_every}`,
{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, Python
{platform.python_version()}. A random 2-layer Llama (hidden 64) with SmolLM2's tokenizer,
G = 4, m = 2, 64 tokens, 1 s per call, a VPO step every {args.train_every} groups, circle_packing.
{end[1]} iterations; the database holds {counts}.

| minute | iterations | campaign RSS (MB) | process tree RSS (MB) | open fds |
|---:|---:|---:|---:|---:|
{rows}

Warm from minute {warm[0]:.1f} (the first sample past {args.warm_up:g} minutes with
{trained} groups recorded, so two training steps and the optimiser's state in) to the end
(minute {end[0]:.1f}), {len(after)} samples: campaign RSS {warm[2]:.0f} -> {end[2]:.0f} MB
({end[2] - warm[2]:+.0f} MB; {span(2)}), process tree {warm[3]:.0f} -> {end[3]:.0f} MB
({end[3] - warm[3]:+.0f} MB; {span(3)}), open file descriptors {warm[4]} -> {end[4]}
({end[4] - warm[4]:+d}; {span(4)}).
A sample taken during a training step includes its activations and gradients, so single
samples above the rest are expected; a leak shows as a rise that stays.
"""
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
