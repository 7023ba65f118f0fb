"""The campaign's family tree and each program's story, read back for the dashboard and
`vpo db lineage`.

`family` is what the genealogy page draws: every program's parent, island, generation, origin,
status and the policy version that sampled it, as arrays, read incrementally (id > after_id) so
a campaign of 100,000 programs is read once and then only its new rows. `story` is what a
program page tells: the prompt its rollout was sent, the completion, what became of each
candidate of that rollout, and the group's other rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.engine import Connection

from harness.store.inspection import Inspection
from harness.store.tables import GROUP, ID_BATCH, POLICY, PROGRAM, SCORE, TRAJECTORY

ORIGIN_CODES = {"seed": 0, "llm": 1, "migration": 2}


class Genealogy(Inspection):
    """Reads on top of `Inspection`'s (a story starts from a program's provenance)."""

    def family(self, campaign_id: int, after_id: int = 0) -> dict[str, np.ndarray]:
        """For the programs with id > after_id, in id order: `id`, `parent` (-1: none),
        `island`, `generation`, `origin` (ORIGIN_CODES), `valid` and `version` (the policy
        step that sampled it; 0 for the base weights, -1 for seeds and migrants)."""
        query = (
            select(
                PROGRAM.c.id,
                PROGRAM.c.parent_id,
                PROGRAM.c.island,
                PROGRAM.c.generation,
                PROGRAM.c.origin,
                PROGRAM.c.status,
                PROGRAM.c.trajectory_id,
                POLICY.c.step,
            )
            .outerjoin(TRAJECTORY, TRAJECTORY.c.id == PROGRAM.c.trajectory_id)
            .outerjoin(POLICY, POLICY.c.id == TRAJECTORY.c.policy_version_id)
            .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.id > after_id)
            .order_by(PROGRAM.c.id)
        )
        with self._reading() as connection:
            rows = connection.execute(query).all()
        n = len(rows)

        def column(values: Any, dtype: Any = np.int64) -> np.ndarray:
            return np.fromiter(values, dtype=dtype, count=n)

        return {
            "id": column(r[0] for r in rows),
            "parent": column(-1 if r[1] is None else r[1] for r in rows),
            "island": column(r[2] for r in rows),
            "generation": column(r[3] for r in rows),
            "origin": column(ORIGIN_CODES.get(r[4], 1) for r in rows),
            "valid": column((r[5] == "ok" for r in rows), bool),
            "version": column(-1 if r[6] is None else (0 if r[7] is None else r[7]) for r in rows),
        }

    def story(self, program_id: int) -> dict[str, Any] | None:
        """What the rollout that wrote `program_id` was shown and what it wrote: the prompt's
        messages, the policy version, the completion, its candidates with what became of each
        (with the program's status and scores where one was stored), and the group's other
        rollouts in brief. None for seeds and migrants (no rollout wrote them)."""
        written_by = self.provenance(program_id)
        if written_by is None:
            return None
        group_id, this = written_by["group_id"], written_by["trajectory"]["id"]
        with self._reading() as connection:
            prompt = connection.execute(
                select(GROUP.c.prompt).where(GROUP.c.id == group_id)
            ).scalar_one()
            rollouts = connection.execute(
                select(
                    TRAJECTORY.c.id,
                    TRAJECTORY.c.position,
                    TRAJECTORY.c.completion,
                    TRAJECTORY.c.num_tokens,
                    TRAJECTORY.c.finish_reason,
                    TRAJECTORY.c.parse_status,
                    TRAJECTORY.c.parse_error,
                    TRAJECTORY.c.candidates,
                    POLICY.c.step,
                )
                .outerjoin(POLICY, POLICY.c.id == TRAJECTORY.c.policy_version_id)
                .where(TRAJECTORY.c.group_id == group_id)
                .order_by(TRAJECTORY.c.position)
            ).all()
            written = {
                c.get("program_id")
                for r in rollouts
                for c in _candidate_list(r.candidates)
                if isinstance(c.get("program_id"), int)
            }
            outcomes = _standing(connection, sorted(written))
        return {
            "group_id": group_id,
            "iteration": written_by["iteration"],
            "prompt": _messages(prompt),
            "rollouts": [
                {
                    "position": r.position,
                    "this": r.id == this,
                    "policy_version": r.step or 0,
                    "completion": r.completion,
                    "num_tokens": r.num_tokens,
                    "finish_reason": r.finish_reason,
                    "parse_status": r.parse_status,
                    "parse_error": r.parse_error,
                    "candidates": [
                        {**c, **outcomes.get(c.get("program_id"), {})}
                        for c in _candidate_list(r.candidates)
                    ],
                }
                for r in rollouts
            ],
        }

    def children_of(self, parents: Sequence[int], limit: int) -> list[dict[str, Any]]:
        """The programs whose parent is one of `parents` (id, parent_id, island, generation,
        origin), lowest ids first, at most `limit`: a lookup on the parent_id index per
        `ID_BATCH` parents, whatever the campaign's size."""
        found: list[dict[str, Any]] = []
        with self._reading() as connection:
            for start in range(0, len(parents), ID_BATCH):
                rows = connection.execute(
                    select(
                        PROGRAM.c.id,
                        PROGRAM.c.parent_id,
                        PROGRAM.c.island,
                        PROGRAM.c.generation,
                        PROGRAM.c.origin,
                    )
                    .where(PROGRAM.c.parent_id.in_(list(parents[start : start + ID_BATCH])))
                    .order_by(PROGRAM.c.id)
                    .limit(limit)
                ).all()
                found += [dict(row._mapping) for row in rows]
        return sorted(found, key=lambda row: row["id"])[:limit]

    def standing(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Each stored program's status, error and scores by objective, by id."""
        with self._reading() as connection:
            return _standing(connection, ids)


def _standing(connection: Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), ID_BATCH):
        batch = list(ids[start : start + ID_BATCH])
        for pid, status, error in connection.execute(
            select(PROGRAM.c.id, PROGRAM.c.status, PROGRAM.c.error).where(PROGRAM.c.id.in_(batch))
        ):
            found[pid] = {"status": status, "error": error, "scores": {}}
        for pid, objective, value in connection.execute(
            select(SCORE.c.program_id, SCORE.c.objective, SCORE.c.value)
            .where(SCORE.c.program_id.in_(batch))
            .order_by(SCORE.c.program_id, SCORE.c.objective)
        ):
            if pid in found:
                found[pid]["scores"][objective] = value
    return found


def _candidate_list(stored: Any) -> list[dict[str, Any]]:
    """The trajectory's candidate outcomes as dicts, whatever an older writer left there."""
    if not isinstance(stored, list):
        return []
    return [c for c in stored if isinstance(c, dict)]


def _messages(prompt: Any) -> list[dict[str, str]]:
    """The prompt as chat messages: a stored list of messages, or one text as the user's."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list):
        return [
            {"role": str(m.get("role", "user")), "content": str(m.get("content", ""))}
            for m in prompt
            if isinstance(m, dict)
        ]
    return []
