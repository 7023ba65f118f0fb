"""Generation speed of each backend with the embedded SmolLM2, at n=4 and n=16 per prompt.

    python benchmarks/generation_speed.py [--backends transformers,vllm,openai]
                                          [--max-tokens 128] [--prompts 1] [--repeats 2]
                                          [--top-p 0.95] [--top-k 0]

Each row is the fastest of `repeats` `generate(prompts, n, sampling)` calls after a warm-up
call, as the campaign makes them (one prompt, a group of n rollouts): completion tokens over
wall time. The prompt is
campaign-like, a program to improve (259 tokens). Completions that stop early count only the
tokens they had. "openai" starts a `vllm serve` on 127.0.0.1 and talks to it over HTTP.

Prints a table and writes it to benchmarks/results/generation_speed.md. Nothing else should run
on the machine meanwhile: on 2 cores, another busy process halves these numbers or worse.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.llm import Generator, Sampling, make_generator  # noqa: E402
from trainer.models import EMBEDDED, preferred_dtype, resolve_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "generation_speed.md"
PROGRAM = '''import numpy as np


def pack(n: int = 26) -> np.ndarray:
    """Centres and radii of n disjoint circles inside the unit square, as an (n, 3) array."""
    side = int(np.ceil(np.sqrt(n)))
    step = 1.0 / side
    circles = []
    for row in range(side):
        for column in range(side):
            if len(circles) == n:
                break
            x = (column + 0.5) * step
            y = (row + 0.5) * step
            circles.append((x, y, 0.5 * step))
    return np.array(circles)
'''
PROMPT = [
    {
        "role": "system",
        "content": "You improve Python programs. Answer with the full improved program only.",
    },
    {
        "role": "user",
        "content": "Maximise the sum of radii of 26 disjoint circles in the unit square. "
        "The current program scores 0.5 of the best known value; its code:\n\n"
        f"```python\n{PROGRAM}```\n\n"
        "Earlier drafts tried a hexagonal grid (0.61) and shrinking the corners (0.55). "
        "Write one better program, different from the drafts.",
    },
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(folder: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    dtype = str(preferred_dtype("cuda" if torch.cuda.is_available() else "cpu")).split(".")[-1]
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", folder, "--served-model-name", EMBEDDED,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
        "--max-model-len", "4096", "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if not torch.cuda.is_available():
        command += ["--enforce-eager", "--kv-cache-memory-bytes", str(4 << 30)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    with open(log, "wb") as output:
        server = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return server, f"http://127.0.0.1:{port}/v1"


def wait_ready(server: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}/models").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit("vllm serve was not ready in 600 s")


def measure(
    generator: Generator, n: int, prompts: int, sampling: Sampling, repeats: int
) -> tuple[int, float, int]:
    """(completion tokens, seconds, completions that stopped before max_tokens) of the fastest
    of `repeats` calls: on a shared machine the slower ones measure the neighbours."""
    generator.generate([PROMPT], 2, Sampling(max_tokens=8, seed=0))  # warm-up
    best: tuple[int, float, int] | None = None
    for _ in range(repeats):
        started = time.perf_counter()
        groups = generator.generate([PROMPT] * prompts, n, sampling)
        seconds = time.perf_counter() - started
        completions = [c for group in groups for c in group]
        tokens = sum(len(c.token_ids) or len(c.logprobs or ()) for c in completions)
        stopped = sum(c.finish_reason == "stop" for c in completions)
        if best is None or tokens / seconds > best[0] / best[1]:
            best = (tokens, seconds, stopped)
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="transformers,vllm,openai")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=1, help="prompts per call (default 1)")
    parser.add_argument("--repeats", type=int, default=2, help="calls per row; the fastest counts")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus (default 0.95)")
    # top_k 40 with --top-p 1.0: the cut vLLM's CPU sampler makes without sorting the vocabulary
    parser.add_argument("--top-k", type=int, default=0, help="top-k cut (default 0: off)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    sampling = Sampling(
        temperature=0.8, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens, seed=1
    )
    folder = resolve_model(EMBEDDED)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = str(preferred_dtype(device)).split(".")[-1]

    rows: list[tuple[str, int, int, int, float, int, float]] = []
    notes: list[str] = []
    if device == "cpu" and dtype == "float32":
        notes.append(
            "This CPU has no native bf16 (no AVX-512 BF16 or AMX): torch emulates it, a bf16 "
            "matmul runs ~200x slower than fp32, so every backend runs fp32 here."
        )
    for backend in backends:
        server = None
        started = time.perf_counter()
        if backend == "openai":
            log = Path(tempfile.mkdtemp(prefix="vpo-bench-")) / "server.log"
            server, base_url = start_server(folder, log)
            wait_ready(server, base_url, log)
            generator = make_generator("openai", EMBEDDED, base_url=base_url, api_key_env="")
        else:
            generator = make_generator(backend, EMBEDDED)
        startup = time.perf_counter() - started
        try:
            for n in (4, 16):
                tokens, seconds, stopped = measure(
                    generator, n, args.prompts, sampling, args.repeats
                )
                rows.append((backend, n, args.prompts, tokens, seconds, stopped, startup))
                print(
                    f"{backend:12} n={n:<3} {tokens:6d} tokens {seconds:7.1f} s "
                    f"{tokens / seconds:7.1f} tok/s  (start {startup:.0f} s)",
                    flush=True,
                )
        finally:
            generator.close()
            if server is not None:
                os.killpg(server.pid, 15)
                server.wait(timeout=60)

    cpu = platform.processor() or platform.machine()
    lines = [
        "# Generation speed with SmolLM2-135M-Instruct (embedded)",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs, {cpu}, torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, cuda: {torch.cuda.is_available()}",
        f"- dtype: {dtype} (bf16 only where the hardware multiplies it natively)",
        f"- command: `python benchmarks/generation_speed.py --max-tokens {args.max_tokens} "
        f"--prompts {args.prompts} --repeats {args.repeats} --top-p {args.top_p:g} "
        f"--top-k {args.top_k}`",
        f"- one campaign-like prompt (259 tokens) per call, temperature 0.8, top_p "
        f"{args.top_p:g}, top_k {args.top_k or 'off'}, after a warm-up call; tok/s = "
        "completion tokens / wall seconds of the fastest of the calls",
        "",
        "| backend | n | prompts | tokens | seconds | tok/s | stopped early | start s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, n, prompts, tokens, seconds, stopped, startup in rows:
        lines.append(
            f"| {backend} | {n} | {prompts} | {tokens} | {seconds:.1f} | "
            f"{tokens / seconds:.1f} | {stopped} | {startup:.0f} |"
        )
    lines += ["", *notes]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
