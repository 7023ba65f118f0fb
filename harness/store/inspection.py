"""What a campaign reads back and `vpo db` shows: programs, their lineage and provenance, the
event log, and the counts behind `vpo status`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Select, and_, func, inspect, select
from sqlalchemy.engine import Connection

from harness.records import Counts, EventRecord, ProgramRecord, Summary
from harness.store.models import PROGRAM_ORIGINS, PROGRAM_STATUSES
from harness.store.opening import Database
from harness.store.tables import (
    DRAFT,
    EVENT,
    GROUP,
    POLICY,
    PROGRAM,
    SCORE,
    TRAJECTORY,
    check_choice,
    count_by_status,
    with_scores,
)


class Inspection(Database):
    # Programs

    def program(self, program_id: int) -> ProgramRecord | None:
        with self._reading() as connection:
            rows = connection.execute(select(PROGRAM).where(PROGRAM.c.id == program_id)).all()
            records = with_scores(connection, rows)
        return records[0] if records else None

    def programs(
        self,
        campaign_id: int,
        status: str | None = None,
        island: int | None = None,
        origin: str | None = None,
        limit: int | None = None,
    ) -> list[ProgramRecord]:
        """The campaign's programs in the order they were stored, optionally filtered."""
        query = select(PROGRAM).where(PROGRAM.c.campaign_id == campaign_id)
        if status is not None:
            check_choice("program status", status, PROGRAM_STATUSES)
            query = query.where(PROGRAM.c.status == status)
        if island is not None:
            query = query.where(PROGRAM.c.island == island)
        if origin is not None:
            check_choice("program origin", origin, PROGRAM_ORIGINS)
            query = query.where(PROGRAM.c.origin == origin)
        return self._program_records(query, limit)

    def programs_by_ids(self, ids: Sequence[int]) -> list[ProgramRecord]:
        """Programs in the order of `ids` (a parent and its drafts): two queries."""
        if not ids:
            return []
        with self._reading() as connection:
            rows = connection.execute(select(PROGRAM).where(PROGRAM.c.id.in_(ids))).all()
            found = {record.id: record for record in with_scores(connection, rows)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise ValueError(f"no programs with ids {missing}")
        return [found[i] for i in ids]

    def find_by_hash(self, campaign_id: int, code_hash: str) -> list[ProgramRecord]:
        """Programs with this code hash, oldest first; several when a program was migrated."""
        query = select(PROGRAM).where(
            PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.code_hash == code_hash
        )
        return self._program_records(query)

    def _program_records(self, query: Select[Any], limit: int | None = None) -> list[ProgramRecord]:
        with self._reading() as connection:
            rows = connection.execute(query.order_by(PROGRAM.c.id).limit(limit)).all()
            return with_scores(connection, rows)

    def iter_programs(
        self, campaign_id: int, batch: int = 1000, after: int = 0
    ) -> Iterator[ProgramRecord]:
        """Every program of the campaign (with an id above `after`) in id order, read `batch`
        at a time."""
        while True:
            query = select(PROGRAM).where(
                PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.id > after
            )
            records = self._program_records(query, batch)
            if not records:
                return
            yield from records
            after = records[-1].id

    def program_vectors(
        self, campaign_id: int, objectives: Sequence[str], after_id: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """(ids, islands, valid, scores[N, d], code hashes) of the programs with id > after_id.

        Selection works on these arrays; two narrow queries, no code text, so a campaign with
        100k programs loads in well under a second and refreshes incrementally.
        """
        with self._reading() as connection:
            rows = connection.execute(
                select(PROGRAM.c.id, PROGRAM.c.island, PROGRAM.c.status, PROGRAM.c.code_hash)
                .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.id > after_id)
                .order_by(PROGRAM.c.id)
            ).all()
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            islands = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
            valid = np.fromiter((r[2] == "ok" for r in rows), dtype=bool, count=len(rows))
            scores = np.zeros((len(rows), len(objectives)))
            if rows:
                column = {name: j for j, name in enumerate(objectives)}
                position = {int(pid): i for i, pid in enumerate(ids)}
                for program_id, objective, value in connection.execute(
                    select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value)
                    .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
                    .where(SCORE.c.program_id > after_id, PROGRAM.c.campaign_id == campaign_id)
                ):
                    j = column.get(objective)
                    if j is not None:
                        scores[position[program_id], j] = value
        return ids, islands, valid, scores, [r[3] for r in rows]

    def archive(
        self, campaign_id: int, objectives: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(islands, groups, scores[N, d]) of the campaign's programs that ran and were scored,
        where `groups` is the id of the group whose rollout wrote each (-1 for a seed or a
        migrated copy): what the campaign held before group g is the rows with groups < g.
        (Duplicate rows, a migrated copy beside its original, are harmless to a front.)"""
        ids, islands, valid, scores, _ = self.program_vectors(campaign_id, objectives)
        with self._reading() as connection:
            written = dict(
                connection.execute(
                    select(PROGRAM.c.id, TRAJECTORY.c.group_id)
                    .join(TRAJECTORY, TRAJECTORY.c.id == PROGRAM.c.trajectory_id)
                    .where(PROGRAM.c.campaign_id == campaign_id)
                ).all()
            )
        groups = np.fromiter((written.get(int(i), -1) for i in ids), dtype=np.int64, count=len(ids))
        return islands[valid], groups[valid], scores[valid]

    def code_hashes(self, campaign_id: int) -> dict[str, int]:
        """Normalised-code hash -> the first program with it: what was evaluated already."""
        with self._reading() as connection:
            rows = connection.execute(
                select(PROGRAM.c.code_hash, func.min(PROGRAM.c.id))
                .where(PROGRAM.c.campaign_id == campaign_id)
                .group_by(PROGRAM.c.code_hash)
            ).all()
        return {code: program_id for code, program_id in rows}

    # Lineage and provenance

    def ancestry(self, program_id: int) -> list[tuple[int, int | None, int, int, str]]:
        """(id, parent id, island, generation, origin) of the program and every ancestor
        through parent links, the program first: one recursive query."""
        chain = (
            select(PROGRAM.c.id, PROGRAM.c.parent_id)
            .where(PROGRAM.c.id == program_id)
            .cte("chain", recursive=True)
        )
        chain = chain.union(
            select(PROGRAM.c.id, PROGRAM.c.parent_id).join(chain, PROGRAM.c.id == chain.c.parent_id)
        )
        with self._reading() as connection:
            rows = connection.execute(
                select(
                    PROGRAM.c.id,
                    PROGRAM.c.parent_id,
                    PROGRAM.c.island,
                    PROGRAM.c.generation,
                    PROGRAM.c.origin,
                ).join(chain, chain.c.id == PROGRAM.c.id)
            ).all()
        by_id = {r.id: tuple(r) for r in rows}
        ordered, current = [], program_id
        while current in by_id and len(ordered) < len(by_id):
            ordered.append(by_id[current])
            current = by_id[current][1]
        return ordered

    def drafts_shown(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """For each of `ids` written by a rollout, the drafts its prompt showed, in order."""
        with self._reading() as connection:
            rows = connection.execute(
                select(PROGRAM.c.id, DRAFT.c.program_id)
                .join(TRAJECTORY, TRAJECTORY.c.id == PROGRAM.c.trajectory_id)
                .join(DRAFT, DRAFT.c.group_id == TRAJECTORY.c.group_id)
                .where(PROGRAM.c.id.in_(list(ids)))
                .order_by(PROGRAM.c.id, DRAFT.c.position)
            ).all()
        shown: dict[int, list[int]] = {}
        for program_id, draft_id in rows:
            shown.setdefault(program_id, []).append(draft_id)
        return shown

    def children_counts(self, ids: Sequence[int]) -> dict[int, int]:
        """How many programs name each of `ids` as their parent."""
        with self._reading() as connection:
            rows = connection.execute(
                select(PROGRAM.c.parent_id, func.count())
                .where(PROGRAM.c.parent_id.in_(list(ids)))
                .group_by(PROGRAM.c.parent_id)
            ).all()
        return {parent: count for parent, count in rows}

    def provenance(self, program_id: int) -> dict[str, Any] | None:
        """Where an LLM program came from: its group (iteration, island, parent, drafts shown)
        and the rollout that wrote it, with the step of the policy version that sampled it
        (`policy_version`: 0 for the weights the campaign started from, which a rollout names
        no version for; None when the version it names is not the campaign's or not in the
        database); None for seeds and migrants."""
        with self._reading() as connection:
            row = connection.execute(
                select(
                    TRAJECTORY.c.id,
                    TRAJECTORY.c.group_id,
                    TRAJECTORY.c.position,
                    TRAJECTORY.c.completion,
                    TRAJECTORY.c.num_tokens,
                    TRAJECTORY.c.finish_reason,
                    TRAJECTORY.c.parse_status,
                    TRAJECTORY.c.parse_error,
                    TRAJECTORY.c.policy_version_id,
                    GROUP.c.iteration,
                    GROUP.c.island,
                    GROUP.c.parent_program_id,
                    GROUP.c.train_step,
                    POLICY.c.step,
                )
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .join(PROGRAM, PROGRAM.c.trajectory_id == TRAJECTORY.c.id)
                .outerjoin(
                    POLICY,
                    and_(
                        POLICY.c.id == TRAJECTORY.c.policy_version_id,
                        POLICY.c.campaign_id == PROGRAM.c.campaign_id,
                    ),
                )
                .where(PROGRAM.c.id == program_id)
            ).one_or_none()
            if row is None:
                return None
            drafts = connection.execute(
                select(DRAFT.c.program_id)
                .where(DRAFT.c.group_id == row.group_id)
                .order_by(DRAFT.c.position)
            ).scalars()
            return {
                "group_id": row.group_id,
                "iteration": row.iteration,
                "island": row.island,
                "parent_id": row.parent_program_id,
                "draft_ids": list(drafts),
                "trained_in_step": row.train_step,
                "trajectory": {
                    "id": row.id,
                    "position": row.position,
                    "completion": row.completion,
                    "num_tokens": row.num_tokens,
                    "finish_reason": row.finish_reason,
                    "parse_status": row.parse_status,
                    "parse_error": row.parse_error,
                    "policy_version_id": row.policy_version_id,
                    "policy_version": 0 if row.policy_version_id is None else row.step,
                },
            }

    def iter_trajectory_groups(
        self, campaign_id: int, batch: int = 200
    ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(group, its trajectories) in iteration order, with every column the trainer uses."""
        after = -1
        with self._reading() as connection:
            # A database of an earlier release opened read-only lacks the added columns.
            present = {c["name"] for c in inspect(connection).get_columns(GROUP.name)}
        columns = [c for c in GROUP.c if c.name in present]
        while True:
            with self._reading() as connection:
                groups = connection.execute(
                    select(*columns)
                    .where(GROUP.c.campaign_id == campaign_id, GROUP.c.iteration > after)
                    .order_by(GROUP.c.iteration)
                    .limit(batch)
                ).all()
                if not groups:
                    return
                group_ids = [g.id for g in groups]
                trajectories: dict[int, list[dict[str, Any]]] = {}
                for row in connection.execute(
                    select(TRAJECTORY)
                    .where(TRAJECTORY.c.group_id.in_(group_ids))
                    .order_by(TRAJECTORY.c.group_id, TRAJECTORY.c.position)
                ):
                    trajectories.setdefault(row.group_id, []).append(dict(row._mapping))
                drafts: dict[int, list[int]] = {}
                for row in connection.execute(
                    select(DRAFT)
                    .where(DRAFT.c.group_id.in_(group_ids))
                    .order_by(DRAFT.c.group_id, DRAFT.c.position)
                ):
                    drafts.setdefault(row.group_id, []).append(row.program_id)
            for group in groups:
                record = dict(group._mapping)
                record["draft_ids"] = drafts.get(group.id, [])
                yield record, trajectories.get(group.id, [])
            after = groups[-1].iteration

    # Events and counts

    def events(self, campaign_id: int, kind: str | None = None) -> list[EventRecord]:
        query = select(EVENT).where(EVENT.c.campaign_id == campaign_id)
        if kind is not None:
            query = query.where(EVENT.c.kind == kind)
        with self._reading() as connection:
            rows = connection.execute(query.order_by(EVENT.c.id)).all()
        return [EventRecord(e.id, e.campaign_id, e.kind, e.payload, e.created_at) for e in rows]

    def recent_payloads(self, campaign_id: int, kind: str, last: int) -> list[dict[str, Any]]:
        """The payloads of the campaign's `last` newest events of `kind`, oldest first (a
        walk down the (campaign, kind) index: a long campaign's older events are not read)."""
        with self._reading() as connection:
            rows = connection.execute(
                select(EVENT.c.payload)
                .where(EVENT.c.campaign_id == campaign_id, EVENT.c.kind == kind)
                .order_by(EVENT.c.id.desc())
                .limit(last)
            ).scalars()
            return [payload for payload in rows][::-1]

    def counts(self, campaign_id: int) -> Counts:
        with self._reading() as connection:
            programs = count_by_status(connection, campaign_id)
            by_kind = connection.execute(
                select(EVENT.c.kind, func.count())
                .where(EVENT.c.campaign_id == campaign_id)
                .group_by(EVENT.c.kind)
            ).all()
        return Counts(programs=programs, events={kind: count for kind, count in by_kind})

    def iterations_done(self, campaign_id: int) -> int:
        with self._reading() as connection:
            return _groups(connection, campaign_id)

    def skipped_iterations(self, campaign_id: int, limit: int = 5) -> list[dict[str, Any]]:
        """The newest `limit` iterations that produced nothing, newest first, with why."""
        with self._reading() as connection:
            if not _has_skipped(connection):
                return []
            rows = connection.execute(
                select(GROUP.c.iteration, GROUP.c.skipped)
                .where(GROUP.c.campaign_id == campaign_id, GROUP.c.skipped.is_not(None))
                .order_by(GROUP.c.iteration.desc())
                .limit(limit)
            ).all()
        return [{"iteration": row.iteration, "reason": row.skipped} for row in rows]

    def summary(self, campaign_id: int) -> Summary:
        with self._reading() as connection:
            statuses = count_by_status(connection, campaign_id)
            evaluations = connection.scalar(
                select(func.count()).where(
                    PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.origin != "migration"
                )
            )
            trajectories, tokens = connection.execute(
                select(func.count(), func.coalesce(func.sum(TRAJECTORY.c.num_tokens), 0))
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(GROUP.c.campaign_id == campaign_id)
            ).one()
            versions = connection.scalar(
                select(func.count()).where(POLICY.c.campaign_id == campaign_id)
            )
            return Summary(
                programs=sum(statuses.values()),
                valid_programs=statuses["ok"],
                evaluations=evaluations or 0,
                groups=_groups(connection, campaign_id),
                trajectories=trajectories or 0,
                policy_versions=versions or 0,
                tokens=int(tokens or 0),
                best=_best_by_objective(connection, campaign_id),
                skipped=_skipped(connection, campaign_id),
            )


def _has_skipped(connection: Connection) -> bool:
    # A database of an earlier release (read-only, so not upgraded) has no such column.
    return "skipped" in {c["name"] for c in inspect(connection).get_columns(GROUP.name)}


def _skipped(connection: Connection, campaign_id: int) -> int:
    if not _has_skipped(connection):
        return 0
    query = select(func.count()).where(
        GROUP.c.campaign_id == campaign_id, GROUP.c.skipped.is_not(None)
    )
    return connection.scalar(query) or 0


def _groups(connection: Connection, campaign_id: int) -> int:
    return connection.scalar(select(func.count()).where(GROUP.c.campaign_id == campaign_id)) or 0


def _best_by_objective(connection: Connection, campaign_id: int) -> dict[str, dict[str, Any]]:
    """Objective -> the best valid score, its raw value and the first program that has it."""
    best_value = (
        select(SCORE.c.objective, func.max(SCORE.c.value).label("value"))
        .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
        .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.status == "ok")
        .group_by(SCORE.c.objective)
        .subquery()
    )
    best: dict[str, dict[str, Any]] = {}
    for objective, value, raw, program_id in connection.execute(
        select(SCORE.c.objective, SCORE.c.value, SCORE.c.raw, func.min(PROGRAM.c.id))
        .join(PROGRAM, PROGRAM.c.id == SCORE.c.program_id)
        .join(
            best_value,
            (best_value.c.objective == SCORE.c.objective) & (best_value.c.value == SCORE.c.value),
        )
        .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.status == "ok")
        .group_by(SCORE.c.objective, SCORE.c.value, SCORE.c.raw)
        .order_by(SCORE.c.objective)
    ):
        if objective not in best:
            best[objective] = {"score": value, "raw": raw, "program_id": program_id}
    return best
