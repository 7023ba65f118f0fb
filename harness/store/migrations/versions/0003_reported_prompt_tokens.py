"""Prompt tokens a server reported: rollout_group.prompt_tokens.

A server that returns no token ids (the OpenAI API, most servers besides vLLM) still reports
how many prompt tokens a request took, in its `usage`. This nullable column keeps that count
for such a group, so that `max_total_tokens` and `max_cost` count the prompts a campaign paid
for after a resume too. Groups that have their prompt token ids, and every group of an earlier
database, keep NULL: their ids are counted, as before.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("rollout_group")}
    if "prompt_tokens" not in columns:
        op.add_column("rollout_group", sa.Column("prompt_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_group") as batch:
        batch.drop_column("prompt_tokens")
