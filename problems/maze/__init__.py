"""Maze navigation with a conflicting reward vector: the VPO paper's designed-conflict task.

Each instance is a 9 x 9 maze of cells (randomised Prim, then 18 to 28 more walls knocked
down so that there are cycles). Start and exit sit on opposite corners, a zone of 3 to 5 gold
items and a zone of 3 to 5 diamonds in the two other corners (within two cells of the corner),
and 3 to 5 lava cells inside the maze. The step budget is the shorter of the best route that
collects every gold item and the best that collects every diamond, whichever is longer, plus 7:
one corner's detour fits, and instances are kept only when collecting both never fits. The
answer is a move list, not a program: the reward vector is (completion, gold fraction, diamond
fraction, lava avoidance), all zero unless the route reaches the exit within the budget.

From the paper (Bahlous-Boldi et al., arXiv 2605.22817) and its authors' release as summarised
in the project's reference notes: the 9 x 9 Prim maze with 18 to 28 extra cycles, the corner
layout, the zone sizes and radius, the 3 to 5 lava tiles, the budget rule and the filter, the four
components and the gate on completion, `<route_i>` tags holding only UP/DOWN/LEFT/RIGHT, the
deduplication by identical move list, and the seeds 42 (training) and 4242 (test). Our own
choices where the notes are silent: cells with walls between them (not wall tiles); a radius
measured as the larger of the row and column distances; a move into a wall makes the route
invalid (all zero) rather than a step in place; moves after the exit is reached are ignored; and
no centre "bonus" tile (the release draws one that has no effect on the reward, which we leave
out rather than advertise).
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

import numpy as np

from problems.api import AnswerProblem, Infeasible, Objective

SIZE = 9
SEEDS = {"train": 42, "test": 4242}
MOVES = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
SOURCE = "VPO maze task (Bahlous-Boldi et al., arXiv 2605.22817); 1 is the whole part"

Cell = tuple[int, int]


@dataclass(frozen=True)
class Maze:
    """One instance: open passages between neighbouring cells, and what lies where."""

    seed: int
    index: int
    passages: frozenset[tuple[Cell, Cell]]  # each open passage in both directions
    start: Cell
    exit: Cell
    gold: frozenset[Cell]
    diamonds: frozenset[Cell]
    lava: frozenset[Cell]
    budget: int

    def open(self, a: Cell, b: Cell) -> bool:
        return (a, b) in self.passages

    def render(self) -> str:
        """The maze as text: `+---+` walls, one letter per cell."""
        marks = {self.start: "S", self.exit: "E"}
        marks.update({c: "G" for c in self.gold})
        marks.update({c: "D" for c in self.diamonds})
        marks.update({c: "L" for c in self.lava})
        lines = ["+" + "---+" * SIZE]
        for r in range(SIZE):
            row = "|"
            below = "+"
            for c in range(SIZE):
                row += f" {marks.get((r, c), '.')} "
                row += " " if c + 1 < SIZE and self.open((r, c), (r, c + 1)) else "|"
                below += "   +" if r + 1 < SIZE and self.open((r, c), (r + 1, c)) else "---+"
            lines += [row, below]
        return "\n".join(lines)


def walk(maze: Maze, moves: Sequence[str]) -> dict[str, float]:
    """The reward vector of a move list; Infeasible when it cannot be walked."""
    position = maze.start
    gold: set[Cell] = set()
    diamonds: set[Cell] = set()
    lava: set[Cell] = set()
    for step, move in enumerate(moves[: maze.budget], start=1):
        dr, dc = MOVES[move]
        target = (position[0] + dr, position[1] + dc)
        if not maze.open(position, target):
            raise Infeasible(
                f"move {step} ({move}) from row {position[0]} column {position[1]} runs into a wall"
            )
        position = target
        if position in maze.gold:
            gold.add(position)
        if position in maze.diamonds:
            diamonds.add(position)
        if position in maze.lava:
            lava.add(position)
        if position == maze.exit:
            return {
                "completion": 1.0,
                "gold": len(gold) / len(maze.gold),
                "diamond": len(diamonds) / len(maze.diamonds),
                "avoid_lava": 1.0 - len(lava) / len(maze.lava),
            }
    if len(moves) > maze.budget:
        raise Infeasible(f"the exit is not reached within the budget of {maze.budget} moves")
    raise Infeasible(f"the route ends at row {position[0]} column {position[1]}, not the exit")


def parse_moves(body: str) -> list[str]:
    """The moves in a route's text: UP, DOWN, LEFT, RIGHT separated by spaces or commas."""
    words = [w for w in re.split(r"[\s,;]+", body.strip()) if w]
    unknown = [w for w in words if w.upper() not in MOVES]
    if unknown:
        raise Infeasible(f"a route holds only UP, DOWN, LEFT, RIGHT, not {unknown[0][:20]!r}")
    if not words:
        raise Infeasible("the route is empty")
    return [w.upper() for w in words]


# Generation ----------------------------------------------------------------------------------


def _neighbours(cell: Cell) -> list[Cell]:
    r, c = cell
    return [
        (r + dr, c + dc) for dr, dc in MOVES.values() if 0 <= r + dr < SIZE and 0 <= c + dc < SIZE
    ]


def _prim(rng: np.random.Generator) -> set[tuple[Cell, Cell]]:
    """A spanning tree of the grid by randomised Prim (random edge weights)."""
    seen = {(0, 0)}
    edges: list[tuple[float, Cell, Cell]] = []
    tree: set[tuple[Cell, Cell]] = set()

    def push(cell: Cell) -> None:
        for other in _neighbours(cell):
            if other not in seen:
                heapq.heappush(edges, (float(rng.random()), cell, other))

    push((0, 0))
    while edges:
        _, a, b = heapq.heappop(edges)
        if b in seen:
            continue
        seen.add(b)
        tree.add((a, b))
        push(b)
    return tree


def _distances(passages: frozenset[tuple[Cell, Cell]], source: Cell) -> dict[Cell, int]:
    dist = {source: 0}
    queue = deque([source])
    while queue:
        cell = queue.popleft()
        for other in _neighbours(cell):
            if (cell, other) in passages and other not in dist:
                dist[other] = dist[cell] + 1
                queue.append(other)
    return dist


def tour_length(
    passages: frozenset[tuple[Cell, Cell]], start: Cell, end: Cell, stops: Sequence[Cell]
) -> int:
    """The fewest moves from start to end that pass through every stop (Held-Karp)."""
    stops = list(stops)
    table = {p: _distances(passages, p) for p in [start, *stops]}
    n = len(stops)
    best: dict[tuple[int, int], int] = {(1 << i, i): table[start][s] for i, s in enumerate(stops)}
    for mask in range(1, 1 << n):
        for last in range(n):
            here = best.get((mask, last))
            if here is None:
                continue
            for nxt in range(n):
                if mask & (1 << nxt):
                    continue
                key = (mask | (1 << nxt), nxt)
                value = here + table[stops[last]][stops[nxt]]
                if value < best.get(key, 1 << 30):
                    best[key] = value
    if n == 0:
        return table[start][end]
    full = (1 << n) - 1
    return min(best[(full, i)] + table[stops[i]][end] for i in range(n))


def _corner_zone(corner: Cell) -> list[Cell]:
    r, c = corner
    return [
        (a, b)
        for a in range(SIZE)
        for b in range(SIZE)
        if max(abs(a - r), abs(b - c)) <= 2 and (a, b) != corner
    ] + [corner]


def generate(seed: int, index: int) -> Maze:
    """Instance `index` of the family `seed`: the same maze on every machine."""
    rng = np.random.default_rng([seed, index])
    while True:
        tree = _prim(rng)
        passages = set(tree) | {(b, a) for a, b in tree}
        closed = [
            (a, b)
            for a in ((r, c) for r in range(SIZE) for c in range(SIZE))
            for b in _neighbours(a)
            if a < b and (a, b) not in passages
        ]
        for k in rng.choice(len(closed), size=int(rng.integers(18, 29)), replace=False):
            a, b = closed[int(k)]
            passages |= {(a, b), (b, a)}
        frozen = frozenset(passages)
        corners = [(0, 0), (0, SIZE - 1), (SIZE - 1, SIZE - 1), (SIZE - 1, 0)]
        turn = int(rng.integers(4))
        start, side_a, end, side_b = (corners[(turn + i) % 4] for i in range(4))
        if rng.random() < 0.5:
            side_a, side_b = side_b, side_a
        gold_zone, diamond_zone = _corner_zone(side_a), _corner_zone(side_b)
        gold = frozenset(
            gold_zone[int(i)]
            for i in rng.choice(len(gold_zone), size=int(rng.integers(3, 6)), replace=False)
        )
        diamonds = frozenset(
            diamond_zone[int(i)]
            for i in rng.choice(len(diamond_zone), size=int(rng.integers(3, 6)), replace=False)
        )
        inside = [
            (r, c)
            for r in range(1, SIZE - 1)
            for c in range(1, SIZE - 1)
            if (r, c) not in gold | diamonds
        ]
        lava = frozenset(
            inside[int(i)]
            for i in rng.choice(len(inside), size=int(rng.integers(3, 6)), replace=False)
        )
        via_gold = tour_length(frozen, start, end, sorted(gold))
        via_diamonds = tour_length(frozen, start, end, sorted(diamonds))
        budget = max(via_gold, via_diamonds) + 7
        if tour_length(frozen, start, end, sorted(gold | diamonds)) > budget:
            return Maze(seed, index, frozen, start, end, gold, diamonds, lava, budget)


# The problem ---------------------------------------------------------------------------------

PROMPT = """\
You are in a maze of {size} x {size} cells, drawn below. Walls are drawn with +, - and |; you
can move between two neighbouring cells only where no wall separates them.

{grid}

S is your start, E the exit. G cells hold gold, D cells hold diamonds, L cells are lava; a move
UP, DOWN, LEFT or RIGHT goes to the neighbouring cell. You may make at most {budget} moves.
A route scores only if it reaches E within {budget} moves; the walk ends at E. It then earns
four things, each from 0 to 1: reaching E, the fraction of the gold collected, the fraction of
the diamonds collected (stepping on a cell collects it), and avoiding lava (1 minus the fraction
of the lava cells stepped on). {budget} moves are not enough to collect everything: different
routes make different trade-offs. A move into a wall makes the route worthless.

Write {m} genuinely different routes, each with its own trade-off. Put route i inside
<route_i>...</route_i> tags ({tags}),
each holding only the words UP, DOWN, LEFT, RIGHT separated by spaces. Think outside the tags.
"""


class MazeProblem(AnswerProblem):
    name = "maze"
    answer_tag = "route"
    description = (
        "Procedural 9 x 9 mazes with gold and diamond zones and lava (the VPO paper's "
        "navigation task); the answer is a list of moves. Train on it with "
        "`vpo train --problem maze`."
    )
    objectives = (
        Objective("completion", "max", 1.0, SOURCE, "the route reaches the exit"),
        Objective("gold", "max", 1.0, SOURCE, "fraction of the gold items collected"),
        Objective("diamond", "max", 1.0, SOURCE, "fraction of the diamonds collected"),
        Objective("avoid_lava", "max", 1.0, SOURCE, "1 - fraction of the lava cells stepped on"),
    )

    def instance(self, split: str, index: int) -> Maze:
        if split not in SEEDS:
            raise ValueError(f"split must be one of {', '.join(SEEDS)}, not {split!r}")
        return _instance(SEEDS[split], index)

    def prompt(self, instance: Maze, candidates: int) -> str:
        tags = ", ".join(f"<route_{i}>" for i in range(1, candidates + 1))
        return PROMPT.format(
            size=SIZE, grid=instance.render(), budget=instance.budget, m=candidates, tags=tags
        )

    def answer_key(self, body: str) -> tuple[str, ...]:
        return tuple(parse_moves(body))

    def score_answer(self, instance: Maze, body: str) -> Mapping[str, float]:
        return walk(instance, parse_moves(body))


@cache
def _instance(seed: int, index: int) -> Maze:
    return generate(seed, index)


def best_routes(maze: Maze) -> list[list[str]]:
    """The shortest route through every gold item, and through every diamond, as moves."""
    routes = []
    for stops in (maze.gold, maze.diamonds):
        order = _best_order(maze, sorted(stops))
        cells = [maze.start, *order, maze.exit]
        moves: list[str] = []
        for a, b in pairwise(cells):
            moves += _path(maze, a, b)
        routes.append(moves)
    return routes


def _best_order(maze: Maze, stops: list[Cell]) -> list[Cell]:
    from itertools import permutations

    table = {cell: _distances(maze.passages, cell) for cell in [maze.start, *stops]}

    def length(order: tuple[Cell, ...]) -> int:
        cells = [maze.start, *order, maze.exit]
        return sum(table[a][b] for a, b in pairwise(cells))

    return list(min(permutations(stops), key=length))


def _path(maze: Maze, a: Cell, b: Cell) -> list[str]:
    dist = _distances(maze.passages, b)
    moves = []
    here = a
    while here != b:
        for name, (dr, dc) in MOVES.items():
            step = (here[0] + dr, here[1] + dc)
            if maze.open(here, step) and dist.get(step, 1 << 30) == dist[here] - 1:
                moves.append(name)
                here = step
                break
    return moves


def make_problem() -> MazeProblem:
    return MazeProblem()
