"""What `vpo db plot` draws: PNG plots of a campaign's progress (best value per objective over
evaluations), its fronts, its iterations (pool diversity and parse rate, with the policy
versions that sampled them) and its training steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.errors import UserError
from harness.observation.views import measure_series
from harness.records import IterationMeasures, PolicyVersion
from harness.store import Store
from problems.api import record_note
from trainer.measures import pareto_front


def plot(
    store: Store, campaign_id: int, out: Path, pair: Sequence[str] | None = None
) -> list[Path]:
    """PNG files in `out`: best value per objective over evaluations, the Pareto front of each
    pair of objectives (or of `pair`), the training step metrics by kind, pool diversity and
    parse rate per iteration with the policy versions that sampled them, and evaluations and
    tokens over time. Returns the files written."""
    figures = plot_figures(store, campaign_id, pair)
    out.mkdir(parents=True, exist_ok=True)
    return [_save(figure, out / name) for name, figure in figures.items()]


def plot_figures(
    store: Store, campaign_id: int, pair: Sequence[str] | None = None
) -> dict[str, Any]:
    """The matplotlib figures `plot` saves, by file name, in the order it writes them."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.observation.gists import problem_facts, version_starts

    objectives = store.objectives(campaign_id)
    if pair is not None and (len(pair) != 2 or any(p not in objectives for p in pair)):
        raise UserError(f"--pair needs two of the objectives {', '.join(objectives)}")
    campaign = next(c for c in store.campaigns() if c.id == campaign_id)
    notes = problem_facts(campaign.problem).notes
    ids, _, valid, scores, _ = store.program_vectors(campaign_id, objectives)
    figures: dict[str, Any] = {}

    figure, axis = plt.subplots(figsize=(8, 4))
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
    _finish(axis)
    _note(figure, zero_notes(objectives, scores[valid], notes, partial=False))
    figures["best.png"] = figure

    pairs = [tuple(pair)] if pair is not None else list(itertools.combinations(objectives, 2))
    for x_name, y_name in pairs:
        x, y = objectives.index(x_name), objectives.index(y_name)
        figure, axis = plt.subplots(figsize=(7, 5))
        points = scores[valid][:, [x, y]]
        axis.scatter(points[:, 0], points[:, 1], s=8, alpha=0.4, label="valid programs")
        front = points[pareto_front(points)]
        front = front[np.argsort(front[:, 0])]
        axis.plot(front[:, 0], front[:, 1], "o-", color="C3", label="Pareto front")
        axis.set(xlabel=x_name, ylabel=y_name, title=f"Pareto front: {x_name} vs {y_name}")
        _finish(axis)
        _note(figure, zero_notes([x_name, y_name], points, notes, partial=True))
        figures[f"pareto_{_file(x_name)}_{_file(y_name)}.png"] = figure

    figures["training.png"] = _plot_training(store.policies(campaign_id))
    starts = version_starts(store.sampling_versions(campaign_id))
    figures["iterations.png"] = _plot_measures(store.iteration_measures(campaign_id), starts)

    timeline = store.timeline(campaign_id)
    figure, axis = plt.subplots(figsize=(7, 4))
    if timeline["programs"]:
        start = timeline["programs"][0][0]
        minutes = [(t - start).total_seconds() / 60 for t, _ in timeline["programs"]]
        axis.plot(minutes, np.arange(1, len(minutes) + 1), drawstyle="steps-post")
        if timeline["tokens"]:
            token_minutes = [(t - start).total_seconds() / 60 for t, _ in timeline["tokens"]]
            tokens = np.cumsum([n for _, n in timeline["tokens"]])
            twin = axis.twinx()
            twin.plot(token_minutes, tokens, color="C1", drawstyle="steps-post")
            # Each axis names its line in the line's colour: no legend to cover either.
            twin.set_ylabel("tokens generated", color="C1")
    axis.set(xlabel="minutes", title="Evaluations and tokens")
    axis.set_ylabel("programs stored", color="C0")
    _finish(axis)
    figures["progress.png"] = figure
    return figures


# The training step metrics (trainer/train.py StepMetrics) by what they tell, in this order;
# the rest follow by name under "Other step metrics".
TRAINING_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Loss", ("loss", "policy_loss")),
    ("KL to the reference", ("kl",)),
    ("Ratio and clipping", ("mean_ratio", "clip_fraction")),
    ("Set score and diversity", ("set_score", "diversity", "zero_std_fraction")),
)
# What each metric's y-axis shows; another metric is labelled by its name.
TRAINING_UNITS = {
    "loss": "loss",
    "policy_loss": "policy loss",
    "kl": "KL per token",
    "mean_ratio": "π_θ / π_old, token mean",
    "clip_fraction": "share of tokens clipped",
    "set_score": "set score, rollout mean",
    "diversity": "L1 distance, pair mean",
    "zero_std_fraction": "share of groups",
    "grad_norm": "gradient norm",
    "staleness": "versions behind",
    "fresh_gap": "|Δ log-prob| per token",
    "trained": "rollouts trained",
    "groups": "groups",
    "rollouts": "rollouts",
    "tokens": "completion tokens",
    "seconds": "seconds",
    "tokens_per_second": "tokens / s",
    "sampler_fraction": "share of rollouts",
    "cut_rollouts": "rollouts cut",
    "mismatched": "rollouts",
    "unshared": "rollouts",
    "checkpointed": "passes",
}
TRAINING_COLUMNS = 4


def training_panels(policies: Sequence[PolicyVersion]) -> list[str]:
    """Every number a version stored but its step, by name."""
    return sorted(
        {
            key
            for p in policies
            for key, value in p.metrics.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
    )


def training_layout(
    policies: Sequence[PolicyVersion],
) -> tuple[list[tuple[str, list[str]]], dict[str, float]]:
    """What training.png draws: (group title, its metrics) in TRAINING_GROUPS' order, the
    other metrics last; and the metrics left out because every step that stored one stored
    the same value (with that value). With fewer than two steps nothing is left out."""
    constant: dict[str, float] = {}
    for key in training_panels(policies):
        values = [p.metrics[key] for p in policies if _number(p.metrics.get(key))]
        if len(values) > 1 and all(v == values[0] for v in values):
            constant[key] = values[0]
    shown = [key for key in training_panels(policies) if key not in constant]
    grouped = {key for _, keys in TRAINING_GROUPS for key in keys}
    layout = [(title, [k for k in keys if k in shown]) for title, keys in TRAINING_GROUPS]
    layout.append(("Other step metrics", [k for k in shown if k not in grouped]))
    return [(title, keys) for title, keys in layout if keys], constant


def _plot_training(policies: Sequence[PolicyVersion]) -> Any:
    """The training step metrics over the policy versions, a row of panels per group (loss,
    KL, ratio and clipping, set score and diversity, the rest), each with what its y-axis
    shows; a note names the metrics left out for holding one value all along."""
    import matplotlib.pyplot as plt

    steps = [p.step for p in policies]
    layout, constant = training_layout(policies)
    if not layout:
        figure, axis = plt.subplots(figsize=(7, 3))
        said = "no policy versions yet" if not policies else "every metric held one value"
        axis.text(0.5, 0.5, said, ha="center", va="center", transform=axis.transAxes)
        axis.set(xlabel="training step", title="Training", xticks=[], yticks=[])
        figure.tight_layout()
        if constant:
            _note(figure, [_held(constant)])
        return figure
    heights = [-(-len(keys) // TRAINING_COLUMNS) for _, keys in layout]
    figure = plt.figure(figsize=(3.3 * TRAINING_COLUMNS, 2.5 * sum(heights) + 0.6))
    figure.set_layout_engine("constrained")
    groups = figure.subfigures(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    for group, (title, keys), rows in zip(groups, layout, heights, strict=True):
        group.suptitle(title, x=0.01, ha="left", fontsize=10, fontweight="bold")
        axes = list(group.subplots(rows, TRAINING_COLUMNS, squeeze=False).flat)
        for axis, key in zip(axes, keys, strict=False):
            values = [p.metrics.get(key) for p in policies]
            numbers = [v if _number(v) else np.nan for v in values]
            axis.plot(steps, numbers, "o-", markersize=3)
            axis.set_title(key, fontsize=9)
            axis.set_ylabel(TRAINING_UNITS.get(key, key.replace("_", " ")), fontsize=8)
            axis.set_xlabel("training step", fontsize=8)
            axis.tick_params(labelsize=7)
            axis.grid(alpha=0.3)
        for axis in axes[len(keys) :]:
            axis.axis("off")
    if constant:
        _note(figure, [_held(constant)])
    return figure


def _held(constant: dict[str, float]) -> str:
    held = ", ".join(f"{key} {value:g}" for key, value in constant.items())
    return f"Left out, the same at every step: {held}."


def _plot_measures(recorded: Sequence[IterationMeasures], starts: Sequence[tuple[int, int]]) -> Any:
    """Pool diversity above, parse rate below: each iteration's value as a dot, the rolling
    mean as a line; a dotted line where a policy version first sampled (labelled v<step>)."""
    import matplotlib.pyplot as plt

    series = measure_series(recorded)
    figure, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    labels = {
        "pool_diversity": ("pool diversity", "pool diversity (L1)"),
        "parse_rate": ("parse rate", "share of rollouts parsed"),
    }
    for axis, (name, (label, unit)) in zip(axes, labels.items(), strict=True):
        x = np.array(series["iteration"], dtype=float)
        values = np.array([np.nan if v is None else v for v in series[name]], dtype=float)
        mean = np.array([np.nan if v is None else v for v in series[f"{name}_mean"]], dtype=float)
        axis.plot(x, values, ".", color="C0", alpha=0.35, label=f"{label} of the iteration")
        axis.plot(x, mean, "-", color="C0", label=f"mean of the last {series['window']}")
        axis.set(ylabel=unit)
        axis.grid(alpha=0.3)
    axes[1].set(xlabel="iteration", ylim=(-0.02, 1.02))
    axes[1].xaxis.get_major_locator().set_params(integer=True)
    _version_lines(axes, starts)
    title = "Candidates per iteration" if recorded else "Candidates per iteration (none yet)"
    axes[0].set_title(title, pad=14 if starts else 6)
    for axis in axes:
        _finish(axis)
    figure.tight_layout()
    return figure


def _version_lines(axes: Sequence[Any], starts: Sequence[tuple[int, int]]) -> None:
    """A dotted line before the first iteration each policy version sampled, on every axis,
    labelled v<step> above the top one (about a dozen labels at most)."""
    every = max(1, -(-len(starts) // 12))
    for i, (iteration, step) in enumerate(starts):
        for axis in axes:
            axis.axvline(
                iteration - 0.5,
                color="C2",
                linestyle=":",
                linewidth=1,
                label="a new policy version samples" if i == 0 else None,
            )
        if i % every == 0:
            axes[0].text(
                iteration - 0.5,
                1.01,
                f"v{step}",
                transform=axes[0].get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
                color="C2",
            )


def zero_notes(
    names: Sequence[str], values: np.ndarray, notes: dict[str, str], *, partial: bool
) -> list[str]:
    """A line per objective at 0 in `values` (programs x objectives, in `names` order): at 0
    for every program, with the problem's own description of the objective where it has one
    (which says why: a gate holding simplicity at 0 until the fit beats it); with `partial`,
    also one at 0 for some programs, saying how many, where the problem describes it."""
    lines = []
    for j, name in enumerate(names):
        column = values[:, j]
        zeros = int(np.count_nonzero(column == 0))
        about = notes.get(name)
        if len(column) and zeros == len(column):
            lines.append(f"{name} is 0 for every valid program" + (f": {about}" if about else "."))
        elif partial and zeros and about:
            lines.append(f"{name} is 0 for {zeros} of {len(column)} valid programs: {about}")
    return lines


def _note(figure: Any, lines: Sequence[str]) -> None:
    """Lines under the figure, each wrapped to its width and a blank line apart (the saved
    image grows to hold them)."""
    import textwrap

    if not lines:
        return
    width = int(figure.get_figwidth() * 14)
    text = "\n\n".join(textwrap.fill(line, width, break_on_hyphens=False) for line in lines)
    figure.text(0.01, 0.0, text, ha="left", va="top", fontsize=8, color="0.25")


def _finish(axis: Any) -> None:
    """A grid, and the legend to the right of the axes, where it covers no point."""
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8)


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    # "tight": the saved image holds the legends and notes drawn outside the axes.
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _file(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
