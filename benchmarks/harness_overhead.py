"""Harness overhead per iteration at 1k, 10k and 100k programs, beside OpenEvolve's database.

    python benchmarks/harness_overhead.py [--sizes 1000 10000 100000] [--iterations 200]
        [--openevolve-python PATH | --no-openevolve]

What one iteration of `harness.evolution.loop` costs the main process when generation and evaluation
take no time, on a SQLite campaign of N synthetic circle-packing programs (1.5 KB median,
0.8-2.1 KB of code, two objectives, 4 islands, ~10% not ok), stage by stage as `campaign.evolve`
runs them:

- refresh: `run.refresh_population` (`Store.program_vectors(after_id=last)` and
  `Population.extend` of the new programs)
- select: `selection.select` (island, parent, drafts), and `selection.migrants` (every 20th
  iteration)
- load: `Store.programs_by_ids` for the parent and the 3 drafts
- prompt: `build_prompt` with 3 candidates
- parse: `iteration.classify_group` of G = 4 canned completions (thinking, tags, full programs,
  edits, a truncated and a missing candidate): parsing and the duplicate checks by code hash
  and syntax tree (`novelty.Novelty`, which `refresh` fills with the new programs' trees)
- record: `loop.store_iteration`: the rollout records, and `Store.record_iteration` of the
  group, 4 trajectories (with token ids and logprobs) and the ~6 new programs, each with a
  precomputed evaluation (the sandbox is not run)

Each stage calls the loop's own functions, on a `run.CampaignRun` built as
`campaign.prepare` builds it. The completions are written between `prompt` and `parse`, outside
the clock: that is the generator's time. Each iteration stores ~6 programs, so N grows during
the run (the table says from what to what). The one-time load at start or resume (all vectors,
all code hashes) is shown apart.

OpenEvolve (0.4.0, in its own virtual environment so the project's is never touched) holds the
same N programs in its `ProgramDatabase`, filled directly (its `add` keeps only MAP-Elites
winners, so adding N programs would not leave N) with population_size N, 4 islands, an archive
of 100 and a 20-program diversity reference set, as a long run has them. Timed per iteration as
its controller runs them in the main process: `sample_from_island` (parent and 2 inspirations),
`_create_database_snapshot` and its pickling for the worker, and `add` of the child (at the
population cap, so it evicts one). The worker's unpickling is shown apart. Without
`--openevolve-python`, the environment is made once in /tmp/vpo-openevolve-venv (pip install
openevolve==0.4.0). OpenEvolve is slow at 100k, so it runs fewer repetitions there.

Prints a table and writes it to benchmarks/results/harness_overhead.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from harness.llm import Completion
    from harness.store import Store
    from problems.api import Evaluation

# harness is imported inside the functions that use it: this file also runs, with
# --openevolve-side, under OpenEvolve's environment, which has no SQLAlchemy.

RESULTS = Path(__file__).resolve().parent / "results" / "harness_overhead.md"
OPENEVOLVE_VERSION = "0.4.0"
OPENEVOLVE_VENV = Path(tempfile.gettempdir()) / "vpo-openevolve-venv"
OBJECTIVES = ("n26", "n32")
BEST_KNOWN = {"n26": 2.63598308, "n32": 2.9379445}
ISLANDS = 4
GROUP_SIZE = 4  # G rollouts per prompt
CANDIDATES = 3  # per rollout
DRAFTS = 3
MIGRATION_INTERVAL = 20  # the campaign default
INVALID_SHARE = 0.1
SEED = 0
TARGET_SECONDS = 0.005  # p50 per iteration at 100k programs
STAGES = ("refresh", "select", "load", "prompt", "parse", "record")


# -- synthetic programs, the same on both sides ------------------------------------------------

_HELPERS = (
    '''
def _shrink_to_fit(centers, radii):
    """Scale radii down until no pair overlaps and every circle is inside the square."""
    for _ in range({loops}):
        d = np.hypot(*(centers[:, None, :] - centers[None, :, :]).transpose(2, 0, 1))
        np.fill_diagonal(d, np.inf)
        worst = (radii[:, None] + radii[None, :] - d).max()
        if worst <= 0:
            break
        radii = radii * (1 - {step})
    radii = np.minimum(radii, np.minimum(centers, 1 - centers).min(axis=1))
    return radii
''',
    '''
def _jitter(centers, rng, scale={scale}):
    """Nudge the centres a little, staying inside the square."""
    moved = centers + rng.normal(0.0, scale, centers.shape)
    return np.clip(moved, {margin}, 1 - {margin})
''',
    '''
def _ring(n, radius={radius}, offset={offset}):
    """n points on a ring around the centre of the square."""
    angles = offset + 2 * np.pi * np.arange(n) / max(n, 1)
    return 0.5 + radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
''',
    '''
def _relax(centers, radii, iterations={loops}, rate={step}):
    """Push overlapping circles apart; a few rounds of a simple repulsion."""
    for _ in range(iterations):
        delta = centers[:, None, :] - centers[None, :, :]
        dist = np.linalg.norm(delta, axis=2) + np.eye(len(centers))
        push = np.clip(radii[:, None] + radii[None, :] - dist, 0, None)
        centers = centers + rate * (push[:, :, None] * delta / dist[:, :, None]).sum(axis=1)
        centers = np.clip(centers, radii[:, None], 1 - radii[:, None])
    return centers
''',
)

_BODY = '''\
import numpy as np

# variant {tag}
{helpers}

def construct_packing(n):
    """Rows of circles, {rows} per column at most, then shrunk until the packing is valid."""
    rng = np.random.default_rng({seed})
    k = int(np.ceil(np.sqrt(n))) + {extra}
    r = 0.5 / k
    cells = [(i, j) for i in range(k) for j in range(k)][:n]
    centers = np.array([[(2 * i + 1) * r, (2 * j + 1) * r] for i, j in cells])
    centers = centers + rng.uniform(-{scale}, {scale}, centers.shape)
    centers = np.clip(centers, r, 1 - r)
    radii = np.full(n, r * (1 - {margin}))
    return centers, radii
'''


def synthetic_program(rng: random.Random, tag: str) -> str:
    """A plausible circle-packing program of 1-2 KB; `tag` makes its code unique."""
    values = {
        "tag": tag,
        "seed": rng.randrange(10**6),
        "rows": rng.randint(4, 7),
        "extra": rng.randint(0, 2),
        "scale": f"{rng.uniform(1e-4, 1e-2):.5f}",
        "margin": f"{rng.uniform(1e-12, 1e-6):.3g}",
        "loops": rng.randint(10, 400),
        "step": f"{rng.uniform(1e-4, 1e-2):.5f}",
        "radius": f"{rng.uniform(0.2, 0.4):.4f}",
        "offset": f"{rng.uniform(0, 3.14):.4f}",
    }
    helpers = "".join(h.format(**values) for h in rng.sample(_HELPERS, rng.randint(1, 4)))
    return _BODY.format(helpers=helpers, **values)


def synthetic_scores(rng: random.Random) -> tuple[str, dict[str, float]]:
    """(status, scores in [0, 1]) as the scorer reports them; ~10% fail and score zeros."""
    if rng.random() < INVALID_SHARE:
        return rng.choice(("invalid", "invalid", "error", "timeout")), dict.fromkeys(
            OBJECTIVES, 0.0
        )
    # Below 1.0 (the best known) and continuous: ties would change which path OpenEvolve's
    # inspiration sampling takes.
    base = rng.uniform(0.3, 0.9)
    return "ok", {o: base + rng.uniform(-0.05, 0.05) for o in OBJECTIVES}


# -- our harness ---------------------------------------------------------------------------------


def build_campaign(path: Path, n: int) -> tuple[Store, int]:
    """A campaign of n programs: the seed through `add_program`, the rest by bulk insert."""
    from sqlalchemy import insert

    from harness.records import NewProgram, code_hash
    from harness.store import Store
    from harness.store.models import Program, Score
    from problems.circle_packing import SEED_PROGRAM

    store = Store.open(path)
    campaign_id = store.create_campaign("bench", "circle_packing", config={}, seed=SEED)
    seed_id = store.add_program(
        campaign_id,
        NewProgram(
            SEED_PROGRAM,
            "ok",
            dict.fromkeys(OBJECTIVES, 0.3),
            {o: 0.3 * BEST_KNOWN[o] for o in OBJECTIVES},
        ),
    )
    rng = random.Random(SEED)
    now = datetime.datetime.now(datetime.UTC)
    chunk = 5_000
    with store.engine.begin() as connection:
        for start in range(seed_id + 1, seed_id + n, chunk):
            programs, scores = [], []
            for program_id in range(start, min(start + chunk, seed_id + n)):
                code = synthetic_program(rng, f"p{program_id}")
                status, values = synthetic_scores(rng)
                error = None if status == "ok" else "circle 3 is not inside the unit square"
                programs.append(
                    {
                        "id": program_id,
                        "campaign_id": campaign_id,
                        "code": code,
                        "code_hash": code_hash(code),
                        "parent_id": rng.randrange(seed_id, program_id),
                        "island": program_id % ISLANDS,
                        "generation": rng.randint(1, 60),
                        "origin": "llm",
                        "status": status,
                        "error": error,
                        "eval_seconds": rng.uniform(0.2, 3.0),
                        "metrics": {"artifacts": _artifacts(status, error)},
                        "created_at": now,
                    }
                )
                scores.extend(
                    {
                        "program_id": program_id,
                        "objective": o,
                        "value": v,
                        "raw": v * BEST_KNOWN[o] if status == "ok" else None,
                    }
                    for o, v in values.items()
                )
            connection.execute(insert(Program), programs)
            connection.execute(insert(Score), scores)
    return store, campaign_id


def _artifacts(status: str, error: str | None) -> dict[str, Any]:
    stderr = "" if status == "ok" else f"Traceback (most recent call last):\n  ...\n{error}\n"
    return {
        key: {"seconds": 0.42, "stdout": "", "stderr": stderr, "warnings": []} for key in OBJECTIVES
    }


def canned_completions(parent_code: str, iteration: int) -> list[str]:
    """G completions as a model writes them: 6 new programs, 3 duplicates, 3 unparsed.

    Candidate 1 is a new full program in each; candidate 2 edits the parent (completions 0 and
    1 make the same edit, so do 2 and 3); candidate 3 is the parent again, truncated, missing,
    and a copy of candidate 1.
    """
    rng = random.Random(iteration)
    texts = []
    for g in range(GROUP_SIZE):
        full = synthetic_program(rng, f"i{iteration}g{g}")
        edit = (
            "<<<<<<< SEARCH\n"
            "    return centers, radii\n"
            "=======\n"
            f"    radii = radii * (1 - {1e-9 * (1 + iteration * 2 + g // 2):.3g})\n"
            "    return centers, radii\n"
            ">>>>>>> REPLACE\n"
        )
        third = {
            0: f"<candidate_3>\n```python\n{parent_code}```\n</candidate_3>\n",
            1: "<candidate_3>\n```python\nimport numpy as np\n\ndef construct_packing(n):\n",
            2: "",
            3: f"<candidate_3>\n```python\n{full}```\n</candidate_3>\n",
        }[g]
        texts.append(
            "The current program places circles on a grid and shrinks them. A denser start "
            "would help n32 more than n26; I will try a staggered layout, a smaller margin, "
            "and a ring for the outer circles.\n\n"
            f"<candidate_1>\n```python\n{full}```\n</candidate_1>\n\n"
            f"<candidate_2>\n{edit}</candidate_2>\n\n{third}"
        )
    return texts


def precomputed_evaluations(count: int) -> list[Evaluation]:
    """Evaluations to give new programs in turn, as the sandbox would report them."""
    from problems.api import Evaluation

    rng = random.Random(SEED + 1)
    evaluations = []
    for _ in range(count):
        status, scores = synthetic_scores(rng)
        error = None if status == "ok" else "circles 4 and 9 overlap by 1.2e-05"
        raw = {o: v * BEST_KNOWN[o] if status == "ok" else None for o, v in scores.items()}
        artifacts = _artifacts(status, error)
        evaluations.append(Evaluation(status, scores, raw, error, 0.8, artifacts))
    return evaluations


def generated(texts: list[str], prompt: list[dict[str, str]]) -> list[Completion]:
    """The completions as a generator returns them: chars / 4 token ids and logprobs."""
    from harness.llm import Completion

    prompt_tokens = tuple(range(sum(len(message["content"]) for message in prompt) // 4))
    return [
        Completion(
            text,
            tuple(range(1000, 1000 + len(text) // 4)),
            (-0.25,) * (len(text) // 4),
            "stop",
            prompt_tokens,
        )
        for text in texts
    ]


def measure_vpo(n: int, iterations: int, warmup: int, folder: Path) -> dict[str, Any]:
    """Per-stage seconds of `iterations` iterations on a fresh campaign of n programs."""
    from sqlalchemy import event

    from harness.config.settings import build
    from harness.evaluation.calls import Limits
    from harness.evolution.iteration import BatchKeys, SampledIteration, classify_group
    from harness.evolution.novelty import Novelty
    from harness.evolution.population import Population
    from harness.evolution.prompts import build_prompt
    from harness.evolution.recording import store_iteration
    from harness.evolution.run import CampaignRun, refresh_population
    from harness.evolution.selection import SelectionConfig, migrants, select, should_migrate
    from problems.circle_packing import make_problem

    problem = make_problem()
    started = time.perf_counter()
    store, campaign_id = build_campaign(folder / f"campaign-{n}.db", n)
    build_seconds = time.perf_counter() - started
    settings = {"islands": ISLANDS, "migration_interval": MIGRATION_INTERVAL, "drafts": DRAFTS}
    config = build({"candidates": CANDIDATES, "group_size": GROUP_SIZE, "seed": SEED, **settings})
    # As `generation.loop_settings` makes it (without a generator: no sampling to set).
    selection_config = SelectionConfig(
        islands=config.islands, migration_interval=config.migration_interval, drafts=DRAFTS
    )
    evaluations = itertools.cycle(precomputed_evaluations(1000))

    # What `campaign.prepare` loads once, at start or resume (the seed is stored already).
    started = time.perf_counter()
    run = CampaignRun(
        config,
        problem,
        store,
        campaign_id,
        None,  # no sandbox: the evaluations are precomputed
        Limits(),
        store.programs(campaign_id, origin="seed", limit=1)[0].id,
        list(OBJECTIVES),  # the synthetic programs score two of the problem's objectives
        Population(OBJECTIVES),
        set(store.code_hashes(campaign_id)),
        Novelty(problem.entry, problem.family, config.near_duplicate),
    )
    refresh_population(run)
    load_seconds = time.perf_counter() - started

    statements = [0]

    @event.listens_for(store.engine, "before_cursor_execute")
    def _count(*_: Any) -> None:
        statements[0] += 1

    samples: dict[str, list[float]] = {stage: [] for stage in STAGES}
    counts = dict.fromkeys(STAGES, 0)
    sizes = {"prompt chars": 0, "completion chars": 0, "new programs": 0}
    for iteration in range(warmup + iterations):
        rng = np.random.default_rng([SEED, iteration])
        marks = [(time.perf_counter(), statements[0])]  # (clock, SQL statements) at each step

        refresh_population(run)
        marks.append((time.perf_counter(), statements[0]))

        selection = select(run.population, iteration, rng, selection_config)
        moving = []
        if should_migrate(iteration, MIGRATION_INTERVAL):
            moving = migrants(run.population, ISLANDS, selection_config.migrants_per_island, rng)
        marks.append((time.perf_counter(), statements[0]))

        parent, *drafts = store.programs_by_ids([selection.parent_id, *selection.draft_ids])
        marks.append((time.perf_counter(), statements[0]))

        assert parent is not None and all(d is not None for d in drafts)
        prompt = build_prompt(problem, parent, drafts, CANDIDATES)
        marks.append((time.perf_counter(), statements[0]))

        texts = canned_completions(parent.code, iteration)  # the generator's part
        sampled = SampledIteration(
            iteration, selection, parent, prompt, generated(texts, prompt), moving
        )
        marks.append((time.perf_counter(), statements[0]))

        group = classify_group(
            texts, CANDIDATES, parent.code, run.seen, problem.entry, family=problem.family,
            memory=run.novelty, island=selection.island, batch=BatchKeys(),
        )  # fmt: skip
        evaluated = {digest: next(evaluations) for digest in group.new_code}
        marks.append((time.perf_counter(), statements[0]))

        store_iteration(run, sampled, group, evaluated)
        marks.append((time.perf_counter(), statements[0]))

        if iteration >= warmup:
            steps = list(itertools.pairwise(marks))
            del steps[4]  # writing the completions: generation, not on the clock
            for stage, ((t0, c0), (t1, c1)) in zip(STAGES, steps, strict=True):
                samples[stage].append(t1 - t0)
                counts[stage] += c1 - c0
            sizes["prompt chars"] += sum(len(message["content"]) for message in prompt)
            sizes["completion chars"] += sum(len(text) for text in texts) / GROUP_SIZE
            sizes["new programs"] += len(evaluated)
    final = store.summary(campaign_id).programs
    store.close()
    return {
        "n": n,
        "final_n": final,
        "build_seconds": build_seconds,
        "load_seconds": load_seconds,
        "samples": samples,
        "statements": {stage: count / iterations for stage, count in counts.items()},
        "sizes": {what: total / iterations for what, total in sizes.items()},
        "file_mb": (folder / f"campaign-{n}.db").stat().st_size / 2**20,
    }


# -- OpenEvolve, run under its own environment ----------------------------------------------------


def openevolve_side(sizes: list[int], seed: int) -> dict[str, Any]:
    """Seconds per iteration of OpenEvolve's main-process database work, at each size."""
    import logging
    import pickle
    from multiprocessing.reduction import ForkingPickler
    from types import SimpleNamespace

    import openevolve
    from openevolve.database import Program
    from openevolve.process_parallel import ProcessParallelController

    logging.disable(logging.WARNING)  # it logs every eviction; the log is not what we time
    results: dict[str, Any] = {"version": openevolve.__version__, "sizes": {}}
    for n in sizes:
        started = time.perf_counter()
        db = _filled_openevolve(n, seed)
        fill_seconds = time.perf_counter() - started
        # Sampling grows with N (seconds at 10k): fewer repetitions there, never fewer than 3.
        repetitions = max(3, min(30, 100_000 // n))
        rng = random.Random(seed + 7)
        rows: dict[str, list[float]] = {
            "sample": [],
            "snapshot": [],
            "pickle": [],
            "add": [],
            "worker_unpickle": [],
        }
        blob_mb = 0.0
        for repetition in range(repetitions + 1):  # the first warms the diversity cache
            island = repetition % ISLANDS
            t0 = time.perf_counter()
            parent, inspirations = db.sample_from_island(island_id=island, num_inspirations=2)
            t1 = time.perf_counter()
            snapshot = ProcessParallelController._create_database_snapshot(
                SimpleNamespace(database=db)
            )
            snapshot["sampling_island"] = island
            t2 = time.perf_counter()
            blob = bytes(ForkingPickler.dumps(snapshot))
            t3 = time.perf_counter()
            status, scores = synthetic_scores(rng)
            child = Program(
                id=_uuid(rng),
                code=synthetic_program(rng, f"child{repetition}"),
                parent_id=parent.id,
                generation=parent.generation + 1,
                metrics=_openevolve_metrics(status, scores),
            )
            t4 = time.perf_counter()
            db.add(child, iteration=n + repetition, target_island=island)
            t5 = time.perf_counter()
            received = pickle.loads(blob)
            rebuilt = {pid: Program(**fields) for pid, fields in received["programs"].items()}
            t6 = time.perf_counter()
            del snapshot, received, rebuilt
            if repetition == 0:
                blob_mb = len(blob) / 2**20
                continue
            for row, seconds in (
                ("sample", t1 - t0),
                ("snapshot", t2 - t1),
                ("pickle", t3 - t2),
                ("add", t5 - t4),
                ("worker_unpickle", t6 - t5),
            ):
                rows[row].append(seconds)
        results["sizes"][str(n)] = {
            "fill_seconds": fill_seconds,
            "repetitions": repetitions,
            "snapshot_mb": blob_mb,
            "held": len(db.programs),
            "samples": rows,
        }
        del db
    return results


def _openevolve_metrics(status: str, scores: dict[str, float]) -> dict[str, float]:
    # The shape OpenEvolve's circle-packing example returns: per-part values and combined_score.
    return {
        **scores,
        "validity": 1.0 if status == "ok" else 0.0,
        "combined_score": sum(scores.values()) / len(scores),
    }


def _filled_openevolve(n: int, seed: int) -> Any:
    """A ProgramDatabase holding n programs, in the state a long run leaves it."""
    from openevolve.config import DatabaseConfig
    from openevolve.database import Program, ProgramDatabase

    config = DatabaseConfig(
        population_size=n, archive_size=100, num_islands=ISLANDS, random_seed=seed
    )
    db = ProgramDatabase(config)
    rng = random.Random(seed)
    programs = []
    for i in range(n):
        status, scores = synthetic_scores(rng)
        program = Program(
            id=_uuid(rng),
            code=synthetic_program(rng, f"p{i}"),
            parent_id=programs[rng.randrange(i)].id if i else None,
            generation=rng.randint(1, 60),
            iteration_found=i,
            metrics=_openevolve_metrics(status, scores),
            metadata={"island": i % ISLANDS},
        )
        programs.append(program)
        db.programs[program.id] = program
        db.islands[i % ISLANDS].add(program.id)
    by_fitness = sorted(programs, key=lambda p: p.metrics["combined_score"], reverse=True)
    db.archive = {p.id for p in by_fitness[: config.archive_size]}
    db.best_program_id = by_fitness[0].id
    for island in range(ISLANDS):
        members = [p for p in by_fitness if p.metadata["island"] == island]
        db.island_best_programs[island] = members[0].id
        # MAP-Elites cells (complexity x diversity bins): the fittest program of each cell.
        for program in reversed(members):
            cell = f"{len(program.code) * db.feature_bins // 2100}-{rng.randrange(db.feature_bins)}"
            db.island_feature_maps[island][cell] = program.id
    lengths = [len(p.code) for p in programs]
    db.feature_stats = {
        "complexity": {"min": min(lengths), "max": max(lengths), "values": lengths[-1000:]},
    }
    # Built from the first programs of a run and kept; rebuilding it scans all N x 20.
    db.diversity_reference_set = [p.code for p in rng.sample(programs, 20)]
    db.last_iteration = n
    return db


def _uuid(rng: random.Random) -> str:
    import uuid

    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def openevolve_python(given: str | None) -> Path:
    """OpenEvolve's interpreter: the one given, else /tmp/vpo-openevolve-venv, made if missing."""
    if given:
        return Path(given)
    python = OPENEVOLVE_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {OPENEVOLVE_VENV} with openevolve=={OPENEVOLVE_VERSION} (once)")
        subprocess.run([sys.executable, "-m", "venv", str(OPENEVOLVE_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"openevolve=={OPENEVOLVE_VERSION}"],
            check=True,
        )
    return python


# -- report ------------------------------------------------------------------------------------


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def p90(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1] if len(samples) > 1 else samples[0]


def ms(seconds: float) -> str:
    if seconds >= 10:
        return f"{seconds * 1e3:,.0f}"
    return f"{seconds * 1e3:.2f}" if seconds < 0.1 else f"{seconds * 1e3:.1f}"


def vpo_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| programs (start -> end) | "
        + " | ".join(STAGES)
        + " | total p50 | total p90 | generator waits p50 |",
        "|---|" + "---:|" * (len(STAGES) + 3),
    ]
    for run in runs:
        samples = run["samples"]
        totals = vpo_totals(samples)
        cells = [ms(p50(samples[s])) for s in STAGES]
        lines.append(
            f"| {run['n']:,} -> {run['final_n']:,} | "
            + " | ".join(cells)
            + f" | **{ms(p50(totals))}** | {ms(p90(totals))} | {ms(p50(waits(samples)))} |"
        )
    return "\n".join(lines)


def vpo_p90_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| programs | " + " | ".join(STAGES) + " | load at start | build (setup) | file MB |",
        "|---|" + "---:|" * (len(STAGES) + 3),
    ]
    for run in runs:
        samples = run["samples"]
        lines.append(
            f"| {run['n']:,} | "
            + " | ".join(ms(p90(samples[s])) for s in STAGES)
            + f" | {ms(run['load_seconds'])} | {run['build_seconds']:.1f} s"
            + f" | {run['file_mb']:.0f} |"
        )
    return "\n".join(lines)


def statements_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| programs | "
        + " | ".join(STAGES)
        + " | ms per statement, load | ms per statement, record |",
        "|---|" + "---:|" * (len(STAGES) + 2),
    ]
    for run in runs:
        count = run["statements"]
        per = [
            ms(p50(run["samples"][stage]) / count[stage]) if count[stage] else "-"
            for stage in ("load", "record")
        ]
        lines.append(
            f"| {run['n']:,} | "
            + " | ".join(f"{count[stage]:.1f}" for stage in STAGES)
            + f" | {per[0]} | {per[1]} |"
        )
    return "\n".join(lines)


def sizes_line(run: dict[str, Any]) -> str:
    sizes = run["sizes"]
    return (
        f"prompt {sizes['prompt chars']:,.0f} chars, each completion "
        f"{sizes['completion chars']:,.0f} chars, {sizes['new programs']:.1f} new programs"
    )


def shares(run: dict[str, Any]) -> str:
    """Each stage's part of the total p50, largest first."""
    medians = {stage: p50(run["samples"][stage]) for stage in STAGES}
    total = sum(medians.values())
    ranked = sorted(medians.items(), key=lambda item: -item[1])
    return ", ".join(f"{stage} {100 * value / total:.0f}%" for stage, value in ranked)


def openevolve_totals(samples: dict[str, list[float]]) -> list[float]:
    """Main-process seconds per iteration: everything but the worker's unpickling."""
    parts = (samples[row] for row in ("sample", "snapshot", "pickle", "add"))
    return [sum(step) for step in zip(*parts, strict=True)]


def waits(samples: dict[str, list[float]]) -> list[float]:
    """The stages on the generating thread: `campaign.evolve` parses and records on its
    evaluation thread, overlapped with the next generation."""
    parts = (samples[stage] for stage in ("refresh", "select", "load", "prompt"))
    return [sum(step) for step in zip(*parts, strict=True)]


def vpo_totals(samples: dict[str, list[float]]) -> list[float]:
    return [sum(step) for step in zip(*(samples[stage] for stage in STAGES), strict=True)]


def openevolve_table(side: dict[str, Any]) -> str:
    lines = [
        "| programs | reps | sample p50 (min) | snapshot p50 | pickle p50 (MB) | add p50 "
        "| main total p50 | worker unpickle p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, run in side["sizes"].items():
        s = run["samples"]
        lines.append(
            f"| {int(n):,} | {run['repetitions']} "
            f"| {ms(p50(s['sample']))} ({ms(min(s['sample']))}) | {ms(p50(s['snapshot']))} "
            f"| {ms(p50(s['pickle']))} ({run['snapshot_mb']:.0f}) | {ms(p50(s['add']))} "
            f"| **{ms(p50(openevolve_totals(s)))}** | {ms(p50(s['worker_unpickle']))} |"
        )
    return "\n".join(lines)


def side_by_side(runs: list[dict[str, Any]], side: dict[str, Any] | None) -> str:
    lines = [
        "| programs | vpo select+load | OpenEvolve sample | ratio | vpo total "
        "| OpenEvolve main total | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        s = run["samples"]
        ours = p50(vpo_totals(s))
        pick = p50([a + b for a, b in zip(s["select"], s["load"], strict=True)])
        theirs = (side or {}).get("sizes", {}).get(str(run["n"]))
        if theirs is None:
            lines.append(f"| {run['n']:,} | {ms(pick)} | - | - | {ms(ours)} | - | - |")
            continue
        sample = p50(theirs["samples"]["sample"])
        total = p50(openevolve_totals(theirs["samples"]))
        lines.append(
            f"| {run['n']:,} | {ms(pick)} | {ms(sample)} | {sample / pick:,.0f}x "
            f"| {ms(ours)} | {ms(total)} | {total / ours:,.0f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--iterations", type=int, default=200, help="timed iterations per size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed iterations first")
    parser.add_argument(
        "--openevolve-python",
        help="python of an environment with openevolve installed "
        f"(default: {OPENEVOLVE_VENV}, created with openevolve=={OPENEVOLVE_VERSION} if missing)",
    )
    parser.add_argument("--no-openevolve", action="store_true", help="measure our harness only")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the table goes")
    parser.add_argument("--openevolve-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.openevolve_side:
        print(json.dumps(openevolve_side(args.sizes, SEED)))
        return

    runs = []
    with tempfile.TemporaryDirectory(prefix="vpo-overhead-") as folder:
        for n in args.sizes:
            run = measure_vpo(n, args.iterations, args.warmup, Path(folder))
            runs.append(run)
            print(f"vpo {n:,}: built in {run['build_seconds']:.1f} s, measured", flush=True)

    side = None
    if not args.no_openevolve:
        python = openevolve_python(args.openevolve_python)
        started = time.perf_counter()
        done = subprocess.run(
            [str(python), __file__, "--openevolve-side", "--sizes", *map(str, args.sizes)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            sys.exit(f"the OpenEvolve side failed:\n{done.stderr[-3000:]}")
        side = json.loads(done.stdout.strip().splitlines()[-1])
        side["python"] = str(python)
        print(f"OpenEvolve side took {time.perf_counter() - started:.0f} s", flush=True)

    report = render(args, runs, side)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"written to {args.out}")


def render(
    args: argparse.Namespace, runs: list[dict[str, Any]], side: dict[str, Any] | None
) -> str:
    import sqlite3

    import sqlalchemy

    command = "python " + " ".join(
        shlex.quote(a) for a in ["benchmarks/harness_overhead.py", *sys.argv[1:]]
    )
    largest = max(runs, key=lambda run: run["n"])
    waited = ms(p50(waits(largest["samples"])))
    verdict = "meets" if p50(vpo_totals(largest["samples"])) <= TARGET_SECONDS else "misses"
    if side is None:
        theirs = "Not measured (--no-openevolve)."
    else:
        fills = ", ".join(
            f"{int(n):,}: {run['fill_seconds']:.1f} s" for n, run in side["sizes"].items()
        )
        theirs = f"""{openevolve_table(side)}

OpenEvolve {side["version"]} under `{side["python"]}`. sample: `sample_from_island` (parent and
2 inspirations); snapshot: `_create_database_snapshot`; pickle: what `executor.submit` does to
it (MB shipped per task); add: `add` of the child at the population cap; worker unpickle:
`pickle.loads` and the `Program` objects the worker rebuilds (in the worker, not the main
process). One untimed repetition first. Filling the database (setup): {fills}."""
    return f"""# Harness overhead per iteration

- date: {datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {platform.machine()},
  Linux {platform.release()}, Python {platform.python_version()}, SQLAlchemy
  {sqlalchemy.__version__}, SQLite {sqlite3.sqlite_version}, numpy {np.__version__}
- command: `{command}`
- shared and noisy machine: compare ratios, read medians; every row is from this one run
- per iteration: G = {GROUP_SIZE} rollouts x m = {CANDIDATES} candidates, {DRAFTS} drafts,
  {ISLANDS} islands, migration every {MIGRATION_INTERVAL}; {args.iterations} timed iterations
  after {args.warmup} untimed; generation and evaluation are not on the clock
- mean per iteration: {sizes_line(largest)}; each completion is stored with
  chars / 4 token ids and logprobs, the group with chars / 4 prompt token ids

## vpo-evolve, milliseconds per iteration

Target: p50 <= {TARGET_SECONDS * 1e3:.0f} ms at 100k programs. At {largest["n"]:,} this run
{verdict} it; the stages' parts of the total p50 there: {shares(largest)}.
The generator waits for refresh, select, load and prompt only ({waited} ms p50 there):
`campaign.evolve` parses and records on its evaluation thread while the next prompt generates.

p50 per stage:

{vpo_table(runs)}

p90 per stage, and the one-time costs (load at start: all vectors and code hashes, what
`campaign.prepare` reads on start or resume; build: writing the synthetic campaign):

{vpo_p90_table(runs)}

SQL statements per iteration by stage (select, prompt and parse run none), and what each
costs at p50:

{statements_table(runs)}

## OpenEvolve's main process per iteration, milliseconds

{theirs}

## Side by side, p50 milliseconds

{side_by_side(runs, side)}
"""


if __name__ == "__main__":
    main()
