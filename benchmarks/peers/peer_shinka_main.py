"""ShinkaEvolve's run for benchmarks/peers.py; it runs in ShinkaEvolve's environment.

    /tmp/vpo-shinka-venv/bin/python peer_shinka_main.py SETTINGS.json

ShinkaEvolve's documented Python API, as its examples/circle_packing/run_evo.py drives it: an
EvolutionConfig, a LocalJobConfig and a DatabaseConfig, built here from the JSON the benchmark
wrote (peer_harnesses.shinka_settings), given to ShinkaEvolveRunner. Shinka 0.0.7 has no seed
setting, so the run's seed seeds Python's and NumPy's global generators, which its sampling of
parents, inspirations, patch types and temperatures draws from.
"""

import json
import random
import sys
from pathlib import Path

import numpy as np
from shinka.core import EvolutionConfig, ShinkaEvolveRunner
from shinka.database import DatabaseConfig
from shinka.launch import LocalJobConfig


def main(path: str) -> None:
    settings = json.loads(Path(path).read_text())
    random.seed(settings["seed"])
    np.random.seed(settings["seed"])
    runner = ShinkaEvolveRunner(
        evo_config=EvolutionConfig(**settings["evo_config"]),
        job_config=LocalJobConfig(**settings["job_config"]),
        db_config=DatabaseConfig(**settings["db_config"]),
        max_evaluation_jobs=settings["max_evaluation_jobs"],
        max_proposal_jobs=settings["max_proposal_jobs"],
        max_db_workers=settings["max_db_workers"],
        verbose=True,
    )
    runner.run()


if __name__ == "__main__":
    main(sys.argv[1])
