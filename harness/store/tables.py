"""What every part of the store shares: the tables as Core statements see them, the checks a
write makes before it touches them, and the plain records made from their rows.

The store reads and writes with Core statements on a connection, never through the ORM's
unit of work: a handful of statements per write whatever its size, and no live objects to
leak out of a transaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from harness.records import CampaignRecord, NewProgram, ProgramRecord
from harness.store.models import (
    PROGRAM_ORIGINS,
    PROGRAM_STATUSES,
    Campaign,
    Event,
    GroupDraft,
    IterationClaim,
    PolicyVersion,
    Program,
    RolloutGroup,
    Score,
    Trajectory,
    utc_now,
)
from problems.api import MAX_SCORE

CAMPAIGN = Campaign.__table__
PROGRAM = Program.__table__
SCORE = Score.__table__
GROUP = RolloutGroup.__table__
DRAFT = GroupDraft.__table__
TRAJECTORY = Trajectory.__table__
EVENT = Event.__table__
POLICY = PolicyVersion.__table__
CLAIM = IterationClaim.__table__

CANDIDATE_OUTCOMES = ("new", "duplicate", "unparsed")

# Ids per `IN (...)` list: well under the bound parameters either engine takes in a statement.
ID_BATCH = 500


# Checks before a write


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {', '.join(allowed)}")


def check_program(program: NewProgram, origin: str) -> None:
    check_choice("program status", program.status, PROGRAM_STATUSES)
    check_choice("program origin", origin, PROGRAM_ORIGINS)
    _check_scores(program.scores, program.raw)
    if "\x00" in program.code:
        # PostgreSQL text cannot hold NUL, SQLite can: refuse on both so engines agree.
        raise ValueError("program code contains a NUL character; treat it as invalid output")


def _check_scores(scores: Mapping[str, float], raw: Mapping[str, float | None]) -> None:
    # The table checks the range too; checking here first gives a message that names the value.
    # No cap at 1: a record scores above it (see `Objective.normalise`).
    for objective, value in scores.items():
        if not 0.0 <= float(value) <= MAX_SCORE:  # False for NaN and infinity as well
            raise ValueError(
                f"score {objective}={value!r} is not a finite number >= 0 (at most {MAX_SCORE:g})"
            )
    for objective, value in raw.items():
        if objective not in scores:
            raise ValueError(f"raw value for {objective!r}, which has no score")
        if value is not None and not math.isfinite(value):
            # SQLite would store NaN as NULL and PostgreSQL keeps it: refuse rather than diverge.
            raise ValueError(f"raw {objective}={value!r} is not finite; pass None instead")


# Statements more than one part of the store makes


def log_event(
    connection: Connection,
    campaign_id: int,
    kind: str,
    payload: dict[str, Any],
    now: datetime | None = None,
) -> int:
    """Append one event; its id."""
    return connection.execute(
        insert(EVENT).returning(EVENT.c.id),
        {
            "campaign_id": campaign_id,
            "kind": kind,
            "payload": payload,
            "created_at": utc_now() if now is None else now,
        },
    ).scalar_one()


def count_by_status(
    connection: Connection, campaign_id: int, after_id: int = 0, upto: int | None = None
) -> dict[str, int]:
    """The campaign's programs in (after_id, upto] by status, every status listed."""
    rows = connection.execute(
        select(PROGRAM.c.status, func.count())
        .where(PROGRAM.c.campaign_id == campaign_id, *id_range(PROGRAM.c.id, after_id, upto))
        .group_by(PROGRAM.c.status)
    ).all()
    counts = dict.fromkeys(PROGRAM_STATUSES, 0)
    counts.update({status: count for status, count in rows})
    return counts


def id_range(column: Any, after_id: int, upto: int | None) -> list[Any]:
    return [column > after_id] + ([] if upto is None else [column <= upto])


def float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


# Records from rows


def campaign_record(row: Any) -> CampaignRecord:
    return CampaignRecord(
        id=row.id,
        name=row.name,
        problem=row.problem,
        config=row.config,
        seed=row.seed,
        created_at=row.created_at,
        status=row.status,
    )


def with_scores(connection: Connection, rows: Sequence[Any]) -> list[ProgramRecord]:
    """Records of program rows, with their scores read `ID_BATCH` programs a query."""
    scores: dict[int, list[Any]] = {}
    ids = [row.id for row in rows]
    for start in range(0, len(ids), ID_BATCH):
        for score in connection.execute(
            select(SCORE)
            .where(SCORE.c.program_id.in_(ids[start : start + ID_BATCH]))
            .order_by(SCORE.c.program_id, SCORE.c.objective)
        ):
            scores.setdefault(score.program_id, []).append(score)
    return [program_record(row, scores.get(row.id, [])) for row in rows]


def program_record(row: Any, scores: Sequence[Any]) -> ProgramRecord:
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
