"""Score one program file with the project's sandbox and trusted scorer, for a peer harness.

    .venv/bin/python benchmarks/peers/peer_score.py --program_path FILE --problem NAME
        --log FILE [--results_dir DIR]

OpenEvolve's evaluation file (peer_openevolve_evaluator.py, in OpenEvolve's own environment) runs
this in a subprocess and reads the metrics it prints as its last line. ShinkaEvolve runs it as
its evaluation program (its `LocalJobConfig.python_executable` is the project's interpreter),
with --results_dir, where it writes metrics.json and correct.json as Shinka reads them. Either
way the program is scored by `harness.evaluation.evaluate.evaluate`, the function `vpo eval` and
every campaign score with, and what it said is appended to --log: one JSON line when the scoring
starts and one when it ends, with the scores and the code. The benchmark reads a peer's results
from that log, not from what the peer recorded.

The metrics a peer optimises: `combined_score`, the mean of the normalised objective scores (1 =
the best known value of each; the scalar OpenEvolve itself falls back to, the average of the
metrics), and each objective by name, which both peers show the model beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MAX_LOGGED_CODE = 20_000  # characters of a program kept in the log


def combined(scores: dict[str, float], objectives: list[str]) -> float:
    return sum(scores.get(name, 0.0) for name in objectives) / len(objectives)


def metrics_of(scores: dict[str, float], objectives: list[str]) -> dict[str, float]:
    """What a peer is given: the mean as combined_score, and every objective (0 where failed)."""
    values = {name: float(scores.get(name, 0.0)) for name in objectives}
    return {"combined_score": combined(values, objectives), **values}


def append(log: Path, entry: dict[str, Any]) -> None:
    """One line, in one write: several evaluations of a run append to the same file at once."""
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(descriptor)


def score_file(program: Path, problem_name: str, log: Path) -> dict[str, Any]:
    """Score `program` in the sandbox; what the log's end line says."""
    from harness.evaluation.evaluate import evaluate
    from harness.evaluation.sandbox import Sandbox
    from problems.registry import load

    problem = load(problem_name)
    objectives = [o.name for o in problem.objectives]
    key = uuid.uuid4().hex
    append(log, {"event": "start", "id": key, "t": time.time()})
    try:
        code = program.read_text(encoding="utf-8", errors="replace")
        with Sandbox(workers=1) as sandbox:
            evaluation = evaluate(problem, code, sandbox)
        status, scores, reason = evaluation.status, dict(evaluation.scores), evaluation.reason
    except Exception as exc:  # the harness's own failure: say it, never leave a start open
        code, status, scores, reason = "", "error", {}, f"{type(exc).__name__}: {exc}"
    entry = {
        "event": "end",
        "id": key,
        "t": time.time(),
        "status": status,
        "scores": metrics_of(scores, objectives) if status == "ok" else metrics_of({}, objectives),
        "reason": reason,
        "sha": hashlib.sha256(code.encode()).hexdigest()[:16],
        "code": code[:MAX_LOGGED_CODE],
    }
    append(log, entry)
    return entry


def write_shinka_results(results_dir: Path, entry: dict[str, Any]) -> None:
    """metrics.json and correct.json, as shinka.core.wrap_eval.save_json_results writes them."""
    results_dir.mkdir(parents=True, exist_ok=True)
    scores = dict(entry["scores"])
    metrics = {
        "combined_score": scores.pop("combined_score"),
        "public": scores,
        "private": {},
        "text_feedback": entry["reason"] or "",
    }
    correct = {"correct": entry["status"] == "ok", "error": entry["reason"]}
    (results_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (results_dir / "correct.json").write_text(json.dumps(correct, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program_path", type=Path, required=True)
    parser.add_argument("--problem", required=True, help="e.g. equation_discovery:oscillator1")
    parser.add_argument("--log", type=Path, required=True, help="the run's scoring log (JSONL)")
    parser.add_argument("--results_dir", type=Path, help="ShinkaEvolve's results folder")
    args = parser.parse_args()
    entry = score_file(args.program_path, args.problem, args.log)
    if args.results_dir is not None:
        write_shinka_results(args.results_dir, entry)
    said = {"status": entry["status"], "metrics": entry["scores"], "reason": entry["reason"]}
    print(json.dumps(said))


if __name__ == "__main__":
    main()
