"""The campaign's programs as columns, for selection: ids, islands, score vectors, validity and
code hashes, appended as programs are stored and never rewritten.

Selection (`selection`) reads these columns with numpy and never touches full records;
each island's valid programs are also kept as one contiguous score block, so a pick over an island
is one matrix-vector product.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from harness.records import ProgramRecord


class Population:
    """Append-only columnar index of a campaign's programs, in the objective order given.

    Besides the global columns it keeps, per island, the valid programs' score vectors as one
    contiguous (d, n) block: a pick is then `w @ block`, with no mask or gather over all N.
    Storage grows by capacity doubling, so appending is amortised O(1). The array properties
    are views of the first `len(self)` rows; an `append` may move the storage, so do not hold
    them across one.
    """

    def __init__(self, objectives: Sequence[str], capacity: int = 1024) -> None:
        self.objectives = tuple(objectives)
        if not self.objectives:
            raise ValueError("a population needs at least one objective")
        capacity = max(1, capacity)
        self._n = 0
        self._ids = np.empty(capacity, dtype=np.int64)
        self._islands = np.empty(capacity, dtype=np.int32)
        self._scores = np.empty((capacity, len(self.objectives)), dtype=np.float64)
        self._valid = np.empty(capacity, dtype=bool)
        self._row_of: dict[int, int] = {}
        self._valid_on: dict[int, _Block] = {}  # island -> its valid programs
        # code hash -> bit mask of the islands holding that code; duplicates and migrations
        # ask "is this code already there?" without a scan.
        self._code_islands: dict[str, int] = {}
        self._hashes: list[str] = []  # by row, for migration's "already there?" check

    @classmethod
    def from_records(
        cls, objectives: Sequence[str], records: Iterable[ProgramRecord]
    ) -> Population:
        records = list(records)
        population = cls(objectives, capacity=len(records) + 1024)
        population.extend(
            [r.id for r in records],
            [r.island for r in records],
            [[r.scores.get(name, 0.0) for name in population.objectives] for r in records],
            valid=[r.status == "ok" for r in records],
            code_hashes=[r.code_hash for r in records],
        )
        return population

    def __len__(self) -> int:
        return self._n

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._row_of

    @property
    def ids(self) -> np.ndarray:  # (N,) int64
        return self._ids[: self._n]

    @property
    def islands(self) -> np.ndarray:  # (N,) int32
        return self._islands[: self._n]

    @property
    def scores(self) -> np.ndarray:  # (N, d) float64 >= 0, 1 = the best known, above = record
        return self._scores[: self._n]

    @property
    def valid(self) -> np.ndarray:  # (N,) bool, status == "ok"
        return self._valid[: self._n]

    def row(self, program_id: int) -> int:
        try:
            return self._row_of[program_id]
        except KeyError:
            raise KeyError(f"program {program_id} is not in the population") from None

    def code_hash(self, row: int) -> str:
        return self._hashes[row]

    def has_code(self, code_hash: str, island: int | None = None) -> bool:
        """Whether a program with this code hash is indexed (on `island`, when given).

        The campaign's duplicate check: a candidate whose `records.code_hash` is known is not
        evaluated again. With several workers on one database, the database stays the judge.
        """
        mask = self._code_islands.get(code_hash, 0)
        return bool(mask) if island is None else bool(mask >> island & 1)

    def valid_on(self, island: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows (n,) and score block (d, n) of the valid programs on `island`, rows ascending."""
        block = self._valid_on.get(island)
        if block is None:
            return np.zeros(0, dtype=np.int64), np.zeros((len(self.objectives), 0))
        return block.rows[: block.n], block.scores[:, : block.n]

    def add(self, record: ProgramRecord) -> None:
        self.append(
            record.id,
            record.island,
            [record.scores.get(name, 0.0) for name in self.objectives],
            valid=record.status == "ok",
            code_hash=record.code_hash,
        )

    def append(
        self,
        program_id: int,
        island: int,
        scores: Sequence[float] | np.ndarray,
        *,
        valid: bool,
        code_hash: str,
    ) -> None:
        if program_id in self._row_of:
            raise ValueError(f"program {program_id} is already in the population")
        if island < 0:
            raise ValueError(f"program {program_id}: island must be >= 0, got {island}")
        vector = np.asarray(scores, dtype=np.float64)
        if vector.shape != (len(self.objectives),):
            raise ValueError(
                f"program {program_id}: expected {len(self.objectives)} scores "
                f"({', '.join(self.objectives)}), got shape {vector.shape}"
            )
        if not np.isfinite(vector).all():
            # A NaN would poison every comparison in argpartition; a failed part scores 0.
            vector = np.nan_to_num(vector, nan=0.0, posinf=0.0, neginf=0.0)
        if self._n == len(self._ids):
            self._grow()
        n = self._n
        self._ids[n] = program_id
        self._islands[n] = island
        self._scores[n] = vector
        self._valid[n] = valid
        if valid:
            block = self._valid_on.get(island)
            if block is None:
                block = self._valid_on[island] = _Block(len(self.objectives))
            block.append(n, vector)
        self._row_of[program_id] = n
        self._code_islands[code_hash] = self._code_islands.get(code_hash, 0) | (1 << island)
        self._hashes.append(code_hash)
        self._n = n + 1

    def extend(
        self,
        program_ids: Sequence[int] | np.ndarray,
        islands: Sequence[int] | np.ndarray,
        scores: Sequence[Sequence[float]] | np.ndarray,
        *,
        valid: Sequence[bool] | np.ndarray,
        code_hashes: Sequence[str],
    ) -> None:
        """Append many programs at once (loading a campaign), in one vectorised step."""
        ids = np.asarray(program_ids, dtype=np.int64).reshape(-1)
        count = len(ids)
        homes = np.asarray(islands, dtype=np.int64).reshape(-1)
        vectors = np.asarray(scores, dtype=np.float64).reshape(count, -1)
        ok = np.asarray(valid, dtype=bool).reshape(-1)
        if vectors.shape[1] != len(self.objectives) or not (
            len(homes) == len(ok) == len(code_hashes) == count
        ):
            raise ValueError(
                f"extend needs {count} islands, validity flags and code hashes and a "
                f"({count}, {len(self.objectives)}) score array"
            )
        if count == 0:
            return
        if (homes < 0).any():
            raise ValueError("islands must be >= 0")
        new_rows = dict(zip(ids.tolist(), range(self._n, self._n + count), strict=True))
        if len(new_rows) != count or not self._row_of.keys().isdisjoint(new_rows):
            raise ValueError("program ids must be new and distinct")
        vectors = np.nan_to_num(vectors, nan=0.0, posinf=0.0, neginf=0.0)
        while self._n + count > len(self._ids):
            self._grow()
        rows = np.arange(self._n, self._n + count)
        self._ids[rows] = ids
        self._islands[rows] = homes
        self._scores[rows] = vectors
        self._valid[rows] = ok
        for island in np.unique(homes[ok]).tolist():
            chosen = ok & (homes == island)
            block = self._valid_on.get(island)
            if block is None:
                block = self._valid_on[island] = _Block(len(self.objectives))
            block.extend(rows[chosen], vectors[chosen])
        self._row_of.update(new_rows)
        for code_hash, island in zip(code_hashes, homes.tolist(), strict=True):
            self._code_islands[code_hash] = self._code_islands.get(code_hash, 0) | (1 << island)
        self._hashes.extend(code_hashes)
        self._n += count

    def _grow(self) -> None:
        capacity = 2 * len(self._ids)
        self._ids = _resized(self._ids, capacity)
        self._islands = _resized(self._islands, capacity)
        self._scores = _resized(self._scores, capacity)
        self._valid = _resized(self._valid, capacity)


class _Block:
    """The valid programs of one island: rows (n,) and their scores as columns (d, n)."""

    def __init__(self, d: int, capacity: int = 256) -> None:
        self.n = 0
        self.rows = np.empty(capacity, dtype=np.int64)
        self.scores = np.empty((d, capacity), dtype=np.float64)

    def append(self, row: int, vector: np.ndarray) -> None:
        self._reserve(1)
        self.rows[self.n] = row
        self.scores[:, self.n] = vector
        self.n += 1

    def extend(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        self._reserve(len(rows))
        self.rows[self.n : self.n + len(rows)] = rows
        self.scores[:, self.n : self.n + len(rows)] = vectors.T
        self.n += len(rows)

    def _reserve(self, more: int) -> None:
        capacity = len(self.rows)
        if self.n + more <= capacity:
            return
        while capacity < self.n + more:
            capacity *= 2
        self.rows = _resized(self.rows, capacity)
        scores = np.empty((len(self.scores), capacity), dtype=np.float64)
        scores[:, : self.n] = self.scores[:, : self.n]
        self.scores = scores


def _resized(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown
