"""`vpo train` on two processes (torchrun, gloo on CPU) takes the step one process takes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.records import CandidateRecord, NewGroup, NewProgram, RolloutRecord
from harness.store import Store


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


def train(launcher: list[str], db: Path, model: str, out: Path) -> dict:
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
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "vpo-train.json").read_text())


@pytest.mark.slow
def test_two_processes_take_the_same_step_as_one(tiny_model: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    db = tmp_path / "harvest.db"
    harvested(db, tiny_model)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    one = train([sys.executable, "-m", "harness.cli", "train"], db, tiny_model, tmp_path / "one")
    # `-m harness.cli.train` is `vpo train`, the form `accelerate launch` and torchrun use.
    two = train([*torchrun, "-m", "harness.cli.train"], db, tiny_model, tmp_path / "two")
    assert one["processes"] == 1 and two["processes"] == 2
    assert all(step["zero_std_fraction"] < 1 for step in one["steps"])  # real advantages
    # Each process trained on half of each batch's tokens.
    assert [s["tokens"] for s in two["steps"]] != [s["tokens"] for s in one["steps"]]

    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    single = AutoModelForCausalLM.from_pretrained(tmp_path / "one")
    double = AutoModelForCausalLM.from_pretrained(tmp_path / "two")

    # Adam divides each gradient by its own size, so components that are zero up to rounding
    # move by up to lr either way: compare the whole update, not each weight.
    @torch.no_grad()
    def update(model: torch.nn.Module) -> torch.Tensor:
        return torch.cat(
            [(b - a).flatten() for a, b in zip(start.parameters(), model.parameters(), strict=True)]
        )

    one_step, two_steps = update(single), update(double)
    assert one_step.norm() > 0
    cosine = torch.nn.functional.cosine_similarity(one_step, two_steps, dim=0)
    assert cosine > 0.99
    assert two_steps.norm() == pytest.approx(one_step.norm().item(), rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["FSDP", "DeepSpeed"])
def test_a_sharded_accelerate_config_is_refused_in_one_line(
    sharding: str, tiny_model: str, tmp_path: Path
) -> None:
    """FSDP and DeepSpeed would shard what the step treats as whole copies: refused in one line
    by every process, not run silently unsharded."""
    db = tmp_path / "harvest.db"
    harvested(db, tiny_model)
    out = str(tmp_path / "x")
    train = ["-m", "harness.cli.train", "--db", str(db), "--out", out, "--model", tiny_model]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if sharding == "FSDP":
        command = [
            sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--use_fsdp", *train,
        ]  # fmt: skip
    else:
        # DeepSpeed's launcher wants the package installed (it is not here); what it tells the
        # processes it starts is this variable.
        command, env["ACCELERATE_USE_DEEPSPEED"] = [sys.executable, *train], "true"
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    refusal = f"vpo: error: accelerate's config asks for {sharding}, which vpo train does not"
    assert done.stderr.count(refusal) == (2 if sharding == "FSDP" else 1), done.stderr[-3000:]
    assert "internal error" not in done.stderr
