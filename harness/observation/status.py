"""How a campaign is going: what `vpo status` adds to the counts, and the dashboard shows.

Everything is derived from what the database stores (groups, events, policy versions, the
stored config); nothing is kept in a second place:

    iterations  = the groups recorded (a skipped iteration too: it used its number)
    budget      = `iterations` of the config the campaign last ran with (its newest `resumed`
                  event's, else the one it was created with)
    elapsed_s   = from the campaign's creation to its newest record (every write logs an event),
                  so a pause between a stop and a resume counts
    pace        = over the last `PACE_WINDOW` groups by the time they were stored, t_0 .. t_n:
                  (t_n - t_0) / n seconds per iteration; the tokens and evaluations of groups
                  1..n over the same span give tokens/s and evaluations/s
    stopped_by  = why a finished campaign's last run ended before its budget of iterations
                  (`token budget spent: ...`, `cost budget reached: ...`), else None
    eta_s       = pace x (budget - iterations); None when finished (a budget that stopped it
                  too), without a budget, or with fewer than two groups (no span to measure)
    running     = the campaign's status is "running" and it wrote something in the last
                  max(`ACTIVE_S`, 3 x pace) seconds (a killed run keeps status "running")
    time_split  = where the last `TIME_WINDOW` batches spent their time, by stage, and the cores
                  each kept busy (harness/observation/time_split.py); no batches before a campaign
                  recorded them
    skipped_steps = training steps that changed no weight and made no version (their events)
    versions    = per policy version (0: the starting weights), what it sampled: groups,
                  rollouts, mean parse rate and pool diversity of its groups, best per objective
    policy_bytes = the bytes in the folder of the newest policy version (the versions kept,
                  merged copies, leftovers of a kill); None when it is not on this machine.
                  The folder is the one beside the SQLite file (`x.db` -> `x.policies/NAME`)
                  when that exists, else the one the database names (`policy_folder_stored`):
                  a copied or moved database is reported with the versions that travelled
                  with it, not the original's

A span, not a median of gaps: with several iterations in flight, groups are stored in bursts
(many gaps near zero, then one long one), so a median gap would say almost nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.observation import time_split, views
from harness.records import CampaignRecord, EventRecord, PolicyVersion
from harness.store import Store
from harness.store.models import utc_now

# Groups the recent pace is measured over: a few batches of iterations in flight.
PACE_WINDOW = 50
# Batches the time split is added over: the recent ones, as for the pace.
TIME_WINDOW = 20
# A campaign that wrote nothing for longer than this (or 3 iterations at its pace) is not running.
ACTIVE_S = 300.0
# A policy version's folder, as harness/learning/publish.py names it (not imported: inspecting a
# database stays below the campaign's code).
_VERSION = re.compile(r"step-\d+")


def report(store: Store, campaign: CampaignRecord, now: datetime | None = None) -> dict[str, Any]:
    """What `vpo status --json` prints: `views.summary_json`'s keys, each best value with the
    iteration that found it, `progress`'s keys, the policy versions on disk, and why
    candidates were rejected."""
    summary = views.summary_json(store, campaign.id)
    found = store.found_at([best["program_id"] for best in summary["best"].values()])
    for best in summary["best"].values():
        # The seed (or any program no rollout wrote) was there before iteration 0 ended.
        best["iteration"] = found.get(best["program_id"], 0)
    rejected = store.rejections(campaign.id)
    versions = store.version_measures(campaign.id, list(summary["best"]))
    return {
        **summary,
        **progress(store, campaign, now),
        **versions_on_disk(store.latest_policy(campaign.id), _database_file(store)),
        "versions": [row.as_json() for row in versions],
        "candidates": rejected.pop("candidates"),
        "rejections": rejected,
    }


def progress(store: Store, campaign: CampaignRecord, now: datetime | None = None) -> dict[str, Any]:
    """Iterations of the budget, elapsed time, recent pace, ETA, whether it runs, and the
    training steps with the last one's metrics (see the module's docstring)."""
    now = now or utc_now()
    recent = store.recent_groups(campaign.id, PACE_WINDOW)
    done = store.iterations_done(campaign.id)
    budget = iteration_budget(campaign, store.events(campaign.id, "resumed"))
    pace = recent_pace([(at, tokens, evaluated) for _, at, tokens, evaluated in recent])
    last = store.last_record_at(campaign.id) or campaign.created_at
    idle = (now - last).total_seconds()
    per_iteration = pace["seconds_per_iteration"]
    policies = store.policies(campaign.id)
    finished = campaign.status == "finished"
    return {
        "iterations": done,
        "budget": budget,
        "stopped_by": stopped_by(store, campaign) if finished else None,
        "elapsed_s": (last - campaign.created_at).total_seconds(),
        "eta_s": None if finished else eta(per_iteration, done, budget),
        "running": campaign.status == "running"
        and idle <= max(ACTIVE_S, 3 * (per_iteration or 0.0)),
        "idle_s": idle,
        "pace_window": len(recent),
        **pace,
        "time_split": time_split.split(
            store.recent_payloads(campaign.id, time_split.EVENT, TIME_WINDOW)
        ).as_json(),
        "steps": len(policies),
        "last_step": dict(policies[-1].metrics) if policies else None,
        **step_accounting(store, campaign.id),
    }


def versions_on_disk(latest: PolicyVersion | None, database: Path | None = None) -> dict[str, Any]:
    """The folder of the newest policy version, the versions it holds and its bytes (all of
    its files, the versions' merged copies and a killed save's leftovers included), the
    folder the database names (`policy_folder_stored`), and a note when the two differ or
    the folder is missing. The folder beside `database`, a SQLite file, wins where it exists:
    a database copied with its policy folder names the original's. The counts are None
    without a version, or when neither folder is on this machine (the trainer ran on another,
    or its path is relative to another working folder)."""
    stored = Path(latest.path).parent if latest is not None else None
    beside = None
    if stored is not None and database is not None:
        beside = database.with_name(database.stem + ".policies") / stored.name
    folder = beside if beside is not None and beside.is_dir() else stored
    report: dict[str, Any] = {
        "policy_folder": None,
        "policy_folder_stored": None if stored is None else str(stored),
        "policy_folder_note": None,
        "policy_versions_on_disk": None,
        "policy_bytes": None,
    }
    if folder is None or stored is None:
        return report
    try:
        with os.scandir(folder) as found:
            entries = list(found)
    except OSError:
        report["policy_folder_note"] = f"the database names {stored}, not on this machine"
        return report
    if folder != stored:
        report["policy_folder_note"] = f"the database names {stored}"
    elif beside is not None and beside != stored and stored.parent.suffix == ".policies":
        # Beside another database file: this one was copied or moved without its folder.
        report["policy_folder_note"] = (
            f"beside the database this one was copied from; none at {beside}"
        )
    return {
        **report,
        "policy_folder": str(folder),
        "policy_versions_on_disk": sum(
            1 for entry in entries if _VERSION.fullmatch(entry.name) and entry.is_dir()
        ),
        "policy_bytes": sum(_bytes(entry) for entry in entries),
    }


def _database_file(store: Store) -> Path | None:
    """The SQLite file `store` reads; None for a server or an in-memory database."""
    url = store.engine.url
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def _bytes(entry: os.DirEntry[str]) -> int:
    """The bytes of the files in `entry`, a file or a folder (links not followed)."""
    try:
        if entry.is_dir(follow_symlinks=False):
            with os.scandir(entry.path) as inside:
                return sum(_bytes(child) for child in inside)
        return entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:  # removed while counted: a version pruned meanwhile
        return 0


def step_accounting(store: Store, campaign_id: int) -> dict[str, Any]:
    """The training steps that changed no weight (each an event: `skipped_steps`, the last
    one's metrics and reason in `last_skipped_step`) and the groups no step took yet
    (`untrained_groups`: they wait for the next step, oldest first)."""
    skipped = store.skipped_steps(campaign_id)
    return {
        "skipped_steps": len(skipped),
        "last_skipped_step": skipped[-1] if skipped else None,
        "untrained_groups": store.untrained_count(campaign_id),
    }


def stopped_by(store: Store, campaign: CampaignRecord) -> str | None:
    """Why the campaign's last run finished before its iterations (the budget that stopped
    it, as `vpo run` said it); None when it ran them all."""
    statuses = store.events(campaign.id, "campaign_status")
    return statuses[-1].payload.get("reason") if statuses else None


def iteration_budget(campaign: CampaignRecord, resumed: Sequence[EventRecord]) -> int | None:
    """`iterations` of the config the campaign last ran with; None when it names none (a
    campaign written through the store API alone)."""
    configs = [campaign.config] + [event.payload.get("config") or {} for event in resumed]
    budgets = [config["iterations"] for config in configs if "iterations" in config]
    return int(budgets[-1]) if budgets else None


def recent_pace(groups: Sequence[tuple[datetime, int, int]]) -> dict[str, float | None]:
    """Seconds per iteration, tokens/s and evaluations/s over (stored at, tokens,
    evaluations) of consecutive groups in the order stored: what groups 1..n did in the span
    from group 0 to group n. All None with fewer than two groups or no time between them."""
    span = (groups[-1][0] - groups[0][0]).total_seconds() if len(groups) > 1 else 0.0
    if span <= 0:
        return {"seconds_per_iteration": None, "tokens_per_s": None, "evals_per_s": None}
    return {
        "seconds_per_iteration": span / (len(groups) - 1),
        "tokens_per_s": sum(tokens for _, tokens, _ in groups[1:]) / span,
        "evals_per_s": sum(evaluated for _, _, evaluated in groups[1:]) / span,
    }


def eta(seconds_per_iteration: float | None, done: int, budget: int | None) -> float | None:
    """Seconds until `budget` iterations at the recent pace; None when there is nothing left
    to do or nothing to measure the pace by."""
    if seconds_per_iteration is None or budget is None or done >= budget:
        return None
    return seconds_per_iteration * (budget - done)
