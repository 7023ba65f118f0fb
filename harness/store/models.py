"""The solution database: SQLAlchemy 2.0 typed models, one class per table.

The database is the checkpoint: a campaign resumes from these rows alone. Only `harness.store`
reads and writes them; everything else receives plain records.

The same models run on SQLite (the embedded default) and PostgreSQL, so they use only portable
column types: JSON, Text, Float, Integer and timestamps stored in UTC.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from problems.api import MAX_SCORE

# Bump when a table or column changes; `Store.open` refuses databases written by a newer version.
SCHEMA_VERSION = 1

# The largest id a row can have (SQLite's INTEGER is 64-bit signed): a larger one names no row,
# and the SQLite driver raises OverflowError binding it, so ids from users are checked first.
MAX_ID = 2**63 - 1

CAMPAIGN_STATUSES = ("running", "finished", "failed", "stopped")
PROGRAM_STATUSES = ("ok", "invalid", "error", "timeout")
PROGRAM_ORIGINS = ("seed", "llm", "migration")


def dumps_json(value: Any) -> str:
    """JSON for JSON columns; NaN and infinity are refused because PostgreSQL refuses them."""
    return json.dumps(value, allow_nan=False)


def utc_now() -> datetime:
    return datetime.now(UTC)


def create_tables(connection: Connection) -> None:
    """Create every table, on any engine."""
    schema_copy().create_all(connection)


def schema_copy() -> MetaData:
    """A copy of the tables, to make DDL from: a constraint SQLAlchemy adds with ALTER TABLE
    (on PostgreSQL, the cyclic foreign key; a replaced check) is marked not-inline for the rest
    of the process, so a SQLite table created afterwards from the shared metadata would
    silently lack it."""
    copy = MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.tables.values():
        table.to_metadata(copy)
    return copy


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite has no timezone-aware type and hands back naive datetimes; without this the same
    row would compare differently depending on the engine.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# Python None is stored as SQL NULL, not as the JSON text 'null', so `IS NULL` finds it.
NullableJSON = JSON(none_as_null=True)


def _one_of(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


class Base(DeclarativeBase):
    # Named constraints keep DDL stable across engines and let a later migration refer to them.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        str: Text(),
        float: Float(),
    }


class Meta(Base):
    """Key/value facts about the database itself; `schema_version` is the one that matters."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str]


class Campaign(Base):
    __tablename__ = "campaign"
    __table_args__ = (CheckConstraint(_one_of("status", CAMPAIGN_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    problem: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]]
    seed: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    status: Mapped[str] = mapped_column(String(16), default="running")


class Program(Base):
    __tablename__ = "program"
    __table_args__ = (
        CheckConstraint(_one_of("status", PROGRAM_STATUSES), name="status"),
        CheckConstraint(_one_of("origin", PROGRAM_ORIGINS), name="origin"),
        # Not unique: a migration copies a program, hash and all, to another island.
        Index(None, "campaign_id", "code_hash"),
        Index(None, "campaign_id", "status"),
        Index(None, "campaign_id", "island"),
        # "the programs stored since id X": the incremental refresh of every iteration
        Index(None, "campaign_id", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"))
    code: Mapped[str]
    code_hash: Mapped[str] = mapped_column(String(64))
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("program.id", ondelete="CASCADE"), index=True
    )
    island: Mapped[int] = mapped_column(default=0)
    generation: Mapped[int] = mapped_column(default=0)
    origin: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None]
    eval_seconds: Mapped[float] = mapped_column(default=0.0)
    # program -> trajectory -> rollout_group -> program is a cycle; use_alter lets PostgreSQL
    # add this key after all three tables exist (SQLite accepts the forward reference inline).
    trajectory_id: Mapped[int | None] = mapped_column(
        ForeignKey("trajectory.id", ondelete="CASCADE", use_alter=True), index=True
    )
    candidate_index: Mapped[int | None]
    # Raw objective values and artifacts (stdout tail, construction) as the scorer reported them.
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)

    # Ordered so records and prompts list objectives the same way on every engine.
    scores: Mapped[list[Score]] = relationship(
        back_populates="program",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="Score.objective",
    )


class Score(Base):
    """One objective of one program: `value` the normalised score (>= 0, higher is better,
    1 = the best known value, above 1 a record) and the raw number."""

    __tablename__ = "score"
    __table_args__ = (
        # A finite number >= 0, written so NaN and infinity fail on both engines: on
        # PostgreSQL NaN sorts above every number, so an upper bound is what refuses it (SQLite
        # stores NaN as NULL, which NOT NULL refuses). Databases of earlier releases carry
        # "value_unit" (value <= 1) instead, until migration 0001 replaces it.
        CheckConstraint(f"value >= 0 AND value <= {MAX_SCORE:.0e}", name="value_finite"),
        # "The best programs by one objective, oldest first among equals" is a walk down this
        # index that stops after the rows wanted; without the id, ties (many programs at the
        # same score) would all be read and sorted. It also lists the distinct objectives.
        Index("ix_score_ranked", "objective", text("value DESC"), "program_id"),
    )

    program_id: Mapped[int] = mapped_column(
        ForeignKey("program.id", ondelete="CASCADE"), primary_key=True
    )
    objective: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[float]
    raw: Mapped[float | None]

    program: Mapped[Program] = relationship(back_populates="scores")


class RolloutGroup(Base):
    """G rollouts generated for one prompt (`group` is a reserved word in SQL).

    `iteration` is unique within a campaign: a resumed or concurrent run can never record the
    same iteration twice, and the number of iterations done is the number of groups.
    """

    __tablename__ = "rollout_group"
    __table_args__ = (
        Index(None, "campaign_id", "train_step"),
        UniqueConstraint("campaign_id", "iteration"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"))
    iteration: Mapped[int]
    island: Mapped[int] = mapped_column(default=0)
    # The chat messages the G rollouts answered, and their tokens where the backend gave them.
    prompt: Mapped[list[dict[str, str]]] = mapped_column(JSON, default=list)
    prompt_token_ids: Mapped[list[int] | None] = mapped_column(NullableJSON)
    # The prompt tokens a server reported where it gave no ids (migration 0003); NULL otherwise.
    prompt_tokens: Mapped[int | None]
    parent_program_id: Mapped[int | None] = mapped_column(
        ForeignKey("program.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
    # NULL until a training step consumes the group; resuming trains on exactly the NULL ones.
    train_step: Mapped[int | None]
    # Why the step that took the group changed no weight (a non-finite gradient, no completion
    # token within the training length); no step takes it again. NULL otherwise. Added by
    # migration 0002.
    train_skipped: Mapped[str | None] = mapped_column(Text)
    policy_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("policy_version.id", ondelete="CASCADE"), index=True
    )
    # Why the iteration produced no rollouts (its prompt did not fit, its request failed);
    # NULL for an iteration that generated. A skipped iteration still uses its number.
    skipped: Mapped[str | None] = mapped_column(Text)
    # The population when the parent was chosen: {"programs", "valid", "upto" (the highest
    # program id it held), "islands" (programs per island)}. With many iterations in flight,
    # timing decides which programs a selection saw; this records it.
    population: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    # What the iteration's candidates measure (trainer/measures.py), written with the
    # group: the share of its rollouts whose m candidates all parsed, and the mean L1 distance
    # between the reward vectors of its candidate slots that hold a program (every pair of the
    # G x m).
    # NULL for a skipped iteration, a diversity of fewer than two such slots, and groups
    # recorded before the columns existed (`Store.iteration_measures` computes theirs on read).
    parse_rate: Mapped[float | None]
    pool_diversity: Mapped[float | None]


class GroupDraft(Base):
    """A program shown to the model as a draft (inspiration) in a group's prompt."""

    __tablename__ = "group_draft"

    group_id: Mapped[int] = mapped_column(
        ForeignKey("rollout_group.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True)
    program_id: Mapped[int] = mapped_column(
        ForeignKey("program.id", ondelete="CASCADE"), index=True
    )


class Trajectory(Base):
    """One rollout: prompt, completion and the tokens the trainer needs to replay it."""

    __tablename__ = "trajectory"

    id: Mapped[int] = mapped_column(primary_key=True)
    group_id: Mapped[int] = mapped_column(
        ForeignKey("rollout_group.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(default=0)  # 0..G-1 within the group
    completion: Mapped[str]
    token_ids: Mapped[list[int]] = mapped_column(JSON)
    num_tokens: Mapped[int] = mapped_column(default=0)  # len(token_ids), for aggregate queries
    finish_reason: Mapped[str] = mapped_column(String(16), default="stop")
    # Sampling log-probs, where the backend gives them; NULL otherwise.
    logprobs: Mapped[list[float] | None] = mapped_column(NullableJSON)
    policy_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("policy_version.id", ondelete="CASCADE"), index=True
    )
    parse_status: Mapped[str] = mapped_column(String(32))
    parse_error: Mapped[str | None]
    # One entry per candidate slot 1..m: {"index", "outcome": new | duplicate | unparsed,
    # "program_id" (the evaluated program, also for a duplicate), "reason"}. The reward matrix
    # (m x d) of the rollout is read through these program ids; unparsed slots score zeros.
    candidates: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class PolicyVersion(Base):
    __tablename__ = "policy_version"
    __table_args__ = (UniqueConstraint("campaign_id", "step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"))
    step: Mapped[int]
    # Folder or hub id of the weights or adapter.
    path: Mapped[str]
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)


class IterationClaim(Base):
    """An iteration a worker took (`vpo worker`): others skip it while the claim is fresh.

    A worker that dies leaves its claim to go stale after the lease; another worker then takes
    the iteration again. The group's unique (campaign, iteration) key keeps a late finisher
    from recording it twice. Added after schema version 1 shipped: migration 0001 creates it
    in a database from before.
    """

    __tablename__ = "iteration_claim"

    campaign_id: Mapped[int] = mapped_column(
        ForeignKey("campaign.id", ondelete="CASCADE"), primary_key=True
    )
    iteration: Mapped[int] = mapped_column(primary_key=True)
    worker: Mapped[str] = mapped_column(String(200))
    claimed_at: Mapped[datetime] = mapped_column(default=utc_now)


class Event(Base):
    """Append-only log; nothing updates or deletes an event."""

    __tablename__ = "event"
    __table_args__ = (Index(None, "campaign_id", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaign.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utc_now)
