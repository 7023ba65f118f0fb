"""Costs and budgets: the tokens a campaign paid for, what they cost at the configured prices,
and when a budget stops it (`max_total_tokens`, `max_cost`; docs/campaigns.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.config.settings import CampaignSettings
    from harness.evolution.iteration import SampledIteration
    from harness.store import Store


@dataclass
class Spend:
    """The tokens a campaign paid for: each group's prompt once (a server takes the G
    rollouts of a prompt in one request) and every rollout's completion, as stored."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def cost(self, config: CampaignSettings) -> float | None:
        """Dollars at the config's prices per million tokens; None when it sets none."""
        if config.price_prompt is None and config.price_completion is None:
            return None
        return (
            self.prompt_tokens * (config.price_prompt or 0.0)
            + self.completion_tokens * (config.price_completion or 0.0)
        ) / 1e6

    def add(self, batch: Sequence[SampledIteration]) -> None:
        for sampled in batch:
            self.prompt_tokens += sampled.prompt_tokens  # 0 when skipped
            self.completion_tokens += sum(c.num_tokens for c in sampled.completions)

    def stop_reason(self, config: CampaignSettings) -> str | None:
        """Why no new batch may start (a budget reached, and how to go on), else None."""
        if config.max_total_tokens is not None and self.total >= config.max_total_tokens:
            return (
                f"token budget reached: {self.total} of {config.max_total_tokens} tokens; "
                "resume with a larger --max-total-tokens"
            )
        cost = self.cost(config)
        if config.max_cost is not None and cost is not None and cost >= config.max_cost:
            return (
                f"cost budget reached: ${cost:.4f} of ${config.max_cost:g}; "
                "resume with a larger --max-cost"
            )
        return None

    def line(self, config: CampaignSettings) -> str:
        """The cost, for the end of `vpo run` (the config sets a price)."""
        return (
            f"cost: ${self.cost(config):.4f} for {self.prompt_tokens} prompt and "
            f"{self.completion_tokens} completion tokens (${config.price_prompt or 0:g} and "
            f"${config.price_completion or 0:g} per million)"
        )


def stored_spend(store: Store, campaign_id: int) -> Spend:
    """The tokens of the campaign's stored groups: a group's prompt token ids (where the
    backend gave them, else the count a server reported) and its rollouts' completions."""
    spend = Spend()
    for group, trajectories in store.iter_trajectory_groups(campaign_id):
        if trajectories:
            ids = group.get("prompt_token_ids")
            spend.prompt_tokens += len(ids) if ids else group.get("prompt_tokens") or 0
        spend.completion_tokens += sum(t["num_tokens"] for t in trajectories)
    return spend


def counts_spend(config: CampaignSettings) -> bool:
    """Whether a run keeps count of its tokens: a budget or a price is set."""
    return any(
        value is not None
        for value in (
            config.max_total_tokens,
            config.max_cost,
            config.price_prompt,
            config.price_completion,
        )
    )
