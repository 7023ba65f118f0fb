"""Iterations: a group, its drafts, its rollouts, the programs their new candidates became, what
its candidates measure (parse rate, pool diversity) and the migrations the iteration carries, in
one transaction.

Written with Core statements on one connection: about a dozen statements per iteration whatever
G and m are, which keeps the harness's own time per iteration small
(benchmarks/harness_overhead.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from harness import faults
from harness.config.errors import IterationRecorded
from harness.records import CandidateRecord, Lineage, NewGroup, NewProgram, RolloutRecord, code_hash
from harness.store.models import utc_now
from harness.store.opening import Database
from harness.store.programs import insert_programs, insert_returning_ids
from harness.store.series import record_measures
from harness.store.tables import (
    CANDIDATE_OUTCOMES,
    DRAFT,
    GROUP,
    PROGRAM,
    SCORE,
    TRAJECTORY,
    check_choice,
    check_program,
    log_event,
)


class Iterations(Database):
    def record_iteration(
        self,
        campaign_id: int,
        group: NewGroup,
        *,
        migrations: Sequence[tuple[int, int]] = (),
    ) -> int:
        """Store one iteration atomically and return its group id. `migrations`: (program id,
        destination island) pairs, each copied there in the same transaction.

        A second attempt at the same iteration (a resumed run racing a stale one) fails on the
        unique (campaign, iteration) key and raises UserError; nothing of it is written.
        """
        if group.skipped is not None and group.rollouts:
            raise ValueError(f"iteration {group.iteration} is skipped yet has rollouts")
        for rollout in group.rollouts:
            for candidate in rollout.candidates:
                check_choice("candidate outcome", candidate.outcome, CANDIDATE_OUTCOMES)
                if candidate.program is not None:
                    check_program(candidate.program, "llm")
        try:
            with self._writing() as connection:
                group_id = _write_iteration(connection, campaign_id, group, migrations)
                faults.point("iteration_commit")  # written, not yet committed
                return group_id
        except IntegrityError:
            with self._reading() as connection:
                taken = connection.execute(
                    select(func.count()).where(
                        GROUP.c.campaign_id == campaign_id, GROUP.c.iteration == group.iteration
                    )
                ).scalar_one()
            if taken:
                raise IterationRecorded(
                    f"iteration {group.iteration} of campaign {campaign_id} is already "
                    "recorded; is another process running this campaign?"
                ) from None
            raise

    def missing_iterations(self, campaign_id: int, budget: int) -> list[int]:
        """The iteration numbers below `budget` that have no group yet, in order (a run
        killed with many iterations in flight may have stored later ones)."""
        with self._reading() as connection:
            recorded = set(
                connection.execute(
                    select(GROUP.c.iteration).where(
                        GROUP.c.campaign_id == campaign_id, GROUP.c.iteration < budget
                    )
                ).scalars()
            )
        return [k for k in range(budget) if k not in recorded]


def _write_iteration(
    connection: Connection,
    campaign_id: int,
    group: NewGroup,
    migrations: Sequence[tuple[int, int]],
) -> int:
    parent = connection.execute(
        select(PROGRAM.c.campaign_id, PROGRAM.c.generation).where(PROGRAM.c.id == group.parent_id)
    ).one_or_none()
    if parent is None or parent.campaign_id != campaign_id:
        raise ValueError(f"parent program {group.parent_id} is not in campaign {campaign_id}")
    now = utc_now()
    group_id = _insert_group(connection, campaign_id, group, now)
    if group.rollouts:
        slots = _write_rollouts(
            connection, campaign_id, group_id, group, parent.generation + 1, now
        )
        # Parse rate and pool diversity, once each slot names the program that scores it.
        record_measures(
            connection,
            group_id,
            [
                (rollout.parse_status, programs)
                for rollout, programs in zip(group.rollouts, slots, strict=True)
            ],
        )
    if migrations:
        _migrate(connection, campaign_id, migrations, now)
    payload = {"group_id": group_id, "iteration": group.iteration, "island": group.island}
    log_event(connection, campaign_id, "group_recorded", payload, now)
    return group_id


def _insert_group(connection: Connection, campaign_id: int, group: NewGroup, now: datetime) -> int:
    """The group row and the drafts its prompt showed, in order."""
    tokens = group.prompt_token_ids
    group_id = connection.execute(
        insert(GROUP).returning(GROUP.c.id),
        {
            "campaign_id": campaign_id,
            "iteration": group.iteration,
            "island": group.island,
            "parent_program_id": group.parent_id,
            "prompt": group.prompt,
            "prompt_token_ids": None if tokens is None else list(tokens),
            "prompt_tokens": None if tokens else group.prompt_tokens,
            "policy_version_id": None if group.version is None else group.version.id,
            "skipped": group.skipped,
            "population": None if group.population is None else dict(group.population),
            "created_at": now,
        },
    ).scalar_one()
    if group.draft_ids:
        connection.execute(
            insert(DRAFT),
            [
                {"group_id": group_id, "position": i, "program_id": d}
                for i, d in enumerate(group.draft_ids)
            ],
        )
    return group_id


def _write_rollouts(
    connection: Connection,
    campaign_id: int,
    group_id: int,
    group: NewGroup,
    generation: int,
    now: datetime,
) -> list[list[int | None]]:
    """The rollouts, the programs their new candidates became, and then each rollout's
    candidate slots naming the program that scores the slot; those programs, per rollout
    (None for an unparsed slot)."""
    trajectory_ids = _insert_trajectories(connection, group_id, group, now)
    parent, island = group.parent_id, group.island
    # Each new candidate, its program, and the lineage the group and its rollout give it.
    fresh = [
        (c, c.program, Lineage("llm", parent, island, generation, trajectory_id, c.index))
        for trajectory_id, rollout in zip(trajectory_ids, group.rollouts, strict=True)
        for c in rollout.candidates
        if c.program is not None
    ]
    # A new candidate's own hash, computed once (the caller's may be missing).
    digests = {id(candidate): code_hash(program.code) for candidate, program, _ in fresh}
    program_ids = insert_programs(
        connection,
        campaign_id,
        [(program, lineage) for _, program, lineage in fresh],
        now,
        log=False,
        hashes=[digests[id(candidate)] for candidate, _, _ in fresh],
    )
    known: dict[str, int] = {}  # code hash -> the program that scores it
    for (candidate, _, _), program_id in zip(fresh, program_ids, strict=True):
        known.setdefault(digests[id(candidate)], program_id)
    known.update(_earlier_programs(connection, campaign_id, group.rollouts, known))
    return _fill_slots(connection, trajectory_ids, group.rollouts, digests, known)


def _insert_trajectories(
    connection: Connection, group_id: int, group: NewGroup, now: datetime
) -> list[int]:
    """One trajectory per rollout, its candidate slots still empty; their ids in order."""
    version_id = None if group.version is None else group.version.id  # None: the base weights
    return insert_returning_ids(
        connection,
        TRAJECTORY,
        [
            {
                "group_id": group_id,
                "position": position,
                "completion": rollout.completion.replace("\x00", "\ufffd"),
                "token_ids": list(rollout.token_ids),
                "num_tokens": len(rollout.token_ids) or rollout.num_tokens or 0,
                "logprobs": None if rollout.logprobs is None else list(rollout.logprobs),
                "finish_reason": rollout.finish_reason,
                "policy_version_id": version_id,
                "parse_status": rollout.parse_status,
                "parse_error": rollout.parse_error,
                "candidates": [],
                "created_at": now,
            }
            for position, rollout in enumerate(group.rollouts)
        ],
    )


def _earlier_programs(
    connection: Connection,
    campaign_id: int,
    rollouts: Sequence[RolloutRecord],
    known: Mapping[str, int],
) -> dict[str, int]:
    """Code hash -> first program with it, for the duplicates of programs stored before."""
    wanted = {
        c.code_hash
        for r in rollouts
        for c in r.candidates
        if c.outcome == "duplicate" and c.code_hash is not None and c.code_hash not in known
    }
    if not wanted:
        return {}
    rows = connection.execute(
        select(PROGRAM.c.code_hash, func.min(PROGRAM.c.id))
        .where(PROGRAM.c.campaign_id == campaign_id, PROGRAM.c.code_hash.in_(wanted))
        .group_by(PROGRAM.c.code_hash)
    ).all()
    return {digest: program_id for digest, program_id in rows}


def _fill_slots(
    connection: Connection,
    trajectory_ids: Sequence[int],
    rollouts: Sequence[RolloutRecord],
    digests: Mapping[int, str],
    known: Mapping[str, int],
) -> list[list[int | None]]:
    """Each trajectory's candidate slots, in one statement for the group; the program each
    slot names, per rollout."""
    slots = [[_slot(c, digests, known) for c in rollout.candidates] for rollout in rollouts]
    connection.execute(
        update(TRAJECTORY)
        .where(TRAJECTORY.c.id == bindparam("trajectory"))
        .values(candidates=bindparam("slots")),
        [
            {"trajectory": trajectory_id, "slots": filled}
            for trajectory_id, filled in zip(trajectory_ids, slots, strict=True)
        ],
    )
    return [[slot["program_id"] for slot in filled] for filled in slots]


def _slot(
    candidate: CandidateRecord, digests: Mapping[int, str], known: Mapping[str, int]
) -> dict[str, Any]:
    digest = digests.get(id(candidate), candidate.code_hash or "")
    return {
        "index": candidate.index,
        "outcome": candidate.outcome,
        "program_id": None if candidate.outcome == "unparsed" else known.get(digest),
        "reason": candidate.reason,
        "lazy": candidate.lazy,
        **({"near": True} if candidate.near else {}),
    }


def _migrate(
    connection: Connection,
    campaign_id: int,
    migrations: Sequence[tuple[int, int]],
    now: datetime,
) -> None:
    """Migrants: each (program, island) pair's code and scores copied to that island, the
    source as parent; one batch for the iteration's migrations."""
    wanted = sorted({program_id for program_id, _ in migrations})
    sources = {
        row.id: row for row in connection.execute(select(PROGRAM).where(PROGRAM.c.id.in_(wanted)))
    }
    for program_id, _ in migrations:
        if program_id not in sources or sources[program_id].campaign_id != campaign_id:
            raise ValueError(f"program {program_id} is not in campaign {campaign_id}")
    scores: dict[int, list[Any]] = {}
    for score in connection.execute(select(SCORE).where(SCORE.c.program_id.in_(wanted))):
        scores.setdefault(score.program_id, []).append(score)
    copies = [
        (
            _copy(sources[program_id], scores.get(program_id, [])),
            Lineage("migration", program_id, island, sources[program_id].generation),
        )
        for program_id, island in migrations
    ]
    # A migrant keeps its source's hash, which an earlier release may have computed.
    hashes = [sources[program_id].code_hash for program_id, _ in migrations]
    insert_programs(connection, campaign_id, copies, now, log=True, hashes=hashes)


def _copy(source: Any, scores: Sequence[Any]) -> NewProgram:
    return NewProgram(
        code=source.code,
        status=source.status,
        scores={score.objective: score.value for score in scores},
        raw={score.objective: score.raw for score in scores},
        error=source.error,
        metrics=source.metrics,
    )
