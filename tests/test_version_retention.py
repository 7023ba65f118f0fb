"""Policy versions on disk stay bounded: a long campaign keeps its newest `keep_versions` (and
those in use), resumes after pruning with the newest version's optimiser state, survives a kill
in the middle of a removal, and writes merged copies only for generators that load whole
weights, in the compute dtype, removed once loaded or superseded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors import safe_open

from harness.cli.render import size, status_rows
from harness.config.errors import UserError
from harness.config.files import load_toml
from harness.config.settings import CampaignSettings, build
from harness.config.training import KEEP_VERSIONS
from harness.evolution.loop import run_campaign
from harness.learning import publish as publishing
from harness.learning.offline import follow
from harness.learning.publish import merged_folder, prune_versions, publish, step_name
from harness.observation import status
from harness.store import Store
from problems.api import Infeasible, Objective, Problem


class Three(Problem):
    """A statement of three words: the prompt, and so each step, stays short."""

    name = "three"
    description = "Return 3.0."
    seed_program = "def answer():\n    return 1.0\n"
    entry = "answer"
    time_limit = 2.0
    objectives = (Objective("closeness", "max", 1.0, "by definition"),)

    def score(self, call: object, value: object) -> dict[str, float]:
        if not isinstance(value, float):
            raise Infeasible("not a float")
        return {"closeness": 1.0 / (1.0 + abs(value - 3.0))}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors: a second thread only waits for the first on a busy machine (a step took
    4-7 s on 2 threads against 0.5 s on one, with other tests running beside it)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def settings(model: str, **extra: object) -> dict[str, object]:
    """A LoRA campaign training one step per group, 8 groups sampled per generate call."""
    return {
        "problem": "three",
        "model": model,
        "backend": "transformers",
        "group_size": 2,
        "candidates": 1,
        "max_tokens": 16,
        "top_p": 1.0,
        "drafts": 0,
        "islands": 1,
        "workers": 1,
        "concurrency": 8,
        "train_every": 1,
        "lora": True,
        "lora_rank": 2,
        "learning_rate": 1e-3,
        "kl_beta": 0.0,
        "micro_batch": 1,
        "skip_zero_advantage": False,  # the tiny model's groups are flat; steps still run
        **extra,
    }


def listing(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir()) if folder.exists() else []


def adam_steps(version: Path) -> set[int]:
    """The optimiser steps AdamW counted in a saved version's state."""
    import torch

    state = torch.load(version / "optimizer.pt", weights_only=True)["state"]
    return {int(moments["step"]) for moments in state.values()}


@pytest.mark.slow
def test_a_long_campaign_keeps_its_newest_versions_and_resumes(
    tiny_model: str, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "c.db")
    folder = tmp_path / "c.policies" / "three"
    seen: list[list[str]] = []
    config = build(settings(tiny_model, iterations=56, keep_versions=3))
    campaign_id = run_campaign(
        config, store, Three(), on_progress=lambda *_: seen.append(listing(folder))
    )
    recorded = store.policies(campaign_id)
    assert [p.step for p in recorded] == list(range(1, 57))
    # After every iteration, between steps: at most the 3 newest versions, nothing else (the
    # generator wraps the trainer's model: no merged copy, no version in use by another).
    assert len(seen) >= 56 and max(map(len, seen)) == 3
    assert all(
        name.startswith("step-") and "merged" not in name for names in seen for name in names
    )
    assert listing(folder) == [step_name(s) for s in (54, 55, 56)]
    # The database still lists every version; status counts what the disk holds.
    report = status.report(store, store.get_campaign("three"))
    files = [f for f in folder.rglob("*") if f.is_file()]
    assert report["policy_versions_on_disk"] == 3
    assert report["policy_bytes"] == sum(f.stat().st_size for f in files) > 0
    assert report["policy_folder"] == str(folder)
    json.dumps(report)
    rows = dict(status_rows(report))
    assert rows["policy versions on disk"] == f"3, {size(report['policy_bytes'])} in {folder}"

    # A resumed campaign loads the newest version with its optimiser state: AdamW's counter
    # goes on from 56 (a fresh optimiser would count 8).
    run_campaign(build({**config.to_dict(), "iterations": 64}), store, Three())
    assert [p.step for p in store.policies(campaign_id)] == list(range(1, 65))
    assert listing(folder) == [step_name(s) for s in (62, 63, 64)]
    assert adam_steps(folder / step_name(64)) == {64}


def test_a_kill_in_the_middle_of_a_removal_leaves_a_campaign_that_resumes(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(tmp_path / "c.db")
    folder = tmp_path / "c.policies" / "three"
    config = build(settings(tiny_model, iterations=8, keep_versions=1))
    real_rmtree = publishing.shutil.rmtree

    def killed(path: Path, ignore_errors: bool = False) -> None:
        """The process dies after removing one file of the version."""
        next(f for f in Path(path).iterdir() if f.is_file()).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(publishing.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        run_campaign(config, store, Three())
    # Step 2 was recorded, then the removal of step 1 died half-way: under a trash name.
    names = listing(folder)
    assert names[-1] == step_name(2) and names[0].startswith(".trash.step-000001.")
    campaign = store.get_campaign("three")
    assert campaign is not None
    assert [p.step for p in store.policies(campaign.id)] == [1, 2]
    # A killed save leaves its staging folder too (trainer/policy.py `_atomic_folder`).
    (folder / ".step-000003.k1ll3d").mkdir()

    monkeypatch.setattr(publishing.shutil, "rmtree", real_rmtree)
    run_campaign(build({**config.to_dict(), "iterations": 12}), store, Three())
    assert [p.step for p in store.policies(campaign.id)] == list(range(1, 13))
    assert listing(folder) == [step_name(12)]  # the leftovers went with the next removal
    assert adam_steps(folder / step_name(12)) == {12}


def test_a_follower_keeps_what_workers_may_use_and_merged_copies_of_the_two_newest(
    tiny_model: str, tmp_path: Path
) -> None:
    """`vpo train --follow` writes each LoRA version merged for in-process workers. With
    keep_versions 1, the version before the newest stays too (a worker may still be loading it),
    as does every version from the one before the newest when a worker claimed its work (it
    samples from that one until it records it; a server may read the adapter again)."""
    store = Store.open(tmp_path / "c.db")
    run_campaign(build(settings(tiny_model, iterations=8, train_every=0)), store, Three())
    campaign = store.get_campaign("three")
    assert campaign is not None
    folder = tmp_path / "c.policies" / "three"
    seen: list[list[str]] = []

    def steps(n: int) -> int:
        overrides = {"train_every": 1, "lora": True, "keep_versions": 1}
        say = lambda line: seen.append(listing(folder))  # noqa: E731
        return follow(store, campaign, overrides, steps=n, poll=0.01, say=say)

    def merged(*numbers: int) -> list[str]:
        return [name for n in numbers for name in (step_name(n), step_name(n) + "-merged")]

    assert steps(2) == 2
    # A slow worker loaded version 2 and claimed an iteration.
    assert store.claim_iteration(campaign.id, "slow", budget=9, lease_seconds=900) == 8
    assert store.version_at_oldest_claim(campaign.id) == 2
    assert steps(4) == 4
    assert listing(folder) == [step_name(n) for n in (1, 2, 3, 4)] + merged(5, 6)
    store.release_claim(campaign.id, 8, "slow")
    assert store.version_at_oldest_claim(campaign.id) is None
    assert steps(1) == 1
    assert listing(folder) == merged(6, 7)
    assert max(map(len, seen)) == 8  # versions 1..6, the copies of 5 and 6
    # The copy is what a worker's engine loads: whole weights, no adapter, in the dtype the
    # trainer computes in (bf16 where the CPU or GPU has it; fp32 on others).
    from trainer.models import preferred_dtype

    copy = merged_folder(folder / step_name(7))
    dtype = str(preferred_dtype("cpu")).removeprefix("torch.")
    assert json.loads((copy / "config.json").read_text())["dtype"] == dtype
    assert not (copy / "adapter_config.json").exists()


@pytest.mark.slow
def test_the_in_process_vllm_engine_never_needs_a_merged_copy(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LoRA campaign on vLLM in process: each version goes from the trainer's memory into the
    engine, merged tensor by tensor; no merged copy is ever written."""
    from conftest import require_vllm

    from trainer.policy import Policy

    require_vllm()

    def no_copy(*_: object, **__: object) -> None:
        raise AssertionError("a merged copy was written")

    monkeypatch.setattr(Policy, "save_merged", no_copy)
    store = Store.open(tmp_path / "c.db")
    folder = tmp_path / "c.policies" / "three"
    seen: list[list[str]] = []
    config = build(settings(tiny_model, backend="vllm", iterations=6, concurrency=2))
    campaign_id = run_campaign(
        config, store, Three(), on_progress=lambda *_: seen.append(listing(folder))
    )
    assert [p.step for p in store.policies(campaign_id)] == list(range(1, 7))
    assert any(seen) and not any(n.endswith("-merged") for names in seen for n in names)
    assert listing(folder) == [step_name(s) for s in (4, 5, 6)]


def test_the_trainers_own_engine_loads_a_version_from_memory_with_no_merged_copy(
    tiny_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from harness.llm.transformers_backend import TransformersGenerator
    from trainer.policy import Policy, PolicyConfig

    torch.manual_seed(0)
    policy = Policy.load(tiny_model, PolicyConfig(lora=True, lora_rank=2))
    for module in policy.model.modules():  # a trained adapter: B is no longer zero
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.1)
    version = policy.save(tmp_path / step_name(0))
    engine = TransformersGenerator(tiny_model, dtype="float32")  # loads whole weights

    def no_copy(*_: object, **__: object) -> None:
        raise AssertionError("a merged copy was written")

    with monkeypatch.context() as patched:
        patched.setattr(Policy, "save_merged", no_copy)
        publish(policy, engine, version)
    # The engine holds the merged weights, copied from the trainer's memory; no copy on disk.
    assert listing(tmp_path) == [step_name(0)]
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        loaded = engine.hf_model.get_submodule(name).weight
        assert torch.equal(loaded, _merged_weight(policy, name))
    untouched = engine.hf_model.get_submodule("model.embed_tokens").weight
    assert torch.equal(untouched, policy.model.get_base_model().model.embed_tokens.weight)

    # Asked for bf16 (the compute dtype on hardware that has it), the copy is half the bytes.
    expected = _merged_weight(policy, "model.layers.0.self_attn.q_proj")
    held = [p.dtype for p in policy.model.parameters()]
    full = policy.save_merged(tmp_path / "fp32")
    half = policy.save_merged(tmp_path / "bf16", dtype=torch.bfloat16)
    sizes = [(f / "model.safetensors").stat().st_size for f in (full, half)]
    assert 0.49 < sizes[1] / sizes[0] < 0.51
    with safe_open(str(half / "model.safetensors"), "pt") as weights:
        name = "model.layers.0.self_attn.q_proj.weight"
        assert weights.get_tensor(name).dtype == torch.bfloat16
        assert torch.equal(weights.get_tensor(name), expected.to(torch.bfloat16))
    # ... and the policy itself is left as it was: its adapter in fp32, its frozen linear
    # layers in the dtype it computes in (trainer.adapters.frozen_linear_to).
    assert [p.dtype for p in policy.model.parameters()] == held
    assert {p.dtype for p in policy.model.parameters() if p.requires_grad} == {torch.float32}


def _merged_weight(policy: object, name: str) -> object:
    """W + B A * scale of one LoRA layer of `policy`, computed by hand."""
    layer = policy.model.get_submodule("base_model.model." + name)  # type: ignore[attr-defined]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    return (layer.base_layer.weight + b @ a * layer.scaling["default"]).detach()


def test_prune_keeps_the_newest_and_those_in_use(tmp_path: Path) -> None:
    """Which folders go, on plain folders: versions 1..10, merged copies, leftovers, and a
    file of the user's that is none of these."""
    for step in range(1, 11):
        (tmp_path / step_name(step)).mkdir()
        (tmp_path / (step_name(step) + "-merged")).mkdir()
    (tmp_path / step_name(11)).mkdir()  # saved, not yet recorded
    (tmp_path / ".step-000004.abcd1234").mkdir()  # a killed save
    (tmp_path / "notes.txt").write_text("mine")
    mine = {"notes.txt"}

    prune_versions(tmp_path, 10, 3, shared=False)
    assert set(listing(tmp_path)) == mine | {
        step_name(8),
        step_name(9),
        step_name(10),
        step_name(10) + "-merged",
        step_name(11),
    }
    # Shared with workers or a server: the one before the newest and its copy are in use.
    prune_versions(tmp_path, 11, 1, shared=True)
    assert set(listing(tmp_path)) == mine | {
        step_name(10),
        step_name(10) + "-merged",
        step_name(11),
    }
    # A worker in flight claimed its work when 9 was the newest: it samples from 8 or 9.
    for step in (7, 8, 9, 12):
        (tmp_path / step_name(step)).mkdir()
    prune_versions(tmp_path, 12, 1, shared=True, sampled_from=9)
    assert set(listing(tmp_path)) == mine | {step_name(n) for n in (8, 9, 10, 11, 12)}
    for step in (8, 9):
        (tmp_path / step_name(step)).rmdir()
    # 0 keeps every version; a merged copy no one loads goes.
    (tmp_path / (step_name(12) + "-merged")).mkdir()
    prune_versions(tmp_path, 13, 0, shared=False)
    assert set(listing(tmp_path)) == mine | {step_name(10), step_name(11), step_name(12)}


def test_keep_versions_is_a_setting_with_a_flag_and_a_toml_key(tmp_path: Path) -> None:
    from harness.cli.parser import build_parser

    assert CampaignSettings().training.keep_versions == KEEP_VERSIONS == 3
    file = tmp_path / "c.toml"
    file.write_text("[training]\nkeep_versions = 5\n")
    assert build(load_toml(file)).training.keep_versions == 5
    args = build_parser().parse_args(["run", "--keep-versions", "7"])
    assert args.keep_versions == 7
    for bad, words in ((-1, "must be a whole number >= 0"), (2.5, "must be a whole number")):
        with pytest.raises(UserError, match=words) as error:
            build({"keep_versions": bad})
        assert "\n" not in str(error.value) and "keep_versions" in str(error.value)
