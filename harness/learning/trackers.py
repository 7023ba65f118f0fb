"""Experiment trackers a campaign reports to (`vpo run --report-to tensorboard,mlflow`).

    reporter = open_reporter(config, store, campaign_id, name, objectives)   # None: none asked
    reporter.iteration(progress)      # after each stored iteration, steps = iteration number
    reporter.train_step(metrics)      # after each training step, steps = the policy's step
    reporter.close()

Per iteration: its parse rate and pool diversity, the best score so far per objective, the
hypervolume of the valid programs' score vectors (reference point 0), and this run's tokens/s
and evaluations/s. Per training step: every number `trainer.train.StepMetrics` holds. The
campaign's settings are the run's parameters, logged when the tracker's run is created.

Each tracker writes under one folder per campaign, whatever the database engine:
`trackers/NAME-RUN/tensorboard`, `.../mlflow`, `.../wandb`, `.../trackio` in the working
directory, or under `tracker_dir` (RUN: eight hex digits of the run id); the campaign says
where when it starts. A resumed campaign continues the same run: the run id is derived from
the campaign's name and id and the database, and the steps are iteration numbers and training
steps, which a resumed campaign continues, so nothing logged is overwritten.

Each tracker is an optional extra (`pip install 'vpo-evolve[tensorboard]'`); a missing one is
refused before the campaign starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from harness.config.errors import UserError
from harness.config.settings import CampaignSettings
from harness.learning.publish import safe_name
from trainer.measures import front_points, hypervolume

if TYPE_CHECKING:
    from harness.observation.progress import Progress
    from harness.store import Store
    from trainer.train import StepMetrics

# Tracker -> the module it needs (the extra of the same name installs it).
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
PROJECT = "vpo-evolve"  # the wandb / trackio project and the MLflow experiment
ITERATION = "iteration"  # the step axis of the per-iteration metrics
TRAIN_STEP = "train/step"  # the step axis of the per-step metrics
REPORTED = "tracker_reported"  # the event saying up to which group iterations were reported
SAVE_EVERY = 20  # iterations reported between two such events (and one at the end)


def check_installed(names: tuple[str, ...]) -> None:
    """A UserError naming the extra to install for the first tracker whose library is absent."""
    for name in names:
        if importlib.util.find_spec(MODULES[name]) is None:
            raise UserError(
                f"--report-to {name} needs the {MODULES[name]} package: "
                f"pip install 'vpo-evolve[{name}]'"
            )


def tracker_folder(config: CampaignSettings, store: Store, campaign_id: int, name: str) -> Path:
    """`TRACKER_DIR/NAME-RUN`, the same for every database engine: TRACKER_DIR is
    `tracker_dir`, or `trackers` in the working directory. RUN is the run id's digest, so
    two databases that each hold a campaign of the same name never share a folder."""
    root = Path(config.tracker_dir or "trackers").expanduser()
    digest = run_id(store, campaign_id, name).removeprefix("vpo-")[:8]
    return (root / f"{safe_name(name)}-{digest}").resolve()


def run_id(store: Store, campaign_id: int, campaign_name: str) -> str:
    """The same id every time this campaign runs: its name, id and database."""
    where = store.engine.url.render_as_string(hide_password=True)
    digest = hashlib.sha256(f"{where}|{campaign_id}|{campaign_name}".encode()).hexdigest()
    return f"vpo-{digest[:16]}"


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int, axis: str) -> None: ...

    def close(self) -> None: ...


def metric_name(name: str) -> str:
    """A name every tracker takes (MLflow allows letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-./]", "_", name)


def parameters(config: CampaignSettings) -> dict[str, str | int | float | bool]:
    """The campaign's settings as flat scalar parameters, the training ones among the rest
    under their one names (lists joined, unset ones empty)."""
    flat: dict[str, str | int | float | bool] = {}
    for key, value in config.flat().items():
        if value is None:
            value = ""
        elif isinstance(value, list | tuple):
            value = ",".join(map(str, value))
        flat[key] = value
    return flat


class TensorBoard:
    """Event files in one log dir; a resumed run adds an event file beside the old ones."""

    def __init__(self, folder: Path, run: str, name: str, config: CampaignSettings) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        fresh = not folder.exists()
        self.writer = SummaryWriter(log_dir=str(folder), flush_secs=10)
        if fresh:
            params = parameters(config)
            table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
            self.writer.add_text("config", f"| setting | value |\n|---|---|\n{table}")
            for summary in hparams(params, {}):  # the HPARAMS tab, in this run's own folder
                self.writer.file_writer.add_summary(summary)

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class MLflow:
    """A run in a local MLflow store (SQLite: MLflow refuses its plain-file store), found again
    by its `vpo.run_id` tag."""

    def __init__(self, folder: Path, run: str, name: str, config: CampaignSettings) -> None:
        import logging

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its table creation notes
        folder.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=f"sqlite:///{(folder / 'mlflow.db').resolve()}")
        experiment = self.client.get_experiment_by_name(PROJECT)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(
                PROJECT, artifact_location=(folder / "artifacts").resolve().as_uri()
            )
        )
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`vpo.run_id` = '{run}'", max_results=1
        )
        if found:
            self.run = found[0].info.run_id
            self.client.update_run(self.run, status="RUNNING")
        else:
            self.run = self.client.create_run(
                experiment_id, run_name=name, tags={"vpo.run_id": run}
            ).info.run_id
            # MLflow keeps a parameter's first value: set once, when the run is created.
            params = [Param(k, str(v)[:6000]) for k, v in parameters(config).items()]
            self.client.log_batch(self.run, params=params)

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(key, value, now, step) for key, value in metrics.items()]
        self.client.log_batch(self.run, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run)


class WandB:
    """A wandb run with a fixed id, resumed when it exists; `WANDB_MODE=offline` writes it
    under the folder without a network (`wandb sync` uploads it later)."""

    def __init__(self, folder: Path, run: str, name: str, config: CampaignSettings) -> None:
        import wandb

        fresh = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=name,
            id=run,
            resume="allow",
            dir=str(folder),
            config=parameters(config) if fresh else None,
        )
        # Two step axes: iterations and training steps.
        for axis, prefixes in ((ITERATION, ("iteration/*", "best/*")), (TRAIN_STEP, ("train/*",))):
            self.run.define_metric(axis)
            for prefix in prefixes:
                self.run.define_metric(prefix, step_metric=axis)

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        self.run.log({**metrics, axis: step})

    def close(self) -> None:
        self.run.finish()


class Trackio:
    """A trackio run, resumed by name; trackio keeps its runs under `TRACKIO_DIR`, which is
    set to the folder when the environment does not say otherwise."""

    def __init__(self, folder: Path, run: str, name: str, config: CampaignSettings) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("TRACKIO_DIR", str(folder.resolve()))  # read when it is imported
        import trackio

        # The run itself, not trackio's module functions: those find the run in a context
        # variable, which a campaign's other threads (its iterations are stored off the main
        # one) do not see ("Call trackio.init() before trackio.log()").
        self.run = trackio.init(
            project=PROJECT, name=f"{name}-{run}", config=parameters(config), resume="allow"
        )

    def log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        self.run.log({**metrics, axis: step}, step=step)

    def close(self) -> None:
        self.run.finish()


BACKENDS: dict[str, type] = {
    "tensorboard": TensorBoard,
    "mlflow": MLflow,
    "wandb": WandB,
    "trackio": Trackio,
}


@dataclass
class Reporter:
    """The trackers of one campaign run, fed from the database: what it measured per
    iteration since the last report, the best scores and the Pareto front of the valid
    programs so far. Iterations are reported from the evaluation thread and training steps
    from the loop's, so one lock orders them."""

    trackers: list[Tracker]
    store: Store
    campaign_id: int
    objectives: list[str]
    folder: Path | None = None  # where the trackers write
    # Without a record of what was reported, whether the stored iterations were: a campaign
    # resumed by `vpo run` reported its own; workers report none, for a follower to report.
    reported_before: bool = True
    last_group: int = 0
    last_program: int = 0
    front: np.ndarray | None = None  # (n, d) the distinct non-dominated valid score vectors
    volume: float = 0.0
    best: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._unsaved = 0  # iterations reported since the last REPORTED event
        saved = self.store.events(self.campaign_id, REPORTED)
        if saved:
            self.last_group = int(saved[-1].payload["group"])
        elif self.reported_before:
            newest = self.store.iteration_measures(self.campaign_id, last=1)
            self.last_group = newest[-1].group_id if newest else 0
        self.front = np.zeros((0, len(self.objectives)))
        self.best = {}
        self._read_programs()

    def _read_programs(self) -> None:
        ids, _islands, valid, scores, _hashes = self.store.program_vectors(
            self.campaign_id, self.objectives, after_id=self.last_program
        )
        if not len(ids):
            return
        self.last_program = int(ids[-1])
        fresh = scores[valid]
        if not len(fresh):
            return
        assert self.front is not None and self.best is not None
        for name, value in zip(self.objectives, fresh.max(axis=0), strict=True):
            self.best[name] = max(self.best.get(name, 0.0), float(value))
        front = front_points(np.vstack([self.front, fresh]))
        if not np.array_equal(front, self.front):
            self.front, self.volume = front, hypervolume(front)

    def iteration(self, progress: Progress | None) -> None:
        """Report the iterations stored since the last report (by this process or, for a
        follower, by the workers: `progress` None, whose throughput is theirs to know)."""
        with self._lock:
            measures = self.store.iteration_measures(self.campaign_id, after_group=self.last_group)
            if not measures:
                return
            self._read_programs()
            assert self.best is not None
            shared = {
                "iteration/hypervolume": self.volume,
                **{metric_name(f"best/{k}"): v for k, v in self.best.items()},
            }
            if progress is not None:
                wall = max(time.perf_counter() - progress.started, 1e-9)
                shared["iteration/tokens_per_second"] = progress.tokens / wall
                shared["iteration/evals_per_second"] = progress.evaluations / wall
            for measured in measures:
                metrics = dict(shared)
                if measured.parse_rate is not None:
                    metrics["iteration/parse_rate"] = measured.parse_rate
                if measured.pool_diversity is not None:
                    metrics["iteration/pool_diversity"] = measured.pool_diversity
                self._log(metrics, measured.iteration + 1, ITERATION)
                self.last_group = max(self.last_group, measured.group_id)
            self._unsaved += len(measures)
            if self._unsaved >= SAVE_EVERY:
                self._save()

    def train_step(self, metrics: StepMetrics) -> None:
        numbers = {
            metric_name(f"train/{key}"): float(value)
            for key, value in metrics.as_dict().items()
            if isinstance(value, int | float) and key != "step"
        }
        with self._lock:
            self._log(numbers, metrics.step, TRAIN_STEP)

    def _log(self, metrics: dict[str, float], step: int, axis: str) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step, axis)

    def _save(self) -> None:
        """Record how far the iterations were reported, for the next run or follower."""
        self.store.record_event(self.campaign_id, REPORTED, {"group": self.last_group})
        self._unsaved = 0

    def close(self) -> None:
        with self._lock:
            try:
                if self._unsaved:
                    self._save()  # a failure here (a full disk) costs a repeat on resume only
            finally:
                for tracker in self.trackers:
                    tracker.close()


def open_reporter(
    config: CampaignSettings,
    store: Store,
    campaign_id: int,
    name: str,
    objectives: list[str],
    reported_before: bool = True,
) -> Reporter | None:
    """The campaign's trackers, each resuming its run; None when it reports to none.
    `reported_before`: see `Reporter` (False for a follower of workers)."""
    if not config.report_to:
        return None
    check_installed(config.report_to)
    folder = tracker_folder(config, store, campaign_id, name)
    run = run_id(store, campaign_id, name)
    trackers: list[Tracker] = []
    try:
        for tracker in config.report_to:
            trackers.append(BACKENDS[tracker](folder / tracker, run, name, config))
        return Reporter(
            trackers, store, campaign_id, objectives, folder=folder, reported_before=reported_before
        )
    except BaseException:
        for opened in trackers:
            opened.close()
        raise
