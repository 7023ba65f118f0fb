"""`vpo ui`: a read-only web dashboard over a solution database, live while a campaign writes.

The server keeps, per campaign, only what the page draws (record points, 2-D Pareto fronts, a
thinned score cloud, the best programs by mean score, progress points, each iteration's pool
diversity and parse rate, the first iteration each policy version sampled, a line of each
program the top table shows), never the tables. The first read is a handful of aggregate queries;
after that every request reads only the programs and groups stored since, which is correct
because programs, scores and groups' measures are never updated once written.

Everything from the database is untrusted (model output, program code): the page builds its DOM
with `textContent` only and is served with a Content-Security-Policy that runs no inline script,
so nothing stored can execute in the browser.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from harness.config.errors import UserError
from harness.observation import status, views
from harness.observation.gists import gist, problem_facts
from harness.records import CampaignRecord, IterationMeasures
from harness.store import REJECTIONS, Store
from harness.store.series import VersionRow

# Points the scatter cloud and the progress curve keep; they thin themselves past twice this.
CLOUD_POINTS = 2000
PROGRESS_POINTS = 400
# Iterations the pool diversity and parse rate chart draws (thinned past this, means kept).
MEASURE_POINTS = 1000
# Best programs kept in memory per ranking (the mean and the last few weightings asked for);
# enough for a table of 100 after removing copies.
TOP_KEPT = 400
RANKINGS_KEPT = 8


class CampaignView:
    """What the dashboard shows of one campaign, brought up to date by `refresh`."""

    def __init__(self, store: Store, campaign: CampaignRecord) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.campaign = campaign
        self.facts = problem_facts(campaign.problem)
        self._reset()

    def _reset(self) -> None:
        self.objectives: list[str] = self._store.objectives(self.campaign.id)
        self.last_id = 0
        self.last_group = 0
        self.counts: dict[str, int] = {}
        self.records: dict[str, list[tuple[int, int, float, float | None]]] = {
            name: [] for name in self.objectives
        }
        self.fronts: dict[tuple[str, str], list[tuple[int, float, float]]] = {
            pair: [] for pair in _pairs(self.objectives)
        }
        self.cloud: list[tuple[int, list[float]]] = []
        self.cloud_stride = 1
        # Normalised weights -> best (id, key, code hash); the mean's is filled at once.
        self.tops: dict[tuple[float, ...], list[tuple[int, float, str]]] = {}
        if self.objectives:
            self.tops[_normalised([1.0] * len(self.objectives))] = []
        self.progress: list[tuple[int, datetime]] = []
        self.progress_stride = 1
        self.groups: list[tuple[int, datetime, int]] = []
        # Group id -> its measures, and the highest group id read; their rejected candidates.
        self.measures: dict[int, IterationMeasures] = {}
        self.last_measured = 0
        self.rejected = _no_rejections()
        # What each policy version sampled, and what it was read at (groups, programs): read
        # again only when a group or a program was stored since.
        self.versions: list[dict[str, Any]] = []
        self.versions_at: tuple[int, int, int] | None = None
        # The rows those come from, by step, over the groups up to `version_group`
        # (`version_groups` of them).
        self.version_rows: dict[int, VersionRow] = {}
        self.version_group = self.version_groups = 0
        # Policy step -> the first iteration it sampled, and the highest group id read for it.
        self.first_sampled: dict[int, int] = {}
        self.last_sampled = 0
        # What is shown of programs, by id (programs are never updated): the record holders'
        # origins and the top table's gists.
        self.origins: dict[int, str] = {}
        self.gists: dict[int, dict[str, str]] = {}

    @property
    def programs(self) -> int:
        return sum(self.counts.values())

    def refresh(self) -> None:
        """Read what was stored since the last refresh; start over if the campaign's
        objectives changed or a program committed below what was already read (PostgreSQL
        sequences can commit out of order)."""
        with self._lock:
            store, cid = self._store, self.campaign.id
            self.campaign = next(c for c in store.campaigns() if c.id == cid)
            if store.objectives(cid) != self.objectives or (
                self.last_id and store.program_count(cid, upto=self.last_id) != self.programs
            ):
                self._reset()
            after = self.last_id
            upto = store.last_program_id(cid)
            if upto is None or upto <= after:
                self._read_groups()
                return
            new_counts = store.status_counts(cid, after, upto)
            # Thin at the source on a first read: a 100k-program cloud is never fetched whole.
            self.cloud_stride = max(self.cloud_stride, _stride(new_counts["ok"], CLOUD_POINTS))
            self.progress_stride = max(
                self.progress_stride, _stride(sum(new_counts.values()), PROGRESS_POINTS)
            )
            valid_before = self.counts.get("ok", 0)
            for name in self.objectives:
                best = self.records[name][-1][2] if self.records[name] else -1.0
                for pid, n, score, raw in store.record_points(cid, name, after, upto):
                    if score > best:
                        self.records[name].append((pid, n + valid_before, score, raw))
                        best = score
            for (x, y), front in self.fronts.items():
                self.fronts[(x, y)] = _front(front + store.pair_front(cid, x, y, after, upto))
            self.cloud += store.score_sample(cid, self.objectives, self.cloud_stride, after, upto)
            while len(self.cloud) > 2 * CLOUD_POINTS:
                self.cloud_stride *= 2
                self.cloud = [p for p in self.cloud if p[0] % self.cloud_stride == 0]
            for key, kept in self.tops.items():
                weights = dict(zip(self.objectives, key, strict=True))
                self.tops[key] = _merge(
                    kept, store.top_by_weights(cid, weights, TOP_KEPT, after, upto)
                )
            self.progress = _keep_last_and_stride(
                self.progress
                + store.progress_points(cid, self.progress_stride, self.programs, after, upto),
                self.progress_stride,
            )
            while len(self.progress) > 2 * PROGRESS_POINTS:
                self.progress_stride *= 2
                self.progress = _keep_last_and_stride(self.progress, self.progress_stride)
            for status, count in new_counts.items():
                self.counts[status] = self.counts.get(status, 0) + count
            self.last_id = upto
            self._read_groups()

    def _read_groups(self) -> None:
        new = self._store.group_tokens(self.campaign.id, self.last_group)
        if new:
            self.groups += new
            self.last_group = new[-1][0]
        self._read_measures()

    def _read_measures(self) -> None:
        """The measures of the groups stored since; all again when a group committed below
        the highest id read (concurrent workers on PostgreSQL can commit out of order)."""
        store, cid = self._store, self.campaign.id
        if self.last_measured and store.group_count(cid, self.last_measured) != len(self.measures):
            self.measures, self.last_measured, self.rejected = {}, 0, _no_rejections()
            self.first_sampled, self.last_sampled = {}, 0
        after = self.last_measured
        for measured in store.iteration_measures(cid, after):
            self.measures[measured.group_id] = measured
            self.last_measured = max(self.last_measured, measured.group_id)
        if self.last_measured > after:
            for reason, count in store.rejections(cid, after, self.last_measured).items():
                self.rejected[reason] += count
        for group_id, iteration, step in store.sampling_versions(cid, self.last_sampled):
            self.first_sampled[step] = min(iteration, self.first_sampled.get(step, iteration))
            self.last_sampled = max(self.last_sampled, group_id)

    def overview(self) -> dict[str, Any]:
        """Everything the main page draws."""
        self.refresh()
        with self._lock:
            policies = self._store.policies(self.campaign.id)
            origins = self._origins([points[-1][0] for points in self.records.values() if points])
            start = self.progress[0][1] if self.progress else None
            tokens, cumulative = [], 0
            for _, at, count in self.groups:
                cumulative += count
                tokens.append([_minutes(at, start), cumulative])
            return {
                "campaign": _campaign(self.campaign),
                "objectives": self.objectives,
                "programs": self.programs,
                "counts": self.counts,
                "iterations": len(self.groups),
                "tokens": cumulative,
                "policy_steps": len(policies),
                "best": {
                    name: views.with_record({"program_id": pid, "score": score, "raw": raw})
                    for name, points in self.records.items()
                    if points
                    for pid, _, score, raw in points[-1:]
                },
                # Where each best program came from: "seed" when nothing beat the seed yet.
                "best_origin": {
                    name: origins[points[-1][0]] for name, points in self.records.items() if points
                },
                # Each objective's description from the problem: why its values are what
                # they are (a gate holding one at 0); none where the problem is not installed.
                "notes": {n: self.facts.notes[n] for n in self.objectives if n in self.facts.notes},
                "version_starts": [
                    [iteration, step]
                    for step, iteration in sorted(self.first_sampled.items(), key=lambda s: s[1])
                    if step > 0
                ],
                "records": {
                    name: [[n, pid, score] for pid, n, score, _ in points]
                    for name, points in self.records.items()
                },
                "valid_programs": self.counts.get("ok", 0),
                "fronts": [
                    {"x": x, "y": y, "points": [list(p) for p in front]}
                    for (x, y), front in self.fronts.items()
                ],
                "cloud": [[pid, *vector] for pid, vector in self.cloud],
                "progress": {
                    "programs": [[_minutes(at, start), n] for n, at in self.progress],
                    "tokens": tokens,
                },
                "training": [{"step": p.step, **_numbers(p.metrics)} for p in policies],
                "versions": self._versions(len(policies)),
                "status": {
                    # Not `idle_s`: the page says whether it runs, and the overview stays a
                    # function of the database (a live view and a fresh one answer alike).
                    **{
                        k: v
                        for k, v in status.progress(self._store, self.campaign).items()
                        if k != "idle_s"
                    },
                    "candidates": self.rejected["candidates"],
                    "rejections": {k: n for k, n in self.rejected.items() if k != "candidates"},
                },
                "measures": _thinned(views.measure_series(list(self.measures.values()))),
                "last_program_id": self.last_id,
            }

    def _versions(self, steps: int) -> list[dict[str, Any]]:
        """Per policy version, what it sampled (`Store.version_measures`): the groups read
        since the last call added to the rows kept (a group's programs are stored with it and
        never change), all read again when a group committed below those read (concurrent
        workers on PostgreSQL)."""
        store, cid = self._store, self.campaign.id
        at = (len(self.groups), self.last_id, steps)
        if at == self.versions_at:
            return self.versions
        if self.version_group and store.group_count(cid, self.version_group) != self.version_groups:
            self.version_rows, self.version_group, self.version_groups = {}, 0, 0
        upto = max(self.last_group, self.version_group)
        for row in store.version_measures(cid, self.objectives, self.version_group, upto):
            if row.step in self.version_rows:
                self.version_rows[row.step].add(row)
            else:
                self.version_rows[row.step] = row
            self.version_groups += row.groups
        self.version_group = upto
        first = store.first_trained_step(cid)
        for row in self.version_rows.values():
            row.changed = first is not None and row.step >= first
        self.versions = [self.version_rows[step].as_json() for step in sorted(self.version_rows)]
        self.versions_at = at
        return self.versions

    def top(
        self,
        *,
        objective: str | None = None,
        weights: Sequence[float] | None = None,
        n: int = 50,
    ) -> list[dict[str, Any]]:
        """The top table. By one objective: a walk down the index. By weights (the mean when
        none): from the best programs kept for that weighting, which `refresh` keeps current;
        a weighting not asked for recently is read once (and falls back to a query when
        copies crowd the kept rows out)."""
        if objective is not None:
            return self._with_gists(
                views.top(self._store, self.campaign.id, objective=objective, n=n)
            )
        if not views.weights_by_objective(self.objectives, weights):
            return []
        self.refresh()
        key = _normalised(weights or [1.0] * len(self.objectives))
        with self._lock:
            if key not in self.tops:
                if len(self.tops) >= RANKINGS_KEPT:
                    del self.tops[next(k for k in self.tops if len(set(k)) > 1)]
                by = dict(zip(self.objectives, key, strict=True))
                # Read to the watermark: the next refresh adds what came after it.
                self.tops[key] = self._store.top_by_weights(
                    self.campaign.id, by, TOP_KEPT, 0, self.last_id
                )
            kept = list(self.tops[key])
        chosen = views.distinct_ranked(kept, n)
        if len(chosen) < n and len(kept) == TOP_KEPT:
            return self._with_gists(views.top(self._store, self.campaign.id, weights=weights, n=n))
        return self._with_gists(views.ranked_rows(self._store, chosen))

    def _with_gists(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows, each with its program's `gist` (read once per program)."""
        with self._lock:
            missing = [row["id"] for row in rows if row["id"] not in self.gists]
            if len(self.gists) + len(missing) > 4 * TOP_KEPT:
                self.gists = {}
                missing = [row["id"] for row in rows]
            for program in self._store.programs_by_ids(missing):
                self.gists[program.id] = gist(program.code, self.facts)
            return [{**row, "gist": self.gists[row["id"]]} for row in rows]

    def _origins(self, ids: Sequence[int]) -> dict[int, str]:
        """Program id -> origin ("seed", "llm", "migration"), read once per program."""
        missing = [i for i in dict.fromkeys(ids) if i not in self.origins]
        for program in self._store.programs_by_ids(missing):
            self.origins[program.id] = program.origin
        return self.origins


class Dashboard:
    """The campaigns of one database and their views."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._views: dict[int, CampaignView] = {}
        self._lock = threading.Lock()

    def campaigns(self) -> list[dict[str, Any]]:
        return [_campaign(c) for c in self.store.campaigns()]

    def view(self, campaign_id: int | None) -> CampaignView:
        campaigns = self.store.campaigns()
        if not campaigns:
            raise UserError(f"{self.store.where} holds no campaign yet")
        if campaign_id is None:
            campaign = campaigns[-1]
        else:
            found = [c for c in campaigns if c.id == campaign_id]
            if not found:
                raise LookupError(f"no campaign {campaign_id}")
            campaign = found[0]
        with self._lock:
            if campaign.id not in self._views:
                self._views[campaign.id] = CampaignView(self.store, campaign)
            return self._views[campaign.id]

    def warm(self) -> None:
        """Read every campaign once, so the first page a user opens answers at once."""
        for campaign in self.store.campaigns():
            self.view(campaign.id).refresh()


def _normalised(weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(round(w / total, 12) for w in weights)


def _merge(
    kept: list[tuple[int, float, str]], new: list[tuple[int, float, str]]
) -> list[tuple[int, float, str]]:
    """The best TOP_KEPT of both (a program once), best first, oldest first among equals."""
    unique = {row[0]: row for row in kept + new}
    return sorted(unique.values(), key=lambda r: (-r[1], r[0]))[:TOP_KEPT]


def _stride(count: int, points: int) -> int:
    """The smallest power of two that thins `count` items to at most `points`."""
    stride = 1
    while count > points * stride:
        stride *= 2
    return stride


def _pairs(objectives: Sequence[str]) -> list[tuple[str, str]]:
    return [(a, b) for i, a in enumerate(objectives) for b in objectives[i + 1 :]]


def _front(points: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """The 2-D non-dominated points, by descending x; the oldest stands for equal pairs."""
    front: list[tuple[int, float, float]] = []
    for pid, x, y in sorted(points, key=lambda p: (-p[1], -p[2], p[0])):
        if not front or y > front[-1][2]:
            front.append((pid, x, y))
    return front


def _keep_last_and_stride(
    points: list[tuple[int, datetime]], stride: int
) -> list[tuple[int, datetime]]:
    return [p for i, p in enumerate(points) if p[0] % stride == 0 or i == len(points) - 1]


def _thinned(series: dict[str, Any]) -> dict[str, Any]:
    """Every stride-th iteration of a measure series, and the last: about MEASURE_POINTS at
    most. The rolling means were taken over every iteration first."""
    count = len(series["iteration"])
    stride = _stride(count, MEASURE_POINTS)
    kept = [i for i in range(count) if i % stride == 0 or i == count - 1]
    return {
        key: value if key == "window" else [value[i] for i in kept] for key, value in series.items()
    }


def _no_rejections() -> dict[str, int]:
    return dict.fromkeys(("candidates", *REJECTIONS), 0)


def _minutes(at: datetime, start: datetime | None) -> float:
    return 0.0 if start is None else round((at - start).total_seconds() / 60, 4)


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics dict (a browser's JSON has no NaN)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _campaign(c: CampaignRecord) -> dict[str, Any]:
    return {
        "id": c.id,
        "name": c.name,
        "problem": c.problem,
        "status": c.status,
        "created_at": c.created_at.isoformat(),
    }
