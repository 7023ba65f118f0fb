"""Campaigns, the programs stored outside an iteration (a seed), and the one way any program
is inserted: its row, its scores and, when logged, its `program_added` event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from harness.config.errors import UserError
from harness.records import CampaignRecord, Lineage, NewProgram, code_hash
from harness.store.models import CAMPAIGN_STATUSES, utc_now
from harness.store.opening import Database
from harness.store.tables import (
    CAMPAIGN,
    EVENT,
    PROGRAM,
    SCORE,
    campaign_record,
    check_choice,
    check_program,
    float_or_none,
    log_event,
)

SEED = Lineage()


class Campaigns(Database):
    def create_campaign(self, name: str, problem: str, config: dict[str, Any], seed: int) -> int:
        try:
            with self._writing() as connection:
                campaign_id = connection.execute(
                    insert(CAMPAIGN).returning(CAMPAIGN.c.id),
                    {"name": name, "problem": problem, "config": config, "seed": seed},
                ).scalar_one()
                payload = {"name": name, "problem": problem, "seed": seed}
                log_event(connection, campaign_id, "campaign_created", payload)
                return campaign_id
        except IntegrityError as exc:
            if self.get_campaign(name) is None:
                raise
            raise UserError(
                f"a campaign named {name!r} already exists in {self.where}; "
                "pick another name or resume that one"
            ) from exc

    def get_campaign(self, name: str) -> CampaignRecord | None:
        with self._reading() as connection:
            row = connection.execute(select(CAMPAIGN).where(CAMPAIGN.c.name == name)).one_or_none()
        return None if row is None else campaign_record(row)

    def campaigns(self) -> list[CampaignRecord]:
        with self._reading() as connection:
            rows = connection.execute(select(CAMPAIGN).order_by(CAMPAIGN.c.id)).all()
        return [campaign_record(row) for row in rows]

    def set_campaign_status(self, campaign_id: int, status: str, reason: str | None = None) -> None:
        """The campaign's status, logged as an event with `reason` where one is given (why a
        run finished before its iterations: the budget that stopped it)."""
        check_choice("campaign status", status, CAMPAIGN_STATUSES)
        with self._writing() as connection:
            result = connection.execute(
                update(CAMPAIGN).where(CAMPAIGN.c.id == campaign_id).values(status=status)
            )
            if result.rowcount != 1:
                raise KeyError(f"no campaign with id {campaign_id}")
            payload = {"status": status} if reason is None else {"status": status, "reason": reason}
            log_event(connection, campaign_id, "campaign_status", payload)

    def add_program(
        self,
        campaign_id: int,
        program: NewProgram,
        lineage: Lineage = SEED,
        *,
        the_seed: bool = False,
        islands: int = 1,
    ) -> int:
        """Store a program, its scores and a `program_added` event in one transaction.

        `the_seed`: this is the campaign's one seed; if another process stored it first, its
        id is returned and nothing is written. With `islands` > 1 the seed lands on island 0
        and, in the same transaction, a copy of it (origin "migration", the seed its parent)
        on each other island, so that every island starts from the seed, as FunSearch's do:
        an island that started empty would take its first valid child, however poor, as the
        only parent it knows."""
        check_program(program, lineage.origin)
        with self._writing() as connection:
            if the_seed:
                existing = _the_seed(connection, campaign_id)
                if existing is not None:
                    return existing
            now = utc_now()
            [program_id] = insert_programs(
                connection, campaign_id, [(program, lineage)], now, log=True
            )
            if the_seed and islands > 1:
                copies = [
                    (program, Lineage("migration", program_id, island, lineage.generation))
                    for island in range(1, islands)
                ]
                insert_programs(connection, campaign_id, copies, now, log=True)
            return program_id

    def record_event(self, campaign_id: int, kind: str, payload: dict[str, Any]) -> int:
        with self._writing() as connection:
            return log_event(connection, campaign_id, kind, payload)


def _the_seed(connection: Connection, campaign_id: int) -> int | None:
    """The campaign's seed, if stored. One seed per campaign, however many workers start at
    once: the campaign row lock orders them, and the later ones get the first one's seed."""
    connection.execute(select(CAMPAIGN.c.id).where(CAMPAIGN.c.id == campaign_id).with_for_update())
    return connection.execute(
        select(PROGRAM.c.id)
        .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.origin == "seed")
        .order_by(PROGRAM.c.id)
        .limit(1)
    ).scalar()


def insert_programs(
    connection: Connection,
    campaign_id: int,
    programs: Sequence[tuple[NewProgram, Lineage]],
    now: datetime,
    *,
    log: bool,
    hashes: Sequence[str] | None = None,
) -> list[int]:
    """Store programs (checked already), their scores and, when `log`, a `program_added`
    event each; their ids, in order. Three statements however many programs.

    `hashes`: the programs' code hashes where the caller has them (a migrant keeps its
    source's); computed from the code otherwise."""
    if hashes is None:
        hashes = [code_hash(program.code) for program, _ in programs]
    rows = [
        _program_row(campaign_id, program, lineage, digest, now)
        for (program, lineage), digest in zip(programs, hashes, strict=True)
    ]
    ids = insert_returning_ids(connection, PROGRAM, rows)
    scores = [
        {
            "program_id": program_id,
            "objective": objective,
            "value": float(value),
            "raw": float_or_none(program.raw.get(objective)),
        }
        for program_id, (program, _) in zip(ids, programs, strict=True)
        for objective, value in program.scores.items()
    ]
    if scores:
        connection.execute(insert(SCORE), scores)
    if log and ids:
        connection.execute(
            insert(EVENT),
            [
                {
                    "campaign_id": campaign_id,
                    "kind": "program_added",
                    "payload": {
                        "program_id": program_id,
                        "status": program.status,
                        "origin": lineage.origin,
                        "island": lineage.island,
                    },
                    "created_at": now,
                }
                for program_id, (program, lineage) in zip(ids, programs, strict=True)
            ],
        )
    return ids


def _program_row(
    campaign_id: int, program: NewProgram, lineage: Lineage, digest: str, now: datetime
) -> dict[str, Any]:
    return {
        "campaign_id": campaign_id,
        "code": program.code,
        "code_hash": digest,
        "parent_id": lineage.parent_id,
        "island": lineage.island,
        "generation": lineage.generation,
        "origin": lineage.origin,
        "status": program.status,
        # Error text is for people (often a stderr tail); keep a visible marker for a NUL.
        "error": None if program.error is None else program.error.replace("\x00", "\\x00"),
        "eval_seconds": program.eval_seconds,
        "trajectory_id": lineage.trajectory_id,
        "candidate_index": lineage.candidate_index,
        "metrics": program.metrics,
        "created_at": now,
    }


def insert_returning_ids(
    connection: Connection, table: Any, rows: list[dict[str, Any]]
) -> list[int]:
    """Insert rows and return their ids in order, in one statement on either engine.

    PostgreSQL batches `INSERT ... RETURNING` in parameter order. SQLite cannot (SQLAlchemy
    falls back to one statement per row there), but a SQLite writer holds the database's write
    lock (BEGIN IMMEDIATE), so it picks the ids SQLite itself would: max(id) + 1 onwards.
    """
    if not rows:
        return []
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
