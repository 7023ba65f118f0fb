"""Adopt a database from before migrations: schema version 1 as its releases left it.

Releases of schema version 1 added, without a version change, a table (iteration_claim, for
`vpo worker`), four nullable rollout_group columns (skipped, population, parse_rate,
pool_diversity) and a wider check on score.value (the first releases refused a score above 1,
a record: `ck_score_value_unit`; now `ck_score_value_finite`). A database may lack any of
them, so each step looks first. Indexes those releases added are made where missing.

Written against the tables as they stand at this revision (not today's models), so a later
revision that changes them does not change what this one does.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

MAX_SCORE = 1e300  # harness.store.models.MAX_SCORE at this revision

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ADDED_COLUMNS = (
    ("skipped", sa.Text()),
    ("population", sa.JSON(none_as_null=True)),
    ("parse_rate", sa.Float()),
    ("pool_diversity", sa.Float()),
)

# Every index of schema 1 at this revision, (table, name, columns): releases added some as
# they went (the ranked score walk, the worker queries), and each is made where missing.
INDEXES = (
    ("program", "ix_program_parent_id", ("parent_id",)),
    ("program", "ix_program_campaign_id_island", ("campaign_id", "island")),
    ("program", "ix_program_campaign_id_code_hash", ("campaign_id", "code_hash")),
    ("program", "ix_program_campaign_id_status", ("campaign_id", "status")),
    ("program", "ix_program_campaign_id_id", ("campaign_id", "id")),
    ("program", "ix_program_trajectory_id", ("trajectory_id",)),
    ("score", "ix_score_ranked", ("objective", sa.text("value DESC"), "program_id")),
    ("rollout_group", "ix_rollout_group_campaign_id_train_step", ("campaign_id", "train_step")),
    ("rollout_group", "ix_rollout_group_parent_program_id", ("parent_program_id",)),
    ("rollout_group", "ix_rollout_group_policy_version_id", ("policy_version_id",)),
    ("group_draft", "ix_group_draft_program_id", ("program_id",)),
    ("trajectory", "ix_trajectory_policy_version_id", ("policy_version_id",)),
    ("trajectory", "ix_trajectory_group_id", ("group_id",)),
    ("event", "ix_event_campaign_id_kind", ("campaign_id", "kind")),
)


def _tables() -> sa.MetaData:
    """iteration_claim and score as they stand at this revision."""
    metadata = sa.MetaData(naming_convention=NAMING)
    sa.Table("campaign", metadata, sa.Column("id", sa.Integer, primary_key=True))
    sa.Table("program", metadata, sa.Column("id", sa.Integer, primary_key=True))
    sa.Table(
        "iteration_claim",
        metadata,
        sa.Column(
            "campaign_id",
            sa.Integer,
            sa.ForeignKey("campaign.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("iteration", sa.Integer, primary_key=True),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
    )
    sa.Table(
        "score",
        metadata,
        sa.Column(
            "program_id",
            sa.Integer,
            sa.ForeignKey("program.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("objective", sa.String(100), primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("raw", sa.Float, nullable=True),
        sa.CheckConstraint(f"value >= 0 AND value <= {MAX_SCORE:.0e}", name="value_finite"),
    )
    return metadata


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    tables = _tables()
    if not inspector.has_table("iteration_claim"):
        tables.tables["iteration_claim"].create(bind)
    have = {column["name"] for column in inspector.get_columns("rollout_group")}
    for name, kind in ADDED_COLUMNS:
        if name not in have:
            op.add_column("rollout_group", sa.Column(name, kind, nullable=True))
    checks = {check["name"] for check in inspector.get_check_constraints("score")}
    if "ck_score_value_unit" in checks:
        _widen_score_check(bind, tables.tables["score"])
    indexes = {
        index["name"]
        for table in sorted({table for table, _, _ in INDEXES})
        for index in sa.inspect(bind).get_indexes(table)
    }
    for table, name, columns in INDEXES:
        if name not in indexes:
            op.create_index(op.f(name), table, list(columns))


def _widen_score_check(bind: sa.Connection, score: sa.Table) -> None:
    """ck_score_value_unit (value <= 1) replaced by ck_score_value_finite. PostgreSQL alters
    the table; SQLite cannot drop a constraint, so the table is made anew with its rows (its
    indexes go first: SQLite index names are global; nothing refers to the score table)."""
    if bind.dialect.name != "sqlite":
        # op.f: the names are final, not to be run through the naming convention again.
        op.drop_constraint(op.f("ck_score_value_unit"), "score", type_="check")
        op.create_check_constraint(
            op.f("ck_score_value_finite"), "score", f"value >= 0 AND value <= {MAX_SCORE:.0e}"
        )
        return
    for index in sa.inspect(bind).get_indexes("score"):
        op.execute(f'DROP INDEX "{index["name"]}"')
    op.execute("ALTER TABLE score RENAME TO score_before_upgrade")
    score.create(bind)
    op.execute(
        "INSERT INTO score (program_id, objective, value, raw) "
        "SELECT program_id, objective, value, raw FROM score_before_upgrade"
    )
    op.execute("DROP TABLE score_before_upgrade")
