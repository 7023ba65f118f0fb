"""How benchmarks/peers.py starts each harness, and where each keeps the program it calls best.

Every harness gets the problem's own statement (`problem.description`) and seed program, talks
to the model through the run's proxy (peer_proxy.py) and is scored by the project's scorer
(peer_score.py). Beyond that each runs with its own documented configuration:

- OpenEvolve 0.4.0: `openevolve-run` with the settings of its LLM-SR example
  (examples/symbolic_regression/data_api.py `create_config`: population 70, archive 30, 4
  islands, elite ratio 0.3, exploitation 0.6, 4 top programs in the prompt, template
  stochasticity, diff-based evolution, no cascade, 4 parallel evaluations, evaluator timeout
  90 s), one model instead of its two (there is one), and a 1,200 s request timeout instead of
  60 s: a 0.5B model on a 2-core CPU may take minutes for one answer. `openevolve-full` is
  the same with `diff_based_evolution: false` (each answer a whole program), OpenEvolve's
  documented alternative: the 0.5B model wrote no SEARCH/REPLACE diff OpenEvolve could apply.
- ShinkaEvolve 0.0.7: its Python API (peer_shinka_main.py) with examples/circle_packing's
  shinka_small.yaml (2 islands, archive 40, patch types diff/full/cross at 0.6/0.3/0.1, weighted
  parent selection, UCB1 model selection, 5 evaluation and 5 proposal jobs, which Shinka caps to
  the CPU count itself), one local model, and no embedding model or novelty judge: the
  documented ones are OpenAI's and a served chat model has no embeddings.
- vpo-evolve: `vpo run` with examples/demo.toml (`make demo`'s equation-discovery campaign:
  compact candidates, G = 4, m = 3, two drafts, a LoRA step of VPO after every 2 groups), held
  at 2 iterations in flight and the paper's absolute reward as when the peers were run, the
  openai backend; `vpo` without training (--train-every 0), `vpo-train` with VPO in the loop.

Each peer has a virtual environment of its own under /tmp, made on first use (pip, with torch
pinned to the project's should a dependency ask for it); the project's is never touched.
"""

from __future__ import annotations

import ast
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from peer_proxy import Sampling

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCORER = HERE / "peer_score.py"
TORCH_PIN = "torch==2.13.0"  # the project's torch: a peer's dependency never installs another
MAX_ITERATIONS = 100_000  # a cap that never binds: the token budget ends every run
OPENEVOLVE_TIMEOUT_S = 1200
SCORE_TIME = "00:02:00"  # Shinka's limit on one evaluation job (the scorer's own is 30 s)
VPO_CONFIG = ROOT / "examples" / "demo.toml"


@dataclass(frozen=True)
class Peer:
    name: str
    distribution: str
    version: str
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


TMP = Path(tempfile.gettempdir())
PEERS = {
    "openevolve": Peer("openevolve", "openevolve", "0.4.0", TMP / "vpo-openevolve-venv"),
    "shinka": Peer("shinka", "shinka-evolve", "0.0.7", TMP / "vpo-shinka-venv"),
}
PEERS["openevolve-full"] = PEERS["openevolve"]  # one installation, another setting


class PeerInstallError(Exception):
    """A peer could not be installed; the message is one line for the user."""


def installed_version(python: Path, distribution: str) -> str | None:
    probe = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def peer_python(peer: Peer, say: Callable[[str], None] = print) -> Path:
    """The interpreter of `peer`'s environment, made (or brought to the pinned version) first."""
    if peer.python.exists() and installed_version(peer.python, peer.distribution) == peer.version:
        return peer.python
    requirement = f"{peer.distribution}=={peer.version}"
    say(f"installing {requirement} into {peer.venv} (once; pip)")
    if not peer.python.exists():
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(peer.venv)], capture_output=True, text=True
        )
        if made.returncode != 0:
            raise PeerInstallError(f"could not create {peer.venv}: {last_line(made.stderr)}")
    constraints = peer.venv / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    command = [str(peer.python), "-m", "pip", "install", "-q", "-c", str(constraints)]
    done = subprocess.run([*command, requirement], capture_output=True, text=True)
    if done.returncode != 0 or installed_version(peer.python, peer.distribution) != peer.version:
        raise PeerInstallError(
            f"pip could not install {requirement} into {peer.venv}: {last_line(done.stderr)}"
        )
    return peer.python


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def marked_seed(code: str, entry: str) -> str:
    """The seed program with its `entry` function between EVOLVE-BLOCK markers, the region both
    peers let the model change (the imports stay outside it)."""
    lines = code.splitlines()
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            last = node.end_lineno or node.lineno
            marked = [*lines[:first], "# EVOLVE-BLOCK-START", *lines[first:last]]
            return "\n".join([*marked, "# EVOLVE-BLOCK-END", *lines[last:]]) + "\n"
    raise ValueError(f"the seed program defines no function {entry!r}")


@dataclass(frozen=True)
class Launch:
    """One harness run as a process: what to start, and how it stops once the budget is spent:
    `graceful` (OpenEvolve) first gets SIGTERM alone, on which it saves its best program;
    one that `stops_itself` (vpo, at its own --token-budget, the proxy's count) is waited for."""

    command: list[str]
    env: dict[str, str]
    cwd: Path
    graceful: bool = False
    stops_itself: bool = False


def openevolve_launch(
    python: Path, description: str, seed_code: str, problem: str, seed: int, url: str,
    model: str, sampling: Sampling, folder: Path, diffs: bool = True,
) -> Launch:  # fmt: skip
    """`diffs`: answers are SEARCH/REPLACE diffs of the parent (the example's setting), else
    whole programs."""
    initial = folder / "initial_program.py"
    initial.write_text(seed_code)
    settings = {
        "max_iterations": MAX_ITERATIONS,
        "checkpoint_interval": 10,
        "log_level": "INFO",
        "random_seed": seed,
        "llm": {
            "primary_model": model,
            "primary_model_weight": 1.0,
            "api_base": url,
            "api_key": "local",
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "timeout": OPENEVOLVE_TIMEOUT_S,
            "retries": 3,
            "retry_delay": 5,
        },  # fmt: skip
        "prompt": {
            "system_message": description,
            "num_top_programs": 4,
            "use_template_stochasticity": True,
        },
        "database": {
            "population_size": 70,
            "archive_size": 30,
            "num_islands": 4,
            "elite_selection_ratio": 0.3,
            "exploitation_ratio": 0.6,
            "random_seed": seed,
        },  # fmt: skip
        "evaluator": {
            "timeout": 90,
            "cascade_evaluation": False,
            "cascade_thresholds": [1.0],
            "parallel_evaluations": 4,
            "use_llm_feedback": False,
        },  # fmt: skip
        "diff_based_evolution": diffs,
    }
    config = folder / "config.yaml"
    config.write_text(json.dumps(settings, indent=1))  # JSON is YAML to OpenEvolve's loader
    command = [
        str(python.parent / "openevolve-run"), str(initial),
        str(HERE / "peer_openevolve_evaluator.py"), "--config", str(config),
        "--output", str(folder / "openevolve"), "--iterations", str(MAX_ITERATIONS),
    ]  # fmt: skip
    env = os.environ | {
        "VPO_PEER_PYTHON": sys.executable,
        "VPO_PEER_SCORER": str(SCORER),
        "VPO_PEER_PROBLEM": problem,
        "VPO_PEER_SCORE_LOG": str(folder / "scores.jsonl"),
    }
    return Launch(command, env, folder, graceful=True)


def shinka_settings(
    description: str, initial: Path, problem: str, seed: int, url: str, model: str,
    sampling: Sampling, folder: Path,
) -> dict:  # fmt: skip
    """examples/circle_packing/shinka_small.yaml, with the run's model, statement and scorer."""
    database = {
        "num_islands": 2, "archive_size": 40, "elite_selection_ratio": 0.3,
        "num_archive_inspirations": 1, "num_top_k_inspirations": 1, "migration_interval": 10,
        "migration_rate": 0.1, "island_elitism": True, "enforce_island_separation": True,
        "parent_selection_strategy": "weighted", "parent_selection_lambda": 10,
        "archive_selection_strategy": "crowding", "island_selection_strategy": "equal",
        "archive_criteria": {"combined_score": 1.0, "loc": -0.3},
        "enable_dynamic_islands": False, "stagnation_threshold": 10,
        "island_spawn_strategy": "best", "island_spawn_subtree_size": 2,
    }  # fmt: skip
    evolution = {
        "task_sys_msg": description, "patch_types": ["diff", "full", "cross"],
        "patch_type_probs": [0.6, 0.3, 0.1], "num_generations": MAX_ITERATIONS,
        "max_api_costs": 20.0, "max_patch_resamples": 3, "max_patch_attempts": 1,
        "max_novelty_attempts": 1, "job_type": "local", "language": "python",
        "llm_models": [f"local/{model}@{url}"],
        "llm_kwargs": {"temperatures": [sampling.temperature], "max_tokens": sampling.max_tokens},
        "enable_controlled_oversubscription": False, "proposal_target_mode": "adaptive",
        "proposal_target_min_samples": 8, "proposal_target_ratio_cap": 1.75,
        "proposal_buffer_max": 6, "proposal_target_hard_cap": 26,
        "proposal_target_ewma_alpha": 0.25, "meta_rec_interval": None, "embedding_model": None,
        "novelty_llm_models": None, "init_program_path": str(initial),
        "llm_dynamic_selection": "ucb1",
        "llm_dynamic_selection_kwargs": {"exploration_coef": 1.0, "cost_aware_coef": 0.5},
        "results_dir": str(folder / "shinka"), "evolve_prompts": False,
    }  # fmt: skip
    job = {
        "eval_program_path": str(SCORER),
        "python_executable": sys.executable,
        "time": SCORE_TIME,
        "extra_cmd_args": {"problem": problem, "log": str(folder / "scores.jsonl")},
    }
    return {
        "seed": seed, "max_evaluation_jobs": 5, "max_proposal_jobs": 5, "max_db_workers": 4,
        "db_config": database, "evo_config": evolution, "job_config": job,
    }  # fmt: skip


def shinka_launch(
    python: Path, description: str, seed_code: str, problem: str, seed: int, url: str,
    model: str, sampling: Sampling, folder: Path,
) -> Launch:  # fmt: skip
    initial = folder / "initial.py"
    initial.write_text(seed_code)
    settings = shinka_settings(description, initial, problem, seed, url, model, sampling, folder)
    path = folder / "shinka_settings.json"
    path.write_text(json.dumps(settings, indent=1))
    env = os.environ | {"LOCAL_OPENAI_API_KEY": "local", "SHINKA_PRICING_MODE": "offline"}
    return Launch([str(python), str(HERE / "peer_shinka_main.py"), str(path)], env, folder)


def vpo_launch(
    harness: str, problem: str, seed: int, url: str, model: str, sampling: Sampling,
    budget: int, folder: Path,
) -> Launch:  # fmt: skip
    """`vpo run` on make demo's settings, stopping itself at the budget (as the proxy would)."""
    command = [
        sys.executable, "-m", "harness.cli", "run", problem, "--config", str(VPO_CONFIG),
        "--db", str(folder / "vpo.db"), "--seed", str(seed),
        "--iterations", str(MAX_ITERATIONS), "--token-budget", str(budget),
        "--backend", "openai", "--base-url", url, "--api-key-env", "", "--model", model,
        "--temperature", str(sampling.temperature), "--top-p", str(sampling.top_p),
        "--max-tokens", str(sampling.max_tokens),
    ]  # fmt: skip
    # The sampling and reward the committed peers runs had: the demo's settings moved since.
    command += ["--concurrency", "2", "--reward-reference", "none", "--slot-cost", "0"]
    if harness == "vpo":
        command += ["--train-every", "0"]
    else:  # a group of 4 answers of up to 1,024 tokens: without it the step's activations took
        # 15.8 GB beside the server's 6 and the kernel killed the run (demo answers stop at 192)
        command += ["--gradient-checkpointing", "on"]
    return Launch(command, dict(os.environ), ROOT, stops_itself=True)


def openevolve_best(folder: Path) -> str | None:
    """best/best_program.py, written when it stops; else its latest checkpoint's."""
    output = folder / "openevolve"
    best = output / "best" / "best_program.py"
    if best.exists():
        return best.read_text()
    checkpoints = sorted(
        (output / "checkpoints").glob("checkpoint_*/best_program.py"),
        key=lambda p: int(p.parent.name.rsplit("_", 1)[-1]),
    )
    return checkpoints[-1].read_text() if checkpoints else None


def shinka_best(folder: Path) -> str | None:
    """The program Shinka tracks as best (its `best_program_id`), else its correct program of
    the highest combined_score, as `ProgramDatabase.get_best_program` picks it."""
    path = folder / "shinka" / "programs.sqlite"
    if not path.exists():
        return None
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        row = db.execute(
            "SELECT value FROM metadata_store WHERE key = 'best_program_id'"
        ).fetchone()
        if row and row[0]:
            found = db.execute(
                "SELECT code FROM programs WHERE id = ? AND correct = 1", (row[0],)
            ).fetchone()
            if found:
                return found[0]
        found = db.execute(
            "SELECT code FROM programs WHERE correct = 1 ORDER BY combined_score DESC LIMIT 1"
        ).fetchone()
    return found[0] if found else None


def vpo_best(folder: Path) -> str | None:
    """The valid program of the highest mean score: the scalar the peers are given."""
    from harness.store import Store

    with Store.open(folder / "vpo.db", read_only=True) as store:
        campaign_id = store.campaigns()[0].id
        objectives = store.objectives(campaign_id)
        best, code = -1.0, None
        for program in store.iter_programs(campaign_id):
            mean = sum(program.scores.get(o, 0.0) for o in objectives) / len(objectives)
            if program.status == "ok" and mean > best:
                best, code = mean, program.code
    return code
