"""`vpo train` on two processes (torchrun, gloo on CPU) takes the step one process takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord
from harness.store import Store
from trainer.models import preferred_dtype


def harvested(db: Path, tokenizer_folder: str) -> None:
    """A campaign of 4 groups, G = 2 rollouts of m = 2 candidates, with varied scores."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    store = Store.open(db)
    campaign = store.create_campaign("c", "circle_packing", {"candidates": 2, "model": "x"}, 0)
    seed = store.add_program(campaign, NewProgram("seed = 1", "ok", {"a": 0.1}, {}))
    prompt = tokenizer("Pack the circles")["input_ids"]
    value = 0.05
    for iteration in range(4):
        rollouts = []
        for position in range(2):
            candidates = []
            for index in (1, 2):
                value = (value * 7.3 + 0.11) % 1.0
                program = NewProgram(
                    f"x = {iteration}{position}{index}", "ok", {"a": value, "b": value**2}, {}
                )
                candidates.append(CandidateRecord(index, "new", program))
            text = f"answer {iteration} {position} " * (3 + position)
            rollouts.append(
                RolloutRecord(
                    text, tokenizer(text)["input_ids"], None, "stop", "ok", None, candidates
                )
            )
        store.record_iteration(
            campaign,
            NewGroup(
                iteration=iteration,
                island=0,
                parent_id=seed,
                draft_ids=(),
                prompt=[{"role": "user", "content": "pack"}],
                prompt_token_ids=prompt,
                rollouts=rollouts,
            ),
        )
    store.close()


def launch(launcher: list[str], db: Path, model: str, out: Path, *extra: str) -> Any:
    """`vpo train` started (one process, or torchrun's), its output in OUT.log."""
    command = [
        *launcher,
        "--db",
        str(db),
        "--out",
        str(out),
        "--model",
        model,
        "--advantage",
        "multi_rlvr",  # deterministic: the same advantages however the groups are split
        "--steps",
        "2",
        "--groups-per-step",
        "4",
        "--lr",
        "1e-2",
        "--kl-beta",
        "0",
        *extra,
    ]
    process = start(command, out.with_name(out.name + ".log"))
    process.out = out
    return process


def start(command: list[str], log: Path, **env: str) -> Any:
    """`command` started with one thread per process, its output appended to `log`."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    handle = open(log, "a")  # noqa: SIM115 (closed by wait)
    process = subprocess.Popen(
        command, stdout=handle, stderr=subprocess.STDOUT, text=True, env=environment
    )
    process.log = handle
    return process


def wait(process: Any, succeeds: bool = True) -> int:
    """The exit status of a process `start` started (asserted 0 when it `succeeds`)."""
    try:
        process.wait(timeout=300)
    finally:
        process.kill()
        process.log.close()
    if succeeds:
        assert process.returncode == 0, Path(process.log.name).read_text()[-3000:]
    return process.returncode


def finish(process: Any) -> dict:
    wait(process)
    return json.loads((process.out / "vpo-train.json").read_text())


def train_together(*runs: tuple[Any, ...]) -> list[dict]:
    """Several `vpo train` runs at once (start-up dominates them: the cores are shared)."""
    started = [launch(*run) for run in runs]
    return [finish(process) for process in started]


# --standalone: a free rendezvous port, so two launches can run at once.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ONE = [sys.executable, "-m", "harness.cli", "train"]


def update(start: torch.nn.Module, model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        pairs = zip(start.state_dict().values(), model.state_dict().values(), strict=True)
        return torch.cat([(b - a).flatten() for a, b in pairs])


def assert_same_update(tiny_model: str, one: Path, two: Path) -> None:
    """Adam divides each gradient by its own size, so components that are zero up to rounding
    move by up to lr either way: compare the whole update, not each weight."""
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    one_step = update(start, AutoModelForCausalLM.from_pretrained(one))
    two_steps = update(start, AutoModelForCausalLM.from_pretrained(two))
    assert one_step.norm() > 0
    cosine = torch.nn.functional.cosine_similarity(one_step, two_steps, dim=0)
    # The processes compute in bf16 on CPUs with AVX-512 BF16 (FSDP2 aside): more of the
    # update's components are rounding there (0.989 measured for DDP with LoRA on such a CPU).
    assert cosine > (0.99 if preferred_dtype("cpu") == torch.float32 else 0.98)
    assert two_steps.norm() == pytest.approx(one_step.norm().item(), rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    "training", [("fsdp", "full"), ("fsdp", "lora"), ("ddp", "full"), ("ddp", "lora")], ids="-".join
)
def test_two_processes_take_the_same_step_as_one(
    training: tuple[str, str], tiny_model: str, tmp_path: Path
) -> None:
    """Two processes, each with half of every batch, sharded by FSDP2 (or whole copies under
    DDP), end where one process with all of it ends; the two share each prompt over its
    rollouts (packed under a block mask), the one trains a row per rollout.

    FSDP's mixed precision keeps the residual stream in bf16 where the CPU has it, autocast in
    fp32; a LoRA adapter's first Adam steps move each entry by about lr whatever its gradient's
    size, which makes the merged update sensitive to that rounding (cosine 0.98 against the
    autocast run). So the sharded LoRA run is compared with FSDP on one process (a real wrap,
    the same numerics): what is checked is that splitting the work changes nothing."""
    sharding, weights = training
    db = tmp_path / "harvest.db"
    harvested(db, tiny_model)
    lora = ["--lora", "--lora-rank", "4"] if weights == "lora" else []
    alone = ["--sharding", "fsdp"] if training == ("fsdp", "lora") else []
    # `-m harness.cli.train` is `vpo train`, the form `accelerate launch` and torchrun use.
    # One process trains a row per rollout, the two the default shared-prompt step: the same
    # update either way.
    one, two = train_together(
        (ONE, db, tiny_model, tmp_path / "one", *lora, *alone, "--no-shared-prompt"),
        (
            [*TORCHRUN, "-m", "harness.cli.train"],
            *(db, tiny_model, tmp_path / "two", "--sharding", sharding, *lora),
        ),
    )
    assert (one["processes"], one["sharding"]) == (1, "fsdp" if alone else "none")
    assert (two["processes"], two["sharding"]) == (2, sharding)
    assert all(step["zero_std_fraction"] < 1 for step in one["steps"])  # real advantages
    assert all(s["unshared"] == s["trained"] > 0 for s in one["steps"])
    assert all(s["unshared"] == 0 < s["trained"] for s in two["steps"])
    # Each process trained on half of each batch's tokens.
    assert [s["tokens"] for s in two["steps"]] != [s["tokens"] for s in one["steps"]]
    assert_same_update(tiny_model, tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_accelerate_launch_with_fsdp_shards(tiny_model: str, tmp_path: Path) -> None:
    """`accelerate launch --use_fsdp` starts processes that shard with FSDP2 (it used to be
    refused); the step is the one-process step."""
    db = tmp_path / "harvest.db"
    harvested(db, tiny_model)
    accelerate = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", "0", "--use_fsdp", "-m", "harness.cli.train",
    ]  # fmt: skip
    one, two = train_together(
        (ONE, db, tiny_model, tmp_path / "one"), (accelerate, db, tiny_model, tmp_path / "two")
    )
    assert one["sharding"] == "none" and (two["processes"], two["sharding"]) == (2, "fsdp")
    assert_same_update(tiny_model, tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
def test_deepspeed_is_refused_in_one_line(tiny_model: str, tmp_path: Path) -> None:
    """DeepSpeed's launcher wants the package installed (it is not here); what it tells the
    processes it starts is this variable."""
    db = tmp_path / "harvest.db"
    harvested(db, tiny_model)
    out = str(tmp_path / "x")
    command = [sys.executable, "-m", "harness.cli.train", "--db", str(db), "--out", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_DEEPSPEED": "true"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert done.stderr.count("vpo: error: accelerate's config asks for DeepSpeed") == 1
    assert "internal error" not in done.stderr
