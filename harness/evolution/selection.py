"""Which program to improve next, which drafts to show beside it, and which programs migrate.

Selection works on `Population` (`population`), a columnar, append-only index of the
campaign (ids, islands, score vectors, validity, code hashes), never on full records: with 100k
programs a pick must cost well under a millisecond or two, so every step over the population is
one numpy operation.

Parents are drawn by stochastic scalarisation, the same device VPO trains with:

    w ~ Dirichlet(1_d)            a fresh weighting of the objectives for every pick
    u = scores @ w                (N,) each program's value under w
    parent ~ softmax(u / T) over the top_k programs by u

A fixed combined score would pull every island toward one point of the Pareto front; a random w
lands on a different part of the front each time, so parents spread over all of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from harness.config.settings import MAX_DRAFTS
from harness.evolution.population import Population
from trainer.measures import pareto_front

# A program beats another under w only by more than this: float noise in `scores @ w` must not
# turn exact ties (copies, equal vectors) into "complementary strengths".
BEAT_MARGIN = 1e-12


@dataclass(frozen=True)
class SelectionConfig:
    """How the campaign picks parents, drafts and migrants.

    `top_k` programs best under the drawn w compete for parenthood, weighted by
    exp(u / temperature); temperature 0 takes the best. Scores are fractions of the best known
    value (a record scores above 1, unclipped, so it wins over a tie with the record), and the
    default 0.02 makes a program 0.05 below the best under w about 12 times less likely to be
    picked.
    `migration_interval` 0 turns migration off.
    """

    islands: int = 4
    migration_interval: int = 50  # iterations between migrations
    migrants_per_island: int = 1
    top_k: int = 8
    temperature: float = 0.02
    drafts: int = 3  # programs shown beside the parent

    def __post_init__(self) -> None:
        _at_least("islands", self.islands, 1)
        _at_least("migration_interval", self.migration_interval, 0)
        _at_least("migrants_per_island", self.migrants_per_island, 0)
        _at_least("top_k", self.top_k, 1)
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(
                f"SelectionConfig.temperature must be a finite number >= 0, "
                f"got {self.temperature!r}"
            )
        _at_least("drafts", self.drafts, 0)
        if self.drafts > MAX_DRAFTS:
            raise ValueError(
                f"SelectionConfig.drafts must be at most {MAX_DRAFTS} (small models have small "
                f"contexts), got {self.drafts}"
            )


def _at_least(field: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"SelectionConfig.{field} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class Selection:
    """What one iteration works from: the child belongs to `island`."""

    island: int
    parent_id: int
    draft_ids: tuple[int, ...]


def select(
    pop: Population,
    iteration: int,
    rng: np.random.Generator,
    config: SelectionConfig,
    cases: Population | None = None,
) -> Selection:
    """Island, parent and drafts for one iteration; with `cases` (the same programs' case
    scores), the parent by epsilon-lexicase over them."""
    island = island_for(iteration, config.islands)
    if cases is not None:
        parent = pick_parent_lexicase(cases, island, rng)
    else:
        parent = pick_parent(pop, island, rng, top_k=config.top_k, temperature=config.temperature)
    drafts = pick_drafts(
        pop, parent, rng, config.drafts, top_k=config.top_k, temperature=config.temperature
    )
    return Selection(island, parent, tuple(drafts))


def island_for(iteration: int, islands: int) -> int:
    """Islands take turns, so each evolves at the same pace."""
    return iteration % islands


def should_migrate(iteration: int, interval: int) -> bool:
    return interval > 0 and iteration > 0 and iteration % interval == 0


def pick_parent(
    pop: Population,
    island: int,
    rng: np.random.Generator,
    *,
    top_k: int = 8,
    temperature: float = 0.02,
) -> int:
    """Id of a parent from `island`, best under a random weighting w ~ Dirichlet(1), among the
    programs `_competing` names (its valid programs, with fallbacks)."""
    rows, block = _competing(pop, island)
    u = _weights(rng, len(pop.objectives)) @ block  # (n,)
    return int(pop.ids[rows[_pick_best(u, rng, top_k, temperature)]])


def pick_parent_lexicase(cases: Population, island: int, rng: np.random.Generator) -> int:
    """Id of a parent from `island` by epsilon-lexicase selection over its case scores (La Cava,
    Spector and Danai, GECCO 2016): the cases in a random order, each keeping the programs
    within epsilon of the best that remain, epsilon the case's median absolute deviation over
    the competing programs; a random one of those left. A program that excels on one case
    survives when that case comes first, whatever its mean: specialists stay parents. The
    same programs compete as for `pick_parent`."""
    rows, block = _competing(cases, island)  # (n,), (k, n)
    spread = np.median(np.abs(block - np.median(block, axis=1, keepdims=True)), axis=1)
    alive = np.arange(len(rows))
    for case in rng.permutation(len(block)):
        values = block[case, alive]
        alive = alive[values >= values.max() - spread[case]]
        if len(alive) == 1:
            break
    return int(cases.ids[rows[alive[rng.integers(len(alive))]]])


def _competing(pop: Population, island: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows (n,) and scores (d, n) of the programs that compete for parenthood on `island`:
    its valid programs; when it has none, valid programs from every island (an island starts
    empty, or lost its line to errors); when nothing in the campaign is valid, all programs of
    the island (else all), so the model sees a failure with its feedback and can repair it."""
    if len(pop) == 0:
        raise ValueError("the population is empty; add the seed program first")
    rows, block = pop.valid_on(island)
    if len(rows) == 0:
        # Rare paths, so a scan over all N is fine here.
        on_island = pop.islands == island
        for mask in (pop.valid, on_island, np.ones(len(pop), dtype=bool)):
            rows = np.flatnonzero(mask)
            if len(rows):
                break
        block = pop.scores[rows].T
    return rows, block


def pick_drafts(
    pop: Population,
    parent_id: int,
    rng: np.random.Generator,
    k: int,
    *,
    top_k: int = 8,
    temperature: float = 0.02,
    tries: int = 4,
) -> list[int]:
    """Up to k distinct ids of valid programs from the parent's island, never the parent.

    First the top program (best mean score, i.e. under the even weighting), then programs
    that beat the parent under another random w: their strengths complement the parent's.
    Each of those is drawn like a parent, among the programs that beat the parent under its w
    (`tries` weightings per place). When too few programs beat the parent anywhere (it leads
    the island), the next best by mean fill the places. Fewer than k come back only when the
    island has fewer valid programs.
    """
    if k <= 0:
        return []
    parent_row = pop.row(parent_id)
    parent = pop.scores[parent_row]  # (d,)
    rows, block = pop.valid_on(int(pop.islands[parent_row]))  # (n,), (d, n)
    taken = np.zeros(len(rows), dtype=bool)
    at = int(np.searchsorted(rows, parent_row))
    if at < len(rows) and rows[at] == parent_row:
        taken[at] = True
    if taken.all():
        return []
    d = len(pop.objectives)
    mean = np.full(d, 1.0 / d) @ block  # (n,)
    chosen = [int(np.argmax(np.where(taken, -np.inf, mean)))]
    taken[chosen[0]] = True

    for _ in range(tries * (k - 1)):
        if len(chosen) == k:
            break
        w = _weights(rng, d)
        u = w @ block  # (n,)
        # Beating the parent under w: a strength the parent lacks.
        beats = np.flatnonzero((u > w @ parent + BEAT_MARGIN) & ~taken)
        if len(beats):
            pick = int(beats[_pick_best(u[beats], rng, top_k, temperature)])
            chosen.append(pick)
            taken[pick] = True

    missing = min(k - len(chosen), int((~taken).sum()))
    if missing > 0:
        rest = np.flatnonzero(~taken)
        best = rest[np.argpartition(-mean[rest], missing - 1)[:missing]]
        chosen.extend(int(i) for i in best[np.argsort(-mean[best], kind="stable")])
    return [int(pop.ids[rows[i]]) for i in chosen]


def migrants(
    pop: Population, islands: int, per_island: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """(program id, destination island) pairs: each island sends its best to the next (a ring).

    Each migrant is the best valid program of its island under a fresh random w, so an island
    exports different strengths over time. A program whose code already lives on the
    destination is skipped in favour of the next best under the same w: copies would only
    crowd the destination. The campaign stores each migrant as a copy (origin "migration").
    """
    if islands < 2 or per_island <= 0:
        return []
    moves: list[tuple[int, int]] = []
    for source in range(islands):
        destination = (source + 1) % islands
        rows, block = pop.valid_on(source)
        sent: set[str] = set()
        for _ in range(per_island):
            u = _weights(rng, len(pop.objectives)) @ block
            for i in _best_first(u):
                code_hash = pop.code_hash(int(rows[i]))
                if code_hash not in sent and not pop.has_code(code_hash, destination):
                    sent.add(code_hash)
                    moves.append((int(pop.ids[rows[i]]), destination))
                    break
    return moves


def _best_first(u: np.ndarray, head: int = 32) -> Iterator[int]:
    """Positions of u from the largest value down; sorts everything only if asked past `head`."""
    if len(u) > head:
        top = np.argpartition(-u, head - 1)[:head]
        top = top[np.argsort(-u[top], kind="stable")]
        yield from top.tolist()
        rest = np.ones(len(u), dtype=bool)
        rest[top] = False
        others = np.flatnonzero(rest)
        yield from others[np.argsort(-u[others], kind="stable")].tolist()
    else:
        yield from np.argsort(-u, kind="stable").tolist()


def pareto_ids(pop: Population, island: int | None = None) -> list[int]:
    """Ids of the valid programs on the Pareto front (of one island, when given)."""
    mask = pop.valid if island is None else pop.valid & (pop.islands == island)
    rows = np.flatnonzero(mask)
    return [int(i) for i in pop.ids[rows[pareto_front(pop.scores[rows])]]]


def _weights(rng: np.random.Generator, d: int) -> np.ndarray:
    return rng.dirichlet(np.ones(d))


def _pick_best(u: np.ndarray, rng: np.random.Generator, top_k: int, temperature: float) -> int:
    """Position in u of a pick among its top_k values, weighted by softmax(u / temperature)."""
    k = min(top_k, len(u))
    top = np.argpartition(-u, k - 1)[:k] if k < len(u) else np.arange(len(u))
    values = u[top]
    if temperature == 0:
        best = np.flatnonzero(values == values.max())
        return int(top[best[rng.integers(len(best))]])
    p = np.exp((values - values.max()) / temperature)
    return int(top[rng.choice(k, p=p / p.sum())])
