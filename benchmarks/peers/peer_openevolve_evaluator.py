"""OpenEvolve's evaluation file for benchmarks/peers.py; it runs in OpenEvolve's environment.

OpenEvolve calls `evaluate(program_path)` in its worker processes. The program is scored by the
project's scorer, peer_score.py under the project's interpreter, in a subprocess (OpenEvolve's
environment has none of the project's packages); its metrics are OpenEvolve's, and the reason a
program failed goes to OpenEvolve as an artifact, which its prompts show the model. The settings
come from the environment the benchmark starts OpenEvolve in, which its workers inherit.
"""

import json
import os
import subprocess

from openevolve.evaluation_result import EvaluationResult

# Below OpenEvolve's own evaluator timeout (the benchmark sets 90 s), so this one fires first.
SCORER_TIMEOUT_S = 80


def evaluate(program_path):
    command = [
        os.environ["VPO_PEER_PYTHON"],
        os.environ["VPO_PEER_SCORER"],
        "--program_path",
        program_path,
        "--problem",
        os.environ["VPO_PEER_PROBLEM"],
        "--log",
        os.environ["VPO_PEER_SCORE_LOG"],
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SCORER_TIMEOUT_S)
        said = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return EvaluationResult({"combined_score": 0.0}, {"error": f"the scorer failed: {exc}"})
    artifacts = {"error": said["reason"]} if said.get("reason") else {}
    return EvaluationResult(said["metrics"], artifacts)
