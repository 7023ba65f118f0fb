"""An iteration recorded: its candidates classified (new, repeat, unparsed, ...; the new code
of the batch's earlier iterations counts as seen), the new ones evaluated in the sandbox pool
all together, then each iteration stored in its own transaction (its group, rollouts and
programs) and counted in the run's progress."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping, Sequence

from harness.config.errors import IterationRecorded
from harness.evaluation.evaluate import evaluate_many
from harness.evolution.iteration import (
    BatchKeys,
    ParsedGroup,
    SampledIteration,
    classify_group,
    rollout_records,
)
from harness.evolution.run import CampaignRun
from harness.observation.ledger import Ledger, timed
from harness.records import NewGroup
from problems.api import Evaluation


def evaluate_and_store(
    run: CampaignRun,
    batch: Sequence[SampledIteration],
    *,
    lost: Callable[[SampledIteration], None] | None = None,
    ledger: Ledger | None = None,
) -> Iterator[SampledIteration]:
    """Classify the candidates of a batch, evaluate the new ones in the sandbox pool all
    together, then store each iteration in its own transaction, in order, yielding each once
    stored. A candidate two iterations of the batch share is evaluated once.

    `lost`: called for an iteration another process recorded first (a worker whose claim ran
    out), which is then passed over; without it that is an error."""
    with timed(ledger, "parsing"):
        groups = _classify(run, batch)
    code = {digest: text for group in groups for digest, text in group.new_code.items()}
    sandbox = run.sandbox
    with timed(ledger, "evaluating", lambda: sandbox.cpu_seconds):
        evaluations = evaluate_many(run.problem, list(code.values()), sandbox, run.limits)
    by_hash = dict(zip(code, evaluations, strict=True))
    for sampled, group in zip(batch, groups, strict=True):
        try:
            with timed(ledger, "storing"):
                store_iteration(run, sampled, group, {h: by_hash[h] for h in group.new_code})
        except IterationRecorded:
            if lost is None:
                raise
            lost(sampled)
            continue
        yield sampled


def _classify(run: CampaignRun, batch: Sequence[SampledIteration]) -> list[ParsedGroup]:
    """Each iteration's candidates classified (new, repeat, unparsed, ...), the new code of
    the iterations before it in the batch counted as seen."""
    earlier: set[str] = set()  # new code of the batch's earlier iterations
    keys = BatchKeys()
    groups = []
    for sampled in batch:
        group = classify_group(
            [completion.text for completion in sampled.completions],
            run.config.candidates,
            sampled.parent.code,
            _Either(run.seen, earlier),
            run.problem.entry,
            run.compact.reader(sampled.parent.code) if run.compact else run.problem.admit,
            family=run.problem.family,
            memory=run.novelty,
            island=sampled.selection.island,
            batch=keys,
        )
        earlier.update(group.new_code)
        groups.append(group)
    return groups


class _Either:
    """Membership in either of two sets, without copying them."""

    def __init__(self, first: Container[str], second: Container[str]) -> None:
        self.first, self.second = first, second

    def __contains__(self, item: object) -> bool:
        return item in self.first or item in self.second


def store_iteration(
    run: CampaignRun,
    sampled: SampledIteration,
    group: ParsedGroup,
    evaluations: Mapping[str, Evaluation],
) -> None:
    """The group, its rollouts and its new programs (`evaluations` by code hash) in one
    transaction; then this run's code hashes and progress."""
    selection = sampled.selection
    rollouts = rollout_records(group, sampled.completions, evaluations)
    run.store.record_iteration(
        run.campaign_id,
        NewGroup(
            iteration=sampled.iteration,
            island=selection.island,
            parent_id=selection.parent_id,
            draft_ids=selection.draft_ids,
            prompt=sampled.prompt,
            prompt_token_ids=sampled.prompt_token_ids,
            prompt_tokens=sampled.prompt_tokens,
            rollouts=rollouts,
            version=sampled.version,
            skipped=sampled.skipped,
            population=sampled.population,
        ),
        migrations=sampled.migrations,
    )
    run.seen.update(group.new_code)
    progress = run.progress
    for rollout in group.rollouts:
        for c in rollout.candidates:
            progress.duplicates += c.outcome == "duplicate"
            progress.near += c.near
    progress.iterations += 1
    progress.skipped += sampled.skipped is not None
    progress.evaluations += len(evaluations)
    progress.rollouts += len(rollouts)
    progress.parsed += sum(r.parse_status == "ok" for r in rollouts)
    changed = run.trainer.changed_from if run.trainer else None
    version = sampled.version  # None: the base weights, never trained
    if changed is not None and version is not None and version.step >= changed.step:
        progress.trained += len(rollouts)
    for evaluation in evaluations.values():
        if evaluation.status == "ok":
            for name, value in evaluation.scores.items():
                progress.best[name] = max(progress.best.get(name, 0.0), value)
