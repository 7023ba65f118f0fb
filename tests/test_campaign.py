"""The campaign loop against a real database, a real sandbox and a real (tiny or small) model."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import campaign_invariants
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from harness.config.settings import build
from harness.config.training import TrainSettings
from harness.evaluation.sandbox import Sandbox
from harness.evolution.iteration import SampledIteration
from harness.evolution.loop import prepare, run_campaign
from harness.evolution.recording import evaluate_and_store
from harness.evolution.selection import Selection
from harness.llm import Completion
from harness.observation.views import summary_json
from harness.store import Store
from harness.store.models import GroupDraft, RolloutGroup, Trajectory
from problems.api import Infeasible, Objective, Problem
from problems.circle_packing import SEED_PROGRAM, CirclePacking


def fast_settings(model: str, **extra: object) -> dict[str, object]:
    settings: dict[str, object] = {
        "problem": "circle_packing",
        "model": model,
        "group_size": 2,
        "candidates": 2,
        "max_tokens": 24,
        "workers": 2,
        "islands": 2,
        "migration_interval": 2,
    }
    settings.update(extra)
    return settings


def test_a_short_campaign_records_every_iteration(tiny_model: str, tmp_path: Path) -> None:
    config = build(fast_settings(tiny_model, iterations=4))
    store = Store.open(tmp_path / "campaign.db")
    seen: list[int] = []
    campaign_id = run_campaign(
        config, store, CirclePacking(), on_progress=lambda i, progress: seen.append(i)
    )
    campaign_invariants(store, campaign_id, 4, 2, 2)
    assert seen[-1] == 4
    report = summary_json(store, campaign_id)
    assert report["groups"] == 4 and report["trajectories"] == 8
    assert report["tokens"] > 0 and report["valid_programs"] >= 1
    assert set(report["best"]) == {"n26", "n32", "rect21"}
    assert store.get_campaign("circle_packing").status == "finished"
    # resuming a finished campaign with a larger budget continues where it stopped
    run_campaign(build(fast_settings(tiny_model, iterations=6)), store, CirclePacking())
    campaign_invariants(store, campaign_id, 6, 2, 2)


def test_best_of_n_always_prompts_with_the_seed(tiny_model: str, tmp_path: Path) -> None:
    config = build(fast_settings(tiny_model, iterations=3, strategy="best-of-n"))
    store = Store.open(tmp_path / "campaign.db")
    campaign_id = run_campaign(config, store, CirclePacking())
    seed = store.programs(campaign_id, origin="seed")[0]
    with Session(store.engine) as session:
        parents = set(session.scalars(select(RolloutGroup.parent_program_id)).all())
        drafts = session.scalar(select(func.count()).select_from(GroupDraft))
    assert parents == {seed.id} and drafts == 0


def test_every_island_starts_from_the_seed(tmp_path: Path) -> None:
    """A new campaign stores the seed on island 0 and a copy of it on each other island, once:
    a resumed run adds none, and a best-of-n campaign (one prompt, no islands) none at all."""
    store = Store.open(tmp_path / "campaign.db")
    problem = CirclePacking()
    config = build({"problem": "circle_packing", "islands": 3})
    campaign_id = store.create_campaign("islands", problem.name, config.to_dict(), 0)
    with Sandbox(workers=2) as sandbox:
        run = prepare(config, store, problem, campaign_id, sandbox)
        prepare(config, store, problem, campaign_id, sandbox)  # a resume
    programs = store.programs(campaign_id)
    seed = store.program(run.seed_id)
    assert [(p.origin, p.island) for p in programs] == [
        ("seed", 0),
        ("migration", 1),
        ("migration", 2),
    ]
    for copy in programs[1:]:
        assert copy.parent_id == seed.id and copy.code_hash == seed.code_hash
        assert copy.scores == seed.scores and copy.status == seed.status == "ok"
    assert sorted(run.population.islands.tolist()) == [0, 1, 2]
    config = build({"problem": "circle_packing", "islands": 3, "strategy": "best-of-n"})
    other = store.create_campaign("best-of-n", problem.name, config.to_dict(), 0)
    with Sandbox(workers=1) as sandbox:
        prepare(config, store, problem, other, sandbox)
    assert [p.origin for p in store.programs(other)] == ["seed"]


def candidate_text(*programs: str) -> str:
    return "".join(
        f"<candidate_{i}>\n```python\n{code}\n```\n</candidate_{i}>\n"
        for i, code in enumerate(programs, start=1)
    )


def test_candidates_are_evaluated_once_and_failures_recorded(tmp_path: Path) -> None:
    """Completions as data: what a model wrote is parsed, evaluated and stored atomically."""
    store = Store.open(tmp_path / "campaign.db")
    problem = CirclePacking()
    config = build({"problem": "circle_packing", "candidates": 3, "group_size": 2})
    smaller = SEED_PROGRAM.replace("1 - 1e-12", "0.9")
    overlapping = SEED_PROGRAM.replace("1 - 1e-12", "1.5")
    completions = [
        Completion(
            candidate_text(smaller, overlapping, "def construct_packing(n:"),
            (1, 2, 3),
            None,
            "stop",
            (7, 8),
        ),
        Completion(
            candidate_text(smaller + "\n\n", "garbage that is not python"),
            (4, 5),
            None,
            "length",
            (7, 8),
        ),
    ]
    campaign_id = store.create_campaign("manual", problem.name, config.to_dict(), 0)
    with Sandbox(workers=2) as sandbox:
        campaign = prepare(config, store, problem, campaign_id, sandbox)
        seed = store.program(campaign.seed_id)
        prompt = [{"role": "user", "content": "improve"}]
        sampled = SampledIteration(0, Selection(0, seed.id, ()), seed, prompt, completions, [])
        assert list(evaluate_and_store(campaign, [sampled])) == [sampled]
    with Session(store.engine) as session:
        trajectories = session.scalars(select(Trajectory).order_by(Trajectory.position)).all()
    first, second = (t.candidates for t in trajectories)
    assert [c["outcome"] for c in first] == ["new", "new", "new"]
    assert [c["outcome"] for c in second] == ["duplicate", "new", "unparsed"]
    assert second[0]["program_id"] == first[0]["program_id"]  # layout noise: same program
    assert "no <candidate_3>" in second[2]["reason"]
    assert len(store.programs(campaign_id, origin="llm")) == 4  # the duplicate is not stored
    by_id = {p.id: p for p in store.programs(campaign_id)}
    good = by_id[first[0]["program_id"]]
    assert good.status == "ok" and good.scores["n26"] == pytest.approx(26 / 12 * 0.9 / 2.63598308)
    assert by_id[first[1]["program_id"]].status == "invalid"
    assert "n26: circle" in by_id[first[1]["program_id"]].error
    assert by_id[first[2]["program_id"]].status == "error"
    assert by_id[second[1]["program_id"]].status == "error"  # runs, and fails, in the sandbox
    assert trajectories[0].parse_status == "ok" and trajectories[1].parse_status == "partial"
    assert trajectories[1].finish_reason == "length"
    assert good.parent_id == seed.id and good.generation == 1


def test_a_lazy_copy_of_the_parent_earns_nothing_unless_kept(tmp_path: Path) -> None:
    """ThetaEvolve's lazy outputs: a candidate that repeats its parent (or a stored program)
    scores zero as a reward by default, so copying is not the safe answer; its stored
    evaluation is untouched, and `duplicate_reward = "keep"` gives it the parent's scores."""
    from harness.learning.rewards import to_group
    from trainer.advantages import compute_advantages
    from trainer.train import TrainConfig

    store = Store.open(tmp_path / "campaign.db")
    problem = CirclePacking()
    config = build({"problem": "circle_packing", "candidates": 1, "group_size": 4})
    smaller = SEED_PROGRAM.replace("1 - 1e-12", "0.9")  # valid, below the seed
    texts = [SEED_PROGRAM, smaller, smaller, SEED_PROGRAM]
    completions = [Completion(candidate_text(t), (1, 2), None, "stop", (7, 8)) for t in texts]
    campaign_id = store.create_campaign("lazy", problem.name, config.to_dict(), 0)
    with Sandbox(workers=2) as sandbox:
        campaign = prepare(config, store, problem, campaign_id, sandbox)
        seed = store.program(campaign.seed_id)
        prompt = [{"role": "user", "content": "improve"}]
        mixed = SampledIteration(0, Selection(0, seed.id, ()), seed, prompt, completions, [])
        # The parent again beside a helper nothing calls: a copy to the scorer, so lazy too.
        beside = SEED_PROGRAM + "\n\ndef unused_helper():\n    return 0\n"
        copies = [
            Completion(candidate_text(text), (1, 2), None, "stop", (7, 8))
            for text in (SEED_PROGRAM, beside, beside, SEED_PROGRAM)
        ]
        copied = SampledIteration(1, Selection(0, seed.id, ()), seed, prompt, copies, [])
        list(evaluate_and_store(campaign, [mixed, copied]))
    with Session(store.engine) as session:
        trajectories = session.scalars(
            select(Trajectory).order_by(Trajectory.group_id, Trajectory.position)
        ).all()
        slots = [t.candidates[0] for t in trajectories[:4]]
        copied_slots = [t.candidates[0] for t in trajectories[4:]]
    # The copies of the parent are lazy; the second `smaller` repeats a candidate of the same
    # group, which is no laziness.
    assert [(s["outcome"], s["lazy"]) for s in slots] == [
        ("duplicate", True),
        ("new", False),
        ("duplicate", False),
        ("duplicate", True),
    ]
    assert slots[0]["program_id"] == seed.id  # the stored link to the evaluation is kept
    assert [(s["outcome"], s["lazy"], s["program_id"]) for s in copied_slots] == [
        ("duplicate", True, seed.id)
    ] * 4
    assert "unchanged" in copied_slots[1]["reason"] and copied_slots[0]["reason"] is None
    objectives = ["n26", "n32", "rect21"]
    stored, all_copies = store.untrained_groups(campaign_id, 2)
    zero = to_group(stored, objectives, 1)
    keep = to_group(stored, objectives, 1, TrainSettings(duplicate_reward="keep"))
    assert zero is not None and keep is not None
    assert not zero.scores[0].any() and not zero.scores[3].any() and zero.scores[1].all()
    assert (keep.scores[0] == keep.scores[3]).all() and (keep.scores[0] > keep.scores[1]).all()
    step = TrainConfig(advantage="grpo")
    by_zero = compute_advantages([zero], step).per_rollout
    by_keep = compute_advantages([keep], step).per_rollout
    assert by_zero[0] < 0 < by_zero[1]  # the new program is worth more than a copy
    assert by_keep[0] > 0 > by_keep[1]  # kept, copying the better parent would win
    # A group whose rollouts all copy the parent gets zero advantages, under VPO too.
    lazy_group = to_group(all_copies, objectives, 1)
    assert lazy_group is not None and not lazy_group.scores.any()
    for advantage in ("grpo", "vpo"):
        assert (
            compute_advantages([lazy_group], TrainConfig(advantage=advantage)).per_rollout
            == [0.0] * 4
        )


# Which version sampled each group, and the staleness of each step's groups: sampling after
# the steps (the in-process default), each batch comes from the newest version; otherwise a
# batch generates while the step on the one before it waits, one version behind.
ORDERS = {
    "on": ([None, None, 1, 1, 2], [0.0, 0.0]),
    "off": ([None, None, None, 1, 1], [0.0, 0.5]),
}


@pytest.mark.parametrize("order", ORDERS)
def test_training_inside_the_campaign_uses_each_group_once(
    tiny_model: str, tmp_path: Path, order: str
) -> None:
    import torch

    from trainer.policy import Policy

    # One iteration in flight, so which groups each step takes is known (on the vLLM backend,
    # whose weights each step reloads).
    # The tiny model's groups are flat: skipping them would leave nothing to train and no
    # weight to check, so here they run (weight decay and the KL term move the weights).
    settings = fast_settings(
        tiny_model,
        iterations=5,
        train_every=2,
        learning_rate=1e-3,
        micro_batch=1,
        concurrency=1,
        skip_zero_advantage=False,
        sample_after_step=order,
    )
    store = Store.open(tmp_path / "campaign.db")
    campaign_id = run_campaign(build(settings), store, CirclePacking())
    campaign_invariants(store, campaign_id, 5, 2, 2)
    policies = store.policies(campaign_id)
    assert [p.step for p in policies] == [1, 2]
    with Session(store.engine) as session:
        steps = session.execute(
            select(RolloutGroup.iteration, RolloutGroup.train_step, RolloutGroup.policy_version_id)
            .where(RolloutGroup.campaign_id == campaign_id)
            .order_by(RolloutGroup.iteration)
        ).all()
    # Steps train on the two newest unused groups; iteration 4 waits for the next step.
    assert [s.train_step for s in steps] == [1, 1, 2, 2, None]
    # Groups record the policy that wrote them: step 1 ran once group 1 was stored, before
    # group 2 was generated, or while it was.
    sampled_by, staleness = ORDERS[order]
    versions = {p.id: p.step for p in policies}
    assert [versions.get(s.policy_version_id) for s in steps] == sampled_by
    for policy in policies:
        assert Path(policy.path, "policy.json").exists()
        for key in (
            "loss",
            "kl",
            "set_score",
            "zero_std_fraction",
            "diversity",
            "tokens_per_second",
        ):
            assert key in policy.metrics
        # vLLM reported every rollout's log-probs: the ratio's old log-probs are the sampler's.
        assert policy.metrics["sampler_fraction"] == 1.0
    # Step 1 trained groups 0 and 1, sampled by the weights it started from; step 2 groups 2
    # and 3 from version 1, which sampled both of them, or only group 3 (one version stale).
    assert [p.metrics["staleness"] for p in policies] == staleness
    assert summary_json(store, campaign_id)["policy_versions"] == 2
    assert Path(policies[0].path).parent == tmp_path / "campaign.policies" / "circle_packing"

    # The saved version differs from the starting weights (AdamW moved them) ...
    start = Policy.load(tiny_model)
    saved = Policy.resume(policies[-1].path)
    moved = any(
        not torch.equal(a, b)
        for a, b in zip(start.model.parameters(), saved.model.parameters(), strict=True)
    )
    assert moved and saved.step == 2

    # ... and resuming continues from it: steps stay contiguous, no group trains twice.
    run_campaign(build({**settings, "iterations": 7}), store, CirclePacking())
    assert [p.step for p in store.policies(campaign_id)] == [1, 2, 3]
    with Session(store.engine) as session:
        trained = session.scalars(
            select(RolloutGroup.train_step)
            .where(RolloutGroup.campaign_id == campaign_id)
            .order_by(RolloutGroup.iteration)
        ).all()
    assert trained == [1, 1, 2, 2, 3, 3, None]


def test_training_settings_are_checked_before_anything_runs() -> None:
    from harness.config.errors import UserError

    with pytest.raises(UserError, match="candidates"):
        build({"train_every": 2, "advantage": "grpo", "candidates": 3})
    endpoint = {"backend": "openai", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(UserError, match="'lora' must be true when training .* openai backend"):
        build({"train_every": 2, **endpoint})
    assert build({"train_every": 2, "lora": True, **endpoint}).training.lora
    with pytest.raises(UserError, match="advantage"):
        build({"advantage": "ppo"})
    with pytest.raises(UserError, match="true or false"):
        build({"lora": "yes"})
    # training off: a single-candidate estimator with m = 3 is not an error yet
    assert build({"advantage": "grpo"}).training.advantage == "grpo"


def test_the_config_knows_the_trainer_estimators() -> None:
    """One table (trainer/estimators.py): the functions, the settings, the help text and the
    docs name the same estimators."""
    import inspect

    from harness.cli.flags import SETTING_FLAGS
    from harness.config.training import ADVANTAGES, SINGLE_CANDIDATE_ADVANTAGES
    from trainer.advantages import ESTIMATORS, set_scores
    from trainer.estimators import SINGLE_CANDIDATE, SPECS
    from trainer.train import TrainConfig

    assert tuple(ESTIMATORS) == tuple(SPECS) == ADVANTAGES
    assert SINGLE_CANDIDATE == SINGLE_CANDIDATE_ADVANTAGES
    config_fields = set(TrainConfig.__dataclass_fields__)
    help_text = SETTING_FLAGS["advantage"].metadata["help"]
    docs = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    for name, spec in SPECS.items():
        keywords = dict(inspect.signature(ESTIMATORS[name]).parameters)
        if "set_options" in keywords:  # vpo and entropic pass them on to set_scores
            keywords |= inspect.signature(set_scores).parameters
        for field, keyword in spec.options:
            assert field in config_fields and keyword in keywords, (name, field, keyword)
        assert ("generator" in keywords) == spec.random, name
        assert f"`{name}`" in docs and name in help_text, name


def test_offline_training_writes_a_model_that_vpo_run_loads(
    tiny_model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from harness.cli import main

    db = tmp_path / "harvest.db"
    store = Store.open(db)
    run_campaign(build(fast_settings(tiny_model, iterations=3)), store, CirclePacking())
    out = tmp_path / "trained"
    args = ["train", "--db", str(db), "--out", str(out), "--steps", "3", "--groups-per-step", "2"]
    assert main([*args, "--lr", "1e-3", "--lora", "--lora-rank", "4"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("step ") >= 3 and "vpo run --model" in printed
    report = json.loads((out / "vpo-train.json").read_text())
    assert [s["step"] for s in report["steps"]] == [1, 2, 3]
    assert report["objectives"] == ["n26", "n32", "rect21"] and report["groups"] == 3
    assert (out / "config.json").exists()  # a plain model folder, the adapter merged in
    # The campaign's reward rules score its groups unless a flag says otherwise.
    assert report["settings"]["duplicate_reward"] == "zero"
    assert report["settings"]["format_reward"] == "partial"
    assert report["settings"]["overlong_buffer"] == 0

    # `vpo run --model DIR` samples from it.
    other = tmp_path / "next.db"
    flags = ["--max-tokens", "16", "-G", "2", "-m", "2", "--workers", "1", "--iterations", "1"]
    assert main(["run", "circle_packing", "--db", str(other), "--model", str(out), *flags]) == 0
    assert summary_json(Store.open(other), 1)["trajectories"] == 2
    capsys.readouterr()  # what that run printed

    # Bad input is one line each.
    def fails(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit:
            main(argv)
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        return err

    assert "--advantage must be vpo, entropic" in fails([*args[:-4], "--advantage", "ppo"])
    assert "--format-reward must be partial or whole" in fails([*args, "--format-reward", "all"])
    assert "--overlong-buffer must be a whole number >= 0" in fails(
        [*args, "--overlong-buffer", "-1"]
    )
    assert "below the campaign's max_tokens (24), not 24" in fails(
        [*args[:3], "--out", str(tmp_path / "o"), "--overlong-buffer", "24"]
    )
    flagged = tmp_path / "flagged"
    rules = ["--format-reward", "whole", "--overlong-buffer", "8", "--steps", "1"]
    assert main(["train", "--db", str(db), "--out", str(flagged), "--lora", *rules]) == 0
    settings = json.loads((flagged / "vpo-train.json").read_text())["settings"]
    assert (settings["format_reward"], settings["overlong_buffer"]) == ("whole", 8)
    assert "is not an empty folder" in fails(["train", "--db", str(db), "--out", str(out)])
    grpo = ["train", "--db", str(db), "--out", str(tmp_path / "o"), "--advantage", "grpo"]
    assert "one candidate per rollout" in fails(grpo)


class Three(Problem):
    """A problem whose prompt is 366 SmolLM2 tokens where circle packing's is 1,207: a training
    step on the CPU costs in proportion to the tokens (a step of 2 rollouts of circle packing
    took 90 to 140 s on 2 busy cores), and which problem a campaign evolves is beside the point
    of a test of its training."""

    name = "three"
    description = "Return a number as close to 3 as you can."
    seed_program = "def answer():\n    return 1.0\n"
    entry = "answer"
    objectives = (Objective("closeness", "max", 1.0, "by definition"),)
    edits = False

    def score(self, call: object, value: object) -> dict[str, float]:
        if not isinstance(value, float):
            raise Infeasible("not a float")
        return {"closeness": 1.0 / (1.0 + abs(value - 3.0))}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_vpo_steps_on_smollm2_inside_a_campaign(tmp_path: Path) -> None:
    """The embedded model, trained twice in a real campaign: the weights change and the
    generator samples from the new version (it holds the very weights the trainer stepped)."""
    import torch

    from harness.learning.steps import start_trainer, trainer_generator
    from harness.llm.transformers_backend import TransformersGenerator
    from trainer.models import load_model

    settings = {
        "problem": "three",
        "model": "smollm2",
        "backend": "transformers",  # the generator shares the trainer's weights
        "group_size": 2,
        "candidates": 2,
        "max_tokens": 32,
        "workers": 1,
        "iterations": 3,
        "train_every": 1,
        "learning_rate": 1e-4,
        "drafts": 0,
        "skip_zero_advantage": False,  # the 135M model's groups may all be flat
    }
    config = build(settings)
    store = Store.open(tmp_path / "smollm2.db")
    campaign_id = run_campaign(config, store, Three())
    policies = store.policies(campaign_id)
    assert [p.step for p in policies] == [1, 2, 3]
    assert all(p.metrics["tokens"] > 0 and p.metrics["loss"] == p.metrics["loss"] for p in policies)
    # Step 1 ran on iteration 0's group before iteration 1 was generated (sampling after the
    # step is the in-process default): each iteration after the first from the newest version.
    with Session(store.engine) as session:
        written_by = session.scalars(
            select(RolloutGroup.policy_version_id).order_by(RolloutGroup.iteration)
        ).all()
    assert written_by == [None, policies[0].id, policies[1].id]

    # The weights moved away from the embedded model's.
    start = load_model("smollm2", dtype=torch.float32)
    trainer = start_trainer(config, store, campaign_id, "three", ["closeness"])
    assert trainer is not None and trainer.policy.step == 3
    changed = [
        name
        for (name, a), b in zip(
            start.named_parameters(), trainer.policy.model.parameters(), strict=True
        )
        if not torch.equal(a, b)
    ]
    assert changed

    # A generator for the resumed campaign samples from the trained weights, not the start's.
    generator = trainer_generator(config, trainer)
    assert isinstance(generator, TransformersGenerator)
    assert generator.hf_model is trainer.policy.model
    ids = torch.tensor([store.training_groups(campaign_id)[0].rollouts[0].prompt_token_ids])
    with torch.no_grad():
        assert not torch.allclose(generator.hf_model(ids).logits, start(ids).logits)


def test_a_token_budget_stops_the_campaign_at_the_batch_that_spends_it(
    tiny_model: str, tmp_path: Path
) -> None:
    """Runs compared at an equal cost: no batch starts once the generated tokens reach the
    budget, so a campaign ends within one batch past it, whatever its iteration budget."""
    config = build(fast_settings(tiny_model, iterations=6, concurrency=1, token_budget=60))
    store = Store.open(tmp_path / "campaign.db")
    lines: list[str] = []
    campaign_id = run_campaign(config, store, CirclePacking(), say=lines.append)
    summary = store.summary(campaign_id)
    groups = store.iterations_done(campaign_id)
    assert summary.tokens >= 60 and 0 < groups < 6
    # One batch (one iteration of G = 2 rollouts of at most 24 tokens) less was under budget.
    assert summary.tokens - 2 * 24 < 60
    assert any(line.startswith("token budget spent") for line in lines)
    campaign_invariants(store, campaign_id, groups, 2, 2)
