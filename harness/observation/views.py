"""Read-only views of a solution database: what `vpo db ...` prints (and the dashboard shows).

Each view returns plain JSON-ready data; the CLI renders it as a table or prints it as JSON.
Views read through `Store` with aggregate and keyed queries: score vectors as arrays, code only
for the handful of programs a view names.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.config.errors import UserError
from harness.observation import windows
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


def recent_measures(store: Store, campaign_id: int, window: int = windows.RECENT) -> dict[str, Any]:
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
    recorded: Sequence[IterationMeasures], window: int = windows.RECENT
) -> dict[str, Any]:
    """Per iteration, in iteration order: its pool diversity and parse rate (None where it has
    none) and their trailing means over it and the `window` - 1 iterations before it."""
    ordered = sorted(recorded, key=lambda m: m.iteration)
    series: dict[str, Any] = {"window": window, "iteration": [m.iteration for m in ordered]}
    for name in MEASURES:
        values = [getattr(m, name) for m in ordered]
        series[name] = values
        series[f"{name}_mean"] = windows.rolling_mean(values, window)
    return series


def bestk(store: Store, campaign_id: int, k: int = windows.MAX_K) -> dict[str, Any]:
    """best@k per objective and for the mean of the vector, and pass@k, for k = 1..`k` (at
    most the number of slots), over every candidate slot of every rollout of the campaign;
    an unparsed slot is a zero vector and never passes (see `trainer.measures`)."""
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
    return [
        {**program_row(p), "value": value} for p, (_, value) in zip(programs, chosen, strict=True)
    ]


def pareto(store: Store, campaign_id: int) -> list[dict[str, Any]]:
    """The valid programs no other valid program beats in every objective (one per code)."""
    objectives = store.objectives(campaign_id)
    ids, _, valid, scores, hashes = store.program_vectors(campaign_id, objectives)
    rows = np.flatnonzero(valid)
    front = rows[pareto_front(scores[rows])]
    # Best first objective first; among equal vectors the oldest (a migrant's original) first.
    front = front[np.lexsort((ids[front], *(-scores[front].T[::-1])))]
    chosen = _distinct(front, hashes, len(front))
    return [program_row(p) for p in store.programs_by_ids([int(ids[i]) for i in chosen])]


def show(store: Store, program_id: int) -> dict[str, Any]:
    """One program: its row, code, feedback, and where it came from (`origin_detail`: the
    group and the rollout, with the completion that wrote it; None for seeds and migrants)
    with `policy_version`, the step of the weights that sampled that rollout."""
    program = _program(store, program_id)
    detail = store.provenance(program_id)
    sampled_by = _sampled_by(detail)
    return {
        **program_row(program),
        "code": program.code,
        "code_hash": program.code_hash,
        "error": program.error,
        "eval_seconds": program.eval_seconds,
        "metrics": program.metrics,
        "created_at": program.created_at.isoformat(),
        "candidate_index": program.candidate_index,
        "origin_detail": detail,
        "policy_version": sampled_by,
    }


def _sampled_by(detail: dict[str, Any] | None) -> int | None:
    """The step of the policy version whose weights sampled the rollout, as `provenance` read
    it with the rollout: 0 for the weights the campaign started from (a rollout names no
    version then); None without a rollout, or when the version it names is not in the
    database. Taken out of the detail: the program shows it once, as `policy_version`."""
    if detail is None:
        return None
    return detail["trajectory"].pop("policy_version")


def diff(store: Store, program_id: int, other_id: int | None = None) -> dict[str, Any]:
    """A unified diff read as `git diff A B` reads: from `program_id` to `other_id`, the lines
    of `other_id` added; without `other_id`, from the program's parent to the program."""
    if other_id is None:
        program = _program(store, program_id)
        if program.parent_id is None:
            raise UserError(f"program {program_id} has no parent; name one to compare with")
        old, new = _program(store, program.parent_id), program
    else:
        old, new = _program(store, program_id), _program(store, other_id)
    lines = difflib.unified_diff(
        old.code.splitlines(keepends=True),
        new.code.splitlines(keepends=True),
        fromfile=f"program {old.id}",
        tofile=f"program {new.id}",
    )
    return {"from": old.id, "to": new.id, "diff": "".join(lines)}


# How far `lineage` follows a program's descendants by default: generations down, and programs
# in all (a seed of a long campaign has tens of thousands).
DESCENDANT_DEPTH = 4
DESCENDANT_LIMIT = 100


def lineage(
    store: Store, program_id: int, depth: int = DESCENDANT_DEPTH, limit: int = DESCENDANT_LIMIT
) -> dict[str, Any]:
    """Ancestry through parents and the drafts each ancestor's prompt showed, as a graph; and
    the descendants, breadth first: children, grandchildren, ... at most `depth` generations
    down and `limit` programs (`descendants_cut` says what was left out, else None). Each
    program listed has its status and scores (`objectives` names them in order)."""
    import networkx as nx

    program = _program(store, program_id)
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
    descendants, cut = _descendants(store, program_id, depth, limit)
    listed = [pid for pid, *_ in chain] + [d["id"] for d in descendants]
    children = store.children_counts(listed)
    standing = {
        pid: {"status": row["status"], "scores": row["scores"]}
        for pid, row in store.standing(listed).items()
    }
    if cut is None and descendants and depth > 0:
        deepest = [d["id"] for d in descendants if d["below"] == depth]
        further = sum(children.get(pid, 0) for pid in deepest)
        if further:
            programs = "1 program" if further == 1 else f"{further} programs"
            cut = f"{programs} {depth + 1} generations down, and all below, not shown"
    return {
        "program_id": program_id,
        "objectives": store.objectives(program.campaign_id),
        "depth": len(chain) - 1,
        "path": [
            {
                "id": pid,
                "island": island,
                "generation": generation,
                "origin": origin,
                "children": children.get(pid, 0),
                **standing[pid],
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
        "descendants": [
            {**d, "children": children.get(d["id"], 0), **standing[d["id"]]} for d in descendants
        ],
        "descendants_cut": cut,
    }


def _descendants(
    store: Store, program_id: int, depth: int, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The programs below `program_id`, generation by generation (`below`: 1 for a child), ids
    in order within one, at most `depth` generations and `limit` programs; and a note when
    `limit` cut them short. One keyed query on parent_id per generation."""
    found: list[dict[str, Any]] = []
    level = [program_id]
    for below in range(1, depth + 1):
        if not level:
            break
        children = store.children_of(level, limit - len(found) + 1)
        if len(found) + len(children) > limit:
            found += [{**c, "below": below} for c in children[: limit - len(found)]]
            return found, f"more than {limit} descendants; the first {limit} shown"
        found += [{**c, "below": below} for c in children]
        level = [c["id"] for c in children]
    return found, None


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


def program_row(p: ProgramRecord) -> dict[str, Any]:
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
