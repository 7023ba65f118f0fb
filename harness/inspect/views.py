"""Read-only views of a solution database: what `vpo db ...` prints (and the dashboard shows).

Each view returns plain JSON-ready data; the CLI renders it as a table or prints it as JSON.
Views read through `Store` with aggregate and keyed queries: score vectors as arrays, code only
for the handful of programs a view names.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.errors import UserError
from harness.inspect import measures
from harness.records import IterationMeasures, ProgramRecord
from harness.store import Store
from problems.api import record_note
from trainer.measures import best_at_k, pareto_front, pass_at_k, passes


def summary_json(store: Store, campaign_id: int) -> dict[str, Any]:
    """What `vpo status` shows: counts by aggregate query, the best value per objective, each
    with `record` ("record: +2.0% over best known") when it beats the best known value, else
    None, and the recent iterations' pool diversity and parse rate (`recent_measures`)."""
    summary = store.summary(campaign_id)
    return {
        "programs": summary.programs,
        "valid_programs": summary.valid_programs,
        "evaluations": summary.evaluations,
        "groups": summary.groups,
        "skipped": summary.skipped,
        "trajectories": summary.trajectories,
        "policy_versions": summary.policy_versions,
        "tokens": summary.tokens,
        "best": {name: with_record(best) for name, best in summary.best.items()},
        "measures": recent_measures(store, campaign_id),
    }


MEASURES = ("pool_diversity", "parse_rate")


def recent_measures(
    store: Store, campaign_id: int, window: int = measures.RECENT
) -> dict[str, Any]:
    """Of the last `window` iterations: for pool diversity and for parse rate, the newest
    iteration's value (`latest`, from `iteration`) and the mean (`mean`) over those that have
    one (a skipped iteration has neither, one with fewer than two programs no diversity);
    None where none has."""
    recent = store.iteration_measures(campaign_id, last=window)
    report: dict[str, Any] = {"window": window}
    for name in MEASURES:
        values = [(m.iteration, getattr(m, name)) for m in recent if getattr(m, name) is not None]
        report[name] = {
            "latest": values[-1][1] if values else None,
            "iteration": values[-1][0] if values else None,
            "mean": float(np.mean([v for _, v in values])) if values else None,
        }
    return report


def measure_series(
    recorded: Sequence[IterationMeasures], window: int = measures.RECENT
) -> dict[str, Any]:
    """Per iteration, in iteration order: its pool diversity and parse rate (None where it has
    none) and their trailing means over it and the `window` - 1 iterations before it."""
    ordered = sorted(recorded, key=lambda m: m.iteration)
    series: dict[str, Any] = {"window": window, "iteration": [m.iteration for m in ordered]}
    for name in MEASURES:
        values = [getattr(m, name) for m in ordered]
        series[name] = values
        series[f"{name}_mean"] = measures.rolling_mean(values, window)
    return series


def bestk(store: Store, campaign_id: int, k: int = measures.MAX_K) -> dict[str, Any]:
    """best@k per objective and for the mean of the vector, and pass@k, for k = 1..`k` (at
    most the number of slots), over every candidate slot of every rollout of the campaign;
    an unparsed slot is a zero vector and never passes (see `harness.inspect.measures`)."""
    if k < 1:
        raise UserError(f"--k must be at least 1, not {k}")
    objectives = store.objectives(campaign_id)
    vectors, has_program = store.candidate_slots(campaign_id, objectives)
    n = len(vectors)
    if n == 0:
        raise UserError(
            "no candidates yet: the campaign has no rollouts; run some iterations first"
        )
    shown = min(k, n)
    mean = vectors.mean(axis=1) if objectives else np.zeros(n)
    best = best_at_k(np.column_stack([vectors, mean]), shown)  # (k, d + 1)
    passing = int(passes(vectors).sum())
    passed = pass_at_k(n, passing, shown)
    return {
        "objectives": objectives,
        "slots": n,
        "with_program": int(has_program.sum()),
        "passing": passing,
        "rows": [
            {
                "k": i + 1,
                "best": {name: float(best[i, j]) for j, name in enumerate(objectives)},
                "best_mean": float(best[i, -1]),
                "pass": float(passed[i]),
            }
            for i in range(shown)
        ],
    }


def with_record(best: dict[str, Any]) -> dict[str, Any]:
    """A best value ({"score", ...}) with its `record` note: None unless the score is above 1."""
    return {**best, "record": record_note(best["score"])}


def stats(store: Store, campaign_id: int) -> dict[str, Any]:
    report = summary_json(store, campaign_id)
    counts = store.counts(campaign_id)
    report["programs_by_status"] = counts.programs
    report["events"] = counts.events
    report["objectives"] = store.objectives(campaign_id)
    report["policy_steps"] = [p.step for p in store.policies(campaign_id)]
    report["last_skipped"] = store.skipped_iterations(campaign_id)
    return report


def top(
    store: Store,
    campaign_id: int,
    *,
    objective: str | None = None,
    weights: Sequence[float] | None = None,
    n: int = 10,
) -> list[dict[str, Any]]:
    """The n best valid programs by one objective, by a weighted mean, or by the mean; one
    program per code (a migrant's copies count once). Ordered queries, no vectors loaded."""
    objectives = store.objectives(campaign_id)
    if objective is not None and weights is not None:
        raise UserError("give --objective or --weights, not both")
    if objective is not None:
        if objective not in objectives:
            raise UserError(f"no objective {objective!r}; the campaign has {', '.join(objectives)}")
        return ranked_rows(
            store,
            _best_distinct(lambda k: store.best_by_objective(campaign_id, objective, k), n),
        )
    by = weights_by_objective(objectives, weights)
    if not by:
        return []
    return ranked_rows(store, _best_distinct(lambda k: store.top_by_weights(campaign_id, by, k), n))


def weights_by_objective(
    objectives: Sequence[str], weights: Sequence[float] | None
) -> dict[str, float]:
    """Objective -> weight, all 1 when `weights` is None; a UserError unless there is one
    finite weight >= 0 per objective, not all 0. Infinity and NaN are refused here, for the
    command line and the dashboard alike: a weighted sum with them has no order, and their
    total (which the dashboard divides by) must be a positive finite number."""
    if weights is not None and (
        len(weights) != len(objectives)
        or any(not (w >= 0 and math.isfinite(w)) for w in weights)
        or not 0 < sum(weights) < math.inf
    ):
        raise UserError(
            f"--weights needs {len(objectives)} numbers, finite and >= 0, not all 0 "
            f"(one per objective: {', '.join(objectives)})"
        )
    return dict(zip(objectives, weights or [1.0] * len(objectives), strict=True))


def _best_distinct(
    fetch: Callable[[int], list[tuple[int, float, str]]], n: int
) -> list[tuple[int, float]]:
    """The n best distinct codes from an ordered query; asks for more rows while copies
    (migrants share code) crowd the distinct ones out."""
    limit = 2 * n
    while True:
        rows = fetch(limit)
        chosen = distinct_ranked(rows, n)
        if len(chosen) >= n or len(rows) < limit:
            return chosen
        limit *= 4


def distinct_ranked(rows: Sequence[tuple[int, float, str]], n: int) -> list[tuple[int, float]]:
    """(program id, value) of the first n ranked rows whose code hash was not seen earlier."""
    seen: set[str] = set()
    chosen = []
    for program_id, value, digest in rows:
        if digest not in seen:
            seen.add(digest)
            chosen.append((program_id, value))
            if len(chosen) == n:
                break
    return chosen


def ranked_rows(store: Store, chosen: Sequence[tuple[int, float]]) -> list[dict[str, Any]]:
    programs = store.programs_by_ids([program_id for program_id, _ in chosen])
    return [{**_row(p), "value": value} for p, (_, value) in zip(programs, chosen, strict=True)]


def pareto(store: Store, campaign_id: int) -> list[dict[str, Any]]:
    """The valid programs no other valid program beats in every objective (one per code)."""
    objectives = store.objectives(campaign_id)
    ids, _, valid, scores, hashes = store.program_vectors(campaign_id, objectives)
    rows = np.flatnonzero(valid)
    front = rows[pareto_front(scores[rows])]
    # Best first objective first; among equal vectors the oldest (a migrant's original) first.
    front = front[np.lexsort((ids[front], *(-scores[front].T[::-1])))]
    chosen = _distinct(front, hashes, len(front))
    return [_row(p) for p in store.programs_by_ids([int(ids[i]) for i in chosen])]


def show(store: Store, program_id: int) -> dict[str, Any]:
    program = _program(store, program_id)
    return {
        **_row(program),
        "code": program.code,
        "code_hash": program.code_hash,
        "error": program.error,
        "eval_seconds": program.eval_seconds,
        "metrics": program.metrics,
        "created_at": program.created_at.isoformat(),
        "candidate_index": program.candidate_index,
        "origin_detail": store.provenance(program_id),
    }


def diff(store: Store, program_id: int, other_id: int | None = None) -> dict[str, Any]:
    """A unified diff from `other_id` (default: the program's parent) to the program."""
    program = _program(store, program_id)
    if other_id is None:
        if program.parent_id is None:
            raise UserError(f"program {program_id} has no parent; name one to compare with")
        other_id = program.parent_id
    other = _program(store, other_id)
    lines = difflib.unified_diff(
        other.code.splitlines(keepends=True),
        program.code.splitlines(keepends=True),
        fromfile=f"program {other_id}",
        tofile=f"program {program_id}",
    )
    return {"from": other_id, "to": program_id, "diff": "".join(lines)}


def lineage(store: Store, program_id: int) -> dict[str, Any]:
    """Ancestry through parents and the drafts each ancestor's prompt showed, as a graph."""
    import networkx as nx

    _program(store, program_id)
    chain = store.ancestry(program_id)
    graph = nx.DiGraph()
    for pid, parent, island, generation, origin in chain:
        graph.add_node(pid, island=island, generation=generation, origin=origin)
        if parent is not None:
            graph.add_edge(parent, pid, kind="parent")
    shown = store.drafts_shown([pid for pid, *_ in chain])
    for pid, *_ in chain:
        for draft in shown.get(pid, []):
            if not graph.has_node(draft):
                graph.add_node(draft)
            graph.add_edge(draft, pid, kind="draft")
    children = store.children_counts([pid for pid, *_ in chain])
    return {
        "program_id": program_id,
        "depth": len(chain) - 1,
        "path": [
            {
                "id": pid,
                "island": island,
                "generation": generation,
                "origin": origin,
                "children": children.get(pid, 0),
            }
            for pid, _, island, generation, origin in chain
        ],
        "islands": sorted({island for _, _, island, _, _ in chain}),
        "branching": float(np.mean([children.get(pid, 0) for pid, *_ in chain[1:]]))
        if len(chain) > 1
        else 0.0,
        "drafts_shown": sum(1 for *_, kind in graph.edges(data="kind") if kind == "draft"),
        "ancestors_in_graph": graph.number_of_nodes() - 1,
        "edges": [{"from": a, "to": b, "kind": kind} for a, b, kind in graph.edges(data="kind")],
    }


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
    pair of objectives (or of `pair`), diversity and set score over training steps, pool
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

    policies = store.policies(campaign_id)
    figure, axis = plt.subplots(figsize=(7, 4))
    steps = [p.step for p in policies]
    for key in ("diversity", "set_score"):
        axis.plot(steps, [p.metrics.get(key, np.nan) for p in policies], "o-", label=key)
    title = "Training" if policies else "Training (no policy versions yet)"
    axis.set(xlabel="training step", ylabel="value", title=title)
    written.append(_save(figure, axis, out / "training.png"))
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
            **_row(p),
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


def _distinct(order: np.ndarray, hashes: list[str], n: int) -> list[int]:
    """The first n positions of `order` whose code was not seen earlier (migrants are copies)."""
    seen: set[str] = set()
    chosen: list[int] = []
    for i in order:
        if hashes[i] in seen:
            continue
        seen.add(hashes[i])
        chosen.append(int(i))
        if len(chosen) == n:
            break
    return chosen


def _program(store: Store, program_id: int) -> ProgramRecord:
    program = store.program(program_id)
    if program is None:
        raise UserError(f"no program {program_id} in {store.where}")
    return program


def _row(p: ProgramRecord) -> dict[str, Any]:
    return {
        "id": p.id,
        "island": p.island,
        "generation": p.generation,
        "origin": p.origin,
        "status": p.status,
        "parent_id": p.parent_id,
        "scores": dict(p.scores),
        "raw": dict(p.raw),
    }
