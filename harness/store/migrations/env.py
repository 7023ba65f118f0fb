"""Alembic's environment: runs the revisions on the connection `harness.store.migrations` hands over
(in `config.attributes["connection"]`), inside that connection's transaction. Offline (SQL
script) mode is not offered: a campaign database is migrated by opening it."""

from alembic import context

from harness.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
