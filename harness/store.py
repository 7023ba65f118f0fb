"""The only code that reads and writes the solution database.

Every public method is one transaction: a program, its scores and the event that logs it are
committed together or not at all. Callers get plain frozen records, never live ORM objects, so
nothing outside this module can touch the database by accident or hold a session open.

    store = Store.open("runs/circles.db")            # or sqlite:///..., postgresql://...
    campaign_id = store.create_campaign("circles", "circle_packing", config={}, seed=0)
    store.add_program(campaign_id, code, status="ok", scores={"sum_radii": 0.9}, raw={...})
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from sqlalchemy import (
    Engine,
    Select,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.pool import StaticPool

from harness import faults
from harness.db import (
    ADDED_TABLES,
    CAMPAIGN_STATUSES,
    PROGRAM_ORIGINS,
    PROGRAM_STATUSES,
    SCHEMA_VERSION,
    Base,
    Campaign,
    Event,
    GroupDraft,
    IterationClaim,
    Meta,
    PolicyVersion,
    Program,
    RolloutGroup,
    Score,
    Trajectory,
    create_tables,
    dumps_json,
    utc_now,
)
from harness.errors import SchemaError, UserError
from harness.records import (
    CampaignRecord,
    Counts,
    EventRecord,
    NewProgram,
    PolicyRecord,
    ProgramRecord,
    RolloutRecord,
    Summary,
    TrainingGroup,
    TrainingRollout,
    code_hash,
)

# Seconds a SQLite writer waits for another writer before giving up, and a PostgreSQL client
# waits for the server to answer: long enough for a busy campaign, short enough not to look hung.
SQLITE_BUSY_TIMEOUT_S = 30
POSTGRES_CONNECT_TIMEOUT_S = 5

# Any fixed number: serialises concurrent `Store.open` calls that would create the tables.
_POSTGRES_CREATE_LOCK = 0x7670_6F65


class Store:
    """A solution database on SQLite or PostgreSQL; get one with `Store.open`."""

    def __init__(self, engine: Engine, where: str) -> None:
        self._engine = engine
        # Writers on SQLite take the write lock up front (BEGIN IMMEDIATE, see `_sqlite_engine`).
        self._write_engine = engine.execution_options(vpo_write=True)
        self.where = where

    @classmethod
    def open(
        cls, target: str | os.PathLike[str], *, create: bool = True, read_only: bool = False
    ) -> Store:
        """Open a file path, `sqlite:///path` or `postgresql://...`; create the tables if new.

        `read_only` (implies not `create`) makes the engine itself refuse writes: SQLite
        files are opened with `mode=ro` and `query_only` (and work on a read-only mount, see
        `_connect_read_only`), PostgreSQL sessions default to read-only transactions. A
        reader never blocks a SQLite campaign's writer (WAL).

        Raises UserError when the database cannot be reached and SchemaError when it is not a
        vpo-evolve database or was written by a newer schema.
        """
        create = create and not read_only
        url = _database_url(target, create=create)
        where = _describe(url)
        engine = _make_engine(url, read_only=read_only)
        try:
            _prepare(engine, where, create=create, read_only=read_only)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, where)

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.where!r})"

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        with Session(self._engine) as session, session.begin():
            yield session

    @contextmanager
    def _writing(self) -> Iterator[Session]:
        with Session(self._write_engine) as session, session.begin():
            yield session

    # Campaigns

    def create_campaign(self, name: str, problem: str, config: dict[str, Any], seed: int) -> int:
        try:
            with self._writing() as session:
                campaign = Campaign(name=name, problem=problem, config=config, seed=seed)
                session.add(campaign)
                session.flush()
                session.add(
                    Event(
                        campaign_id=campaign.id,
                        kind="campaign_created",
                        payload={"name": name, "problem": problem, "seed": seed},
                    )
                )
                return campaign.id
        except IntegrityError as exc:
            if self.get_campaign(name) is None:
                raise
            raise UserError(
                f"a campaign named {name!r} already exists in {self.where}; "
                "pick another name or resume that one"
            ) from exc

    def get_campaign(self, name: str) -> CampaignRecord | None:
        with self._reading() as session:
            campaign = session.scalar(select(Campaign).where(Campaign.name == name))
            return None if campaign is None else _campaign_record(campaign)

    def campaigns(self) -> list[CampaignRecord]:
        with self._reading() as session:
            rows = session.scalars(select(Campaign).order_by(Campaign.id))
            return [_campaign_record(campaign) for campaign in rows]

    def set_campaign_status(self, campaign_id: int, status: str) -> None:
        _check_choice("campaign status", status, CAMPAIGN_STATUSES)
        with self._writing() as session:
            result = session.execute(
                update(Campaign).where(Campaign.id == campaign_id).values(status=status)
            )
            if result.rowcount != 1:
                raise KeyError(f"no campaign with id {campaign_id}")
            session.add(
                Event(campaign_id=campaign_id, kind="campaign_status", payload={"status": status})
            )

    # Programs

    def add_program(
        self,
        campaign_id: int,
        code: str,
        *,
        status: str,
        scores: Mapping[str, float],
        raw: Mapping[str, float | None],
        error: str | None = None,
        parent_id: int | None = None,
        island: int = 0,
        generation: int = 0,
        origin: str = "seed",
        eval_seconds: float = 0.0,
        metrics: dict[str, Any] | None = None,
        trajectory_id: int | None = None,
        candidate_index: int | None = None,
        the_seed: bool = False,
    ) -> int:
        """Store a program, its scores and a `program_added` event in one transaction.

        `the_seed`: this is the campaign's one seed; if another process stored it first, its
        id is returned and nothing is written."""
        _check_choice("program status", status, PROGRAM_STATUSES)
        _check_choice("program origin", origin, PROGRAM_ORIGINS)
        _check_scores(scores, raw)
        if "\x00" in code:
            # PostgreSQL text cannot hold NUL, SQLite can: refuse on both so engines agree.
            raise ValueError("program code contains a NUL character; treat it as invalid output")
        if error is not None:
            # Error text is for people (often a stderr tail); keep a visible marker instead.
            error = error.replace("\x00", "\\x00")
        with self._writing() as session:
            if the_seed:
                # One seed per campaign, however many workers start at once: the campaign row
                # lock orders them, and the later ones get the first one's seed.
                session.execute(
                    select(Campaign.id).where(Campaign.id == campaign_id).with_for_update()
                )
                existing = session.scalar(
                    select(Program.id)
                    .where(Program.campaign_id == campaign_id, Program.origin == "seed")
                    .order_by(Program.id)
                    .limit(1)
                )
                if existing is not None:
                    return existing
            program = _insert_program(
                session,
                campaign_id,
                code,
                status=status,
                scores=scores,
                raw=raw,
                error=error,
                parent_id=parent_id,
                island=island,
                generation=generation,
                origin=origin,
                eval_seconds=eval_seconds,
                metrics=metrics,
                trajectory_id=trajectory_id,
                candidate_index=candidate_index,
            )
            return program.id

    # Iterations: a group, its rollouts, their new programs and migrations, in one transaction

    def record_iteration(
        self,
        campaign_id: int,
        *,
        iteration: int,
        island: int,
        parent_id: int,
        draft_ids: Sequence[int],
        prompt: list[dict[str, str]],
        prompt_token_ids: Sequence[int] | None,
        rollouts: Sequence[RolloutRecord],
        policy_version_id: int | None = None,
        migrations: Sequence[tuple[int, int]] = (),
    ) -> int:
        """Store one iteration atomically and return its group id.

        A second attempt at the same iteration (a resumed run racing a stale one) fails on the
        unique (campaign, iteration) key and raises UserError; nothing of it is written.
        """
        for rollout in rollouts:
            for candidate in rollout.candidates:
                _check_choice("candidate outcome", candidate.outcome, CANDIDATE_OUTCOMES)
                if candidate.program is not None:
                    _check_new_program(candidate.program)
        try:
            with self._write_engine.begin() as connection:
                group_id = _write_iteration(
                    connection,
                    campaign_id,
                    iteration,
                    island,
                    parent_id,
                    draft_ids,
                    prompt,
                    prompt_token_ids,
                    rollouts,
                    policy_version_id,
                    migrations,
                )
                faults.point("iteration_commit")  # written, not yet committed
                return group_id
        except IntegrityError:
            with self._reading() as session:
                taken = session.scalar(
                    select(func.count()).where(
                        RolloutGroup.campaign_id == campaign_id,
                        RolloutGroup.iteration == iteration,
                    )
                )
            if taken:
                raise UserError(
                    f"iteration {iteration} of campaign {campaign_id} is already recorded; "
                    "is another process running this campaign?"
                ) from None
            raise

    # Workers: several processes taking iterations of one campaign

    def claim_iteration(
        self, campaign_id: int, worker: str, *, budget: int, lease_seconds: float
    ) -> int | None:
        """The next iteration `worker` should run, claimed for it; None when every iteration
        below `budget` is recorded or claimed by a worker within its lease.

        Claimers are serialised by a lock on the campaign row (PostgreSQL `FOR UPDATE`; SQLite
        write transactions are exclusive). A claim older than the lease whose iteration has no
        group is taken over first: its worker died or hung.
        """
        now = utc_now()
        stale = now - timedelta(seconds=lease_seconds)
        campaign = Campaign.__table__
        recorded = (
            select(_GROUP.c.id)
            .where(_GROUP.c.campaign_id == campaign_id, _GROUP.c.iteration == _CLAIM.c.iteration)
            .exists()
        )
        with self._write_engine.begin() as connection:
            locked = connection.execute(
                select(campaign.c.id).where(campaign.c.id == campaign_id).with_for_update()
            ).scalar()
            if locked is None:
                raise UserError(f"no campaign {campaign_id} in {self.where}")
            orphan = connection.execute(
                select(_CLAIM.c.iteration)
                .where(
                    _CLAIM.c.campaign_id == campaign_id,
                    _CLAIM.c.claimed_at < stale,
                    _CLAIM.c.iteration < budget,
                    ~recorded,
                )
                .order_by(_CLAIM.c.iteration)
                .limit(1)
            ).scalar()
            if orphan is not None:
                connection.execute(
                    update(_CLAIM)
                    .where(_CLAIM.c.campaign_id == campaign_id, _CLAIM.c.iteration == orphan)
                    .values(worker=worker, claimed_at=now)
                )
                return int(orphan)
            highest = [
                connection.execute(
                    select(func.max(table.c.iteration)).where(table.c.campaign_id == campaign_id)
                ).scalar()
                for table in (_CLAIM, _GROUP)
            ]
            top = max((value for value in highest if value is not None), default=-1)
            if top + 1 >= budget:
                return None
            connection.execute(
                insert(_CLAIM),
                {
                    "campaign_id": campaign_id,
                    "iteration": top + 1,
                    "worker": worker,
                    "claimed_at": now,
                },
            )
            return top + 1

    def release_claim(self, campaign_id: int, iteration: int, worker: str) -> None:
        """Give an iteration back at once (the worker failed cleanly), if it still holds it."""
        with self._write_engine.begin() as connection:
            connection.execute(
                delete(_CLAIM).where(
                    _CLAIM.c.campaign_id == campaign_id,
                    _CLAIM.c.iteration == iteration,
                    _CLAIM.c.worker == worker,
                )
            )

    def open_claims(self, campaign_id: int) -> int:
        """Claims whose iteration has no group yet (in flight, or left by a dead worker)."""
        recorded = (
            select(_GROUP.c.id)
            .where(_GROUP.c.campaign_id == campaign_id, _GROUP.c.iteration == _CLAIM.c.iteration)
            .exists()
        )
        with self._engine.connect() as connection:
            return connection.execute(
                select(func.count()).where(_CLAIM.c.campaign_id == campaign_id, ~recorded)
            ).scalar_one()

    # Training: the groups a step used, and the policy versions it produced

    def untrained_groups(self, campaign_id: int, limit: int) -> list[TrainingGroup]:
        """The newest `limit` groups no training step used yet, oldest of them first."""
        return self.training_groups(campaign_id, unused=True, newest=limit)

    def training_groups(
        self,
        campaign_id: int,
        *,
        unused: bool = False,
        newest: int | None = None,
        after_iteration: int = -1,
        limit: int | None = None,
    ) -> list[TrainingGroup]:
        """Groups as the trainer reads them, in iteration order: token ids and every
        candidate's scores. `unused`: only groups no training step used; `newest`: only the
        newest N of them; `after_iteration` and `limit` page through the rest. Groups without
        prompt tokens (some endpoints do not report them) cannot be trained on and are left out.
        """
        query = select(_GROUP.c.id, _GROUP.c.iteration, _GROUP.c.prompt_token_ids).where(
            _GROUP.c.campaign_id == campaign_id,
            _GROUP.c.prompt_token_ids.is_not(None),
            _GROUP.c.iteration > after_iteration,
        )
        if unused:
            query = query.where(_GROUP.c.train_step.is_(None))
        if newest is not None:
            query = query.order_by(_GROUP.c.iteration.desc()).limit(newest)
        else:
            query = query.order_by(_GROUP.c.iteration).limit(limit)
        with self._engine.connect() as connection:
            groups = connection.execute(query).all()
            if newest is not None:
                groups.reverse()
            if not groups:
                return []
            rows = connection.execute(
                select(
                    _TRAJECTORY.c.group_id,
                    _TRAJECTORY.c.token_ids,
                    _TRAJECTORY.c.logprobs,
                    _TRAJECTORY.c.candidates,
                )
                .where(_TRAJECTORY.c.group_id.in_([g.id for g in groups]))
                .order_by(_TRAJECTORY.c.group_id, _TRAJECTORY.c.position)
            ).all()
            wanted = {
                slot["program_id"]
                for row in rows
                for slot in row.candidates
                if slot.get("program_id") is not None
            }
            scores: dict[int, dict[str, float]] = {}
            for score in connection.execute(
                select(_SCORE.c.program_id, _SCORE.c.objective, _SCORE.c.value).where(
                    _SCORE.c.program_id.in_(wanted)
                )
            ):
                scores.setdefault(score.program_id, {})[score.objective] = score.value
        by_group: dict[int, list[TrainingRollout]] = {}
        prompts = {g.id: tuple(g.prompt_token_ids) for g in groups}
        for row in rows:
            slots = sorted(row.candidates, key=lambda slot: slot["index"])
            by_group.setdefault(row.group_id, []).append(
                TrainingRollout(
                    prompt_token_ids=prompts[row.group_id],
                    token_ids=tuple(row.token_ids),
                    logprobs=None if row.logprobs is None else tuple(row.logprobs),
                    candidates=tuple(
                        None
                        if slot.get("program_id") is None
                        else scores.get(slot["program_id"], {})
                        for slot in slots
                    ),
                )
            )
        return [
            TrainingGroup(id=g.id, iteration=g.iteration, rollouts=tuple(by_group.get(g.id, ())))
            for g in groups
        ]

    def objectives(self, campaign_id: int) -> list[str]:
        """The objective names the campaign's programs were scored on, sorted.

        The distinct names come from the (objective, value) index by skipping from one name to
        the next (a handful of index seeks, not a scan of every score); each is then checked
        for a program of this campaign."""
        with self._engine.connect() as connection:
            names = connection.execute(_DISTINCT_OBJECTIVES).scalars().all()
            return [
                name
                for name in names
                if connection.scalar(
                    select(literal(1))
                    .select_from(_SCORE.join(_PROGRAM, _PROGRAM.c.id == _SCORE.c.program_id))
                    .where(_SCORE.c.objective == name, _PROGRAM.c.campaign_id == campaign_id)
                    .limit(1)
                )
            ]

    def untrained_count(self, campaign_id: int) -> int:
        with self._engine.connect() as connection:
            return connection.execute(
                select(func.count()).where(
                    _GROUP.c.campaign_id == campaign_id,
                    _GROUP.c.train_step.is_(None),
                    _GROUP.c.prompt_token_ids.is_not(None),
                )
            ).scalar_one()

    def record_train_step(
        self,
        campaign_id: int,
        *,
        step: int,
        path: str,
        metrics: dict[str, Any],
        group_ids: Sequence[int],
    ) -> int:
        """Mark the groups as used by `step` and add its policy version, in one transaction.

        Raises UserError, writing nothing, when a group was used already or the step exists:
        each group trains once and policy versions stay contiguous.
        """
        try:
            with self._write_engine.begin() as connection:
                marked = connection.execute(
                    update(_GROUP)
                    .where(
                        _GROUP.c.campaign_id == campaign_id,
                        _GROUP.c.id.in_(list(group_ids)),
                        _GROUP.c.train_step.is_(None),
                    )
                    .values(train_step=step)
                ).rowcount
                if marked != len(set(group_ids)):
                    raise UserError(
                        f"training step {step}: {len(set(group_ids)) - marked} of its groups "
                        "were used by another step; is another trainer running?"
                    )
                now = utc_now()
                policy_id = connection.execute(
                    insert(_POLICY).returning(_POLICY.c.id),
                    {
                        "campaign_id": campaign_id,
                        "step": step,
                        "path": path,
                        "metrics": metrics,
                        "created_at": now,
                    },
                ).scalar_one()
                connection.execute(
                    insert(_EVENT),
                    {
                        "campaign_id": campaign_id,
                        "kind": "train_step",
                        "payload": {"step": step, "policy_version_id": policy_id, **metrics},
                        "created_at": now,
                    },
                )
                faults.point("train_commit")  # written, not yet committed
                return policy_id
        except IntegrityError:
            raise UserError(
                f"policy version {step} of campaign {campaign_id} exists already; "
                "is another trainer running?"
            ) from None

    def policies(self, campaign_id: int) -> list[PolicyRecord]:
        """The campaign's policy versions by step."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(_POLICY).where(_POLICY.c.campaign_id == campaign_id).order_by(_POLICY.c.step)
            ).all()
        return [
            PolicyRecord(r.id, r.campaign_id, r.step, r.path, r.metrics, r.created_at) for r in rows
        ]

    def latest_policy(self, campaign_id: int) -> PolicyRecord | None:
        with self._engine.connect() as connection:
            row = connection.execute(
                select(_POLICY)
                .where(_POLICY.c.campaign_id == campaign_id)
                .order_by(_POLICY.c.step.desc())
                .limit(1)
            ).one_or_none()
        if row is None:
            return None
        return PolicyRecord(
            row.id, row.campaign_id, row.step, row.path, row.metrics, row.created_at
        )

    # Inspection: what `vpo db` reads

    def provenance(self, program_id: int) -> dict[str, Any] | None:
        """Where an LLM program came from: its group (iteration, island, parent, drafts shown)
        and the rollout that wrote it; None for seeds and migrants."""
        with self._engine.connect() as connection:
            row = connection.execute(
                select(
                    _TRAJECTORY.c.id,
                    _TRAJECTORY.c.group_id,
                    _TRAJECTORY.c.position,
                    _TRAJECTORY.c.completion,
                    _TRAJECTORY.c.num_tokens,
                    _TRAJECTORY.c.finish_reason,
                    _TRAJECTORY.c.parse_status,
                    _TRAJECTORY.c.parse_error,
                    _TRAJECTORY.c.policy_version_id,
                    _GROUP.c.iteration,
                    _GROUP.c.island,
                    _GROUP.c.parent_program_id,
                    _GROUP.c.train_step,
                )
                .join(_GROUP, _GROUP.c.id == _TRAJECTORY.c.group_id)
                .join(_PROGRAM, _PROGRAM.c.trajectory_id == _TRAJECTORY.c.id)
                .where(_PROGRAM.c.id == program_id)
            ).one_or_none()
            if row is None:
                return None
            drafts = connection.execute(
                select(_DRAFT.c.program_id)
                .where(_DRAFT.c.group_id == row.group_id)
                .order_by(_DRAFT.c.position)
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
                },
            }

    def timeline(self, campaign_id: int) -> dict[str, list[Any]]:
        """When programs were stored and tokens generated: (created_at, ...) rows in order,
        for plots of progress over time."""
        with self._engine.connect() as connection:
            programs = connection.execute(
                select(_PROGRAM.c.created_at, _PROGRAM.c.origin)
                .where(_PROGRAM.c.campaign_id == campaign_id)
                .order_by(_PROGRAM.c.id)
            ).all()
            tokens = connection.execute(
                select(_TRAJECTORY.c.created_at, _TRAJECTORY.c.num_tokens)
                .join(_GROUP, _GROUP.c.id == _TRAJECTORY.c.group_id)
                .where(_GROUP.c.campaign_id == campaign_id)
                .order_by(_TRAJECTORY.c.id)
            ).all()
        return {
            "programs": [(row.created_at, row.origin) for row in programs],
            "tokens": [(row.created_at, row.num_tokens) for row in tokens],
        }

    def best_by_objective(
        self, campaign_id: int, objective: str, limit: int
    ) -> list[tuple[int, float, str]]:
        """(program id, score, code hash) of the `limit` best valid programs by `objective`,
        best first, oldest first among equals: a walk down the `ix_score_ranked` index that
        stops after `limit` valid rows."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(_SCORE.c.program_id, _SCORE.c.value, _PROGRAM.c.code_hash)
                .join(_PROGRAM, _PROGRAM.c.id == _SCORE.c.program_id)
                .where(
                    _PROGRAM.c.campaign_id == campaign_id,
                    _PROGRAM.c.status == "ok",
                    _SCORE.c.objective == objective,
                )
                .order_by(_SCORE.c.value.desc(), _SCORE.c.program_id)
                .limit(limit)
            ).all()
        return [(r.program_id, r.value, r.code_hash) for r in rows]

    def ancestry(self, program_id: int) -> list[tuple[int, int | None, int, int, str]]:
        """(id, parent id, island, generation, origin) of the program and every ancestor
        through parent links, the program first: one recursive query."""
        chain = (
            select(_PROGRAM.c.id, _PROGRAM.c.parent_id)
            .where(_PROGRAM.c.id == program_id)
            .cte("chain", recursive=True)
        )
        chain = chain.union(
            select(_PROGRAM.c.id, _PROGRAM.c.parent_id).join(
                chain, _PROGRAM.c.id == chain.c.parent_id
            )
        )
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(
                    _PROGRAM.c.id,
                    _PROGRAM.c.parent_id,
                    _PROGRAM.c.island,
                    _PROGRAM.c.generation,
                    _PROGRAM.c.origin,
                ).join(chain, chain.c.id == _PROGRAM.c.id)
            ).all()
        by_id = {r.id: tuple(r) for r in rows}
        ordered, current = [], program_id
        while current in by_id and len(ordered) < len(by_id):
            ordered.append(by_id[current])
            current = by_id[current][1]
        return ordered

    def drafts_shown(self, ids: Sequence[int]) -> dict[int, list[int]]:
        """For each of `ids` written by a rollout, the drafts its prompt showed, in order."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(_PROGRAM.c.id, _DRAFT.c.program_id)
                .join(_TRAJECTORY, _TRAJECTORY.c.id == _PROGRAM.c.trajectory_id)
                .join(_DRAFT, _DRAFT.c.group_id == _TRAJECTORY.c.group_id)
                .where(_PROGRAM.c.id.in_(list(ids)))
                .order_by(_PROGRAM.c.id, _DRAFT.c.position)
            ).all()
        shown: dict[int, list[int]] = {}
        for program_id, draft_id in rows:
            shown.setdefault(program_id, []).append(draft_id)
        return shown

    def children_counts(self, ids: Sequence[int]) -> dict[int, int]:
        """How many programs name each of `ids` as their parent."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(_PROGRAM.c.parent_id, func.count())
                .where(_PROGRAM.c.parent_id.in_(list(ids)))
                .group_by(_PROGRAM.c.parent_id)
            ).all()
        return {parent: count for parent, count in rows}

    def iter_programs(self, campaign_id: int, batch: int = 1000) -> Iterator[ProgramRecord]:
        """Every program of the campaign in id order, read `batch` at a time."""
        after = 0
        while True:
            with self._engine.connect() as connection:
                rows = connection.execute(
                    select(_PROGRAM)
                    .where(_PROGRAM.c.campaign_id == campaign_id, _PROGRAM.c.id > after)
                    .order_by(_PROGRAM.c.id)
                    .limit(batch)
                ).all()
                if not rows:
                    return
                records = _with_scores(connection, rows)
            yield from records
            after = rows[-1].id

    def iter_trajectory_groups(
        self, campaign_id: int, batch: int = 200
    ) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """(group, its trajectories) in iteration order, with every column the trainer uses."""
        after = -1
        while True:
            with self._engine.connect() as connection:
                groups = connection.execute(
                    select(_GROUP)
                    .where(_GROUP.c.campaign_id == campaign_id, _GROUP.c.iteration > after)
                    .order_by(_GROUP.c.iteration)
                    .limit(batch)
                ).all()
                if not groups:
                    return
                trajectories: dict[int, list[dict[str, Any]]] = {}
                for row in connection.execute(
                    select(_TRAJECTORY)
                    .where(_TRAJECTORY.c.group_id.in_([g.id for g in groups]))
                    .order_by(_TRAJECTORY.c.group_id, _TRAJECTORY.c.position)
                ):
                    trajectories.setdefault(row.group_id, []).append(dict(row._mapping))
                drafts: dict[int, list[int]] = {}
                for row in connection.execute(
                    select(_DRAFT)
                    .where(_DRAFT.c.group_id.in_([g.id for g in groups]))
                    .order_by(_DRAFT.c.group_id, _DRAFT.c.position)
                ):
                    drafts.setdefault(row.group_id, []).append(row.program_id)
            for group in groups:
                record = dict(group._mapping)
                record["draft_ids"] = drafts.get(group.id, [])
                yield record, trajectories.get(group.id, [])
            after = groups[-1].iteration

    # Aggregates for the views and the dashboard. Programs and scores are never updated once
    # written, so each takes `after_id`: the same query over only the programs stored since,
    # which a caller merges into what it read before.

    def _valid_ids(self, campaign_id: int, after_id: int, upto: int | None) -> Any:
        """Ids of the campaign's valid programs in (after_id, upto]: the (campaign_id, status)
        index covers it, so the wide program rows (code, metrics) are never read."""
        return select(_PROGRAM.c.id).where(
            _PROGRAM.c.campaign_id == campaign_id,
            _PROGRAM.c.status == "ok",
            *_id_range(_PROGRAM.c.id, after_id, upto),
        )

    def _valid_scores(self, campaign_id: int, after_id: int, upto: int | None) -> list[Any]:
        """Conditions for the score rows of those programs; the range on the score's own key
        lets a short range be read from the primary key instead of every row of an objective."""
        return [
            _SCORE.c.program_id.in_(self._valid_ids(campaign_id, after_id, upto)),
            *_id_range(_SCORE.c.program_id, after_id, upto),
        ]

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
            *((_SCORE.c.objective == name, w / total) for name, w in weights.items() if w > 0),
            else_=0.0,
        )
        key = func.sum(_SCORE.c.value * weight).label("key")
        ranked = (
            select(_SCORE.c.program_id, key)
            .where(*self._valid_scores(campaign_id, after_id, upto))
            .group_by(_SCORE.c.program_id)
            .order_by(key.desc(), _SCORE.c.program_id)
            .limit(limit)
            .subquery()
        )
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(ranked.c.program_id, ranked.c.key, _PROGRAM.c.code_hash)
                .join(_PROGRAM, _PROGRAM.c.id == ranked.c.program_id)
                .order_by(ranked.c.key.desc(), ranked.c.program_id)
            ).all()
        return [(r.program_id, float(r.key), r.code_hash) for r in rows]

    def record_points(
        self, campaign_id: int, objective: str, after_id: int = 0, upto: int | None = None
    ) -> list[tuple[int, int, float, float | None]]:
        """(program id, n, score, raw) for each valid program above `after_id` that beat every
        earlier one there on `objective`; n counts the valid programs from the first one above
        `after_id`. The curve of the best value so far, from one windowed scan."""
        earlier = func.max(_SCORE.c.value).over(order_by=_SCORE.c.program_id, rows=(None, -1))
        scan = (
            select(
                _SCORE.c.program_id,
                _SCORE.c.value,
                _SCORE.c.raw,
                func.row_number().over(order_by=_SCORE.c.program_id).label("n"),
                earlier.label("earlier"),
            )
            .where(
                _objective_in([objective], after_id),
                *self._valid_scores(campaign_id, after_id, upto),
            )
            .subquery()
        )
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(scan.c.program_id, scan.c.n, scan.c.value, scan.c.raw)
                .where((scan.c.earlier.is_(None)) | (scan.c.value > scan.c.earlier))
                .order_by(scan.c.program_id)
            ).all()
        return [(r.program_id, r.n, float(r.value), _float_or_none(r.raw)) for r in rows]

    def pair_front(
        self, campaign_id: int, x: str, y: str, after_id: int = 0, upto: int | None = None
    ) -> list[tuple[int, float, float]]:
        """(program id, x score, y score) of the valid programs above `after_id` that no other
        there beats on both objectives, by descending x; the oldest stands for equal pairs."""
        pivot = (
            select(
                _SCORE.c.program_id.label("id"),
                func.max(case((_SCORE.c.objective == x, _SCORE.c.value))).label("x"),
                func.max(case((_SCORE.c.objective == y, _SCORE.c.value))).label("y"),
            )
            .where(
                _objective_in([x, y], after_id),
                *self._valid_scores(campaign_id, after_id, upto),
            )
            .group_by(_SCORE.c.program_id)
            .subquery()
        )
        order = (pivot.c.x.desc(), pivot.c.y.desc(), pivot.c.id)
        scan = select(
            pivot.c.id,
            pivot.c.x,
            pivot.c.y,
            func.max(pivot.c.y).over(order_by=order, rows=(None, -1)).label("higher"),
        ).subquery()
        with self._engine.connect() as connection:
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
        wanted = self._valid_ids(campaign_id, after_id, upto).where(_PROGRAM.c.id % stride == 0)
        vectors: dict[int, list[float]] = {}
        column = {name: j for j, name in enumerate(objectives)}
        with self._engine.connect() as connection:
            for program_id, objective, value in connection.execute(
                select(_SCORE.c.program_id, _SCORE.c.objective, _SCORE.c.value)
                .where(
                    _SCORE.c.program_id.in_(wanted),
                    *_id_range(_SCORE.c.program_id, after_id, upto),
                    _objective_in(objectives, after_id),
                )
                .order_by(_SCORE.c.program_id)
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
        where = [_PROGRAM.c.campaign_id == campaign_id, *_id_range(_PROGRAM.c.id, after_id, upto)]
        numbered = select(
            _PROGRAM.c.id,
            _PROGRAM.c.created_at,
            (func.row_number().over(order_by=_PROGRAM.c.id) + offset).label("n"),
        ).where(*where)
        with self._engine.connect() as connection:
            last = connection.scalar(select(func.max(_PROGRAM.c.id)).where(*where))
            if last is None:
                return []
            numbered = numbered.subquery()
            rows = connection.execute(
                select(numbered.c.n, numbered.c.created_at)
                .where((numbered.c.n % stride == 0) | (numbered.c.id == last))
                .order_by(numbered.c.n)
            ).all()
        return [(n, at) for n, at in rows]

    def group_tokens(
        self, campaign_id: int, after_group: int = 0
    ) -> list[tuple[int, datetime, int]]:
        """(group id, stored at, tokens its rollouts generated) of each group above
        `after_group`, in order."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(
                    _GROUP.c.id,
                    _GROUP.c.created_at,
                    func.coalesce(func.sum(_TRAJECTORY.c.num_tokens), 0),
                )
                .join(_TRAJECTORY, _TRAJECTORY.c.group_id == _GROUP.c.id)
                .where(_GROUP.c.campaign_id == campaign_id, _GROUP.c.id > after_group)
                .group_by(_GROUP.c.id, _GROUP.c.created_at)
                .order_by(_GROUP.c.id)
            ).all()
        return [(gid, at, int(tokens)) for gid, at, tokens in rows]

    def program_count(self, campaign_id: int, upto: int | None = None) -> int:
        """How many programs the campaign has (with id <= `upto`): the (campaign_id, id)
        index counts them."""
        with self._engine.connect() as connection:
            return (
                connection.scalar(
                    select(func.count()).where(
                        _PROGRAM.c.campaign_id == campaign_id,
                        *_id_range(_PROGRAM.c.id, 0, upto),
                    )
                )
                or 0
            )

    def last_program_id(self, campaign_id: int) -> int | None:
        with self._engine.connect() as connection:
            return connection.scalar(
                select(func.max(_PROGRAM.c.id)).where(_PROGRAM.c.campaign_id == campaign_id)
            )

    def status_counts(
        self, campaign_id: int, after_id: int = 0, upto: int | None = None
    ) -> dict[str, int]:
        """Programs above `after_id` by status (every status listed)."""
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(_PROGRAM.c.status, func.count())
                .where(
                    _PROGRAM.c.campaign_id == campaign_id, *_id_range(_PROGRAM.c.id, after_id, upto)
                )
                .group_by(_PROGRAM.c.status)
            ).all()
        counts = dict.fromkeys(PROGRAM_STATUSES, 0)
        counts.update({status: count for status, count in rows})
        return counts

    def iterations_done(self, campaign_id: int) -> int:
        with self._reading() as session:
            return (
                session.scalar(select(func.count()).where(RolloutGroup.campaign_id == campaign_id))
                or 0
            )

    def program_vectors(
        self, campaign_id: int, objectives: Sequence[str], after_id: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """(ids, islands, valid, scores[N, d], code hashes) of the programs with id > after_id.

        Selection works on these arrays; two narrow queries, no code text, so a campaign with
        100k programs loads in well under a second and refreshes incrementally.
        """
        with self._reading() as session:
            rows = session.execute(
                select(Program.id, Program.island, Program.status, Program.code_hash)
                .where(Program.campaign_id == campaign_id, Program.id > after_id)
                .order_by(Program.id)
            ).all()
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            islands = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
            valid = np.fromiter((r[2] == "ok" for r in rows), dtype=bool, count=len(rows))
            scores = np.zeros((len(rows), len(objectives)))
            if rows:
                column = {name: j for j, name in enumerate(objectives)}
                position = {int(pid): i for i, pid in enumerate(ids)}
                for program_id, objective, value in session.execute(
                    select(Score.program_id, Score.objective, Score.value)
                    .join(Program, Program.id == Score.program_id)
                    .where(Score.program_id > after_id, Program.campaign_id == campaign_id)
                ):
                    j = column.get(objective)
                    if j is not None:
                        scores[position[program_id], j] = value
        return ids, islands, valid, scores, [r[3] for r in rows]

    def code_hashes(self, campaign_id: int) -> dict[str, int]:
        """Normalised-code hash -> the first program with it: what was evaluated already."""
        with self._reading() as session:
            rows = session.execute(
                select(Program.code_hash, func.min(Program.id))
                .where(Program.campaign_id == campaign_id)
                .group_by(Program.code_hash)
            )
            return {code: program_id for code, program_id in rows}

    def summary(self, campaign_id: int) -> Summary:
        with self._reading() as session:
            statuses = dict(
                session.execute(
                    select(Program.status, func.count())
                    .where(Program.campaign_id == campaign_id)
                    .group_by(Program.status)
                ).all()
            )
            evaluations = session.scalar(
                select(func.count()).where(
                    Program.campaign_id == campaign_id, Program.origin != "migration"
                )
            )
            groups = session.scalar(
                select(func.count()).where(RolloutGroup.campaign_id == campaign_id)
            )
            trajectories, tokens = session.execute(
                select(func.count(), func.coalesce(func.sum(Trajectory.num_tokens), 0))
                .join(RolloutGroup, RolloutGroup.id == Trajectory.group_id)
                .where(RolloutGroup.campaign_id == campaign_id)
            ).one()
            versions = session.scalar(
                select(func.count()).where(PolicyVersion.campaign_id == campaign_id)
            )
            best_value = (
                select(Score.objective, func.max(Score.value).label("value"))
                .join(Program, Program.id == Score.program_id)
                .where(Program.campaign_id == campaign_id, Program.status == "ok")
                .group_by(Score.objective)
                .subquery()
            )
            best: dict[str, dict[str, Any]] = {}
            for objective, value, raw, program_id in session.execute(
                select(Score.objective, Score.value, Score.raw, func.min(Program.id))
                .join(Program, Program.id == Score.program_id)
                .join(
                    best_value,
                    (best_value.c.objective == Score.objective)
                    & (best_value.c.value == Score.value),
                )
                .where(Program.campaign_id == campaign_id, Program.status == "ok")
                .group_by(Score.objective, Score.value, Score.raw)
                .order_by(Score.objective)
            ):
                if objective not in best:
                    best[objective] = {"score": value, "raw": raw, "program_id": program_id}
        return Summary(
            programs=sum(statuses.values()),
            valid_programs=statuses.get("ok", 0),
            evaluations=evaluations or 0,
            groups=groups or 0,
            trajectories=trajectories or 0,
            policy_versions=versions or 0,
            tokens=int(tokens or 0),
            best=best,
        )

    def program(self, program_id: int) -> ProgramRecord | None:
        with self._reading() as session:
            program = session.get(Program, program_id, options=[selectinload(Program.scores)])
            return None if program is None else _program_record(program)

    def programs(
        self,
        campaign_id: int,
        status: str | None = None,
        island: int | None = None,
        origin: str | None = None,
        limit: int | None = None,
    ) -> list[ProgramRecord]:
        """The campaign's programs in the order they were stored, optionally filtered."""
        query = select(Program).where(Program.campaign_id == campaign_id)
        if status is not None:
            _check_choice("program status", status, PROGRAM_STATUSES)
            query = query.where(Program.status == status)
        if island is not None:
            query = query.where(Program.island == island)
        if origin is not None:
            _check_choice("program origin", origin, PROGRAM_ORIGINS)
            query = query.where(Program.origin == origin)
        return self._program_records(query, limit)

    def programs_by_ids(self, ids: Sequence[int]) -> list[ProgramRecord]:
        """Programs in the order of `ids` (a parent and its drafts): two Core queries."""
        if not ids:
            return []
        with self._engine.connect() as connection:
            rows = connection.execute(select(_PROGRAM).where(_PROGRAM.c.id.in_(ids))).all()
            found = {record.id: record for record in _with_scores(connection, rows)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise ValueError(f"no programs with ids {missing}")
        return [found[i] for i in ids]

    def find_by_hash(self, campaign_id: int, code_hash: str) -> list[ProgramRecord]:
        """Programs with this code hash, oldest first; several when a program was migrated."""
        query = select(Program).where(
            Program.campaign_id == campaign_id, Program.code_hash == code_hash
        )
        return self._program_records(query)

    def _program_records(self, query: Select[Any], limit: int | None = None) -> list[ProgramRecord]:
        query = query.options(selectinload(Program.scores)).order_by(Program.id).limit(limit)
        with self._reading() as session:
            return [_program_record(program) for program in session.scalars(query)]

    # Events and counters

    def record_event(self, campaign_id: int, kind: str, payload: dict[str, Any]) -> int:
        with self._writing() as session:
            entry = Event(campaign_id=campaign_id, kind=kind, payload=payload)
            session.add(entry)
            session.flush()
            return entry.id

    def events(self, campaign_id: int, kind: str | None = None) -> list[EventRecord]:
        query = select(Event).where(Event.campaign_id == campaign_id)
        if kind is not None:
            query = query.where(Event.kind == kind)
        with self._reading() as session:
            return [
                EventRecord(e.id, e.campaign_id, e.kind, e.payload, e.created_at)
                for e in session.scalars(query.order_by(Event.id))
            ]

    def counts(self, campaign_id: int) -> Counts:
        with self._reading() as session:
            by_status = session.execute(
                select(Program.status, func.count())
                .where(Program.campaign_id == campaign_id)
                .group_by(Program.status)
            )
            by_kind = session.execute(
                select(Event.kind, func.count())
                .where(Event.campaign_id == campaign_id)
                .group_by(Event.kind)
            )
            programs = dict.fromkeys(PROGRAM_STATUSES, 0)
            programs.update({status: count for status, count in by_status})
            return Counts(programs=programs, events={kind: count for kind, count in by_kind})


CANDIDATE_OUTCOMES = ("new", "duplicate", "unparsed")


def _check_new_program(program: NewProgram) -> None:
    _check_choice("program status", program.status, PROGRAM_STATUSES)
    _check_scores(program.scores, program.raw)
    if "\x00" in program.code:
        raise ValueError("program code contains a NUL character; treat it as invalid output")


def _insert_program(
    session: Session,
    campaign_id: int,
    code: str,
    *,
    status: str,
    scores: Mapping[str, float],
    raw: Mapping[str, float | None],
    error: str | None,
    parent_id: int | None,
    island: int,
    generation: int,
    origin: str,
    eval_seconds: float,
    metrics: dict[str, Any] | None,
    trajectory_id: int | None,
    candidate_index: int | None,
    log: bool = True,
) -> Program:
    if error is not None:
        # Error text is for people (often a stderr tail); keep a visible marker instead.
        error = error.replace("\x00", "\\x00")
    program = Program(
        campaign_id=campaign_id,
        code=code,
        code_hash=code_hash(code),
        parent_id=parent_id,
        island=island,
        generation=generation,
        origin=origin,
        status=status,
        error=error,
        eval_seconds=eval_seconds,
        trajectory_id=trajectory_id,
        candidate_index=candidate_index,
        metrics={} if metrics is None else metrics,
        scores=[
            Score(objective=objective, value=float(value), raw=_float_or_none(raw.get(objective)))
            for objective, value in scores.items()
        ],
    )
    session.add(program)
    session.flush()
    if log:
        session.add(
            Event(
                campaign_id=campaign_id,
                kind="program_added",
                payload={
                    "program_id": program.id,
                    "status": status,
                    "origin": origin,
                    "island": island,
                },
            )
        )
    return program


# Iterations are written with Core statements on one connection, not through the ORM's unit of
# work: about ten statements per iteration whatever G and m are, and no per-row ORM bookkeeping,
# which keeps the harness's own time per iteration small (benchmarks/harness_overhead.py).
# Every distinct objective name, one index seek each (a loose index scan).
_DISTINCT_OBJECTIVES = text(
    "WITH RECURSIVE names(name) AS ("
    " SELECT min(objective) FROM score"
    " UNION ALL"
    " SELECT (SELECT min(objective) FROM score WHERE objective > names.name)"
    " FROM names WHERE names.name IS NOT NULL"
    ") SELECT name FROM names WHERE name IS NOT NULL ORDER BY name"
)
_PROGRAM = Program.__table__
_SCORE = Score.__table__
_GROUP = RolloutGroup.__table__
_DRAFT = GroupDraft.__table__
_TRAJECTORY = Trajectory.__table__
_EVENT = Event.__table__
_POLICY = PolicyVersion.__table__
_CLAIM = IterationClaim.__table__


def _write_iteration(
    connection: Connection,
    campaign_id: int,
    iteration: int,
    island: int,
    parent_id: int,
    draft_ids: Sequence[int],
    prompt: list[dict[str, str]],
    prompt_token_ids: Sequence[int] | None,
    rollouts: Sequence[RolloutRecord],
    policy_version_id: int | None,
    migrations: Sequence[tuple[int, int]],
) -> int:
    parent = connection.execute(
        select(_PROGRAM.c.campaign_id, _PROGRAM.c.generation).where(_PROGRAM.c.id == parent_id)
    ).one_or_none()
    if parent is None or parent.campaign_id != campaign_id:
        raise ValueError(f"parent program {parent_id} is not in campaign {campaign_id}")
    now = utc_now()
    group_id = connection.execute(
        insert(_GROUP).returning(_GROUP.c.id),
        {
            "campaign_id": campaign_id,
            "iteration": iteration,
            "island": island,
            "parent_program_id": parent_id,
            "prompt": prompt,
            "prompt_token_ids": None if prompt_token_ids is None else list(prompt_token_ids),
            "policy_version_id": policy_version_id,
            "created_at": now,
        },
    ).scalar_one()
    if draft_ids:
        connection.execute(
            insert(_DRAFT),
            [
                {"group_id": group_id, "position": i, "program_id": d}
                for i, d in enumerate(draft_ids)
            ],
        )
    if rollouts:
        _write_rollouts(
            connection,
            campaign_id,
            group_id,
            island,
            parent_id,
            parent.generation + 1,
            rollouts,
            policy_version_id,
            now,
        )
    for program_id, destination in migrations:
        _copy_program(connection, campaign_id, program_id, destination)
    connection.execute(
        insert(_EVENT),
        {
            "campaign_id": campaign_id,
            "kind": "group_recorded",
            "payload": {"group_id": group_id, "iteration": iteration, "island": island},
            "created_at": now,
        },
    )
    return group_id


def _write_rollouts(
    connection: Connection,
    campaign_id: int,
    group_id: int,
    island: int,
    parent_id: int,
    generation: int,
    rollouts: Sequence[RolloutRecord],
    policy_version_id: int | None,
    now: Any,
) -> None:
    trajectory_ids = _insert_returning_ids(
        connection,
        _TRAJECTORY,
        [
            {
                "group_id": group_id,
                "position": position,
                "completion": rollout.completion.replace("\x00", "\ufffd"),
                "token_ids": list(rollout.token_ids),
                "num_tokens": len(rollout.token_ids),
                "logprobs": None if rollout.logprobs is None else list(rollout.logprobs),
                "finish_reason": rollout.finish_reason,
                "policy_version_id": policy_version_id,
                "parse_status": rollout.parse_status,
                "parse_error": rollout.parse_error,
                "candidates": [],
                "created_at": now,
            }
            for position, rollout in enumerate(rollouts)
        ],
    )
    fresh = [
        (position, candidate)
        for position, rollout in enumerate(rollouts)
        for candidate in rollout.candidates
        if candidate.program is not None
    ]
    digests: dict[int, str] = {}  # id(candidate) -> its code hash
    known: dict[str, int] = {}  # code hash -> program id
    if fresh:
        hashes = [code_hash(c.program.code) for _, c in fresh]
        # A new candidate's own hash, computed once (the caller's may be missing).
        digests = {id(c): digest for (_, c), digest in zip(fresh, hashes, strict=True)}
        program_ids = _insert_returning_ids(
            connection,
            _PROGRAM,
            [
                {
                    "campaign_id": campaign_id,
                    "code": c.program.code,
                    "code_hash": digest,
                    "parent_id": parent_id,
                    "island": island,
                    "generation": generation,
                    "origin": "llm",
                    "status": c.program.status,
                    "error": None
                    if c.program.error is None
                    else c.program.error.replace("\x00", "\\x00"),
                    "eval_seconds": c.program.eval_seconds,
                    "trajectory_id": trajectory_ids[position],
                    "candidate_index": c.index,
                    "metrics": c.program.metrics,
                    "created_at": now,
                }
                for (position, c), digest in zip(fresh, hashes, strict=True)
            ],
        )
        scores = [
            {
                "program_id": program_id,
                "objective": objective,
                "value": float(value),
                "raw": _float_or_none(c.program.raw.get(objective)),
            }
            for program_id, (_, c) in zip(program_ids, fresh, strict=True)
            for objective, value in c.program.scores.items()
        ]
        if scores:
            connection.execute(insert(_SCORE), scores)
        for program_id, digest in zip(program_ids, hashes, strict=True):
            known.setdefault(digest, program_id)
    wanted = {
        c.code_hash
        for r in rollouts
        for c in r.candidates
        if c.outcome == "duplicate" and c.code_hash is not None and c.code_hash not in known
    }
    if wanted:
        known.update(
            connection.execute(
                select(_PROGRAM.c.code_hash, func.min(_PROGRAM.c.id))
                .where(_PROGRAM.c.campaign_id == campaign_id, _PROGRAM.c.code_hash.in_(wanted))
                .group_by(_PROGRAM.c.code_hash)
            ).all()
        )
    connection.execute(
        update(_TRAJECTORY)
        .where(_TRAJECTORY.c.id == bindparam("trajectory"))
        .values(candidates=bindparam("slots")),
        [
            {
                "trajectory": trajectory_id,
                "slots": [
                    {
                        "index": c.index,
                        "outcome": c.outcome,
                        "program_id": None
                        if c.outcome == "unparsed"
                        else known.get(digests.get(id(c), c.code_hash or "")),
                        "reason": c.reason,
                    }
                    for c in rollout.candidates
                ],
            }
            for trajectory_id, rollout in zip(trajectory_ids, rollouts, strict=True)
        ],
    )


def _insert_returning_ids(
    connection: Connection, table: Any, rows: list[dict[str, Any]]
) -> list[int]:
    """Insert rows and return their ids in order, in one statement on either engine.

    PostgreSQL batches `INSERT ... RETURNING` in parameter order. SQLite cannot (SQLAlchemy
    falls back to one statement per row there), but a SQLite writer holds the database's write
    lock (BEGIN IMMEDIATE), so it picks the ids SQLite itself would: max(id) + 1 onwards.
    """
    if connection.dialect.name == "sqlite":
        last = connection.execute(select(func.max(table.c.id))).scalar_one() or 0
        ids = list(range(last + 1, last + 1 + len(rows)))
        connection.execute(
            insert(table), [{**row, "id": i} for row, i in zip(rows, ids, strict=True)]
        )
        return ids
    return list(
        connection.scalars(
            insert(table).returning(table.c.id, sort_by_parameter_order=True), rows
        ).all()
    )


def _copy_program(connection: Connection, campaign_id: int, program_id: int, island: int) -> int:
    """A migrant: the same code and scores on another island, its source as parent."""
    source = connection.execute(select(_PROGRAM).where(_PROGRAM.c.id == program_id)).one_or_none()
    if source is None or source.campaign_id != campaign_id:
        raise ValueError(f"program {program_id} is not in campaign {campaign_id}")
    now = utc_now()
    copy_id = connection.execute(
        insert(_PROGRAM).returning(_PROGRAM.c.id),
        {
            "campaign_id": campaign_id,
            "code": source.code,
            "code_hash": source.code_hash,
            "parent_id": source.id,
            "island": island,
            "generation": source.generation,
            "origin": "migration",
            "status": source.status,
            "error": source.error,
            "eval_seconds": 0.0,
            "metrics": source.metrics,
            "created_at": now,
        },
    ).scalar_one()
    connection.execute(
        insert(_SCORE).from_select(
            ["program_id", "objective", "value", "raw"],
            select(literal(copy_id), _SCORE.c.objective, _SCORE.c.value, _SCORE.c.raw).where(
                _SCORE.c.program_id == program_id
            ),
        )
    )
    connection.execute(
        insert(_EVENT),
        {
            "campaign_id": campaign_id,
            "kind": "program_added",
            "payload": {
                "program_id": copy_id,
                "status": source.status,
                "origin": "migration",
                "island": island,
            },
            "created_at": now,
        },
    )
    return copy_id


def _campaign_record(campaign: Campaign) -> CampaignRecord:
    return CampaignRecord(
        id=campaign.id,
        name=campaign.name,
        problem=campaign.problem,
        config=campaign.config,
        seed=campaign.seed,
        created_at=campaign.created_at,
        status=campaign.status,
    )


def _program_record(program: Program) -> ProgramRecord:
    return _program_row_record(program, program.scores)


def _with_scores(connection: Connection, rows: Sequence[Any]) -> list[ProgramRecord]:
    """Records of program rows, with their scores read in one query."""
    scores: dict[int, list[Any]] = {}
    for score in connection.execute(
        select(_SCORE)
        .where(_SCORE.c.program_id.in_([row.id for row in rows]))
        .order_by(_SCORE.c.program_id, _SCORE.c.objective)
    ):
        scores.setdefault(score.program_id, []).append(score)
    return [_program_row_record(row, scores.get(row.id, [])) for row in rows]


def _program_row_record(row: Any, scores: Sequence[Any]) -> ProgramRecord:
    return ProgramRecord(
        id=row.id,
        campaign_id=row.campaign_id,
        code=row.code,
        code_hash=row.code_hash,
        parent_id=row.parent_id,
        island=row.island,
        generation=row.generation,
        origin=row.origin,
        status=row.status,
        error=row.error,
        eval_seconds=row.eval_seconds,
        trajectory_id=row.trajectory_id,
        candidate_index=row.candidate_index,
        metrics=row.metrics,
        created_at=row.created_at,
        scores={score.objective: score.value for score in scores},
        raw={score.objective: score.raw for score in scores},
    )


def _objective_in(names: Sequence[str], after_id: int) -> Any:
    """`score.objective IN names`; for the programs after an id, written as an expression so
    no engine answers it from the objective index (every row of the objective) instead of
    the short program-id range."""
    column = _SCORE.c.objective
    return (column if after_id == 0 else column.concat("")).in_(list(names))


def _id_range(column: Any, after_id: int, upto: int | None) -> list[Any]:
    return [column > after_id] + ([] if upto is None else [column <= upto])


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def _check_scores(scores: Mapping[str, float], raw: Mapping[str, float | None]) -> None:
    # The table checks the range too; checking here first gives a message that names the value.
    for objective, value in scores.items():
        if not 0.0 <= float(value) <= 1.0:  # False for NaN as well
            raise ValueError(f"score {objective}={value!r} is outside [0, 1]")
    for objective, value in raw.items():
        if objective not in scores:
            raise ValueError(f"raw value for {objective!r}, which has no score")
        if value is not None and not math.isfinite(value):
            # SQLite would store NaN as NULL and PostgreSQL keeps it: refuse rather than diverge.
            raise ValueError(f"raw {objective}={value!r} is not finite; pass None instead")


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


# Opening a database


def _database_url(target: str | os.PathLike[str], *, create: bool) -> URL:
    if isinstance(target, str) and "://" in target:
        try:
            url = make_url(target)
        except ArgumentError as exc:
            raise UserError(f"cannot parse database URL {target!r}: {exc}") from exc
        if url.get_backend_name() in ("postgresql", "postgres"):
            # Bare postgresql:// would pick psycopg2; we depend on psycopg 3.
            if url.drivername in ("postgresql", "postgres"):
                url = url.set(drivername="postgresql+psycopg")
            return url
        if url.get_backend_name() != "sqlite":
            raise UserError(
                f"unsupported database URL {url.drivername}://...; "
                "use a file path, sqlite:///path or postgresql://user@host/dbname"
            )
        path = url.database
    else:
        path = os.fspath(target)
        url = URL.create("sqlite", database=path)
    if path and path != ":memory:" and not path.startswith("file:"):
        # Absolute, so a later chdir cannot point new pool connections at another file.
        file = Path(path).expanduser().absolute()
        if not file.exists():
            if not create:
                raise UserError(f"no database at {file}; check the path or start a campaign there")
            file.parent.mkdir(parents=True, exist_ok=True)
        url = url.set(database=str(file))
    return url


def _describe(url: URL) -> str:
    if url.get_backend_name() == "sqlite":
        return url.database or ":memory:"
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)


def _make_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only=read_only)
    if read_only:
        # Added to any server options the URL carries (a search_path, say).
        given = url.query.get("options", "")
        given = " ".join(given) if isinstance(given, tuple) else given
        url = url.update_query_dict(
            {"options": f"{given} -c default_transaction_read_only=on".strip()}
        )
    try:
        return create_engine(
            url,
            json_serializer=dumps_json,
            # A long campaign outlives server restarts and idle-connection reaping.
            pool_pre_ping=True,
            connect_args={
                "connect_timeout": POSTGRES_CONNECT_TIMEOUT_S,
                "application_name": "vpo-evolve",
            },
        )
    except ImportError as exc:
        raise UserError(
            f"PostgreSQL needs the psycopg driver ({exc}); pip install 'vpo-evolve[postgres]'"
        ) from exc


def _sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.database in (None, "", ":memory:"):
        # Each connection to :memory: is a separate empty database: share one across threads.
        engine = create_engine(
            url,
            json_serializer=dumps_json,
            poolclass=StaticPool,
            connect_args={"check_same_thread": False},
        )
    elif read_only and not url.database.startswith("file:"):
        # Through a SQLite URI with mode=ro, so nothing is created or written: a read-only
        # file or mount works. Decided per connection (see `_connect_read_only`), since a
        # live writer elsewhere can come and go while a dashboard runs.
        path = url.database
        engine = create_engine(
            url, json_serializer=dumps_json, creator=lambda: _connect_read_only(path)
        )
    else:
        engine = create_engine(url, json_serializer=dumps_json)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take BEGIN/COMMIT away from the sqlite3 module, which skips BEGIN before DDL (so table
        # creation would not be one transaction); `_on_begin` issues it instead.
        dbapi_connection.isolation_level = None
        for pragma in (
            "foreign_keys = ON",
            f"busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}",
            # In WAL mode NORMAL cannot corrupt the file; a power cut loses the last commits only.
            "synchronous = NORMAL",
            *(["query_only = ON"] if read_only else []),
        ):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A deferred transaction that reads and then writes fails at once with SQLITE_BUSY when
        # another writer got in between (busy_timeout cannot help); writers take the lock first.
        immediate = connection.get_execution_options().get("vpo_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that reads `path` and writes nothing, not even a -wal or -shm file.

    `mode=ro` reads a live campaign's WAL through the -shm file, which SQLite creates when it
    is missing and the folder is writable. On a read-only folder or mount without the -shm
    file (the last writer closed cleanly and removed it), SQLite cannot open a WAL database
    that way; the database is then read as `immutable`, which takes no locks and needs no
    -shm: right for a mount nothing writes to. Reading so would skip the commits in a -wal
    file with content, so that case is refused instead.
    """
    uri = f"{Path(path).as_uri()}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return connection
    except sqlite3.Error as error:
        if getattr(error, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
            return connection  # `_prepare`'s first query meets the error and words it
    connection.close()
    wal = Path(f"{path}-wal")
    if wal.is_file() and wal.stat().st_size > 0:
        raise UserError(
            f"cannot read {path} here: its {wal.name} holds commits that SQLite reads only "
            f"through a {Path(path).name}-shm file, which this read-only folder cannot hold; "
            "copy the database with its -wal file to a writable folder and read it there"
        )
    return sqlite3.connect(f"{uri}&immutable=1", uri=True, check_same_thread=False)


def _prepare(engine: Engine, where: str, *, create: bool, read_only: bool = False) -> None:
    """Check the schema version; create the tables when the database is empty, and indexes
    added since (same schema version: older releases read the file as before) when not."""
    sqlite = engine.dialect.name == "sqlite"
    try:
        with engine.connect() as connection:
            is_new = _check_schema(connection, where)
        if is_new:
            if not create:
                raise SchemaError(f"{where} is empty, not a vpo-evolve database; create it first")
            with engine.execution_options(vpo_write=True).begin() as connection:
                if not sqlite:
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": _POSTGRES_CREATE_LOCK}
                    )
                # Another process may have created the tables while we waited for the lock.
                if _check_schema(connection, where):
                    create_tables(connection)
                    connection.execute(
                        Meta.__table__.insert().values(
                            key="schema_version", value=str(SCHEMA_VERSION)
                        )
                    )
        elif not read_only:
            _add_missing_indexes(engine)
        # A reader leaves the journal mode alone: switching it writes the file. Every
        # database a campaign wrote is in WAL already, so readers never block its writer.
        if sqlite and not read_only:
            _enable_wal(engine, where)
    except DBAPIError as exc:
        raise _open_error(
            exc.orig, where, sqlite, connecting=isinstance(exc, OperationalError)
        ) from exc
    except sqlite3.Error as exc:
        raise _open_error(exc, where, sqlite, connecting=False) from exc


def _add_missing_indexes(engine: Engine) -> None:
    """Tables and indexes a database written by an earlier release of this schema version
    lacks."""
    with engine.connect() as connection:
        tables = set(inspect(connection).get_table_names())
    absent = [Base.metadata.tables[name] for name in ADDED_TABLES if name not in tables]
    if absent:
        with engine.execution_options(vpo_write=True).begin() as connection:
            for table in absent:
                table.create(connection, checkfirst=True)
    with engine.connect() as connection:
        have = {
            index["name"]
            for table in Base.metadata.tables
            for index in inspect(connection).get_indexes(table)
        }
    missing = [
        index
        for table in Base.metadata.tables.values()
        for index in table.indexes
        if index.name not in have
    ]
    if missing:
        with engine.execution_options(vpo_write=True).begin() as connection:
            for index in missing:
                index.create(connection, checkfirst=True)


def _check_schema(connection: Connection, where: str) -> bool:
    """True when the database has no tables; raises SchemaError unless it is ours and current."""
    tables = set(inspect(connection).get_table_names())
    if not tables:
        return True
    foreign = f"{where} is not a vpo-evolve database"
    if "meta" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise SchemaError(f"{foreign} (it holds other tables: {shown}); use a new file or database")
    try:
        value = connection.scalar(select(Meta.value).where(Meta.key == "schema_version"))
    except DBAPIError as exc:
        raise SchemaError(f"{foreign} (its meta table has another layout)") from exc
    try:
        version = int(value)
    except (TypeError, ValueError):
        raise SchemaError(f"{foreign} (its meta table holds no schema_version)") from None
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was written by schema version {version}; "
            f"this vpo-evolve reads version {SCHEMA_VERSION}; upgrade vpo-evolve"
        )
    if version < SCHEMA_VERSION:
        raise SchemaError(
            f"{where} was written by schema version {version}; this vpo-evolve reads version "
            f"{SCHEMA_VERSION} and cannot migrate it; use the vpo-evolve release that wrote it"
        )
    missing = set(Base.metadata.tables) - tables - set(ADDED_TABLES)
    if missing:
        raise SchemaError(f"{where} lacks tables {', '.join(sorted(missing))}; it is damaged")
    return False


def _enable_wal(engine: Engine, where: str) -> None:
    # journal_mode persists in the file but cannot change inside a transaction, so it is set on
    # a raw connection, and only once the file is known to be ours: never convert someone
    # else's database before refusing it.
    # Switching takes a lock SQLite does not wait for (busy_timeout does not apply), so a
    # process opening a new file beside another one that is creating it retries.
    raw = engine.raw_connection()
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    try:
        while True:
            try:
                mode = raw.driver_connection.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    mode = raw.driver_connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        raw.close()
    if mode not in ("wal", "memory"):
        raise UserError(f"cannot switch {where} to WAL mode; it stays in {mode} mode")


def _open_error(
    error: BaseException | None, where: str, sqlite: bool, *, connecting: bool
) -> UserError:
    lines = str(error).strip().splitlines()
    message = lines[0] if lines else type(error).__name__
    if sqlite and getattr(error, "sqlite_errorname", "") == "SQLITE_NOTADB":
        return SchemaError(f"{where} is not a SQLite database; point at a vpo-evolve database")
    if sqlite:
        return UserError(f"cannot open {where}: {message}")
    if connecting:
        return UserError(
            f"cannot use PostgreSQL at {where}: {message}; "
            "check that the server is running and the URL is right"
        )
    if getattr(error, "sqlstate", None) == "42501":  # insufficient_privilege
        # Since PostgreSQL 15 only the database owner may create tables in `public` by default.
        return UserError(
            f"cannot use PostgreSQL at {where}: {message}; "
            "let this role create tables there (GRANT CREATE ON SCHEMA) or use a database it owns"
        )
    return UserError(f"cannot use PostgreSQL at {where}: {message}")
