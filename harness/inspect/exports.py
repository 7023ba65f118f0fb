"""What `vpo db export` and `vpo db plot` write: a campaign's programs or trajectories as JSONL or
Parquet, and PNG plots of its progress, fronts, iterations and training."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.errors import UserError
from harness.inspect.views import measure_series, program_row
from harness.records import IterationMeasures, PolicyRecord
from harness.store import Store
from problems.api import record_note
from trainer.measures import pareto_front


def export(store: Store, campaign_id: int, what: str, fmt: str, out: Path) -> int:
    """Write programs or trajectories as JSONL (or Parquet); returns the number of rows."""
    if what not in ("programs", "trajectories"):
        raise UserError(f"--what must be programs or trajectories, not {what!r}")
    if fmt not in ("jsonl", "parquet"):
        raise UserError(f"--format must be jsonl or parquet, not {fmt!r}")
    if not out.parent.is_dir():  # a typo in the path must not become a tree of new folders
        raise UserError(f"--out {out}: there is no folder {out.parent}; create it first")
    rows = (
        _program_rows(store, campaign_id)
        if what == "programs"
        else _trajectory_rows(store, campaign_id)
    )
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError("--format parquet needs pyarrow: pip install pyarrow") from None
        table = pa.Table.from_pylist(list(rows))
        pq.write_table(table, out)
        return table.num_rows
    count = 0
    staging = out.with_name(out.name + ".partial")
    with staging.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, default=str) + "\n")
            count += 1
    staging.replace(out)
    return count


def plot(
    store: Store, campaign_id: int, out: Path, pair: Sequence[str] | None = None
) -> list[Path]:
    """PNG files in `out`: best value per objective over evaluations, the Pareto front of each
    pair of objectives (or of `pair`), every stored step metric over the training steps, pool
    diversity and parse rate per iteration, and evaluations and tokens over time. Returns the
    files written."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = store.objectives(campaign_id)
    if pair is not None and (len(pair) != 2 or any(p not in objectives for p in pair)):
        raise UserError(f"--pair needs two of the objectives {', '.join(objectives)}")
    ids, _, valid, scores, _ = store.program_vectors(campaign_id, objectives)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    figure, axis = plt.subplots(figsize=(7, 4))
    counted = np.where(valid[:, None], scores, 0.0)
    for j, name in enumerate(objectives):
        best = np.maximum.accumulate(counted[:, j])
        note = record_note(float(best[-1])) if len(best) else None
        label = name if note is None else f"{name} ({note})"
        axis.plot(np.arange(1, len(ids) + 1), best, label=label)
    if len(ids) and counted.max() > 1.0:
        # Only with a record: otherwise the line would squash a curve far below it.
        axis.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="best known value")
    axis.set(xlabel="programs evaluated", ylabel="best score", title="Best value per objective")
    written.append(_save(figure, axis, out / "best.png"))

    pairs = [tuple(pair)] if pair is not None else list(itertools.combinations(objectives, 2))
    for x_name, y_name in pairs:
        x, y = objectives.index(x_name), objectives.index(y_name)
        figure, axis = plt.subplots(figsize=(5.5, 5))
        points = scores[valid][:, [x, y]]
        axis.scatter(points[:, 0], points[:, 1], s=8, alpha=0.4, label="valid programs")
        front = points[pareto_front(points)]
        front = front[np.argsort(front[:, 0])]
        axis.plot(front[:, 0], front[:, 1], "o-", color="C3", label="Pareto front")
        axis.set(xlabel=x_name, ylabel=y_name, title=f"Pareto front: {x_name} vs {y_name}")
        written.append(_save(figure, axis, out / f"pareto_{_file(x_name)}_{_file(y_name)}.png"))

    written.append(_plot_training(store.policies(campaign_id), out / "training.png"))
    written.append(_plot_measures(store.iteration_measures(campaign_id), out / "iterations.png"))

    timeline = store.timeline(campaign_id)
    figure, axis = plt.subplots(figsize=(7, 4))
    if timeline["programs"]:
        start = timeline["programs"][0][0]
        minutes = [(t - start).total_seconds() / 60 for t, _ in timeline["programs"]]
        axis.plot(minutes, np.arange(1, len(minutes) + 1), drawstyle="steps-post", label="programs")
        if timeline["tokens"]:
            token_minutes = [(t - start).total_seconds() / 60 for t, _ in timeline["tokens"]]
            tokens = np.cumsum([n for _, n in timeline["tokens"]])
            twin = axis.twinx()
            twin.plot(token_minutes, tokens, color="C1", drawstyle="steps-post", label="tokens")
            twin.set_ylabel("tokens generated")
            twin.legend(loc="lower right")
    axis.set(xlabel="minutes", ylabel="programs stored", title="Evaluations and tokens")
    written.append(_save(figure, axis, out / "progress.png"))
    return written


def training_panels(policies: Sequence[PolicyRecord]) -> list[str]:
    """The step metrics training.png draws: every number a version stored but its step."""
    return sorted(
        {
            key
            for p in policies
            for key, value in p.metrics.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
    )


def _plot_training(policies: Sequence[PolicyRecord], path: Path) -> Path:
    """Every number a training step stored (loss, KL, gradient norm, set score, diversity,
    clipping, tokens/s, ...), one small panel each, over the policy versions."""
    import matplotlib.pyplot as plt

    steps = [p.step for p in policies]
    keys = training_panels(policies)
    columns = 4
    rows = max(1, -(-len(keys) // columns))
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for axis, key in zip(axes.flat, keys, strict=False):
        values = [p.metrics.get(key) for p in policies]
        axis.plot(steps, [np.nan if v is None else v for v in values], "o-", markersize=3)
        axis.set_title(key, fontsize=9)
        axis.tick_params(labelsize=7)
    for axis in list(axes.flat)[len(keys) :]:
        axis.axis("off")
    title = "Training steps" if policies else "Training (no policy versions yet)"
    figure.suptitle(title)
    figure.supxlabel("training step")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _plot_measures(recorded: Sequence[IterationMeasures], path: Path) -> Path:
    """Pool diversity above, parse rate below: each iteration's value as a dot, the rolling
    mean as a line."""
    import matplotlib.pyplot as plt

    series = measure_series(recorded)
    figure, axes = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    labels = {"pool_diversity": "pool diversity", "parse_rate": "parse rate"}
    for axis, (name, label) in zip(axes, labels.items(), strict=True):
        x = np.array(series["iteration"], dtype=float)
        values = np.array([np.nan if v is None else v for v in series[name]], dtype=float)
        mean = np.array([np.nan if v is None else v for v in series[f"{name}_mean"]], dtype=float)
        axis.plot(x, values, ".", color="C0", alpha=0.35, label=f"{label} of the iteration")
        axis.plot(x, mean, "-", color="C0", label=f"mean of the last {series['window']}")
        axis.set(ylabel=label)
        axis.grid(alpha=0.3)
    axes[1].set(xlabel="iteration", ylim=(-0.02, 1.02))
    axes[1].xaxis.get_major_locator().set_params(integer=True)
    title = "Candidates per iteration" if recorded else "Candidates per iteration (none yet)"
    axes[0].set_title(title)
    axes[0].legend(loc="upper left")
    return _save(figure, axes[1], path)


def _save(figure: Any, axis: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _file(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _program_rows(store: Store, campaign_id: int) -> Iterator[dict[str, Any]]:
    for p in store.iter_programs(campaign_id):
        yield {
            **program_row(p),
            "code": p.code,
            "code_hash": p.code_hash,
            "error": p.error,
            "eval_seconds": p.eval_seconds,
            "trajectory_id": p.trajectory_id,
            "candidate_index": p.candidate_index,
            "created_at": p.created_at.isoformat(),
        }


def _trajectory_rows(store: Store, campaign_id: int) -> Iterator[dict[str, Any]]:
    """One row per rollout with its group and its (candidates x d) reward matrix, zeros and mask
    False where a candidate holds no program: what a trainer reads."""
    objectives = store.objectives(campaign_id)
    for group, trajectories in store.iter_trajectory_groups(campaign_id):
        wanted = {
            c["program_id"]
            for t in trajectories
            for c in t["candidates"]
            if c.get("program_id") is not None
        }
        scores = {p.id: p.scores for p in store.programs_by_ids(sorted(wanted))}
        for t in trajectories:
            candidates = sorted(t["candidates"], key=lambda c: c["index"])
            yield {
                "group_id": group["id"],
                "iteration": group["iteration"],
                "island": group["island"],
                "parent_id": group["parent_program_id"],
                "draft_ids": group["draft_ids"],
                "prompt": group["prompt"],
                "prompt_token_ids": group["prompt_token_ids"],
                "train_step": group["train_step"],
                "trajectory_id": t["id"],
                "position": t["position"],
                "completion": t["completion"],
                "token_ids": t["token_ids"],
                "logprobs": t["logprobs"],
                "finish_reason": t["finish_reason"],
                "parse_status": t["parse_status"],
                "policy_version_id": t["policy_version_id"],
                "candidates": candidates,
                "objectives": objectives,
                "rewards": [
                    [
                        float(scores.get(c.get("program_id"), {}).get(name, 0.0))
                        for name in objectives
                    ]
                    for c in candidates
                ],
                "mask": [c.get("program_id") is not None for c in candidates],
            }
