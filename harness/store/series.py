"""What each iteration's candidates measure, written with the iteration and read back as a
series, and every candidate slot of a campaign as one array for best@k and pass@k.

The definitions: trainer.measures; here are the rows they read. A group recorded before
`rollout_group` had the columns (or read from such a database opened read-only, which lacks
them) has no stored values: reading computes them from its rollouts the same way, without
writing them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import func, inspect, select, update
from sqlalchemy.engine import Connection

from harness.records import IterationMeasures, is_case
from harness.store.opening import Database
from harness.store.tables import GROUP, ID_BATCH, POLICY, PROGRAM, SCORE, TRAJECTORY
from harness.store.versions import moved_weights
from trainer.measures import parse_rate, pool_diversity

# A rollout's parse status and the program of each of its candidate slots (None: unparsed).
Rollout = tuple[str, Sequence[int | None]]


class Series(Database):
    def iteration_measures(
        self, campaign_id: int, after_group: int = 0, last: int | None = None
    ) -> list[IterationMeasures]:
        """The measures of the campaign's groups with id > `after_group` (of its `last`
        iterations, when given), in iteration order; computed from the rollouts for a group
        recorded before they were stored."""
        with self._reading() as connection:
            stored = _has_measures(connection)
            columns = [GROUP.c.id, GROUP.c.iteration, GROUP.c.created_at]
            if stored:
                columns += [GROUP.c.parse_rate, GROUP.c.pool_diversity, GROUP.c.skipped]
            query = select(*columns).where(
                GROUP.c.campaign_id == campaign_id, GROUP.c.id > after_group
            )
            if last is not None:
                query = query.order_by(GROUP.c.iteration.desc()).limit(last)
            rows = sorted(connection.execute(query).all(), key=lambda row: row.iteration)
            # Without a parse rate a group is skipped (no rollouts) or was written without the
            # columns (before they existed, or by an earlier release's process since).
            older = {
                row.id
                for row in rows
                if not stored or (row.parse_rate is None and row.skipped is None)
            }
            computed = _measure_groups(connection, _rollouts_of(connection, sorted(older)))
        records = []
        for row in rows:
            rate, diversity = (
                computed.get(row.id, (None, None))
                if row.id in older
                else (row.parse_rate, row.pool_diversity)
            )
            records.append(
                IterationMeasures(row.id, row.iteration, row.created_at, rate, diversity)
            )
        return records

    def version_measures(
        self,
        campaign_id: int,
        objectives: Sequence[str],
        after_group: int = 0,
        upto_group: int | None = None,
    ) -> list[VersionRow]:
        """What each policy version sampled, oldest first (step 0: the weights the campaign
        started from): its groups and rollouts, the mean parse rate and pool diversity of its
        groups, the best score per objective among the programs its candidates wrote, and
        whether its weights differ from the starting ones (`changed`: from the first step that
        trained some rollout on). Of the groups with after_group < id <= upto_group only, so a
        reader can add new groups' rows to what it read before (`VersionRow.add`)."""
        span = [GROUP.c.campaign_id == campaign_id, GROUP.c.id > after_group]
        if upto_group is not None:
            span.append(GROUP.c.id <= upto_group)
        measures = {
            m.group_id: m
            for m in self.iteration_measures(campaign_id, after_group)
            if upto_group is None or m.group_id <= upto_group
        }
        with self._reading() as connection:
            steps, first = _steps(connection, campaign_id)
            version_of = {
                group_id: steps.get(version_id, 0)
                for group_id, version_id in connection.execute(
                    select(GROUP.c.id, GROUP.c.policy_version_id).where(*span)
                )
            }
            rollouts: dict[int, list[Sequence[int | None]]] = {}
            for group_id, candidates in connection.execute(
                select(TRAJECTORY.c.group_id, TRAJECTORY.c.candidates)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(*span)
            ):
                rollouts.setdefault(group_id, []).append(_slot_programs(candidates))
            # Only the programs these slots name (a repeat names an older program).
            wanted = sorted(
                {pid for slots in rollouts.values() for s in slots for pid in s if pid is not None}
            )
            scores: dict[int, dict[str, float]] = {}
            for start in range(0, len(wanted), ID_BATCH):
                for program_id, objective, value in connection.execute(
                    select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value)
                    .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
                    .where(
                        SCORE.c.program_id.in_(wanted[start : start + ID_BATCH]),
                        PROGRAM.c.status == "ok",
                    )
                ):
                    scores.setdefault(program_id, {})[objective] = value
        rows: dict[int, VersionRow] = {}
        for group_id, step in sorted(version_of.items()):
            row = rows.setdefault(step, VersionRow(step, first is not None and step >= first))
            row.groups += 1
            row.rollouts += len(rollouts.get(group_id, ()))
            measured = measures.get(group_id)
            if measured is not None and measured.parse_rate is not None:
                row.parse_rates.append(measured.parse_rate)
            if measured is not None and measured.pool_diversity is not None:
                row.diversities.append(measured.pool_diversity)
            for slots in rollouts.get(group_id, ()):
                for program_id in slots:
                    for objective in objectives:
                        value = scores.get(program_id, {}).get(objective)  # type: ignore[arg-type]
                        if value is not None and value > row.best.get(objective, -np.inf):
                            row.best[objective] = value
        return [rows[step] for step in sorted(rows)]

    def first_trained_step(self, campaign_id: int) -> int | None:
        """The first policy step whose weights differ from the starting ones (None: none yet)."""
        with self._reading() as connection:
            return _steps(connection, campaign_id)[1]

    def sampling_versions(
        self, campaign_id: int, after_group: int = 0
    ) -> list[tuple[int, int, int]]:
        """(group id, iteration, policy step that sampled it; 0: the starting weights) of the
        campaign's groups with id > `after_group`, by id."""
        query = (
            select(GROUP.c.id, GROUP.c.iteration, POLICY.c.step)
            .outerjoin(POLICY, POLICY.c.id == GROUP.c.policy_version_id)
            .where(GROUP.c.campaign_id == campaign_id, GROUP.c.id > after_group)
            .order_by(GROUP.c.id)
        )
        with self._reading() as connection:
            return [
                (gid, iteration, step or 0) for gid, iteration, step in connection.execute(query)
            ]

    def group_count(self, campaign_id: int, upto: int) -> int:
        """How many of the campaign's groups have id <= `upto`."""
        with self._reading() as connection:
            return (
                connection.scalar(
                    select(func.count()).where(
                        GROUP.c.campaign_id == campaign_id, GROUP.c.id <= upto
                    )
                )
                or 0
            )

    def candidate_slots(
        self, campaign_id: int, objectives: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every candidate slot of every rollout of the campaign, in iteration and rollout
        order: (vectors (n, d) of its program's scores in `objectives` order, zeros for an
        unparsed slot and for an objective the program lacks; has_program (n,))."""
        column = {name: j for j, name in enumerate(objectives)}
        with self._reading() as connection:
            slots = [
                program_id
                for (candidates,) in connection.execute(
                    select(TRAJECTORY.c.candidates)
                    .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                    .where(GROUP.c.campaign_id == campaign_id)
                    .order_by(GROUP.c.iteration, TRAJECTORY.c.position)
                )
                for program_id in _slot_programs(candidates)
            ]
            # Read after the slots (on PostgreSQL each statement sees the latest commits): a
            # program a slot names was committed with it, so is found.
            scores: dict[int, np.ndarray] = {}
            for program_id, objective, value in connection.execute(
                select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value)
                .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
                .where(PROGRAM.c.campaign_id == campaign_id)
            ):
                j = column.get(objective)
                if j is not None:
                    scores.setdefault(program_id, np.zeros(len(objectives)))[j] = value
        vectors = np.zeros((len(slots), len(objectives)))
        for row, program_id in enumerate(slots):
            if program_id in scores:
                vectors[row] = scores[program_id]
        return vectors, np.array([program_id is not None for program_id in slots], dtype=bool)


@dataclass
class VersionRow:
    """What one policy version sampled (`Series.version_measures`)."""

    step: int  # 0: the weights the campaign started from
    changed: bool = False  # its weights differ from the starting ones (a step trained something)
    groups: int = 0
    rollouts: int = 0
    parse_rates: list[float] = field(default_factory=list)  # one per group that has one
    diversities: list[float] = field(default_factory=list)
    best: dict[str, float] = field(default_factory=dict)  # among its valid programs

    def add(self, later: VersionRow) -> None:
        """Fold in the same version's rows of groups read later."""
        self.groups += later.groups
        self.rollouts += later.rollouts
        self.parse_rates += later.parse_rates
        self.diversities += later.diversities
        for objective, value in later.best.items():
            self.best[objective] = max(value, self.best.get(objective, value))

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "changed": self.changed,
            "groups": self.groups,
            "rollouts": self.rollouts,
            "parse_rate": _mean(self.parse_rates),
            "pool_diversity": _mean(self.diversities),
            "best": self.best,
        }


def _steps(connection: Connection, campaign_id: int) -> tuple[dict[int, int], int | None]:
    """The campaign's policy versions (id -> step) and the first step that moved the weights."""
    policies = connection.execute(
        select(POLICY.c.id, POLICY.c.step, POLICY.c.metrics).where(
            POLICY.c.campaign_id == campaign_id
        )
    ).all()
    first = min((p.step for p in policies if moved_weights(p.metrics)), default=None)
    return {policy.id: policy.step for policy in policies}, first


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def record_measures(connection: Connection, group_id: int, rollouts: Sequence[Rollout]) -> None:
    """Store a group's measures, in the caller's transaction (the one that writes it)."""
    rate, diversity = _measure_groups(connection, {group_id: rollouts}).get(group_id, (None, None))
    connection.execute(
        update(GROUP)
        .where(GROUP.c.id == group_id)
        .values(parse_rate=rate, pool_diversity=diversity)
    )


def _measure_groups(
    connection: Connection, groups: Mapping[int, Sequence[Rollout]]
) -> dict[int, tuple[float | None, float | None]]:
    """Group id -> (parse rate, pool diversity), the slots' scores read `ID_BATCH` programs a
    query (one query for any group of up to that many distinct programs)."""
    wanted = sorted(
        {
            pid
            for rollouts in groups.values()
            for _, slots in rollouts
            for pid in slots
            if pid is not None
        }
    )
    scores: dict[int, dict[str, float]] = {}
    for start in range(0, len(wanted), ID_BATCH):
        for program_id, objective, value in connection.execute(
            select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value).where(
                SCORE.c.program_id.in_(wanted[start : start + ID_BATCH])
            )
        ):
            scores.setdefault(program_id, {})[objective] = value
    # An objective no program here has is 0 for all of them, which moves no distance.
    objectives = sorted(
        {name for by_name in scores.values() for name in by_name if not is_case(name)}
    )
    measured = {}
    for group_id, rollouts in groups.items():
        vectors = [
            [scores.get(pid, {}).get(name, 0.0) for name in objectives]
            for _, slots in rollouts
            for pid in slots
            if pid is not None
        ]
        measured[group_id] = (
            parse_rate([status for status, _ in rollouts]),
            pool_diversity(np.array(vectors).reshape(len(vectors), len(objectives))),
        )
    return measured


def _rollouts_of(connection: Connection, group_ids: Sequence[int]) -> dict[int, list[Rollout]]:
    """The stored rollouts of these groups, as `_measure_groups` takes them."""
    rollouts: dict[int, list[Rollout]] = {}
    for start in range(0, len(group_ids), ID_BATCH):
        for group_id, status, candidates in connection.execute(
            select(TRAJECTORY.c.group_id, TRAJECTORY.c.parse_status, TRAJECTORY.c.candidates)
            .where(TRAJECTORY.c.group_id.in_(group_ids[start : start + ID_BATCH]))
            .order_by(TRAJECTORY.c.group_id, TRAJECTORY.c.position)
        ):
            rollouts.setdefault(group_id, []).append((status, _slot_programs(candidates)))
    return rollouts


def _has_measures(connection: Connection) -> bool:
    # A database of an earlier release opened read-only (so not upgraded) lacks the columns.
    names = {column["name"] for column in inspect(connection).get_columns(GROUP.name)}
    return {"parse_rate", "pool_diversity", "skipped"} <= names


def _slot_programs(candidates: Sequence[dict[str, Any]]) -> list[int | None]:
    """The program of each candidate slot 1..m, in order; None for an unparsed one."""
    return [slot.get("program_id") for slot in sorted(candidates, key=lambda s: s["index"])]
