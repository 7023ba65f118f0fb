"""What a stored group scores when a step trains on it: the rules for a lazy duplicate, a rollout
whose candidates did not all parse, and a completion that ran into the token limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from harness.records import TrainingGroup

if TYPE_CHECKING:
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
    duplicate_reward: str = "zero",
    *,
    versions: bool = True,
    format_reward: str = "partial",
    overlong: tuple[int, int] = (0, 0),
) -> Group | None:
    """The (G, m, d) score matrix and mask of a stored group; slots without a program are
    masked out, so they never enter the max (a failed program's zeros are kept: per-objective
    partial credit is part of the vector reward). With `duplicate_reward` "zero", a lazy
    candidate (its parent or a stored program repeated) scores zeros; its stored evaluation is
    untouched. With `format_reward` "whole", a rollout whose m candidates did not all parse has
    every slot masked out: it scores nothing. `overlong` (buffer, max_tokens), a soft overlong
    punishment after DAPO's: a completion of L tokens past max_tokens - buffer loses the share
    (L - max_tokens + buffer) / buffer of every score, all of them at the limit (scores stay
    >= 0, so DAPO's additive -1 becomes a factor). `versions` off: the trained
    policy's steps are not the campaign's policy versions (offline training starts a model of
    its own), so the rollouts' versions are left out."""
    from trainer.train import Group, Rollout

    if not stored.rollouts:
        return None
    scores = np.zeros((len(stored.rollouts), candidates, len(objectives)))
    mask = np.zeros((len(stored.rollouts), candidates), dtype=bool)
    for i, rollout in enumerate(stored.rollouts):
        slots = rollout.candidates[:candidates]
        whole = not (format_reward == "whole" and (len(slots) < candidates or None in slots))
        for j, slot in enumerate(slots if whole else ()):
            if slot is None:
                continue
            mask[i, j] = True
            lazy = j < len(rollout.lazy) and rollout.lazy[j]
            if not (lazy and duplicate_reward == "zero"):
                scores[i, j] = [slot.get(name, 0.0) for name in objectives]
        scores[i] *= 1 - overlong_penalty(len(rollout.token_ids), *overlong)
    return Group(
        rollouts=[
            Rollout(
                r.prompt_token_ids, r.token_ids, r.logprobs, r.sampled_step if versions else None
            )
            for r in stored.rollouts
        ],
        scores=scores,
        mask=mask,
    )
