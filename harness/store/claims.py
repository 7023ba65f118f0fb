"""Workers: several processes taking iterations of one campaign, each claimed for one worker."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, insert, select, update

from harness.config.errors import UserError
from harness.store.models import utc_now
from harness.store.opening import Database
from harness.store.tables import CAMPAIGN, CLAIM, GROUP, POLICY

# A claim whose iteration has a group: the worker finished it.
_RECORDED = (
    select(GROUP.c.id)
    .where(GROUP.c.campaign_id == CLAIM.c.campaign_id, GROUP.c.iteration == CLAIM.c.iteration)
    .exists()
)


class Claims(Database):
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
        with self._writing() as connection:
            locked = connection.execute(
                select(CAMPAIGN.c.id).where(CAMPAIGN.c.id == campaign_id).with_for_update()
            ).scalar()
            if locked is None:
                raise UserError(f"no campaign {campaign_id} in {self.where}")
            orphan = connection.execute(
                select(CLAIM.c.iteration)
                .where(
                    CLAIM.c.campaign_id == campaign_id,
                    CLAIM.c.claimed_at < stale,
                    CLAIM.c.iteration < budget,
                    ~_RECORDED,
                )
                .order_by(CLAIM.c.iteration)
                .limit(1)
            ).scalar()
            if orphan is not None:
                connection.execute(
                    update(CLAIM)
                    .where(CLAIM.c.campaign_id == campaign_id, CLAIM.c.iteration == orphan)
                    .values(worker=worker, claimed_at=now)
                )
                return int(orphan)
            highest = [
                connection.execute(
                    select(func.max(table.c.iteration)).where(table.c.campaign_id == campaign_id)
                ).scalar()
                for table in (CLAIM, GROUP)
            ]
            top = max((value for value in highest if value is not None), default=-1)
            if top + 1 >= budget:
                return None
            connection.execute(
                insert(CLAIM),
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
        with self._writing() as connection:
            connection.execute(
                delete(CLAIM).where(
                    CLAIM.c.campaign_id == campaign_id,
                    CLAIM.c.iteration == iteration,
                    CLAIM.c.worker == worker,
                )
            )

    def open_claims(self, campaign_id: int) -> int:
        """Claims whose iteration has no group yet (in flight, or left by a dead worker)."""
        with self._reading() as connection:
            return connection.execute(
                select(func.count()).where(CLAIM.c.campaign_id == campaign_id, ~_RECORDED)
            ).scalar_one()

    def version_at_oldest_claim(self, campaign_id: int) -> int | None:
        """The step of the newest policy version recorded before the oldest claim in flight
        was made (0: none was), the oldest a worker may still sample from, since a worker loads
        the newest version and then claims; None when no claim is open."""
        with self._reading() as connection:
            since = connection.execute(
                select(func.min(CLAIM.c.claimed_at)).where(
                    CLAIM.c.campaign_id == campaign_id, ~_RECORDED
                )
            ).scalar()
            if since is None:
                return None
            step = connection.execute(
                select(func.max(POLICY.c.step)).where(
                    POLICY.c.campaign_id == campaign_id, POLICY.c.created_at <= since
                )
            ).scalar()
        return int(step or 0)
