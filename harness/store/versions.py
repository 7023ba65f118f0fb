"""Policy versions: the groups a step reads and marks as used, the policy versions it produced, and
the steps that changed nothing (their groups are not offered again; each is an event)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from harness import faults
from harness.config.errors import UserError
from harness.records import PolicyVersion, TrainingGroup, TrainingRollout
from harness.store.models import utc_now
from harness.store.opening import Database
from harness.store.tables import (
    EVENT,
    GROUP,
    POLICY,
    PROGRAM,
    SCORE,
    TRAJECTORY,
    log_event,
)


class Versions(Database):
    def untrained_groups(self, campaign_id: int, limit: int | None) -> list[TrainingGroup]:
        """The oldest `limit` groups no training step took yet (None: all), in iteration order:
        a group waits at most until the groups before it fill a step, never for ever."""
        return self.training_groups(campaign_id, unused=True, limit=limit)

    def training_groups(
        self,
        campaign_id: int,
        *,
        unused: bool = False,
        after_iteration: int = -1,
        limit: int | None = None,
    ) -> list[TrainingGroup]:
        """Groups as the trainer reads them, in iteration order: token ids and every
        candidate's scores. `unused`: only groups no training step took (trained, or dropped by
        a skipped step); `after_iteration` and `limit` page through them. Groups without
        prompt tokens (some endpoints do not report them) cannot be trained on and are left out.
        """
        query = select(
            GROUP.c.id,
            GROUP.c.iteration,
            GROUP.c.prompt_token_ids,
            GROUP.c.island,
            GROUP.c.parent_program_id,
        ).where(
            GROUP.c.campaign_id == campaign_id,
            GROUP.c.prompt_token_ids.is_not(None),
            GROUP.c.iteration > after_iteration,
        )
        if unused:
            query = query.where(GROUP.c.train_step.is_(None), GROUP.c.train_skipped.is_(None))
        query = query.order_by(GROUP.c.iteration).limit(limit)
        with self._reading() as connection:
            groups = connection.execute(query).all()
            if not groups:
                return []
            trajectories = connection.execute(
                select(
                    TRAJECTORY.c.group_id,
                    TRAJECTORY.c.token_ids,
                    TRAJECTORY.c.logprobs,
                    TRAJECTORY.c.candidates,
                    POLICY.c.step,
                )
                .outerjoin(POLICY, POLICY.c.id == TRAJECTORY.c.policy_version_id)
                .where(TRAJECTORY.c.group_id.in_([g.id for g in groups]))
                .order_by(TRAJECTORY.c.group_id, TRAJECTORY.c.position)
            ).all()
            scores, valid = _scores_of_slots(connection, trajectories)
        prompts = {g.id: tuple(g.prompt_token_ids) for g in groups}
        by_group: dict[int, list[TrainingRollout]] = {}
        for row in trajectories:
            rollout = _training_rollout(row, prompts[row.group_id], scores, valid)
            by_group.setdefault(row.group_id, []).append(rollout)
        return [
            TrainingGroup(
                id=g.id,
                iteration=g.iteration,
                rollouts=tuple(by_group.get(g.id, ())),
                island=g.island,
                parent_id=g.parent_program_id,
            )
            for g in groups
        ]

    def untrained_count(self, campaign_id: int) -> int:
        with self._reading() as connection:
            return connection.execute(
                select(func.count()).where(
                    GROUP.c.campaign_id == campaign_id,
                    GROUP.c.train_step.is_(None),
                    GROUP.c.train_skipped.is_(None),
                    GROUP.c.prompt_token_ids.is_not(None),
                )
            ).scalar_one()

    def untrained_rollouts(self, campaign_id: int) -> int:
        """The rollouts of the groups `untrained_count` counts."""
        with self._reading() as connection:
            return connection.execute(
                select(func.count())
                .select_from(TRAJECTORY)
                .join(GROUP, GROUP.c.id == TRAJECTORY.c.group_id)
                .where(
                    GROUP.c.campaign_id == campaign_id,
                    GROUP.c.train_step.is_(None),
                    GROUP.c.train_skipped.is_(None),
                    GROUP.c.prompt_token_ids.is_not(None),
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
    ) -> PolicyVersion:
        """Mark the groups as used by `step` and add its policy version, in one transaction;
        the version recorded.

        Raises UserError, writing nothing, when a group was used already or the step exists:
        each group trains once and policy versions stay contiguous.
        """
        try:
            with self._writing() as connection:
                _take_groups(connection, campaign_id, group_ids, step, train_step=step)
                now = utc_now()
                row = {
                    "campaign_id": campaign_id,
                    "step": step,
                    "path": path,
                    "metrics": finite(metrics),
                    "created_at": now,
                }
                policy_id = connection.execute(
                    insert(POLICY).returning(POLICY.c.id), row
                ).scalar_one()
                payload = {"step": step, "policy_version_id": policy_id, **row["metrics"]}
                log_event(connection, campaign_id, "train_step", payload, now)
                faults.point("train_commit")  # written, not yet committed
                return PolicyVersion(id=policy_id, **row)
        except IntegrityError:
            raise UserError(
                f"policy version {step} of campaign {campaign_id} exists already; "
                "is another trainer running?"
            ) from None

    def record_skipped_step(
        self,
        campaign_id: int,
        *,
        step: int,
        reason: str,
        metrics: Mapping[str, Any],
        group_ids: Sequence[int],
    ) -> None:
        """A step that changed no weight (`reason`: a non-finite gradient, no completion token
        left): its groups are marked with the reason, so no step takes them again, and a
        `train_skipped` event holds its metrics (the skipped steps are those events), in one
        transaction. No policy version: the next step takes the number `step` again.

        Raises UserError, writing nothing, when a group was taken already."""
        with self._writing() as connection:
            _take_groups(connection, campaign_id, group_ids, step, train_skipped=reason)
            payload = {**finite(metrics), "step": step, "skipped": reason}
            log_event(connection, campaign_id, "train_skipped", payload, utc_now())

    def skipped_steps(self, campaign_id: int) -> list[dict[str, Any]]:
        """The metrics of each step that changed no weight, oldest first (each has `step`,
        `skipped`: why, and `groups`)."""
        with self._reading() as connection:
            rows = connection.execute(
                select(EVENT.c.payload)
                .where(EVENT.c.campaign_id == campaign_id, EVENT.c.kind == "train_skipped")
                .order_by(EVENT.c.id)
            ).all()
        return [dict(row.payload) for row in rows]

    def policies(self, campaign_id: int) -> list[PolicyVersion]:
        """The campaign's policy versions by step."""
        with self._reading() as connection:
            rows = connection.execute(
                select(POLICY).where(POLICY.c.campaign_id == campaign_id).order_by(POLICY.c.step)
            ).all()
        return [_policy_version(row) for row in rows]

    def first_changed_policy(self, campaign_id: int) -> PolicyVersion | None:
        """The first policy version whose weights differ from the campaign's starting ones: the
        version of the first step that trained some rollout. A step whose advantages were all 0
        records a version with the weights it was given (`trained` 0 in its metrics); a version
        without the count, from an older run, counts as changed."""
        return next((p for p in self.policies(campaign_id) if moved_weights(p.metrics)), None)

    def latest_policy(self, campaign_id: int) -> PolicyVersion | None:
        with self._reading() as connection:
            row = connection.execute(
                select(POLICY)
                .where(POLICY.c.campaign_id == campaign_id)
                .order_by(POLICY.c.step.desc())
                .limit(1)
            ).one_or_none()
        return None if row is None else _policy_version(row)


def moved_weights(metrics: Mapping[str, Any]) -> bool:
    """Whether the step of a policy version with these metrics changed the weights: it
    trained some rollout (a version from before the count was stored is taken as changed)."""
    return int(metrics.get("trained", 1) or 0) > 0


def finite(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Step metrics as JSON takes them: a non-finite number (a NaN gradient norm) is None, since
    PostgreSQL refuses NaN and infinity in JSON (the skip's reason says what it was)."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in metrics.items()
    }


def _scores_of_slots(
    connection: Connection, trajectories: Sequence[Any]
) -> tuple[dict[int, dict[str, float]], set[int]]:
    """Program id -> its scores by objective, for every program a candidate slot names, and
    the ids of those that ran and were scored (status "ok")."""
    wanted = {
        slot["program_id"]
        for row in trajectories
        for slot in row.candidates
        if slot.get("program_id") is not None
    }
    scores: dict[int, dict[str, float]] = {}
    for score in connection.execute(
        select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value).where(
            SCORE.c.program_id.in_(wanted)
        )
    ):
        scores.setdefault(score.program_id, {})[score.objective] = score.value
    valid = {
        row.id
        for row in connection.execute(
            select(PROGRAM.c.id).where(PROGRAM.c.id.in_(wanted), PROGRAM.c.status == "ok")
        )
    }
    return scores, valid


def _training_rollout(
    row: Any,
    prompt_token_ids: tuple[int, ...],
    scores: dict[int, dict[str, float]],
    valid: set[int],
) -> TrainingRollout:
    slots = sorted(row.candidates, key=lambda slot: slot["index"])
    programs = tuple(slot.get("program_id") for slot in slots)
    return TrainingRollout(
        prompt_token_ids=prompt_token_ids,
        token_ids=tuple(row.token_ids),
        logprobs=None if row.logprobs is None else tuple(row.logprobs),
        # No policy version: the model the campaign started from, step 0.
        version=0 if row.step is None else row.step,
        candidates=tuple(
            None if slot.get("program_id") is None else scores.get(slot["program_id"], {})
            for slot in slots
        ),
        # Databases from before the flag: every duplicate counts as lazy.
        lazy=tuple(bool(slot.get("lazy", slot.get("outcome") == "duplicate")) for slot in slots),
        programs=programs,
        valid=tuple(program in valid for program in programs),
    )


def _policy_version(row: Any) -> PolicyVersion:
    return PolicyVersion(row.id, row.campaign_id, row.step, row.path, row.metrics, row.created_at)


def _take_groups(
    connection: Any, campaign_id: int, group_ids: Sequence[int], step: int, **values: Any
) -> None:
    """Set `values` on the groups no step has taken yet; UserError when one was taken."""
    marked = connection.execute(
        update(GROUP)
        .where(
            GROUP.c.campaign_id == campaign_id,
            GROUP.c.id.in_(list(group_ids)),
            GROUP.c.train_step.is_(None),
            GROUP.c.train_skipped.is_(None),
        )
        .values(**values)
    ).rowcount
    if marked != len(set(group_ids)):
        raise UserError(
            f"training step {step}: {len(set(group_ids)) - marked} of its groups were used by "
            "another step; is another trainer running?"
        )
