"""benchmarks/discovery.py's arms, its measures (pure functions on arrays) and one run's result
with its summary file: what the grid runs and the report both read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.measures import hypervolume

# Arm -> (candidates per rollout, advantage estimator; None: no training).
ARMS: dict[str, tuple[int, str | None]] = {
    "none": (3, None),
    "grpo": (1, "grpo"),
    "multi": (3, "multi_rlvr"),
    "vpo": (3, "vpo"),
    "vpo_front": (3, "vpo"),
    "entropic": (3, "entropic"),
}
# The arms that take the discovery reward (--reward-reference, --slot-cost, --warmup-samples);
# `vpo` keeps the paper's absolute set score.
DISCOVERY_REWARD = ("vpo_front", "entropic")
ARM_TITLES = {
    "none": "no training (m = 3)",
    "grpo": "GRPO in the loop (m = 1)",
    "multi": "Multi-RLVR in the loop (m = 3, summed scalar)",
    "vpo": "VPO in the loop (m = 3)",
    "vpo_front": "VPO, discovery reward (m = 3)",
    "entropic": "entropic, discovery reward (m = 3)",
}
# Front coverage: the R2 indicator of a run's valid programs, E_w[max_s w . r(s)], over these
# many Dirichlet(1) weightings drawn once (seed 0), so every run is measured on the same ones.
COVERAGE_WEIGHTINGS = 2000
BOOTSTRAP = 10_000  # resamples of the seeds for a paired interval
PAIRED_LEVEL = 0.90
BEST_AT_SHOWN = (1, 3, 5, 10, 20, 30)
GRID_POINTS = 101  # points on the tokens axis where the seeds' curves are averaged
PROBE_SLOTS = 30  # the VPO paper's pool: 10 completions x m = 3, or 30 x 1


# The measures: pure functions on arrays (the hypervolume is trainer.measures').


def best_so_far(tokens: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The running best of `values` (n,) or (n, d) among the entries whose `tokens` (n,) are
    at most each point of `grid`: shape (len(grid),) or (len(grid), d); -inf before any."""
    order = np.argsort(tokens, kind="stable")
    running = np.maximum.accumulate(np.asarray(values, dtype=np.float64)[order], axis=0)
    upto = np.searchsorted(np.asarray(tokens)[order], grid, side="right")  # entries <= x
    padded = np.concatenate([np.full((1, *running.shape[1:]), -np.inf), running])
    return padded[upto]


def hypervolume_so_far(tokens: np.ndarray, vectors: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The hypervolume of the vectors (n, d) whose tokens (n,) are at most each grid point."""
    return np.array([hypervolume(vectors[tokens <= x]) for x in grid])


def coverage(vectors: np.ndarray) -> float:
    """The R2 indicator of the rows of `vectors` (n, d): the mean over fixed Dirichlet(1)
    weightings of the best weighted sum, 0 for no rows. Unlike the hypervolume it does not drop
    to 0 when one objective stayed at 0 for every program."""
    if not len(vectors):
        return 0.0
    weights = np.random.default_rng(0).dirichlet(np.ones(vectors.shape[1]), COVERAGE_WEIGHTINGS)
    return float((vectors @ weights.T).max(axis=0).mean())


def paired_interval(
    differences: Sequence[float], level: float = PAIRED_LEVEL
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-seed differences and its percentile bootstrap
    interval at `level` (seeds resampled with replacement, BOOTSTRAP times, seed 0)."""
    values = np.asarray(differences, dtype=np.float64)
    if len(values) == 0:
        return (float("nan"),) * 3
    draws = np.random.default_rng(0).integers(0, len(values), (BOOTSTRAP, len(values)))
    means = values[draws].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(values.mean()), float(low), float(high)


def mean_of(values: Sequence[float | None]) -> float:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else float("nan")


# One run: a `vpo run` process, then its database read back.


@dataclass(frozen=True)
class RunResult:
    arm: str
    seed: int
    objectives: list[str]
    wall_s: float
    tokens: int
    iterations: int
    steps: int
    moved: int  # steps that trained some rollout (a step whose advantages were all 0 did not)
    train_s: float
    program_tokens: np.ndarray  # (n,) tokens generated when each valid program was stored
    program_scores: np.ndarray  # (n, d) the valid programs' score vectors
    diversity: float
    parse_rate: float
    parse_first_half: float
    parse_second_half: float
    rollouts: int
    # Sampled by weights a step has changed: a version from the first step that trained some
    # rollout on (a step whose advantages were all 0 publishes the weights it was given).
    trained_rollouts: int
    probe: dict | None = None  # what the last version samples on the first prompt (probe.py)
    # Per rollout, the score vectors of its scored candidates (benchmarks/reward_geometry.py);
    # None in summaries written before it was kept.
    rollout_scores: list[list[list[float]]] | None = None

    @property
    def best(self) -> np.ndarray:
        return self.program_scores.max(axis=0)

    def hypervolume(self, live: Sequence[int]) -> float:
        """Over the `live` objectives: one that no program scored on would make it 0."""
        return hypervolume(self.program_scores[:, list(live)])

    @property
    def coverage(self) -> float:
        """Front coverage over every objective (`coverage`)."""
        return coverage(self.program_scores)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def save(self, path: Path) -> None:
        """Everything the report needs from this run, as JSON: a few kB that can be committed,
        so that seeds run in different sessions make one report (`--report-from`)."""
        save_summary(self, path)

    @classmethod
    def load(cls, path: Path) -> RunResult:
        fields = summary_fields(path)
        if fields.get("probe") is not None:  # JSON keys are strings; the steps are ints
            fields["probe"] = {int(step): row for step, row in fields["probe"].items()}
        return cls(**fields)

    @property
    def trained_share(self) -> float:
        return self.trained_rollouts / self.rollouts if self.rollouts else float("nan")


def save_summary(run: object, path: Path) -> None:
    """A run's fields as JSON, its programs' tokens and score vectors as lists (this benchmark's
    runs and peers.py's)."""
    fields = dict(vars(run))
    fields["program_tokens"] = fields["program_tokens"].tolist()
    fields["program_scores"] = fields["program_scores"].tolist()
    path.write_text(json.dumps(fields, indent=1) + "\n")


def summary_fields(path: Path) -> dict:
    """What `save_summary` wrote, the programs' tokens and scores as arrays again (an empty run's
    scores keep their shape: no rows, one column an objective)."""
    fields = json.loads(path.read_text())
    fields["program_tokens"] = np.array(fields["program_tokens"], dtype=np.int64)
    scores = np.array(fields["program_scores"], dtype=np.float64)
    fields["program_scores"] = scores.reshape(len(scores), len(fields["objectives"]))
    return fields


def scored_candidates(rollout: Any, objectives: Sequence[str]) -> list[list[float]]:
    """A stored rollout's (harness.records.TrainingRollout) candidates that parsed and ran:
    their score vectors, a repeat of a stored program included."""
    return [
        [slot.get(name, 0.0) for name in objectives]
        for j, slot in enumerate(rollout.candidates)
        if slot is not None and (j >= len(rollout.valid) or rollout.valid[j])
    ]


def database(folder: Path, arm: str, seed: int) -> Path:
    return folder / f"{arm}-seed{seed}.db"


def summary_path(db: Path) -> Path:
    return db.with_suffix(".run.json")


def live_objectives(runs: dict[str, list[RunResult]]) -> list[int]:
    """The objectives some valid program of some run scored above 0 on (all, if none did): a
    gated objective that never opened (simplicity) would make every hypervolume 0."""
    results = [r for rs in runs.values() for r in rs]
    scored = [
        j
        for j in range(len(results[0].objectives))
        if any(len(r.program_scores) and r.program_scores[:, j].max() > 0 for r in results)
    ]
    return scored or list(range(len(results[0].objectives)))
