"""benchmarks/demo_seeds.py run for real on a tiny campaign: its row is what the database holds,
a run that fails is a row with its reason, and kept runs make the same report again."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "demo_seeds.py"
_SPEC = importlib.util.spec_from_file_location("benchmark_demo_seeds", SCRIPT)
assert _SPEC is not None and _SPEC.loader is not None
demo_seeds = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = demo_seeds  # its dataclasses look their module up
_SPEC.loader.exec_module(demo_seeds)

# The demo's shape, shrunk: one iteration of two rollouts, one LoRA step, the transformers
# backend (no engine to start, the generator samples from the trainer's weights).
TINY = """\
problem = "equation_discovery:oscillator1"
iterations = 1
[model]
backend = "transformers"
[sampling]
group_size = 2
candidates = 2
max_tokens = 16
form = "compact"
[evolution]
drafts = 0
[evaluation]
workers = 1
[training]
train_every = 1
lora = true
learning_rate = 1e-4
kl_beta = 0.0
micro_batch = 2
"""


def benchmark(*flags: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], cwd=cwd, capture_output=True, text=True, timeout=240
    )


def row(report: str, seed: int) -> dict[str, str]:
    """The main table's row of `seed`, by its header's names."""
    lines = report.splitlines()
    header = next(line for line in lines if line.startswith("| seed | found |"))
    names = [name.strip() for name in header.strip("|").split("|")]
    start = lines.index(header)
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [value.strip() for value in line.strip("|").split("|")]
        if cells[0] == str(seed):
            return dict(zip(names, cells, strict=True))
    raise AssertionError(f"no row of seed {seed} in:\n{report}")


@pytest.mark.slow
def test_a_row_is_what_the_database_holds_and_a_failed_run_is_a_row(
    tiny_model: str, tmp_path: Path
) -> None:
    config, kept, out = tmp_path / "tiny.toml", tmp_path / "runs", tmp_path / "demo_seeds.md"
    config.write_text(TINY)
    done = benchmark(
        "--config", str(config), "--seeds", "0", "--keep", "runs", "--out", str(out),
        "--model", tiny_model,  # a `vpo run` flag: passed through
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seed0 = row(out.read_text(), 0)

    with closing(sqlite3.connect(kept / "seed0.db")) as db:
        tokens, rollouts = db.execute("SELECT SUM(num_tokens), COUNT(*) FROM trajectory").fetchone()
        (seed_score,) = db.execute(
            "SELECT value FROM score JOIN program ON program.id = program_id "
            "WHERE objective = 'fit_id' AND origin = 'seed' ORDER BY program.id LIMIT 1"
        ).fetchone()
        (best,) = db.execute(
            "SELECT MAX(value) FROM score JOIN program ON program.id = program_id "
            "WHERE objective = 'fit_id' AND status = 'ok'"
        ).fetchone()
        rates = [r for (r,) in db.execute("SELECT parse_rate FROM rollout_group") if r is not None]
    assert rollouts == 2 and int(seed0["tokens"]) == tokens > 0
    assert float(seed0["seed's fit_id"]) == pytest.approx(seed_score, abs=5e-5)
    assert float(seed0["best fit_id"]) == pytest.approx(best, abs=5e-5)
    assert float(seed0["parse rate"]) == pytest.approx(sum(rates) / len(rates), abs=5e-3)
    assert seed0["found"] == ("yes" if best >= seed_score + 0.01 else "no")

    # The memory of the run's tree was watched: a peak, above what it held once loaded.
    summary = json.loads((kept / "seed0.json").read_text())
    memory = summary["memory"]
    assert memory["samples"] > 1 and memory["peak"] >= memory["loaded"] > 50e6
    assert float(seed0["peak memory GB"]) == pytest.approx(memory["peak"] / 1e9, abs=0.01)
    assert summary["backend"] == "transformers"
    weights, how = summary["parts"]["trainer's weights"]
    parameters, adapter, linear = demo_seeds.parameter_counts(tiny_model, 16)
    from trainer.models import preferred_dtype

    frozen = preferred_dtype("cpu").itemsize  # a LoRA trainer's frozen linear layers
    assert weights == (parameters + adapter) * 4 - linear * (4 - frozen)
    assert how.startswith("computed")

    # A bad setting: the run stops at once, and its seed is a row saying why.
    done = benchmark(
        "--config", str(config), "--seeds", "1", "--keep", "runs", "--out", str(out),
        "--model", tiny_model, "--group-size", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    failed = row(out.read_text(), 1)["found"]
    assert failed.startswith("failed: exit 2: vpo: error:") and "group_size" in failed

    # Kept runs make the report again, both seeds gathered, running nothing.
    again = tmp_path / "again.md"
    done = benchmark("--report-from", "runs", "--seeds", "0-1", "--out", str(again), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert row(again.read_text(), 0) == seed0
    assert row(again.read_text(), 1)["found"] == failed
    assert "1 failed" in again.read_text()


def test_the_parameter_counts_are_the_models_and_peft_adds_that_adapter(tiny_model: str) -> None:
    """The computed weights' sizes: the safetensors shapes against the model and the LoRA
    adapter peft puts on it, as the trainer does."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.adapters import LORA_TARGETS, with_lora
    from trainer.policy import PolicyConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model))
    parameters = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    linear = sum(
        p.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m is not head
        for p in m.parameters(recurse=False)
    )
    lora = LoraConfig(r=8, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    adapted = get_peft_model(model, lora)
    adapter = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert demo_seeds.parameter_counts(tiny_model, 8) == (parameters, adapter, linear)
    # An adapter on the top layer only (of the tiny model's two), as the trainer puts it.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model))
    top = with_lora(model, PolicyConfig(lora=True, lora_rank=8, lora_layers=1))
    adapter = sum(p.numel() for p in top.parameters() if p.requires_grad)
    assert 0 < adapter < sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert demo_seeds.parameter_counts(tiny_model, 8, 1) == (parameters, adapter, linear)


def test_seeds_are_ranges_or_lists() -> None:
    assert demo_seeds.parse_seeds("0-9") == list(range(10))
    assert demo_seeds.parse_seeds("0,3,5") == [0, 3, 5]
    assert demo_seeds.parse_seeds("0-2,7,1") == [0, 1, 2, 7]
    with pytest.raises(ValueError):
        demo_seeds.parse_seeds("5-3")


def test_a_vllm_runs_parts_are_its_kv_cache_and_two_copies_of_the_weights(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On vLLM the engine holds its own weights beside the trainer's fp32 ones, and the KV
    cache is the size the campaign's settings give it: a trained campaign's need
    (harness.llm.choice.kv_cache_tokens), an untrained one's 4 GiB."""
    import torch

    from harness.config.settings import build
    from harness.llm.choice import kv_cache_tokens
    from harness.llm.vllm_backend import DEFAULT_CPU_KV_CACHE_GIB, kv_cache_size
    from trainer.models import preferred_dtype

    if torch.cuda.is_available():
        pytest.skip("on a GPU the weights and the KV cache are not resident memory")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    training = {"train_every": 2, "lora": True, "lora_rank": 16, "kl_beta": 0.0}
    settings = {"model": tiny_model, "group_size": 4, "max_tokens": 160, "training": training}
    parts = demo_seeds.memory_parts(settings, "vllm", 4, 1000)
    parameters, adapter, linear = demo_seeds.parameter_counts(tiny_model, 16)
    engine_bytes = preferred_dtype("cpu").itemsize  # the engine's dtype on this CPU
    kv, how = parts["vLLM KV cache"]
    dtype = str(preferred_dtype("cpu")).split(".")[-1]
    assert kv == kv_cache_size(tiny_model, dtype, kv_cache_tokens(build(settings))) * 2**30
    untrained = {**settings, "training": {**training, "train_every": 0}}
    assert demo_seeds.memory_parts(untrained, "vllm", 4, 1000)["vLLM KV cache"][0] == (
        DEFAULT_CPU_KV_CACHE_GIB * 2**30
    )
    # A token: keys and values, 2 layers x 1 head of 64.
    assert f"16 sequences x (1000 + 160) tokens x {2 * 2 * 64 * engine_bytes:,} B" in how
    assert parts["engine's weights"][0] == parameters * engine_bytes
    # fp32, but the frozen linear layers in the dtype the LoRA trainer computes in
    assert parts["trainer's weights"][0] == (parameters + adapter) * 4 - linear * (4 - engine_bytes)
    assert parts["trainer's gradients and AdamW moments"][0] == adapter * 12

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert demo_seeds.memory_parts(settings, "vllm", 4, 1000)["vLLM KV cache"][0] == 2**30
    untrained = settings | {"training": training | {"train_every": 0}}
    assert set(demo_seeds.memory_parts(untrained, "vllm", 4, 1000)) == {
        "vLLM KV cache",
        "engine's weights",
    }


def test_a_fork_running_its_parents_program_is_not_counted_twice() -> None:
    """A forked child's VmRSS counts the pages it shares with its parent copy-on-write: the
    tree's sum leaves it out (and lists it apart), or a fork would double the peak."""
    held = 100_000_000
    code = (
        f"import os, sys, time\nheld = b'x' * {held}\nif os.fork() == 0:\n    time.sleep(30)\n"
        "    os._exit(0)\nprint('forked', flush=True)\ntime.sleep(30)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "forked"
        watch = demo_seeds.TreeMemory(parent.pid)
        watch.sample()
        memory = watch.stop()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    forks = [name for name in memory["processes"] if name.endswith("(fork, not summed)")]
    assert len(forks) == 1 and memory["processes"][forks[0]]["peak"] > held
    assert held < memory["peak"] < 1.5 * held
