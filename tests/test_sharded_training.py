"""Sharded policy versions (FSDP2 under torchrun, gloo on CPU) and gradient checkpointing.

A follower (`vpo train --follow`) on two processes saves each version with
torch.distributed.checkpoint beside consolidated weights; killed between saving a version and
recording it, and started again, it resumes from the last recorded sharded version, optimiser
state included, and ends where an uninterrupted follower ends."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cli import assert_one_line_error, vpo
from test_distributed import harvested, start, wait

from harness.store import Store
from trainer.policy import SHARDED_FOLDER, Policy, PolicyConfig
from trainer.train import TrainConfig, train_step

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def follow(
    db: Path, model: str, out: Path, steps: int, fault: str | None = None, *extra: str
) -> int:
    return finish(launch_follower(db, model, out, steps, fault, *extra))


def launch_follower(
    db: Path, model: str, out: Path, steps: int, fault: str | None = None, *extra: str
) -> Any:
    """A two-process follower, started; its output in OUT.log."""
    command = [
        *TORCHRUN, "-m", "harness.cli.train", "--db", str(db), "--follow", "--model", model,
        "--train-every", "2", "--steps", str(steps), "--out", str(out), "--advantage",
        "multi_rlvr", "--lr", "1e-2", "--kl-beta", "1e-3", "--poll", "0.2", *extra,
    ]  # fmt: skip
    log = out.with_name(out.name + ".log")
    process = start(command, log, **({"VPO_FAULT": fault} if fault else {}))
    process.fault = fault
    return process


def finish(process: Any) -> int:
    return wait(process, succeeds=not process.fault)


@pytest.mark.slow
def test_a_killed_sharded_follower_resumes_with_its_optimiser_state(
    tiny_model: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    harvested(tmp_path / "a.db", tiny_model)
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    # A: two steps in one go; B, beside it: killed (every process) after saving step 2 and
    # before recording it, then started again.
    straight = launch_follower(tmp_path / "a.db", tiny_model, tmp_path / "a", 2)
    killed = launch_follower(tmp_path / "b.db", tiny_model, tmp_path / "b", 2, "train_saved:2")
    finish(straight)
    assert finish(killed) != 0
    store = Store.open(tmp_path / "b.db")
    campaign = store.get_campaign("c")
    assert [v.step for v in store.policies(campaign.id)] == [1]
    store.close()
    follow(tmp_path / "b.db", tiny_model, tmp_path / "b", 1)

    store = Store.open(tmp_path / "b.db")
    versions = store.policies(campaign.id)
    assert [v.step for v in versions] == [1, 2]
    assert store.untrained_count(campaign.id) == 0  # each group trained once
    store.close()

    version = tmp_path / "b" / "step-000002"
    state = json.loads((version / "policy.json").read_text())
    assert state["sharded"] is True and state["step"] == 2
    assert (version / SHARDED_FOLDER / ".metadata").exists()
    assert not (version / "optimizer.pt").exists()
    # The consolidated weights are a plain model folder; the resumed run's step 2 is the
    # uninterrupted run's: the Adam moments of step 1 came back (without them step 2 would
    # move each weight by about lr, far from this).
    resumed = AutoModelForCausalLM.from_pretrained(version)
    straight = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "step-000002")
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    for (name, a), b, s in zip(
        straight.state_dict().items(),
        resumed.state_dict().values(),
        start.state_dict().values(),
        strict=True,
    ):
        torch.testing.assert_close(b - s, a - s, atol=2e-4, rtol=0.05, msg=name)

    # One process resumes the sharded version too (resharded onto a world of one), moments
    # and all.
    policy = Policy.resume(version)
    assert policy.step == 2
    moments = policy.optimizer.state_dict()["state"]
    assert len(moments) == len(policy.trainable_parameters())
    assert all(int(m["step"]) == 2 for m in moments.values())
    for a, b in zip(policy.model.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    served_by_vllm(version, resumed)


def served_by_vllm(folder: Path, model: torch.nn.Module) -> None:
    """vLLM loads the consolidated folder and samples from those weights: its log-probs of
    what it generated are the transformers model's."""
    from conftest import require_vllm

    from harness.llm import Sampling
    from harness.llm.base import chat_prompt_ids
    from harness.llm.vllm_backend import VLLMGenerator

    require_vllm()
    engine = VLLMGenerator(str(folder), max_model_len=512, kv_cache_gib=0.25, dtype="float32")
    try:
        messages = [{"role": "user", "content": "Pack the circles."}]
        sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=6, seed=3)
        completion = engine.generate([messages], 1, sampling)[0][0]
        prompt = chat_prompt_ids(engine.tokenizer, messages)
    finally:
        engine.close()
    ids = torch.tensor([list(prompt) + list(completion.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
    torch.testing.assert_close(torch.tensor(completion.logprobs), expected, atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_a_sharded_lora_version_holds_the_adapter_and_its_moments(
    tiny_model: str, tmp_path: Path
) -> None:
    """A LoRA version under FSDP: the adapter for vLLM and the workers, merged weights beside
    it, and in `sharded/` only what trains (the frozen base is not written with each version)."""
    harvested(tmp_path / "a.db", tiny_model)
    follow(tmp_path / "a.db", tiny_model, tmp_path / "v", 1, None, "--lora", "--lora-rank", "4")
    version = tmp_path / "v" / "step-000001"
    assert (version / "adapter_config.json").exists()
    assert (tmp_path / "v" / "step-000001-merged" / "config.json").exists()
    shards = sum(f.stat().st_size for f in (version / SHARDED_FOLDER).iterdir())
    model = sum(f.stat().st_size for f in Path(tiny_model).glob("*.safetensors"))
    assert shards < model / 4
    policy = Policy.resume(version)
    assert policy.config.lora and policy.step == 1
    moments = policy.optimizer.state_dict()["state"]
    assert len(moments) == len(policy.trainable_parameters()) > 0
    assert all(int(m["step"]) == 1 for m in moments.values())
    # After one step only the B matrices have gradients (B starts at 0, so A's gradient is 0).
    moved = [float(m["exp_avg"].abs().sum()) > 0 for m in moments.values()]
    assert sum(moved) == len(moved) // 2


def one_step(tiny_model: str, checkpointing: str) -> tuple[Policy, list[torch.Tensor]]:
    from test_trainer import tiny_groups

    torch.manual_seed(0)
    config = PolicyConfig(lr=1e-2, reference=False, gradient_checkpointing=checkpointing)
    policy = Policy.load(tiny_model, config)
    groups = tiny_groups(policy, 2)
    train_step(
        policy, groups, TrainConfig(micro_batch=2), generator=torch.Generator().manual_seed(3)
    )
    return policy, [p.detach().clone() for p in policy.model.parameters()]


def test_gradient_checkpointing_leaves_the_step_unchanged(tiny_model: str) -> None:
    plain, without = one_step(tiny_model, "off")
    checked, with_it = one_step(tiny_model, "on")
    assert not plain.checkpointing and checked.checkpointing
    assert checked.model.is_gradient_checkpointing
    start = Policy.load(tiny_model, PolicyConfig(reference=False))
    assert not start.checkpointing  # "auto": a tiny model keeps its activations
    moved = 0.0
    for before, a, b in zip(start.model.parameters(), without, with_it, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
        moved += float((a - before.detach()).abs().sum())
    assert moved > 0


@pytest.mark.parametrize(
    "args,words",
    [
        (("--sharding", "zero3"), "--sharding must be auto, fsdp, ddp, none, not 'zero3'"),
        (("--gradient-checkpointing", "yes"), "--gradient-checkpointing must be auto, on, off"),
    ],
)
def test_bad_sharding_flags_are_one_line(args: tuple[str, ...], words: str, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    assert_one_line_error(vpo("train", "--db", str(db), "--out", str(tmp_path / "o"), *args), words)


def test_a_campaign_refuses_to_run_under_torchrun(tmp_path: Path) -> None:
    """Every process torchrun starts would run the campaign: said in one line instead."""
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0"}
    for command in ("run", "worker"):
        done = vpo(command, "circle_packing", "--db", str(tmp_path / "x.db"), env=env)
        assert_one_line_error(done, f"vpo {command} runs in one process, not under torchrun")
    assert not (tmp_path / "x.db").exists()


def test_a_bad_gradient_checkpointing_setting_is_named(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[training]\ngradient_checkpointing = "always"\n')
    done = vpo("run", "circle_packing", "--config", str(config), "--db", str(tmp_path / "x.db"))
    assert_one_line_error(done, "gradient_checkpointing")
    assert "auto, on, off" in done.stderr
