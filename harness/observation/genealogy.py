"""The whole campaign as a tree: every program under its parent, laid out for the genealogy page.

A campaign is read once into arrays and then only its new programs (`FamilyTree.refresh`), so
the page costs one small query and some numpy per request even at 100,000 programs. Past
`limit` programs the page draws a chosen part and says so: the roots (seeds), the path from a
root to the best program of each objective, the 10 best of each objective with their ancestors,
the newest programs, and a sample of the rest that does not change as the campaign grows (a
program is in it by a hash of its id). A drawn program whose parent was left out hangs from
its nearest drawn ancestor, and the edge says how many generations it skips.

Layout: y is the program's generation; x puts each drawn tree's leaves side by side in id order,
a parent centred over its children, the roots ordered by island then id, a gap between islands.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from harness.store import Store

TOP_PER_OBJECTIVE = 10
NEWEST = 100
DEFAULT_LIMIT = 1500
MAX_LIMIT = 5000
ORIGINS = ("seed", "llm", "migration")
# Knuth's multiplicative hash: which programs the sample keeps depends on the id alone.
_HASH = np.uint64(2654435761)


class FamilyTree:
    """One campaign's programs as arrays (id order), grown by `refresh`; one request at a time
    (the dashboard serves requests from a thread pool)."""

    def __init__(self, store: Store, campaign_id: int) -> None:
        self.store = store
        self.campaign_id = campaign_id
        self._lock = threading.Lock()
        self.objectives = list(store.objectives(campaign_id))
        self.columns: dict[str, np.ndarray] = {}
        self.scores = np.zeros((0, len(self.objectives)))

    def refresh(self) -> None:
        """Read the programs stored since the last read."""
        with self._lock:
            self._refresh()

    def _refresh(self) -> None:
        after = int(self.columns["id"][-1]) if self.columns and len(self.columns["id"]) else 0
        objectives = list(self.store.objectives(self.campaign_id))
        if objectives != self.objectives:  # the first scores arrived: read everything again
            self.objectives, self.columns, after = objectives, {}, 0
            self.scores = np.zeros((0, len(objectives)))
        new = self.store.family(self.campaign_id, after)
        if not len(new["id"]):
            return
        ids, _, _, scores, _ = self.store.program_vectors(self.campaign_id, objectives, after)
        # Both reads are id-ordered; a program stored between them is left for the next refresh.
        keep = np.isin(new["id"], ids)
        new = {name: values[keep] for name, values in new.items()}
        scores = scores[np.isin(ids, new["id"])]
        self.columns = {
            name: np.concatenate([self.columns[name], values]) if self.columns else values
            for name, values in new.items()
        }
        self.scores = np.concatenate([self.scores, scores])

    def view(self, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """The page's data: nodes with positions, parent and draft edges, each objective's best
        path, and what was left out."""
        with self._lock:
            self._refresh()
            return self._view(limit)

    def _view(self, limit: int) -> dict[str, Any]:
        c, n = self.columns, len(self.columns.get("id", ()))
        if n == 0:
            return _empty(self.objectives)
        parent_row = _rows_of(c["id"], c["parent"])
        best = self._best_rows()
        best_paths = {name: _path(parent_row, row) for name, row in best.items()}
        shown = self._chosen(parent_row, best_paths, limit)
        hang, skipped = _nearest_shown(parent_row, shown)
        x = _layout(shown, hang, c["island"], c["id"])
        rows = np.flatnonzero(shown)
        drafts = self.store.drafts_shown([int(c["id"][r]) for r in rows if c["origin"][r] == 1])
        shown_ids = {int(c["id"][r]) for r in rows}
        draft_edges = [
            {"from": d, "to": pid} for pid, ds in drafts.items() for d in ds if d in shown_ids
        ]
        return {
            "objectives": self.objectives,
            "total": n,
            "shown": len(rows),
            "sampled": bool(len(rows) < n),
            "rule": None if len(rows) == n else _rule(limit),
            "nodes": [
                {
                    "id": int(c["id"][r]),
                    "parent": None if hang[r] < 0 else int(c["id"][hang[r]]),
                    "skipped": int(skipped[r]),
                    "x": float(x[r]),
                    "generation": int(c["generation"][r]),
                    "island": int(c["island"][r]),
                    "origin": ORIGINS[int(c["origin"][r])],
                    "valid": bool(c["valid"][r]),
                    "version": int(c["version"][r]),
                    "scores": [round(float(v), 6) for v in self.scores[r]],
                }
                for r in rows
            ],
            "draft_edges": draft_edges,
            "drafts_total": sum(len(ds) for ds in drafts.values()),
            "best": {
                name: {
                    "id": int(c["id"][row]),
                    "score": float(self.scores[row, self.objectives.index(name)]),
                    "is_seed": bool(c["origin"][row] == 0),
                    "path": [int(c["id"][r]) for r in best_paths[name]],
                }
                for name, row in best.items()
            },
            "versions": sorted({int(v) for v in c["version"][rows] if v >= 0}),
            "islands": sorted({int(i) for i in c["island"][rows]}),
        }

    def _best_rows(self) -> dict[str, int]:
        """Each objective's best valid program (the oldest among equals); none if none is valid."""
        valid = np.flatnonzero(self.columns["valid"])
        if not len(valid):
            return {}
        return {
            name: int(valid[np.argmax(self.scores[valid, j])])
            for j, name in enumerate(self.objectives)
        }

    def _chosen(
        self, parent_row: np.ndarray, best_paths: dict[str, list[int]], limit: int
    ) -> np.ndarray:
        """Which rows the page draws: all of them up to `limit`, else the rule in the module's
        docstring (which may pass `limit` by the best paths and top programs' ancestors)."""
        n = len(parent_row)
        if n <= limit:
            return np.ones(n, dtype=bool)
        shown = parent_row < 0  # the roots
        for path in best_paths.values():
            shown[path] = True
        valid = np.flatnonzero(self.columns["valid"])
        for j in range(len(self.objectives)):
            order = valid[np.argsort(-self.scores[valid, j], kind="stable")[:TOP_PER_OBJECTIVE]]
            for row in order:
                shown[_path(parent_row, int(row))] = True
        shown[-NEWEST:] = True
        room = limit - int(shown.sum())
        rest = np.flatnonzero(~shown)
        if room > 0 and len(rest):
            hashed = (self.columns["id"][rest].astype(np.uint64) * _HASH) % np.uint64(2**32)
            shown[rest[np.argsort(hashed, kind="stable")[:room]]] = True
        return shown


class Trees:
    """The dashboard's family trees, one per campaign, made on first use."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._trees: dict[int, FamilyTree] = {}
        self._lock = threading.Lock()

    def get(self, campaign_id: int) -> FamilyTree:
        with self._lock:
            if campaign_id not in self._trees:
                self._trees[campaign_id] = FamilyTree(self.store, campaign_id)
            return self._trees[campaign_id]

    def warm(self) -> None:
        """Read every campaign's tree once, so the genealogy page answers at once."""
        for campaign in self.store.campaigns():
            self.get(campaign.id).refresh()


def _rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The row of each wanted id in the sorted `ids`, -1 where it is absent (or -1 itself)."""
    rows = np.searchsorted(ids, wanted)
    clipped = np.minimum(rows, len(ids) - 1)
    return np.where((wanted >= 0) & (ids[clipped] == wanted), clipped, -1)


def _path(parent_row: np.ndarray, row: int) -> list[int]:
    """Rows from the root down to `row` through parents (a cycle, which the store forbids,
    stops the walk)."""
    path, seen = [], set()
    while row >= 0 and row not in seen:
        seen.add(row)
        path.append(row)
        row = int(parent_row[row])
    return path[::-1]


def _nearest_shown(parent_row: np.ndarray, shown: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each shown row, its nearest shown ancestor (-1: none) and how many rows between."""
    n = len(parent_row)
    hang = np.full(n, -1, dtype=np.int64)
    skipped = np.zeros(n, dtype=np.int64)
    for row in np.flatnonzero(shown):
        up, steps = int(parent_row[row]), 0
        while up >= 0 and not shown[up] and steps < n:
            up, steps = int(parent_row[up]), steps + 1
        hang[row], skipped[row] = (up, steps) if up >= 0 else (-1, 0)
    return hang, skipped


def _layout(shown: np.ndarray, hang: np.ndarray, island: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """x for each shown row: leaves left to right, parents centred over their children."""
    rows = np.flatnonzero(shown)
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for row in rows:  # id order, so children lists come out in id order
        (children.setdefault(int(hang[row]), []) if hang[row] >= 0 else roots).append(int(row))
    roots.sort(key=lambda r: (int(island[r]), int(ids[r])))
    x = np.zeros(len(shown))
    leaf = 0.0
    last_island: int | None = None
    for root in roots:
        if last_island is not None and island[root] != last_island:
            leaf += 2.0  # a gap between islands
        last_island = int(island[root])
        # Post-order without recursion: a campaign's tree can be thousands of levels deep.
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            row, done = stack.pop()
            kids = children.get(row, [])
            if done:
                x[row] = (x[kids[0]] + x[kids[-1]]) / 2
            elif kids:
                stack.append((row, True))
                stack.extend((k, False) for k in reversed(kids))
            else:
                x[row], leaf = leaf, leaf + 1.0
    return x


def _rule(limit: int) -> str:
    return (
        f"the roots, the path to each objective's best program, the {TOP_PER_OBJECTIVE} "
        f"best of each objective with their ancestors, the {NEWEST} newest, and a fixed sample "
        f"of the rest up to {limit:,}; a dotted edge skips programs left out"
    )


def _empty(objectives: list[str]) -> dict[str, Any]:
    return {
        "objectives": objectives, "total": 0, "shown": 0, "sampled": False, "rule": None,
        "nodes": [], "draft_edges": [], "drafts_total": 0, "best": {}, "versions": [],
        "islands": [],
    }  # fmt: skip
