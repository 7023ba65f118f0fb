"""Aggregates for the views and the dashboard.

Programs and scores are never updated once written, so each query takes `after_id` (and
`upto`): the same query over only the programs stored in (after_id, upto], which a caller
merges into what it read before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, literal, select, text

from harness.records import is_case
from harness.store.opening import Database
from harness.store.tables import (
    EVENT,
    GROUP,
    PROGRAM,
    SCORE,
    TRAJECTORY,
    count_by_status,
    float_or_none,
    id_range,
)

# Why candidate slots were rejected: the slot outcomes and the evaluated programs' statuses
# (`Aggregates.rejections`), in the order `vpo status` lists them.
REJECTIONS = ("unparsed", "duplicate", "lazy", "near", "invalid", "error", "timeout")

# Every distinct objective name, one index seek each (a loose index scan).
_DISTINCT_OBJECTIVES = text(
    "WITH RECURSIVE names(name) AS ("
    " SELECT min(objective) FROM score"
    " UNION ALL"
    " SELECT (SELECT min(objective) FROM score WHERE objective > names.name)"
    " FROM names WHERE names.name IS NOT NULL"
    ") SELECT name FROM names WHERE name IS NOT NULL ORDER BY name"
)


class Aggregates(Database):
    def objectives(self, campaign_id: int) -> list[str]:
        """The objective names the campaign's programs were scored on, sorted; its problem's
        cases (harness.records.CASE_PREFIX) left out: `cases` lists those.

        The distinct names come from the (objective, value) index by skipping from one name to
        the next (a handful of index seeks, not a scan of every score); each is then checked
        for a program of this campaign."""
        return [name for name in self._score_names(campaign_id) if not is_case(name)]

    def cases(self, campaign_id: int) -> list[str]:
        """The case names (with their CASE_PREFIX) the campaign's programs were scored on."""
        return [name for name in self._score_names(campaign_id) if is_case(name)]

    def _score_names(self, campaign_id: int) -> list[str]:
        with self._reading() as connection:
            names = connection.execute(_DISTINCT_OBJECTIVES).scalars().all()
            return [
                name
                for name in names
                if connection.scalar(
                    select(literal(1))
                    .select_from(SCORE.join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id))
                    .where(SCORE.c.objective == name, PROGRAM.c.campaign_id == campaign_id)
                    .limit(1)
                )
            ]

    def best_by_objective(
        self, campaign_id: int, objective: str, limit: int
    ) -> list[tuple[int, float, str]]:
        """(program id, score, code hash) of the `limit` best valid programs by `objective`,
        best first, oldest first among equals: a walk down the `ix_score_ranked` index that
        stops after `limit` valid rows."""
        with self._reading() as connection:
            rows = connection.execute(
                select(SCORE.c.program_id, SCORE.c.value, PROGRAM.c.code_hash)
                .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
                .where(
                    PROGRAM.c.campaign_id == campaign_id,
                    PROGRAM.c.status == "ok",
                    SCORE.c.objective == objective,
                )
                .order_by(SCORE.c.value.desc(), SCORE.c.program_id)
                .limit(limit)
            ).all()
        return [(r.program_id, r.value, r.code_hash) for r in rows]

    def top_by_weights(
        self,
        campaign_id: int,
        weights: Mapping[str, float],
        limit: int,
        after_id: int = 0,
        upto: int | None = None,
    ) -> list[tuple[int, float, str]]:
        """(program id, weighted mean score, code hash) of the `limit` best valid programs
        among those in (after_id, upto], best first, oldest first among equals: one aggregate
        over their score rows (about 0.25 s for 100k programs of 3 objectives on SQLite)."""
        total = sum(weights.values())
        if not weights or total <= 0 or any(not w >= 0 for w in weights.values()):
            raise ValueError("weights must be >= 0 and not all 0")
        weight = case(
            *((SCORE.c.objective == name, w / total) for name, w in weights.items() if w > 0),
            else_=0.0,
        )
        key = func.sum(SCORE.c.value * weight).label("key")
        ranked = (
            select(SCORE.c.program_id, key)
            .where(*_valid_scores(campaign_id, after_id, upto))
            .group_by(SCORE.c.program_id)
            .order_by(key.desc(), SCORE.c.program_id)
            .limit(limit)
            .subquery()
        )
        with self._reading() as connection:
            rows = connection.execute(
                select(ranked.c.program_id, ranked.c.key, PROGRAM.c.code_hash)
                .join(PROGRAM, PROGRAM.c.id == ranked.c.program_id)
                .order_by(ranked.c.key.desc(), ranked.c.program_id)
            ).all()
        return [(r.program_id, float(r.key), r.code_hash) for r in rows]

    def record_points(
        self, campaign_id: int, objective: str, after_id: int = 0, upto: int | None = None
    ) -> list[tuple[int, int, float, float | None]]:
        """(program id, n, score, raw) for each valid program above `after_id` that beat every
        earlier one there on `objective`; n counts the valid programs from the first one above
        `after_id`. The curve of the best value so far, from one windowed scan."""
        earlier = func.max(SCORE.c.value).over(order_by=SCORE.c.program_id, rows=(None, -1))
        scan = (
            select(
                SCORE.c.program_id,
                SCORE.c.value,
                SCORE.c.raw,
                func.row_number().over(order_by=SCORE.c.program_id).label("n"),
                earlier.label("earlier"),
            )
            .where(
                _objective_in([objective], after_id),
                *_valid_scores(campaign_id, after_id, upto),
            )
            .subquery()
        )
        with self._reading() as connection:
            rows = connection.execute(
                select(scan.c.program_id, scan.c.n, scan.c.value, scan.c.raw)
                .where((scan.c.earlier.is_(None)) | (scan.c.value > scan.c.earlier))
                .order_by(scan.c.program_id)
            ).all()
        return [(r.program_id, r.n, float(r.value), float_or_none(r.raw)) for r in rows]

    def pair_front(
        self, campaign_id: int, x: str, y: str, after_id: int = 0, upto: int | None = None
    ) -> list[tuple[int, float, float]]:
        """(program id, x score, y score) of the valid programs above `after_id` that no other
        there beats on both objectives, by descending x; the oldest stands for equal pairs."""
        pivot = (
            select(
                SCORE.c.program_id.label("id"),
                func.max(case((SCORE.c.objective == x, SCORE.c.value))).label("x"),
                func.max(case((SCORE.c.objective == y, SCORE.c.value))).label("y"),
            )
            .where(
                _objective_in([x, y], after_id),
                *_valid_scores(campaign_id, after_id, upto),
            )
            .group_by(SCORE.c.program_id)
            .subquery()
        )
        order = (pivot.c.x.desc(), pivot.c.y.desc(), pivot.c.id)
        scan = select(
            pivot.c.id,
            pivot.c.x,
            pivot.c.y,
            func.max(pivot.c.y).over(order_by=order, rows=(None, -1)).label("higher"),
        ).subquery()
        with self._reading() as connection:
            rows = connection.execute(
                select(scan.c.id, scan.c.x, scan.c.y)
                .where(
                    scan.c.x.is_not(None),
                    scan.c.y.is_not(None),
                    scan.c.higher.is_(None) | (scan.c.y > scan.c.higher),
                )
                .order_by(scan.c.x.desc(), scan.c.y.desc())
            ).all()
        return [(r.id, float(r.x), float(r.y)) for r in rows]

    def score_sample(
        self,
        campaign_id: int,
        objectives: Sequence[str],
        stride: int,
        after_id: int = 0,
        upto: int | None = None,
    ) -> list[tuple[int, list[float]]]:
        """(program id, scores) of the valid programs above `after_id` whose id is a multiple
        of `stride`: an even thinning of the cloud a scatter plot draws."""
        wanted = _valid_ids(campaign_id, after_id, upto).where(PROGRAM.c.id % stride == 0)
        vectors: dict[int, list[float]] = {}
        column = {name: j for j, name in enumerate(objectives)}
        with self._reading() as connection:
            for program_id, objective, value in connection.execute(
                select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value)
                .where(
                    SCORE.c.program_id.in_(wanted),
                    *id_range(SCORE.c.program_id, after_id, upto),
                    _objective_in(objectives, after_id),
                )
                .order_by(SCORE.c.program_id)
            ):
                vectors.setdefault(program_id, [0.0] * len(objectives))[column[objective]] = value
        return list(vectors.items())

    def progress_points(
        self,
        campaign_id: int,
        stride: int,
        offset: int = 0,
        after_id: int = 0,
        upto: int | None = None,
    ) -> list[tuple[int, datetime]]:
        """(n, stored at) of the programs in (after_id, upto] whose number n (counted from
        `offset` + 1) is a multiple of `stride`, and of the last one: programs over time."""
        where = [PROGRAM.c.campaign_id == campaign_id, *id_range(PROGRAM.c.id, after_id, upto)]
        numbered = select(
            PROGRAM.c.id,
            PROGRAM.c.created_at,
            (func.row_number().over(order_by=PROGRAM.c.id) + offset).label("n"),
        ).where(*where)
        with self._reading() as connection:
            last = connection.scalar(select(func.max(PROGRAM.c.id)).where(*where))
            if last is None:
                return []
            numbered = numbered.subquery()
            rows = connection.execute(
                select(numbered.c.n, numbered.c.created_at)
                .where((numbered.c.n % stride == 0) | (numbered.c.id == last))
                .order_by(numbered.c.n)
            ).all()
        return [(n, at) for n, at in rows]

    def timeline(self, campaign_id: int) -> dict[str, list[Any]]:
        """When programs were stored and tokens generated: (created_at, ...) rows in order,
        for plots of progress over time."""
        with self._reading() as connection:
            programs = connection.execute(
                select(PROGRAM.c.created_at, PROGRAM.c.origin)
                .where(PROGRAM.c.campaign_id == campaign_id)
                .order_by(PROGRAM.c.id)
            ).all()
            tokens = connection.execute(
                select(TRAJECTORY.c.created_at, TRAJECTORY.c.num_tokens)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(GROUP.c.campaign_id == campaign_id)
                .order_by(TRAJECTORY.c.id)
            ).all()
        return {
            "programs": [(row.created_at, row.origin) for row in programs],
            "tokens": [(row.created_at, row.num_tokens) for row in tokens],
        }

    def group_tokens(
        self, campaign_id: int, after_group: int = 0
    ) -> list[tuple[int, datetime, int]]:
        """(group id, stored at, tokens its rollouts generated) of each group above
        `after_group`, in order."""
        with self._reading() as connection:
            rows = connection.execute(
                select(
                    GROUP.c.id,
                    GROUP.c.created_at,
                    func.coalesce(func.sum(TRAJECTORY.c.num_tokens), 0),
                )
                .join(TRAJECTORY, TRAJECTORY.c.group_id == GROUP.c.id)
                .where(GROUP.c.campaign_id == campaign_id, GROUP.c.id > after_group)
                .group_by(GROUP.c.id, GROUP.c.created_at)
                .order_by(GROUP.c.id)
            ).all()
        return [(gid, at, int(tokens)) for gid, at, tokens in rows]

    def program_count(self, campaign_id: int, upto: int | None = None) -> int:
        """How many programs the campaign has (with id <= `upto`): the (campaign_id, id)
        index counts them."""
        with self._reading() as connection:
            return (
                connection.scalar(
                    select(func.count()).where(
                        PROGRAM.c.campaign_id == campaign_id,
                        *id_range(PROGRAM.c.id, 0, upto),
                    )
                )
                or 0
            )

    def last_program_id(self, campaign_id: int) -> int | None:
        with self._reading() as connection:
            return connection.scalar(
                select(func.max(PROGRAM.c.id)).where(PROGRAM.c.campaign_id == campaign_id)
            )

    def recent_groups(self, campaign_id: int, last: int) -> list[tuple[int, datetime, int, int]]:
        """(iteration, stored at, tokens its rollouts generated, programs it evaluated) of the
        campaign's `last` newest groups (skipped ones too), in the order they were stored:
        the recent pace."""
        with self._reading() as connection:
            groups = connection.execute(
                select(GROUP.c.id, GROUP.c.iteration, GROUP.c.created_at)
                .where(GROUP.c.campaign_id == campaign_id)
                .order_by(GROUP.c.id.desc())
                .limit(last)
            ).all()
            ids = [g.id for g in groups]
            tokens = dict(
                connection.execute(
                    select(TRAJECTORY.c.group_id, func.sum(TRAJECTORY.c.num_tokens))
                    .where(TRAJECTORY.c.group_id.in_(ids))
                    .group_by(TRAJECTORY.c.group_id)
                ).all()
            )
            evaluated = dict(
                connection.execute(
                    select(TRAJECTORY.c.group_id, func.count(PROGRAM.c.id))
                    .join(PROGRAM, PROGRAM.c.trajectory_id == TRAJECTORY.c.id)
                    .where(TRAJECTORY.c.group_id.in_(ids))
                    .group_by(TRAJECTORY.c.group_id)
                ).all()
            )
        rows = [
            (g.iteration, g.created_at, int(tokens.get(g.id) or 0), int(evaluated.get(g.id, 0)))
            for g in groups
        ]
        return sorted(rows, key=lambda row: (row[1], row[0]))

    def last_record_at(self, campaign_id: int) -> datetime | None:
        """When the campaign last wrote anything: every write logs an event with it."""
        with self._reading() as connection:
            return connection.scalar(
                select(func.max(EVENT.c.created_at)).where(EVENT.c.campaign_id == campaign_id)
            )

    def rejections(
        self, campaign_id: int, after_group: int = 0, upto_group: int | None = None
    ) -> dict[str, int]:
        """Why the candidate slots of the groups in (after_group, upto_group] were rejected,
        by class (`REJECTIONS`), and how many slots there were (`candidates`): `unparsed`
        slots; duplicates of another candidate of the iteration (`duplicate`) or of its
        parent or a program stored before (`lazy`), or near-duplicates by their text of a
        recent program of the island (`near`), none evaluated; and the evaluated
        programs by failed status (`invalid`, `error`, `timeout`)."""
        counts = dict.fromkeys(("candidates", *REJECTIONS), 0)
        groups = [
            GROUP.c.campaign_id == campaign_id,
            *id_range(GROUP.c.id, after_group, upto_group),
        ]
        with self._reading() as connection:
            # Only the slots' JSON is read: no completions, no token ids.
            for (slots,) in connection.execute(
                select(TRAJECTORY.c.candidates)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(*groups)
            ):
                for slot in slots:
                    counts["candidates"] += 1
                    outcome = slot.get("outcome")
                    if outcome == "duplicate" and slot.get("near"):
                        counts["near"] += 1
                    elif outcome == "duplicate":
                        counts["lazy" if slot.get("lazy") else "duplicate"] += 1
                    elif outcome == "unparsed":
                        counts["unparsed"] += 1
            for status, count in connection.execute(
                select(PROGRAM.c.status, func.count())
                .join(TRAJECTORY, TRAJECTORY.c.id == PROGRAM.c.trajectory_id)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(*groups, PROGRAM.c.status != "ok")
                .group_by(PROGRAM.c.status)
            ):
                counts[status] += count
        return counts

    def found_at(self, program_ids: Sequence[int]) -> dict[int, int]:
        """Program id -> the iteration of the group whose rollout wrote it, for those of
        `program_ids` a rollout wrote."""
        with self._reading() as connection:
            rows = connection.execute(
                select(PROGRAM.c.id, GROUP.c.iteration)
                .join(TRAJECTORY, TRAJECTORY.c.id == PROGRAM.c.trajectory_id)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(PROGRAM.c.id.in_(list(program_ids)))
            ).all()
        return {program_id: iteration for program_id, iteration in rows}

    def status_counts(
        self, campaign_id: int, after_id: int = 0, upto: int | None = None
    ) -> dict[str, int]:
        """Programs above `after_id` by status (every status listed)."""
        with self._reading() as connection:
            return count_by_status(connection, campaign_id, after_id, upto)


def _valid_ids(campaign_id: int, after_id: int, upto: int | None) -> Any:
    """Ids of the campaign's valid programs in (after_id, upto]: the (campaign_id, status)
    index covers it, so the wide program rows (code, metrics) are never read."""
    return select(PROGRAM.c.id).where(
        PROGRAM.c.campaign_id == campaign_id,
        PROGRAM.c.status == "ok",
        *id_range(PROGRAM.c.id, after_id, upto),
    )


def _valid_scores(campaign_id: int, after_id: int, upto: int | None) -> list[Any]:
    """Conditions for the score rows of those programs; the range on the score's own key
    lets a short range be read from the primary key instead of every row of an objective."""
    return [
        SCORE.c.program_id.in_(_valid_ids(campaign_id, after_id, upto)),
        *id_range(SCORE.c.program_id, after_id, upto),
    ]


def _objective_in(names: Sequence[str], after_id: int) -> Any:
    """`score.objective IN names`; for the programs after an id, written as an expression so
    no engine answers it from the objective index (every row of the objective) instead of
    the short program-id range."""
    column = SCORE.c.objective
    return (column if after_id == 0 else column.concat("")).in_(list(names))
