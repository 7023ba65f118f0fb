"""The maze answer problem: instances built as the VPO paper describes (checked against brute
force), routes scored strictly, completions parsed like any model output, the evaluation
metrics against their definitions, and `vpo train --problem maze` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from problems.api import Infeasible
from problems.maze import MOVES, SIZE, Maze, MazeProblem, best_routes, walk
from problems.registry import load as load_problem

PROBLEM = MazeProblem()
INSTANCES = [PROBLEM.instance(split, i) for split in ("train", "test") for i in range(15)]


def shortest_walk(maze: Maze, stops: frozenset) -> int:
    """Brute force: breadth-first search over (cell, stops collected) from start to exit."""
    stops = sorted(stops)
    full = (1 << len(stops)) - 1
    first = (maze.start, 0)
    seen = {first: 0}
    queue = deque([first])
    while queue:
        cell, got = queue.popleft()
        if cell == maze.exit and got == full:
            return seen[(cell, got)]
        for dr, dc in MOVES.values():
            nxt = (cell[0] + dr, cell[1] + dc)
            if not maze.open(cell, nxt):
                continue
            mask = got | (1 << stops.index(nxt) if nxt in stops else 0)
            if (nxt, mask) not in seen:
                seen[(nxt, mask)] = seen[(cell, got)] + 1
                queue.append((nxt, mask))
    raise AssertionError("the exit cannot be reached with every stop")


def test_instances_follow_the_papers_recipe() -> None:
    for maze in INSTANCES:
        corners = {(0, 0), (0, SIZE - 1), (SIZE - 1, 0), (SIZE - 1, SIZE - 1)}
        assert maze.start in corners and maze.exit in corners
        assert maze.start[0] != maze.exit[0] and maze.start[1] != maze.exit[1]  # opposite
        others = corners - {maze.start, maze.exit}
        for items in (maze.gold, maze.diamonds):
            assert 3 <= len(items) <= 5
            near = [
                c for c in others if all(max(abs(a - c[0]), abs(b - c[1])) <= 2 for a, b in items)
            ]
            assert len(near) == 1  # one zone per corner
        assert 3 <= len(maze.lava) <= 5
        assert all(0 < r < SIZE - 1 and 0 < c < SIZE - 1 for r, c in maze.lava)
        assert not maze.lava & (maze.gold | maze.diamonds)
        # A spanning tree (80 passages) plus 18 to 28 knocked-down walls, every cell reachable.
        assert 80 + 18 <= len(maze.passages) // 2 <= 80 + 28
        seen, queue = {maze.start}, deque([maze.start])
        while queue:
            cell = queue.popleft()
            for dr, dc in MOVES.values():
                nxt = (cell[0] + dr, cell[1] + dc)
                if maze.open(cell, nxt) and nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        assert len(seen) == SIZE * SIZE
        # The budget: the longer corner detour plus 7; never enough for both corners.
        gold, diamonds = shortest_walk(maze, maze.gold), shortest_walk(maze, maze.diamonds)
        assert maze.budget == max(gold, diamonds) + 7
        assert shortest_walk(maze, maze.gold | maze.diamonds) > maze.budget


def test_instances_are_the_same_everywhere_and_the_splits_differ() -> None:
    again = MazeProblem.__new__(MazeProblem)
    from problems.maze import generate

    assert generate(42, 3) == PROBLEM.instance("train", 3)
    assert again.instance("train", 3).render() == PROBLEM.instance("train", 3).render()
    assert PROBLEM.instance("train", 0).render() != PROBLEM.instance("test", 0).render()
    with pytest.raises(ValueError, match="split must be one of"):
        PROBLEM.instance("validation", 0)


def test_the_best_routes_score_one_corner_each() -> None:
    for maze in INSTANCES:
        gold_route, diamond_route = best_routes(maze)
        gold = walk(maze, gold_route)
        diamonds = walk(maze, diamond_route)
        assert gold["completion"] == diamonds["completion"] == 1.0
        assert gold["gold"] == 1.0 and diamonds["diamond"] == 1.0
        assert gold["diamond"] < 1.0 and diamonds["gold"] < 1.0  # the designed conflict
        assert len(gold_route) <= maze.budget and len(diamond_route) <= maze.budget


def _maze() -> Maze:
    return PROBLEM.instance("test", 0)


def test_a_route_must_reach_the_exit_within_the_budget_and_walls_stop_it() -> None:
    maze = _maze()
    route = best_routes(maze)[0]
    with pytest.raises(Infeasible, match="not the exit"):
        walk(maze, route[:-1])
    wall = next(
        name
        for name, (dr, dc) in MOVES.items()
        if not maze.open(maze.start, (maze.start[0] + dr, maze.start[1] + dc))
    )
    with pytest.raises(Infeasible, match="runs into a wall"):
        walk(maze, [wall, *route])
    # Walking back and forth burns the budget: the same route, padded, is too long.
    there = next(
        name
        for name, (dr, dc) in MOVES.items()
        if maze.open(maze.start, (maze.start[0] + dr, maze.start[1] + dc))
    )
    back = {"UP": "DOWN", "DOWN": "UP", "LEFT": "RIGHT", "RIGHT": "LEFT"}[there]
    padding = [there, back] * ((maze.budget - len(route)) // 2 + 1)
    with pytest.raises(Infeasible, match="budget"):
        walk(maze, padding + route)
    # Moves after the exit are ignored.
    assert walk(maze, [*route, wall, wall]) == walk(maze, route)


def test_lava_counts_each_tile_once() -> None:
    maze = _maze()
    for route in best_routes(maze):
        cells, here = set(), maze.start
        for move in route:
            here = (here[0] + MOVES[move][0], here[1] + MOVES[move][1])
            cells.add(here)
        expected = 1 - len(cells & maze.lava) / len(maze.lava)
        assert walk(maze, route)["avoid_lava"] == pytest.approx(expected)


def test_completions_are_parsed_deduplicated_and_never_crash() -> None:
    maze = _maze()
    gold, diamonds = (" ".join(r) for r in best_routes(maze))
    text = (
        f"Thinking first.\n<route_1>{gold}</route_1>\n<route_2>{diamonds.lower()}</route_2>"
        f"\n<route_3>{gold.replace(' ', ', ')}</route_3>"
    )
    values, reasons = PROBLEM.score_completion(maze, text, 3)
    assert values[0]["gold"] == 1.0 and values[1]["diamond"] == 1.0
    assert values[2] is None and "repeats" in reasons[2]
    hostile = [
        "",
        "<route_1>UP UP</route_2>",
        "<route_1>" + "UP " * 100_000 + "</route_1>",
        "<route_1><route_1>LEFT</route_1></route_1>",
        "<route_1>NORTH EAST</route_1><route_2></route_2><route_3>\x00\ud800</route_3>",
        "<route_1>UP" + "\n" * 1000,
    ]
    for text in hostile:
        values, reasons = PROBLEM.score_completion(maze, text, 3)
        assert len(values) == len(reasons) == 3
        for value, reason in zip(values, reasons, strict=True):
            assert value is None or set(value.values()) <= {0.0}
            assert reason and "\n" not in reason


def vpo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True
    )


def test_vpo_train_problem_maze_end_to_end(tiny_model: str, tmp_path: Path) -> None:
    out = tmp_path / "maze-policy"
    run = vpo(
        "train",
        "--problem",
        "maze",
        "--model",
        tiny_model,
        "--out",
        str(out),
        "--steps",
        "2",
        "--groups-per-step",
        "2",
        "--group-size",
        "4",
        "--max-tokens",
        "48",
        "--eval-prompts",
        "2",
        "--eval-generations",
        "2",
        "--eval-every",
        "1",
        "--lr",
        "1e-3",
    )
    assert run.returncode == 0, run.stderr
    assert "eval before training: best@1" in run.stdout and "step 2 |" in run.stdout
    report = json.loads((out / "vpo-train.json").read_text())
    assert [e["step"] for e in report["evals"]] == [0, 1, 2]
    assert all(e["pool"] == 6 and set(e["pass_at_k"]) == {"1", "3", "5"} for e in report["evals"])
    assert len(report["steps"]) == 2 and all(np.isfinite(s["loss"]) for s in report["steps"])
    assert (out / "config.json").exists()  # a model folder any backend loads


@pytest.mark.parametrize(
    "args,words",
    [
        (("--problem", "circle_packing"), "circle_packing is a program problem"),
        (("--problem", "maze", "--db", "x.db"), "either --db"),
        ((), "either --db"),
        (("--problem", "maze", "--name", "x"), "does not go with --problem"),
        (("--problem", "maze", "--temperature", "0"), "expected a positive number"),
        (("--problem", "nonesuch"), "unknown problem 'nonesuch'"),
    ],
)
def test_vpo_train_problem_errors_are_one_line(
    args: tuple[str, ...], words: str, tmp_path: Path
) -> None:
    run = vpo("train", "--out", str(tmp_path / "o"), *args)
    assert run.returncode != 0
    assert words in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_maze_is_listed_as_an_answer_problem_and_cannot_be_evolved(tmp_path: Path) -> None:
    listed = json.loads(vpo("problems", "--json").stdout)
    kinds = {p["name"]: p["kind"] for p in listed}
    assert kinds["maze"] == "answer" and kinds["cap_set"] == "program"
    maze = next(p for p in listed if p["name"] == "maze")
    assert [o["name"] for o in maze["objectives"]] == [
        "completion",
        "gold",
        "diamond",
        "avoid_lava",
    ]
    run = vpo("run", "maze", "--db", str(tmp_path / "m.db"))
    assert run.returncode == 2 and "answer problem" in run.stderr
    assert not (tmp_path / "m.db").exists()
    assert isinstance(load_problem("maze"), MazeProblem)
