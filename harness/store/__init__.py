"""The only code that reads and writes the solution database.

Every public method is one transaction: a program, its scores and the event that logs it are
committed together or not at all. Callers get plain frozen records, never live rows, so
nothing outside this package can touch the database by accident or hold a transaction open.

    store = Store.open("runs/circles.db")            # or sqlite:///..., postgresql://...
    campaign_id = store.create_campaign("circles", "circle_packing", config={}, seed=0)
    store.add_program(campaign_id, NewProgram(code, "ok", {"sum_radii": 0.9}, {...}))

One module per concern, each a part of `Store`:

    opening      the URL, the engine and its pragmas, one-line errors (`Database`)
    schema       whether a database is ours and current; its tables created, or migrated
    programs     campaigns, a seed program, the one way any program is inserted
    iterations   a group with its rollouts, new programs and migrations
    claims       iterations claimed by workers
    versions     the groups a training step reads and the policy versions it adds
    inspection   programs, lineage, provenance, events and counts read back
    genealogy    the campaign's family tree and a program's story (prompt, rollout, siblings)
    series       each iteration's parse rate and pool diversity; a campaign's candidate slots
    aggregates   the incremental queries behind the views and the dashboard
    tables       what they share: the tables, the checks before a write, records from rows
    migrations/  the schema's versions (Alembic)

May import: config
"""

from __future__ import annotations

from harness.records import Lineage, NewGroup, NewProgram
from harness.store.aggregates import REJECTIONS, Aggregates
from harness.store.claims import Claims
from harness.store.genealogy import Genealogy
from harness.store.inspection import Inspection
from harness.store.iterations import Iterations
from harness.store.opening import POSTGRES_CONNECT_TIMEOUT_S, SQLITE_BUSY_TIMEOUT_S
from harness.store.programs import Campaigns
from harness.store.series import Series
from harness.store.tables import CANDIDATE_OUTCOMES
from harness.store.versions import Versions

__all__ = [
    "CANDIDATE_OUTCOMES",
    "POSTGRES_CONNECT_TIMEOUT_S",
    "REJECTIONS",
    "SQLITE_BUSY_TIMEOUT_S",
    "Lineage",
    "NewGroup",
    "NewProgram",
    "Store",
]


class Store(Campaigns, Iterations, Claims, Versions, Genealogy, Inspection, Series, Aggregates):
    """A solution database on SQLite or PostgreSQL; get one with `Store.open`."""
