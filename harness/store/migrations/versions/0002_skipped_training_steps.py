"""Skipped training steps: rollout_group.train_skipped.

A training step that changes no weight (its gradient norm is not finite, or no completion token
is left within the training length) publishes no policy version; its groups are marked with
the reason in this nullable column, so no step takes them again. Every group of an earlier
database keeps NULL: it was trained, or waits for a step, as before.

A database adopted from before migrations in the same upgrade may hold the column already
(tests build such a database from today's models), so it is added where missing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("rollout_group")}
    if "train_skipped" not in columns:
        op.add_column("rollout_group", sa.Column("train_skipped", sa.Text(), nullable=True))
