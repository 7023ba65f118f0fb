"""benchmarks/loop_speed.py: its campaign reads a real loop's stored stages and requests, and its
report states each target from the numbers it was given (the engine replay itself needs vLLM
and minutes: the benchmark's own run is its test)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from conftest import Replay

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import loop_speed  # noqa: E402


def test_a_campaign_run_is_measured_from_its_stages(tmp_path: Path) -> None:
    answer = "<candidate_1>\nparams[0] * x\n</candidate_1>\n"
    generator = Replay([answer] * 16)
    generator.model = "replay"
    run = loop_speed.campaign(generator, tmp_path, "replay-c2", 2, tokens=30)
    # Two groups of G = 4 rollouts of 3 tokens a batch: the budget of 30 stops it after two.
    assert run.tokens == 2 * 2 * 4 * 3 and run.wall > 0
    assert len(run.requests) == 4 and all(len(group) == 4 for group in run.requests)
    assert all(ids == [4, 5] and length == 3 for group in run.requests for ids, length in group)
    assert "generating" in run.split["loop"] and "evaluating" in run.split["beside"]


def _run(label: str, c: int, speed: float, engine: float | None, trained: bool = False):
    run = loop_speed.Run(label, c, trained, int(speed * 100), 100.0, {"loop": {}, "beside": {},
                         "line": "generating 90%"}, engine=engine)  # fmt: skip
    return run


@pytest.mark.parametrize(
    "campaign,engine,trained,verdicts",
    [
        (90.0, 100.0, 60.0, ["met", "met", "met"]),
        (70.0, 100.0, 30.0, ["missed", "met", "missed"]),
    ],
)
def test_the_report_states_each_target(
    campaign: float, engine: float, trained: float, verdicts: list[str]
) -> None:
    default = loop_speed.DEFAULT_CONCURRENCY["vllm"]
    result = {
        "model": "m",
        "load": 10.0,
        "runs": [
            _run("m-c1", 1, 30.0, 40.0),
            _run(f"m-c{default}", default, campaign, engine),
            _run(f"m-c{default}-vpo", default, trained, None, trained=True),
        ],
        "sweep": {"prefix caching on": {1: 40.0, default: engine, 16: engine * 1.1}},
        "swept": 16,
    }
    args = argparse.Namespace(tokens=6000)
    text = loop_speed.report([result], args)
    found = [line.rsplit(": ", 1)[1] for line in text.splitlines() if "(target >=" in line]
    assert found == verdicts
    assert f"| untrained | {default} | {int(campaign * 100)} |" in text
