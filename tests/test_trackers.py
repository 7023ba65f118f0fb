"""Experiment trackers fed by a real tiny campaign: what they wrote is read back with each
library's own reader, a resumed campaign appends to the same run, and a tracker whose library
is absent is refused before the campaign starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_campaign import fast_settings

from harness.campaign.loop import run_campaign
from harness.config.errors import UserError
from harness.config.files import load_toml
from harness.config.settings import build
from harness.store import Store
from problems.circle_packing import CirclePacking

ITERATION_TAGS = {
    "iteration/parse_rate",
    "iteration/hypervolume",
    "iteration/tokens_per_second",
    "iteration/evals_per_second",
}
TRAIN_TAGS = {
    "train/loss",
    "train/kl",
    "train/grad_norm",
    "train/clip_fraction",
    "train/mean_ratio",
    "train/set_score",
    "train/diversity",
    "train/trained",
    "train/seconds",
    "train/tokens_per_second",
}


def settings(model: str, iterations: int) -> dict[str, object]:
    # One iteration in flight and a step after every 2 groups; flat groups still train, so
    # every step has a loss.
    return fast_settings(
        model,
        backend="transformers",
        iterations=iterations,
        concurrency=1,
        train_every=2,
        micro_batch=1,
        skip_zero_advantage=False,
        report_to=["tensorboard", "mlflow"],
    )


def scalars(folder: Path) -> dict[str, list[int]]:
    """The steps of each scalar tag of the TensorBoard event files in `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_and_mlflow_hold_every_iteration_and_step_and_a_resume_appends(
    tmp_path: Path, tiny_model: str
) -> None:
    from mlflow.tracking import MlflowClient

    store = Store.open(tmp_path / "run.db")
    problem = CirclePacking()
    campaign_id = run_campaign(build(settings(tiny_model, 3)), store, problem)
    folder = tmp_path / "run.trackers" / "circle_packing"
    objectives = {f"best/{o.name}" for o in problem.objectives}

    tags = scalars(folder / "tensorboard")
    assert ITERATION_TAGS | TRAIN_TAGS | objectives <= set(tags)
    for tag in ITERATION_TAGS | objectives:
        assert tags[tag] == [1, 2, 3], tag
    for tag in TRAIN_TAGS:
        assert tags[tag] == [1], tag  # one step after iterations 1 and 2

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("vpo-evolve").experiment_id])
    assert run.data.params["iterations"] == "3" and run.data.params["report_to"]
    history = client.get_metric_history(run.info.run_id, "iteration/hypervolume")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert all(m.value > 0 for m in history)  # the seed is valid: its box has a volume
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    stored = store.policies(campaign_id)[0].metrics["loss"]
    assert [(m.step, m.value) for m in loss] == [(1, pytest.approx(stored))]

    # Resumed with a larger budget: the same runs go on from iteration 4 and step 2.
    run_campaign(build(settings(tiny_model, 5)), store, problem)
    tags = scalars(folder / "tensorboard")
    assert tags["iteration/parse_rate"] == [1, 2, 3, 4, 5]
    assert tags["train/loss"] == [1, 2]
    runs = client.search_runs([client.get_experiment_by_name("vpo-evolve").experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    history = client.get_metric_history(run.info.run_id, "iteration/parse_rate")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5]
    assert run.data.params == runs[0].data.params  # set once, at creation
    store.close()


def test_an_absent_tracker_is_one_line_naming_the_extra_before_the_campaign_starts(
    tmp_path: Path,
) -> None:
    assert importlib.util.find_spec("trackio") is None  # not installed here, on purpose
    store = Store.open(tmp_path / "run.db")
    config = build(fast_settings("no-such-model", report_to=["trackio"]))
    with pytest.raises(UserError) as info:
        run_campaign(config, store, CirclePacking())
    message = str(info.value)
    assert "pip install 'vpo-evolve[trackio]'" in message and "\n" not in message
    assert store.campaigns() == []  # refused before the campaign was made
    store.close()


def test_report_to_comes_from_a_toml_list_or_a_comma_flag(tmp_path: Path) -> None:
    from harness.cli.parser import build_parser

    file = tmp_path / "campaign.toml"
    file.write_text('[reporting]\nreport_to = ["tensorboard", "mlflow"]\ntracker_dir = "t"\n')
    config = build(load_toml(file))
    assert config.report_to == ("tensorboard", "mlflow") and config.tracker_dir == "t"
    assert build(load_toml(file), {"report_to": "none"}).report_to == ()
    args = build_parser().parse_args(["run", "--report-to", "wandb,tensorboard"])
    assert build({"report_to": args.report_to}).report_to == ("wandb", "tensorboard")
    assert 'report_to = ["tensorboard", "mlflow"]' in config.to_toml()
    for bad in (["tensorbord"], [1], "wandb,comet"):
        with pytest.raises(UserError, match="'report_to' must be a list") as info:
            build({"report_to": bad})
        assert "\n" not in str(info.value)
