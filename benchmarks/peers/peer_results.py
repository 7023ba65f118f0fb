"""What one harness run left, read back as the same record for every harness; the report and plot.

A peer's programs are those its evaluations sent to the project's scorer (peer_score.py's log),
never what the peer recorded; each is placed on the tokens axis at the run's spend when its
evaluation started (the proxy's log: the completion tokens of the requests answered before
then). Evaluations that started before the first answer are the seed's. A vpo run's programs
are read from its database as benchmarks/discovery.py reads them. The best program a harness
names is scored again by the project's scorer at the end of its run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from discovery import read_run
from discovery_report import spread
from discovery_runs import best_so_far, hypervolume_so_far, save_summary, summary_fields
from peer_proxy import Ledger, read_calls

from trainer.measures import hypervolume

GRID_POINTS = 101
TITLES = {
    "openevolve": "OpenEvolve 0.4.0",
    "openevolve-full": "OpenEvolve 0.4.0, whole programs",
    "shinka": "ShinkaEvolve 0.0.7",
    "vpo": "vpo-evolve, no training",
    "vpo-train": "vpo-evolve, VPO in the loop",
}


@dataclass(frozen=True)
class PeerRun:
    harness: str
    problem: str
    seed: int
    objectives: list[str]
    budget: int
    program_tokens: np.ndarray  # (n,) the spend when each valid program was proposed
    program_scores: np.ndarray  # (n, d) the project's scores of the valid programs
    proposals: int  # programs the model was asked for: one per answered call, m per vpo rollout
    valid: int  # of them, programs the project's scorer scored (status ok)
    tokens: int  # completion tokens the proxy counted
    calls: int  # chat requests the model answered
    refused: int  # chat requests the proxy refused, the budget being spent
    wall_s: float
    best_code: str | None  # the program the harness itself calls best
    rescored: dict[str, float] | None  # that program scored again by the project's scorer
    rescored_status: str | None

    @property
    def cut(self) -> bool:
        """The proxy refused a request: the budget, not the harness, ended the run."""
        return self.refused > 0

    @property
    def valid_share(self) -> float:
        return self.valid / self.proposals if self.proposals else float("nan")

    def within(self) -> tuple[np.ndarray, np.ndarray]:
        """The valid programs proposed within the budget (a request admitted before the budget
        was spent may finish past it)."""
        keep = self.program_tokens <= self.budget
        return self.program_tokens[keep], self.program_scores[keep]

    def best(self) -> np.ndarray:
        _, scores = self.within()
        return scores.max(axis=0) if len(scores) else np.full(len(self.objectives), np.nan)

    def hypervolume(self, live: list[int]) -> float:
        return hypervolume(self.within()[1][:, live])

    def save(self, path: Path) -> None:
        save_summary(self, path)

    @classmethod
    def load(cls, path: Path) -> PeerRun:
        return cls(**summary_fields(path))


def read_scores(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def scoring_open(log: Path) -> int:
    """Evaluations of the run that started and have not ended."""
    events = read_scores(log)
    return sum(e["event"] == "start" for e in events) - sum(e["event"] == "end" for e in events)


def peer_programs(
    calls: list[dict[str, Any]], scores: list[dict[str, Any]], objectives: list[str]
) -> tuple[np.ndarray, np.ndarray, int]:
    """(tokens (n,), score vectors (n, d) of the valid programs, valid proposals)."""
    answered = [c for c in calls if c["status"] == 200]
    ends = np.array([c["end"] for c in answered], dtype=np.float64)
    spent = np.array([c["spent"] for c in answered], dtype=np.int64)
    started = {e["id"]: e["t"] for e in scores if e["event"] == "start"}
    tokens, vectors, valid = [], [], 0
    for entry in (e for e in scores if e["event"] == "end" and e["status"] == "ok"):
        before = int(np.searchsorted(ends, started.get(entry["id"], entry["t"]), side="right"))
        tokens.append(int(spent[before - 1]) if before else 0)
        vectors.append([entry["scores"][name] for name in objectives])
        valid += before > 0  # the seed's evaluations came before any answer
    shape = (len(vectors), len(objectives))
    return np.array(tokens, dtype=np.int64), np.array(vectors).reshape(shape), valid


def vpo_slots(db: Path) -> tuple[int, int]:
    """(candidate slots, slots whose program the scorer scored ok) of a vpo run."""
    from harness.store import Store

    with Store.open(db, read_only=True) as store:
        campaign_id = store.campaigns()[0].id
        status = {p.id: p.status for p in store.iter_programs(campaign_id)}
        slots = [
            slot.get("program_id")
            for _, trajectories in store.iter_trajectory_groups(campaign_id)
            for trajectory in trajectories
            for slot in trajectory["candidates"] or []
        ]
    return len(slots), sum(status.get(program) == "ok" for program in slots)


def rescore(problem_name: str, code: str) -> tuple[str, dict[str, float]]:
    """The program scored again, in a fresh sandbox, by the project's scorer."""
    from harness.evaluation.evaluate import evaluate
    from harness.evaluation.sandbox import Sandbox
    from problems.registry import load

    with Sandbox(workers=1) as sandbox:
        evaluation = evaluate(load(problem_name), code, sandbox)
    return evaluation.status, dict(evaluation.scores)


def live_objectives(runs: list[PeerRun]) -> list[int]:
    """The objectives the seed program (scored before any token was spent) scores above 0 on,
    all if it scores on none: every run starts from it, so each run's hypervolume over them is
    above 0. An objective only some runs opened (simplicity, gated on the fit) would make the
    others' 0; its best has a column of its own."""
    d = len(runs[0].objectives)
    seeds = [r.program_scores[r.program_tokens == 0] for r in runs]
    scored = [j for j in range(d) if any(s[:, j].max(initial=0) > 0 for s in seeds)]
    return scored or list(range(d))


def problem_tables(problem: str, runs: list[PeerRun]) -> list[str]:
    objectives = runs[0].objectives
    live = live_objectives(runs)
    volume = "hypervolume (" + ", ".join(objectives[j] for j in live) + ")"
    lines = [
        f"## {problem}",
        "",
        "| harness | seeds | "
        + " | ".join(f"best {name}" for name in objectives)
        + f" | {volume} | valid proposals | tokens | model calls | wall s |",
        "|---|" + "---:|" * (len(objectives) + 6),
    ]
    harnesses = list(dict.fromkeys(r.harness for r in runs))
    for harness in harnesses:
        mine = [r for r in runs if r.harness == harness]
        cells = [spread([r.best()[j] for r in mine]) for j in range(len(objectives))]
        cells += [
            spread([r.hypervolume(live) for r in mine], 4),
            spread([r.valid_share for r in mine], 2),
            spread([r.tokens for r in mine], 0),
            spread([r.calls for r in mine], 0),
            spread([r.wall_s for r in mine], 0),
        ]
        lines.append(f"| {TITLES[harness]} | {len(mine)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| harness | seed | tokens | calls | refused | proposals | valid | wall s | "
        + " | ".join(f"best {name}" for name in objectives)
        + " | its best program, re-scored |",
        "|---|---:|" + "---:|" * (6 + len(objectives)) + "---|",
    ]
    for r in runs:
        again = "none named" if r.rescored is None else r.rescored_status or "?"
        if r.rescored is not None:
            again += " " + " ".join(f"{name} {r.rescored.get(name, 0):.3f}" for name in objectives)
        cells = [r.tokens, r.calls, r.refused, r.proposals, r.valid, f"{r.wall_s:.0f}"]
        best = [f"{value:.3f}" for value in r.best()]
        lines.append(f"| {r.harness} | {r.seed} | " + " | ".join(map(str, cells + best)) + f" | "
                     f"{again} |")  # fmt: skip
    return lines + [""]


def report(runs: list[PeerRun], header: list[str]) -> str:
    problems = list(dict.fromkeys(r.problem for r in runs))
    lines = ["# OpenEvolve, ShinkaEvolve and vpo-evolve at an equal budget of generated tokens", ""]
    lines += [f"- {line}" for line in header] + [""]
    for problem in problems:
        lines += problem_tables(problem, [r for r in runs if r.problem == problem])
    return "\n".join(lines)


def plot(runs: list[PeerRun], path: Path, title: str) -> None:
    """Per problem (a row), the best of each objective and the hypervolume against tokens:
    each harness's mean over seeds, with a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = list(dict.fromkeys(r.problem for r in runs))
    columns = len(runs[0].objectives) + 1
    figure, axes = plt.subplots(
        len(problems), columns, figsize=(4.6 * columns, 3.8 * len(problems)), squeeze=False
    )
    for row, problem in enumerate(problems):
        mine = [r for r in runs if r.problem == problem]
        live = live_objectives(mine)
        grid = np.linspace(0, max(r.budget for r in mine), GRID_POINTS)
        for harness in dict.fromkeys(r.harness for r in mine):
            results = [r for r in mine if r.harness == harness]
            best = np.stack([best_so_far(*r.within(), grid) for r in results])
            volume = np.stack(
                [hypervolume_so_far(r.within()[0], r.within()[1][:, live], grid) for r in results]
            )
            curves = [best[:, :, j] for j in range(columns - 1)] + [volume]
            for axis, curve in zip(axes[row], curves, strict=True):
                (line,) = axis.plot(grid, curve.mean(axis=0), label=TITLES[harness])
                if len(results) > 1:
                    axis.fill_between(grid, curve.min(axis=0), curve.max(axis=0),
                                      color=line.get_color(), alpha=0.2)  # fmt: skip
        for axis, name in zip(axes[row], [*mine[0].objectives, "hypervolume"], strict=True):
            what = name if name == "hypervolume" else f"best {name}"
            axis.set(xlabel="completion tokens", ylabel=name, title=f"{problem}: {what}")
            axis.grid(alpha=0.3)
        axes[row][0].legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def peer_run(
    harness: str, problem: str, seed: int, folder: Path, budget: int, ledger: Ledger,
    wall_s: float, best_code: str | None,
) -> PeerRun:  # fmt: skip
    """A finished run's record, from its proxy and scoring logs (a peer) or its database."""
    from problems.registry import load

    objectives = [o.name for o in load(problem).objectives]
    if harness in ("vpo", "vpo-train"):
        result = read_run(harness, seed, folder / "vpo.db", wall_s)
        tokens, vectors = result.program_tokens, result.program_scores
        proposals, valid = vpo_slots(folder / "vpo.db")
    else:
        calls = read_calls(folder / "calls.jsonl")
        scores = read_scores(folder / "scores.jsonl")
        tokens, vectors, valid = peer_programs(calls, scores, objectives)
        proposals = ledger.calls
    status, again = rescore(problem, best_code) if best_code else (None, None)
    return PeerRun(
        harness, problem, seed, objectives, budget, tokens, vectors, proposals, valid,
        ledger.spent, ledger.calls, ledger.refused, wall_s, best_code, again, status,
    )  # fmt: skip
