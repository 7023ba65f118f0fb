"""How fast the dashboard answers on a synthetic 100k-program campaign, beside pandas.

    python benchmarks/dashboard_speed.py [--programs 100000] [--objectives 3] [--repeats 15]
                                         [--db PATH] [--postgres URL]

Builds (or reuses, with --db) a SQLite campaign of N programs with realistic rows: 1-2 KB of code
each, three objectives, rollout groups of 8 trajectories with 2 candidates and ~300 token ids,
two drafts per group, programs spread over three days. With --postgres URL the same campaign is
copied into that (empty) PostgreSQL database and measured too.

Timed, in process through FastAPI's test client (routing and JSON included), medians:
- first read: what `vpo ui` does once before it serves (every campaign read in aggregate queries);
- main page data (`/api/overview`), with nothing new and after 100 new programs were stored;
- the top table by mean score, by one objective, by weights the server has not seen (random
  weights each time) and by the same weights again (`/api/top`);
- a program page: the program with its diff (`/api/programs/ID`), its lineage and its story
  (the prompt, its rollout and the group's other rollouts), random ids;
- the genealogy page (`/api/tree`: the default 1,500 of the programs drawn, laid out, with each
  objective's best path), again after 100 new programs.

Beside them, in the same run, what a user would otherwise do in a notebook: pandas `read_sql` of
the score and program tables, then pivot, sort and cummax for the same numbers (for the
genealogy, only reading every program's parent and scores: no choice of programs, no layout).

Prints a table and writes it to benchmarks/results/dashboard_speed.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_overhead import synthetic_program  # noqa: E402
from reporting import publish  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dashboard_speed.md"
MAIN_TARGET_MS = 300.0
PROGRAM_TARGET_MS = 100.0
GROUP, CANDIDATES, DRAFTS = 8, 2, 2
INVALID_SHARE = 0.1


def build(path: Path, n: int, objectives: list[str], seed: int = 0) -> None:
    """A campaign of n programs written by bulk inserts with explicit ids."""
    from sqlalchemy import insert

    from harness.records import code_hash
    from harness.store import Store
    from harness.store.models import GroupDraft, Program, RolloutGroup, Score, Trajectory

    rng = random.Random(seed)
    store = Store.open(path)
    campaign = store.create_campaign("bench", "synthetic", config={}, seed=seed)
    start = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    span = 3 * 24 * 3600
    per_group = GROUP * CANDIDATES
    with store.engine.begin() as connection:
        # program -> trajectory -> group -> program is a cycle: check the keys at commit.
        connection.exec_driver_sql("PRAGMA defer_foreign_keys = ON")
        programs, scores, groups, trajectories, drafts = [], [], [], [], []

        def flush() -> None:
            for table, rows in (
                (Program, programs),
                (RolloutGroup, groups),
                (Trajectory, trajectories),
                (GroupDraft, drafts),
                (Score, scores),
            ):
                if rows:
                    connection.execute(insert(table), rows)
                rows.clear()

        quality = 0.3
        generation_of = [0, 0]  # by id; the seed (id 1) is generation 0
        for pid in range(1, n + 1):
            at = start + datetime.timedelta(seconds=span * pid / n)
            index = pid - 2  # the seed is program 1; LLM programs fill groups from 2 on
            trajectory = None
            if pid > 1:
                group_id, place = divmod(index, per_group)  # place in its group
                group_id += 1
                position, candidate = divmod(place, CANDIDATES)
                trajectory = (group_id - 1) * GROUP + position + 1
                if place == 0:
                    groups.append(
                        {
                            "id": group_id,
                            "campaign_id": campaign,
                            "iteration": group_id - 1,
                            "island": group_id % 4,
                            "prompt": [{"role": "user", "content": "improve the program"}],
                            "prompt_token_ids": list(range(200)),
                            "parent_program_id": rng.randrange(1, pid),
                            "created_at": at,
                        }
                    )
                    drafts += [
                        {"group_id": group_id, "position": k, "program_id": rng.randrange(1, pid)}
                        for k in range(DRAFTS)
                    ]
                if candidate == 0:
                    tokens = rng.randint(150, 450)
                    trajectories.append(
                        {
                            "id": trajectory,
                            "group_id": group_id,
                            "position": position,
                            "completion": "<candidate_1>...</candidate_1>",
                            "token_ids": [rng.randrange(49152) for _ in range(tokens)],
                            "num_tokens": tokens,
                            "finish_reason": "stop",
                            "parse_status": "ok",
                            "candidates": [
                                {"index": c + 1, "outcome": "new", "program_id": pid + c}
                                for c in range(CANDIDATES)
                            ],
                            "created_at": at,
                        }
                    )
            valid = pid == 1 or rng.random() > INVALID_SHARE
            # Quality climbs towards the best known (1.0) and levels off; few programs reach it.
            quality = min(0.9, quality + rng.expovariate(1.0) * 3e-5)
            code = synthetic_program(rng, f"p{pid}")
            parent = None if pid == 1 else rng.randrange(max(1, pid - 5000), pid)
            if pid > 1:
                generation_of.append(generation_of[parent] + 1)
            programs.append(
                {
                    "id": pid,
                    "campaign_id": campaign,
                    "code": code,
                    "code_hash": code_hash(code),
                    "parent_id": parent,
                    "island": pid % 4,
                    "generation": generation_of[pid],
                    "origin": "seed" if pid == 1 else "llm",
                    "status": "ok" if valid else "error",
                    "error": None if valid else "circle 3 is not inside the unit square",
                    "eval_seconds": rng.uniform(0.2, 3.0),
                    "trajectory_id": trajectory,
                    "candidate_index": None if trajectory is None else index % CANDIDATES + 1,
                    "metrics": {"stdout": "", "seconds": 0.4},
                    "created_at": at,
                }
            )
            for name in objectives:
                value = max(0.0, min(1.0, rng.gauss(quality, 0.03))) if valid else 0.0
                scores.append(
                    {"program_id": pid, "objective": name, "value": value, "raw": value * 2.6}
                )
            if len(programs) >= 5000:
                flush()
        flush()
    store.close()


def copy_to_postgres(source: Path, url: str) -> None:
    """The same rows in PostgreSQL, table by table in id order, sequences moved past them."""
    from sqlalchemy import func, insert, select, text

    from harness.store import Store
    from harness.store.models import Base

    Store.open(url).close()  # creates the tables
    with Store.open(source) as src, Store.open(url) as dst:
        with src.engine.connect() as reading, dst.engine.begin() as writing:
            # The key cycle again: a superuser copy skips the key triggers (rows are as checked
            # in SQLite).
            writing.execute(text("SET LOCAL session_replication_role = replica"))
            for table in Base.metadata.sorted_tables:
                if table.name == "meta":
                    continue
                rows = reading.execute(select(table)).mappings()
                batch = []
                for row in rows:
                    batch.append(dict(row))
                    if len(batch) == 5000:
                        writing.execute(insert(table), batch)
                        batch = []
                if batch:
                    writing.execute(insert(table), batch)
                if "id" in table.c:
                    top = writing.scalar(select(func.max(table.c.id))) or 0
                    writing.execute(
                        text(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), :v)"),
                        {"v": max(top, 1)},
                    )
            writing.execute(text("ANALYZE"))


def timed(function: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def measure(target: str, repeats: int, seed: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from harness.observation.web import create_app
    from harness.records import Lineage, NewProgram
    from harness.store import Store

    reader = Store.open(target, read_only=True)
    app = create_app(reader)
    client = TestClient(app)

    def get(path: str) -> Any:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:200])
        return response.json()

    started = time.perf_counter()
    app.state.dashboard.warm()
    app.state.trees.warm()
    results = {"first read (once, at start)": (time.perf_counter() - started) * 1000}
    overview = get("/api/overview")
    objectives = overview["objectives"]
    results["main page data"] = timed(lambda: get("/api/overview"), repeats)

    writer = Store.open(target)
    rng = random.Random(seed)

    def grow_then_get(path: str) -> float:
        """100 new programs under random earlier ones, then one timed request for `path`."""
        for _ in range(100):
            writer.add_program(
                1,
                NewProgram(
                    synthetic_program(rng, f"new{rng.random()}"),
                    "ok",
                    {name: rng.random() for name in objectives},
                    {},
                ),
                Lineage(origin="llm", parent_id=rng.randrange(1, overview["last_program_id"])),
            )
        return timed(lambda: get(path), 1)

    results["main page data, 100 programs new"] = statistics.median(
        grow_then_get("/api/overview") for _ in range(max(3, repeats // 3))
    )
    results["top table, mean score"] = timed(lambda: get("/api/top"), repeats)
    results[f"top table, by {objectives[0]}"] = timed(
        lambda: get(f"/api/top?objective={objectives[0]}"), repeats
    )
    weightings = iter(
        ",".join(str(rng.randint(1, 9)) for _ in objectives) for _ in range(10 * repeats)
    )
    results["top table, weights asked first"] = timed(
        lambda: get(f"/api/top?weights={next(weightings)}"), repeats
    )
    weights = ",".join(str(k + 1) for k in range(len(objectives)))
    get(f"/api/top?weights={weights}")
    results["top table, same weights again"] = timed(
        lambda: get(f"/api/top?weights={weights}"), repeats
    )
    last = overview["last_program_id"]
    ids = iter(random.Random(seed + 1).sample(range(2, last), 4 * repeats))
    get(f"/api/programs/{next(ids)}/lineage")  # imports networkx once
    results["program page (code, scores, diff)"] = timed(
        lambda: get(f"/api/programs/{next(ids)}"), repeats
    )
    results["program lineage"] = timed(lambda: get(f"/api/programs/{next(ids)}/lineage"), repeats)
    results["program story (prompt, rollout, group)"] = timed(
        lambda: get(f"/api/programs/{next(ids)}/story"), repeats
    )
    get("/api/tree")
    results["genealogy page"] = timed(lambda: get("/api/tree"), repeats)
    results["genealogy page, 100 programs new"] = statistics.median(
        grow_then_get("/api/tree") for _ in range(max(3, repeats // 3))
    )
    writer.close()
    reader.close()
    return results


def pandas_side(target: str, objectives_count: int, repeats: int) -> dict[str, float]:
    """The notebook a user would otherwise write: read the tables, pivot, rank."""
    import pandas as pd

    from harness.store import Store

    store = Store.open(target, read_only=True)
    engine = store.engine

    def load() -> Any:
        with engine.connect() as connection:
            scores = pd.read_sql("SELECT program_id, objective, value FROM score", connection)
            programs = pd.read_sql("SELECT id, status, code_hash FROM program", connection)
        wide = scores.pivot(index="program_id", columns="objective", values="value")
        return wide.join(programs.set_index("id")), list(wide.columns)

    def main_page() -> Any:
        table, names = load()
        valid = table[table.status == "ok"]
        best = {name: valid[name].cummax().drop_duplicates() for name in names}
        x, y = names[0], names[1]
        ordered = valid.sort_values([x, y], ascending=False)
        front = ordered[ordered[y] > ordered[y].cummax().shift(fill_value=-1.0)]
        return best, front, table.status.value_counts()

    def top_mean() -> Any:
        table, names = load()
        valid = table[table.status == "ok"]
        return valid.assign(mean=valid[names].mean(axis=1)).nlargest(50, "mean")

    def genealogy() -> Any:
        with engine.connect() as connection:
            tree = pd.read_sql(
                "SELECT id, parent_id, island, generation, status FROM program", connection
            )
            scores = pd.read_sql("SELECT program_id, objective, value FROM score", connection)
        wide = scores.pivot(index="program_id", columns="objective", values="value")
        return tree.set_index("id").join(wide)

    results = {
        "main page data": timed(main_page, max(3, repeats // 3)),
        "genealogy page": timed(genealogy, max(3, repeats // 3)),
        "top table, mean score": timed(top_mean, max(3, repeats // 3)),
    }
    store.close()
    return results


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=100_000)
    parser.add_argument("--objectives", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--db", default=None, help="reuse (or build once) this SQLite file")
    parser.add_argument(
        "--postgres", default=None, help="an empty PostgreSQL database URL (a superuser's)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import tempfile

    import pandas
    import sqlalchemy

    objectives = [f"objective_{k + 1}" for k in range(args.objectives)]
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "dashboard.db"
    if not path.exists():
        started = time.perf_counter()
        build(path, args.programs, objectives, args.seed)
        print(f"built {path} in {time.perf_counter() - started:.0f} s", flush=True)
    engines = {"SQLite": str(path)}
    if args.postgres:
        started = time.perf_counter()
        copy_to_postgres(path, args.postgres)
        print(f"copied to PostgreSQL in {time.perf_counter() - started:.0f} s", flush=True)
        engines["PostgreSQL"] = args.postgres

    ours: dict[str, dict[str, float]] = {}
    theirs: dict[str, dict[str, float]] = {}
    for engine, target in engines.items():
        # Each engine's copy is measured on its own; the SQLite file grows by the programs the
        # "100 programs new" row adds, so pandas reads it first.
        theirs[engine] = pandas_side(target, args.objectives, args.repeats)
        ours[engine] = measure(target, args.repeats, args.seed)
        print(f"{engine}: {ours[engine]}", flush=True)

    header = "| request | " + " | ".join(f"{e} vpo ui ms | {e} pandas ms" for e in engines) + " |"
    lines = [header, "|---|" + "---:|---:|" * len(engines)]
    for request in ours["SQLite"]:
        cells = []
        for engine in engines:
            cells += [ms(ours[engine][request]), ms(theirs[engine].get(request))]
        lines.append(f"| {request} | " + " | ".join(cells) + " |")
    main_rows = [
        r for r in ours["SQLite"] if r.startswith(("main page", "top table", "genealogy page"))
    ]
    main_ms = max(o[r] for o in ours.values() for r in main_rows)
    program_ms = max(
        o["program page (code, scores, diff)"]
        + o["program lineage"]
        + o["program story (prompt, rollout, group)"]
        for o in ours.values()
    )
    verdict = (
        f"Targets: main page data, every top table and the genealogy page under "
        f"{MAIN_TARGET_MS:.0f} ms (slowest here {main_ms:.0f} ms: "
        f"{'met' if main_ms < MAIN_TARGET_MS else 'missed'}); a program page, its three requests "
        f"together, under {PROGRAM_TARGET_MS:.0f} ms (slowest here "
        f"{program_ms:.0f} ms: {'met' if program_ms < PROGRAM_TARGET_MS else 'missed'}). The "
        "first read happens once, before `vpo ui` prints its address."
    )
    command = " ".join(["python", "benchmarks/dashboard_speed.py", *sys.argv[1:]])
    report = "\n".join(
        [
            "# Dashboard speed on a synthetic campaign",
            "",
            f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
            f"- machine: {platform.machine()}, Python {platform.python_version()}, "
            f"SQLAlchemy {sqlalchemy.__version__}, pandas {pandas.__version__}",
            f"- command: `{command}`",
            f"- campaign: {args.programs:,} programs, {args.objectives} objectives, "
            f"{INVALID_SHARE:.0%} invalid, groups of {GROUP} rollouts x {CANDIDATES} candidates",
            f"- medians of {args.repeats} requests through FastAPI's test client; pandas: "
            "`read_sql` of the score and program tables, then pivot and rank, as a notebook would",
            "",
            *lines,
            "",
            verdict,
            "",
        ]
    )
    publish(RESULTS, report)


if __name__ == "__main__":
    main()
