"""Repeats rejected before the sandbox: a candidate with a stored program's syntax tree, or
(with `near_duplicate` below 1) text that close to a recent program of its island, is stored
as a lazy duplicate with its reason, never evaluated, and counted (`vpo status`, the progress
line)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_server import chat_server

from harness.config.errors import UserError
from harness.config.settings import build
from harness.evolution.iteration import BatchKeys, classify_group
from harness.evolution.loop import run_campaign
from harness.evolution.novelty import Novelty
from harness.observation.progress import Progress
from harness.records import code_hash, tree_key
from harness.store import Store
from problems.circle_packing import CirclePacking

SEED = CirclePacking().seed_program
ENTRY = "construct_packing"
# The seed with a comment, a blank line and its docstring gone: the same syntax tree.
REWORDED = SEED.replace('    """Equal circles', '    # a grid\n\n    """Equal circles').replace(
    "    k = int(", "    # side\n    k = int("
)
# The seed with one constant moved: a different program, and a very similar text.
NUDGED = SEED.replace("r = 0.5 / k", "r = 0.49 / k")
OTHER = "import numpy as np\n\n\ndef construct_packing(n, container='square'):\n    return []\n"


def tagged(*codes: str) -> str:
    return "".join(
        f"<candidate_{i}>\n```python\n{code}```\n</candidate_{i}>\n"
        for i, code in enumerate(codes, 1)
    )


def test_tree_keys_ignore_comments_layout_and_docstrings_only() -> None:
    assert tree_key(REWORDED, ENTRY) == tree_key(SEED, ENTRY) is not None
    assert tree_key(REWORDED) == tree_key(SEED) is not None
    assert tree_key(NUDGED) != tree_key(SEED)
    assert tree_key("def f(:\n") is None and tree_key(OTHER, "no_such_entry") is None


def test_a_candidate_with_a_stored_programs_tree_is_a_lazy_duplicate_of_it() -> None:
    """Not only the parent's: any stored program's tree. A tree a candidate before it in the
    batch brought makes a plain duplicate."""
    memory = Novelty(ENTRY)
    memory.add(SEED, code_hash(SEED), island=0)
    batch = BatchKeys()
    parent = OTHER  # the stored seed is not the parent here
    group = classify_group(
        [tagged(REWORDED, NUDGED)], 2, parent, set(), ENTRY, memory=memory, batch=batch
    )
    first = classify_group(
        [tagged(NUDGED.replace("0.49", "0.48"), "# x\n" + NUDGED.replace("0.49", "0.48"))],
        2, parent, set(), ENTRY, memory=memory, batch=batch,
    )  # fmt: skip
    (reworded, nudged), (fresh, again) = group.rollouts[0].candidates, first.rollouts[0].candidates
    assert (reworded.outcome, reworded.lazy, reworded.code_hash) == (
        "duplicate", True, code_hash(SEED),
    )  # fmt: skip
    assert reworded.reason and "the same syntax tree as program" in reworded.reason
    assert (nudged.outcome, fresh.outcome) == ("new", "new")  # near_duplicate is off (1)
    assert (again.outcome, again.lazy, again.code_hash) == ("duplicate", False, fresh.code_hash)
    assert again.reason == "the same syntax tree as a candidate before it"


def test_a_near_duplicate_text_is_rejected_only_in_its_island_and_below_the_threshold() -> None:
    memory = Novelty(ENTRY, near=0.95)
    memory.add(SEED, code_hash(SEED), island=0)

    def classified(code: str, island: int, near: Novelty = memory) -> Any:
        group = classify_group([tagged(code)], 1, OTHER, set(), ENTRY, memory=near, island=island)
        return group.rollouts[0].candidates[0]

    near = classified(NUDGED, 0)
    assert (near.outcome, near.lazy, near.near, near.code_hash) == (
        "duplicate", True, True, code_hash(SEED),
    )  # fmt: skip
    assert near.reason.startswith(f"a near-duplicate of program {code_hash(SEED)[:12]} of island 0")
    assert "(near_duplicate 0.95)" in near.reason
    assert classified(NUDGED, 1).outcome == "new"  # island 1 holds nothing like it
    assert classified(OTHER.replace("[]", "[1]"), 0).outcome == "new"  # far from the seed
    strict = Novelty(ENTRY, near=0.9999)
    strict.add(SEED, code_hash(SEED), island=0)
    assert classified(NUDGED, 0, strict).outcome == "new"


def test_an_island_remembers_its_newest_window_of_programs() -> None:
    memory = Novelty(near=0.95, window=2)
    memory.add(SEED, "a" * 64, island=0)
    memory.add(OTHER, "b" * 64, island=0)
    assert memory.nearest(NUDGED, 0) is not None
    memory.add(OTHER + "\nx = 1\n", "c" * 64, island=0)  # pushes the seed out
    assert memory.nearest(NUDGED, 0) is None


def test_near_duplicate_must_be_in_0_1() -> None:
    assert build({"near_duplicate": 0.97}).near_duplicate == 0.97
    for bad in (0, -0.5, 1.5, "high", float("nan")):
        with pytest.raises(UserError) as info:
            build({"near_duplicate": bad})
        assert "near_duplicate" in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def repeating_server() -> Iterator[str]:
    """Every completion offers the seed reworded and the seed with one constant nudged."""

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        message = {"role": "assistant", "content": tagged(REWORDED, NUDGED)}
        choices = [
            {"index": i, "message": message, "finish_reason": "stop"}
            for i in range(body.get("n", 1))
        ]
        return {"choices": choices}

    with chat_server(answer) as url:
        yield url


def test_a_campaign_never_evaluates_repeats_and_counts_them(
    repeating_server: str, tmp_path: Path
) -> None:
    settings = {
        "backend": "openai", "base_url": repeating_server, "api_key_env": "", "model": "m",
        "iterations": 3, "group_size": 2, "candidates": 2, "concurrency": 1, "islands": 1,
        "near_duplicate": 0.95,
    }  # fmt: skip
    lines: list[str] = []

    def progress(total: int, state: Progress) -> None:
        lines.append(state.line(state.iterations, total))

    db = tmp_path / "c.db"
    with Store.open(db) as store:
        campaign_id = run_campaign(build(settings), store, CirclePacking(), on_progress=progress)
        rejected = store.rejections(campaign_id)
        assert [p.origin for p in store.programs(campaign_id)] == ["seed"]  # nothing evaluated
    assert rejected["candidates"] == 12
    assert rejected["near"] == 6 and rejected["lazy"] == 6
    assert "not evaluated 12 repeats (6 near)" in lines[-1]
    status = subprocess.run(
        [sys.executable, "-m", "harness.cli", "status", "--db", str(db)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "near 6" in status.stdout and "lazy 6" in status.stdout
