"""What one run of a campaign did so far, for its progress line and its trackers (the
database holds the real counts)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from harness.observation.time_split import Split


@dataclass
class Progress:
    """What this run did so far, for the progress line (the database holds the real counts)."""

    started: float = field(default_factory=time.perf_counter)
    iterations: int = 0
    evaluations: int = 0
    tokens: int = 0
    skipped: int = 0  # iterations that produced nothing (see harness.evolution.generation)
    rollouts: int = 0
    parsed: int = 0  # rollouts whose m candidates all parsed
    trained: int = 0  # rollouts sampled by weights a step changed
    duplicates: int = 0  # candidates not evaluated: repeats of a program or candidate
    near: int = 0  # of them, near-duplicates by their text (harness.evolution.novelty)
    generate_seconds: float = 0.0
    best: dict[str, float] = field(default_factory=dict)
    train: str | None = None  # the last training step that made a policy version, as a line
    steps_skipped: int = 0  # training steps that changed no weight (each said once, as it ran)
    time: Split = field(default_factory=Split)  # where this run's batches spent their time

    def line(self, iteration: int, total: int) -> str:
        wall = max(time.perf_counter() - self.started, 1e-9)
        best = " ".join(f"{k} {v:.4f}" for k, v in self.best.items())
        line = (
            f"iteration {iteration}/{total} | best {best} | "
            f"{self.evaluations / wall:.2f} evals/s | {self.tokens / wall:.0f} tok/s"
        )
        if self.rollouts:
            line = f"{line} | parsed {self.parsed}/{self.rollouts}"
        if self.duplicates:
            near = f" ({self.near} near)" if self.near else ""
            line = f"{line} | not evaluated {self.duplicates} repeats{near}"
        if self.train is not None:
            line = f"{line} | by trained weights {self.trained}/{self.rollouts}"
        if self.skipped:
            line = f"{line} | {self.skipped} skipped"
        if self.steps_skipped:
            plural = "s" if self.steps_skipped > 1 else ""
            line = f"{line} | {self.steps_skipped} training step{plural} skipped"
        if self.time.batches:
            line = f"{line} | time: {self.time.line()}"
        return line if self.train is None else f"{line} | {self.train}"
