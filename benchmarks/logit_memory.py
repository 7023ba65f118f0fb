"""Peak memory and seconds of the logits of one training pass, by chunk length and by how the
top-p nucleus is sorted (trainer/logprobs.py).

    python benchmarks/logit_memory.py [--positions 2048] [--chunks 2048 1024 512 256]
        [--sort-rows 64 0] [--out benchmarks/results/logit_memory.md]

The work: the completion positions of one pass, `--positions` hidden states of Qwen2.5-Coder-
0.5B's width (896) through its vocabulary projection (151,936 tokens, bf16; random weights, as
only the shapes matter), log-softmax at temperature 0.8, the log-prob of each target, and the
backward pass to the hidden states; the logits `chunk` positions at a time, each chunk recomputed
in the backward pass where there is more than one (as `token_logprobs` does). At top_p 0.95 each
position's nucleus mass is found as well; the random projection's logits are near flat, so every
position's nucleus reaches past the top 1,024 tokens and is sorted in full: the worst case, which
a trained model meets on its uncertain positions. `--sort-rows 0` sorts them all at once (as
before 2026-12-05), N sorts them N positions at a time (NUCLEUS_SORT_ROWS).

Each configuration runs in a fresh process: its peak is the rise of its maximum resident set
over the loaded projection. Seconds: the median of `--repeats` runs. Prints a table and writes it
to benchmarks/results/logit_memory.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "logit_memory.md"
HIDDEN, VOCABULARY, TEMPERATURE = 896, 151_936, 0.8


def one_configuration(positions: int, chunk: int, top_p: float, sort_rows: int, repeats: int):
    """Runs in its own process: the peak's rise in MiB and the median seconds."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from trainer import logprobs

    logprobs.NUCLEUS_SORT_ROWS = sort_rows or positions
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCABULARY, bias=False, dtype=torch.bfloat16)
    head.weight.requires_grad_(False)  # LoRA leaves the projection frozen
    states = torch.randn(positions, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, VOCABULARY, (positions,))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        pieces = []
        for start in range(0, positions, chunk):
            arguments = (head, states[start : start + chunk], targets[start : start + chunk])
            arguments += (TEMPERATURE, top_p)
            if chunk < positions:
                pieces.append(checkpoint(logprobs._chunk_logprobs, *arguments, use_reentrant=False))
            else:
                pieces.append(logprobs._chunk_logprobs(*arguments))
        torch.cat(pieces, dim=1)[0].sum().backward()
        states.grad = None
        seconds.append(time.perf_counter() - started)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return {"peak_mib": peak, "seconds": statistics.median(seconds)}


def measure(positions: int, chunk: int, top_p: float, sort_rows: int, repeats: int) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import logit_memory as m; "
        f"print(json.dumps(m.one_configuration({positions}, {chunk}, {top_p}, {sort_rows}, "
        f"{repeats})))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--chunks", type=int, nargs="+", default=[2048, 1024, 512, 256])
    parser.add_argument("--sort-rows", type=int, nargs="+", default=[64, 0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.positions < 1 or args.repeats < 1 or min(args.chunks) < 1 or min(args.sort_rows) < 0:
        parser.error("--positions, --repeats and --chunks must be >= 1, --sort-rows >= 0")
    rows = []
    configurations = [(chunk, 1.0, 64) for chunk in args.chunks]
    configurations += [(args.positions, 0.95, rows) for rows in args.sort_rows]
    for chunk, top_p, sort_rows in configurations:
        result = measure(args.positions, chunk, top_p, sort_rows, args.repeats)
        sort = "-" if top_p == 1.0 else (f"{sort_rows} at a time" if sort_rows else "all at once")
        if "error" in result:
            cells = [f"failed: {result['error'][:80]}", "-", "-"]
        else:
            entries = min(chunk, args.positions) * VOCABULARY  # of one chunk's logits
            cells = [
                f"{result['peak_mib']:.0f}",
                f"{result['peak_mib'] * 2**20 / entries:.1f}",
                f"{result['seconds']:.2f}",
            ]
        rows.append([str(chunk), f"{top_p:g}", sort, *cells])
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    lines = [
        "# The logits of one training pass: memory and time",
        "",
        f"{datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"torch {_torch_version()}; `python benchmarks/logit_memory.py "
        f"--positions {args.positions} --chunks {' '.join(map(str, args.chunks))} "
        f"--sort-rows {' '.join(map(str, args.sort_rows))} --repeats {args.repeats}`.",
        "",
        f"{args.positions} completion positions through Qwen2.5-Coder-0.5B's vocabulary projection "
        f"({HIDDEN} x {VOCABULARY:,}, bf16, frozen), forward and backward; each configuration "
        "in a fresh process. Peak: the rise of the maximum resident set; bytes an entry: that "
        "peak over a chunk's positions x vocabulary. Seconds: the median of the repeats (a "
        "shared machine: compare ratios).",
        "",
        "| logit chunk | top_p | nucleus sort | peak MiB | bytes an entry | seconds |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    publish(args.out, "\n".join(lines))


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
