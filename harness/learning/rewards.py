"""What a stored group scores when a step trains on it: the rules for a lazy duplicate, a rollout
whose candidates did not all parse, a completion that ran into the token limit, what a group is
measured against (its parent, or the front the campaign or its island held before it), and what
each wasted candidate slot costs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from harness.config.training import TrainSettings
from harness.records import TrainingGroup, TrainingRollout

if TYPE_CHECKING:
    from harness.store import Store
    from trainer.train import Group


def overlong_penalty(length: int, buffer: int, max_tokens: int) -> float:
    """The share of its scores a completion of `length` tokens loses: 0 up to
    max_tokens - buffer, then linearly to 1 at max_tokens (0 when buffer is 0)."""
    if buffer <= 0 or max_tokens <= 0:
        return 0.0
    return min(max(length - (max_tokens - buffer), 0) / buffer, 1.0)


def to_group(
    stored: TrainingGroup,
    objectives: list[str],
    candidates: int,
    rules: TrainSettings | None = None,
    *,
    max_tokens: int = 0,
    versions: bool = True,
    reference: np.ndarray | None = None,
) -> Group | None:
    """The (G, m, d) score matrix and mask of a stored group, under the reward rules of `rules`;
    slots without a program are masked out, so they never enter the max (a failed program's
    zeros are kept: per-objective partial credit is part of the vector reward).

    With `duplicate_reward` "zero", a lazy candidate (its parent or a stored program repeated)
    scores zeros; its stored evaluation is untouched. With `format_reward` "whole", a rollout
    whose m candidates did not all parse has every slot masked out: it scores nothing.
    `overlong_buffer`, a soft overlong punishment after DAPO's: a completion of L tokens past
    `max_tokens` - buffer loses the share (L - max_tokens + buffer) / buffer of every score, all
    of them at the limit (scores stay >= 0, so DAPO's additive -1 becomes a factor).
    `slot_cost`: each rollout loses this times the share of its m slots that were wasted
    (`wasted_slots`). `versions` off: the trained policy's steps are not the campaign's policy
    versions (offline training starts a model of its own), so the rollouts' versions are left
    out. `reference` (P, d): the vectors the set score is measured against (`references`).
    Without `rules`, the defaults: the VPO paper's."""
    from trainer.train import Group, Rollout

    if not stored.rollouts:
        return None
    rules = rules or TrainSettings()
    scores = np.zeros((len(stored.rollouts), candidates, len(objectives)))
    mask = np.zeros((len(stored.rollouts), candidates), dtype=bool)
    for i, rollout in enumerate(stored.rollouts):
        slots = rollout.candidates[:candidates]
        whole = not (rules.format_reward == "whole" and (len(slots) < candidates or None in slots))
        for j, slot in enumerate(slots if whole else ()):
            if slot is None:
                continue
            mask[i, j] = True
            lazy = j < len(rollout.lazy) and rollout.lazy[j]
            if not (lazy and rules.duplicate_reward == "zero"):
                scores[i, j] = [slot.get(name, 0.0) for name in objectives]
        length = len(rollout.token_ids)
        scores[i] *= 1 - overlong_penalty(length, rules.overlong_buffer, max_tokens)
    cost = None
    if rules.slot_cost:
        share = [wasted_slots(r, candidates, objectives) / candidates for r in stored.rollouts]
        cost = rules.slot_cost * np.array(share)
    return Group(
        reference=reference,
        cost=cost,
        rollouts=[
            Rollout(r.prompt_token_ids, r.token_ids, r.logprobs, r.version if versions else None)
            for r in stored.rollouts
        ],
        scores=scores,
        mask=mask,
    )


def wasted_slots(
    rollout: TrainingRollout, candidates: int, names: Sequence[str] | None = None
) -> int:
    """How many of a rollout's `candidates` slots bring nothing new: missing or not parsed, a
    lazy repeat of its parent or a stored program, a program that failed to run or scored 0 on
    every one of `names` (the vector trained on; None: every score it has), or the same
    program as an earlier slot of the rollout. (Without the
    zero-score rule a policy learnt to fill its slots with distinct, valid equations worse than
    predicting the mean: benchmarks/results/discovery_46.md, seed 1.) A rollout stored without
    program ids counts only its missing and zero-scoring slots."""
    slots = rollout.candidates[:candidates]
    wasted = candidates - len(slots)
    seen: set[int] = set()
    for j, slot in enumerate(slots):
        program = rollout.programs[j] if j < len(rollout.programs) else None
        lazy = j < len(rollout.lazy) and rollout.lazy[j]
        failed = j < len(rollout.valid) and not rollout.valid[j]
        values = () if slot is None else slot.values() if names is None else map(slot.get, names)
        empty = not any(value is not None and value > 0 for value in values)
        if empty or lazy or failed or program in seen:
            wasted += 1
        if program is not None:
            seen.add(program)
    return wasted


def references(
    store: Store,
    campaign_id: int,
    groups: list[TrainingGroup],
    objectives: list[str],
    scope: str,
) -> dict[int, np.ndarray]:
    """Group id -> the (P, d) vectors its set score is measured against under `scope` (the
    choices of `reward_reference` in harness/config/training.py's REWARD_CHOICES): its parent's
    scores (none where the prompt had no scored parent), or the front of the programs its
    island or the campaign held when the group was stored (those written by earlier groups, and
    the seeds). "none": no entry."""
    if scope == "none" or not groups:
        return {}
    if scope == "parent":
        parents = [g.parent_id for g in groups if g.parent_id is not None]
        scored = {p.id: p for p in store.programs_by_ids(parents)} if parents else {}
        found = {}
        for group in groups:
            parent = scored.get(group.parent_id) if group.parent_id is not None else None
            if parent is not None and parent.status == "ok":
                found[group.id] = np.array([[parent.scores.get(n, 0.0) for n in objectives]])
        return found
    from trainer.measures import front_points

    islands, written, scores = store.archive(campaign_id, objectives)
    found = {}
    for group in groups:
        held = written < group.id
        if scope == "island":
            held &= islands == group.island
        front = front_points(scores[held]) if held.any() else np.zeros((0, len(objectives)))
        found[group.id] = front
    return found
