"""Experiment trackers fed by a real tiny campaign: what they wrote is read back with each
library's own reader, a resumed campaign appends to the same run, and a tracker whose library
is absent is refused before the campaign starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_campaign import fast_settings

from harness.config.errors import UserError
from harness.config.files import load_toml
from harness.config.settings import build
from harness.evolution.loop import run_campaign
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


def campaign_folder(root: Path) -> Path:
    """The one folder the circle_packing campaign's trackers wrote under `root/trackers`."""
    (folder,) = (root / "trackers").glob("circle_packing-*")
    return folder


def scalars(folder: Path) -> dict[str, list[int]]:
    """The steps of each scalar tag of the TensorBoard event files in `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_and_mlflow_hold_every_iteration_and_step_and_a_resume_appends(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    store = Store.open(tmp_path / "run.db")
    problem = CirclePacking()
    campaign_id = run_campaign(build(settings(tiny_model, 3)), store, problem)
    folder = campaign_folder(tmp_path)
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


def wandb_history(folder: Path) -> tuple[list[dict[str, object]], dict[str, object]]:
    """The history rows and the config of the offline wandb runs under `folder`, read from
    their `.wandb` files: wandb's record log (a 7-byte header, then records of a 7-byte header,
    checksum, length and kind, in 32 KiB blocks), each record one of wandb's protobufs. wandb
    0.31 keeps its reader in Go (`wandb sync`), so the log is read here."""
    import json

    from wandb.proto import wandb_internal_pb2

    rows: list[dict[str, object]] = []
    config: dict[str, object] = {}
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B", path
        position, block, pieces = 7, 32768, b""
        while position + 7 <= len(data):
            left = block - position % block
            length = int.from_bytes(data[position + 4 : position + 6], "little")
            kind = data[position + 6]
            if left < 7 or (length == 0 and kind == 0):  # the rest of a block is padding
                position += left
                continue
            chunk = data[position + 7 : position + 7 + length]
            position += 7 + length
            pieces = chunk if kind in (1, 2) else pieces + chunk
            if kind not in (1, 4):  # a record's first or middle piece
                continue
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in record.history.item}
                )  # fmt: skip
            elif record.WhichOneof("record_type") in ("config", "run"):
                update = record.config if record.HasField("config") else record.run.config
                for item in update.update:
                    config[item.key] = json.loads(item.value_json)
    return rows, config


def test_wandb_offline_and_trackio_hold_every_iteration_and_step(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    store = Store.open(tmp_path / "run.db")
    config = {**settings(tiny_model, 3), "report_to": ["wandb", "trackio"]}
    campaign_id = run_campaign(build(config), store, CirclePacking())
    stored = store.policies(campaign_id)[0].metrics["loss"]
    folder = campaign_folder(tmp_path)

    rows, logged = wandb_history(folder / "wandb")
    iterations = [r for r in rows if "iteration/parse_rate" in r]
    assert [r["iteration"] for r in iterations] == [1, 2, 3]
    assert all(r["iteration/hypervolume"] > 0 for r in iterations)
    (step,) = [r for r in rows if "train/loss" in r]
    assert step["train/step"] == 1 and step["train/loss"] == pytest.approx(stored)
    assert logged["iterations"] == {"value": 3} or logged["iterations"] == 3

    # trackio's folder is fixed when it is first imported: the campaign's, as it imported it.
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_project_db_path("vpo-evolve").parent == folder / "trackio"
    (run,) = SQLiteStorage.get_runs("vpo-evolve")
    logs = SQLiteStorage.get_logs("vpo-evolve", run)
    assert [r["iteration"] for r in logs if "iteration/parse_rate" in r] == [1, 2, 3]
    (step,) = [r for r in logs if "train/loss" in r]
    assert step["train/step"] == 1 and step["train/loss"] == pytest.approx(stored)
    assert SQLiteStorage.get_run_config("vpo-evolve", run)["iterations"] == 3
    store.close()


def test_an_absent_tracker_is_one_line_naming_the_extra_before_the_campaign_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every tracker is installed for the tests: trackio's absence is made for this one.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a)
    )
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


def test_vpo_train_follow_reports_its_steps_to_the_campaigns_run(
    tmp_path: Path, tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower trains beside workers, which report to no tracker: the follower reports the
    iterations they stored and its own steps to the campaign's tracker run."""
    from harness.learning.offline import follow

    monkeypatch.chdir(tmp_path)
    store = Store.open(tmp_path / "run.db")
    # The iterations a worker would store: this run reports nothing.
    untrained = {**settings(tiny_model, 4), "train_every": 0, "report_to": []}
    campaign_id = run_campaign(build(untrained), store, CirclePacking())
    assert not (tmp_path / "trackers").exists()
    campaign = store.campaigns()[0]
    say: list[str] = []
    changes = {"train_every": 2, "report_to": ["tensorboard"]}
    assert follow(store, campaign, changes, steps=2, poll=0.01, say=say.append) == 2
    folder = campaign_folder(tmp_path)
    assert f"reporting to tensorboard in {folder}" in say
    tags = scalars(folder / "tensorboard")
    assert tags["iteration/parse_rate"] == [1, 2, 3, 4]
    assert tags["iteration/hypervolume"] == [1, 2, 3, 4]
    assert "iteration/tokens_per_second" not in tags  # the workers' to know
    assert tags["train/loss"] == [1, 2]
    assert [p.step for p in store.policies(campaign_id)] == [1, 2]
    store.close()


@pytest.mark.postgres
def test_every_engine_reports_under_one_default_folder_one_per_database(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./trackers/NAME-RUN` for SQLite and PostgreSQL alike; two databases that each hold a
    campaign of the same name write to two folders, and `tracker_dir` moves them all."""
    from harness.learning.trackers import tracker_folder

    monkeypatch.chdir(tmp_path)
    folders = []
    for where in (tmp_path / "a.db", tmp_path / "b.db", postgres_url):
        store = Store.open(where)
        folders.append(tracker_folder(build({}), store, 1, "circle packing"))
        moved = tracker_folder(build({"tracker_dir": "t"}), store, 1, "circle packing")
        assert moved == tmp_path / "t" / folders[-1].name
        store.close()
    assert {f.parent for f in folders} == {tmp_path / "trackers"}
    assert all(f.name.startswith("circle_packing-") for f in folders)
    assert len({f.name for f in folders}) == 3
