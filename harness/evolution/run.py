"""Everything one run of a campaign works with, and the refresh of its population from the
database (the programs this or any other process stored since)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.config.settings import CampaignSettings
from harness.evaluation.calls import Limits
from harness.evaluation.sandbox import Sandbox
from harness.evolution.novelty import Novelty
from harness.evolution.population import Population
from harness.observation.progress import Progress
from harness.store import Store
from problems.api import Compact, Problem

if TYPE_CHECKING:
    from harness.evolution.budgets import Spend
    from harness.learning.steps import CampaignTrainer
    from harness.learning.trackers import Reporter


@dataclass
class CampaignRun:
    """Everything one run of a campaign works with (the campaign itself is in the database)."""

    config: CampaignSettings
    problem: Problem
    store: Store
    campaign_id: int
    sandbox: Sandbox
    limits: Limits
    seed_id: int
    objectives: list[str]
    population: Population
    seen: set[str]  # code hashes evaluated already: duplicates are never evaluated twice
    # The stored programs' trees, families and recent texts: repeats are never evaluated.
    novelty: Novelty = field(default_factory=Novelty)
    progress: Progress = field(default_factory=Progress)
    last_program_id: int = 0
    trainer: CampaignTrainer | None = None  # set when the campaign trains (train_every > 0)
    reporter: Reporter | None = None  # set when the campaign reports to trackers (report_to)
    spend: Spend | None = None  # the tokens stored and in flight, when budgeted or priced
    compact: Compact | None = None  # the problem's compact form, when `form = "compact"`
    # The same programs' case scores (harness.records.CASE_PREFIX names), when parents are
    # picked by lexicase over them (`parent_selection = "lexicase"`).
    cases: Population | None = None


def refresh_population(run: CampaignRun) -> None:
    """Append the programs stored since the last refresh (by this or any other process), and
    remember their trees, families and texts (`run.novelty`)."""
    after = run.last_program_id
    # One read for the objectives and the cases: the same programs in both.
    cases = list(run.cases.objectives) if run.cases is not None else []
    ids, islands, valid, both, hashes = run.store.program_vectors(
        run.campaign_id, run.objectives + cases, after_id=after
    )
    scores, case_scores = both[:, : len(run.objectives)], both[:, len(run.objectives) :]
    if not len(ids):
        return
    for program in run.store.iter_programs(run.campaign_id, after=after):
        if program.id > ids[-1]:
            break  # stored since the vectors were read: the next refresh takes it
        run.novelty.add(program.code, program.code_hash, program.island)
    run.population.extend(ids, islands, scores, valid=valid, code_hashes=hashes)
    if run.cases is not None:
        run.cases.extend(ids, islands, case_scores, valid=valid, code_hashes=hashes)
    if valid.any():
        best = run.progress.best
        for name, value in zip(run.objectives, scores[valid].max(axis=0), strict=True):
            best[name] = max(best.get(name, 0.0), float(value))
    run.last_program_id = int(ids[-1])
