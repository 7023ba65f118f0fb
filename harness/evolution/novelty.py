"""What a campaign stored before, for rejecting candidates that would only repeat it, before
they reach the sandbox (OpenEvolve's novelty check runs after the costly evaluation: its
issue #439).

    memory = Novelty(entry="solve", family=problem.family, near=0.98, window=200)
    memory.add(code, code_hash, island)   # each stored program, from any process
    memory.trees[tree_key(code, entry)]   # -> the code hash of the first program of that tree
    memory.nearest(text, island)          # -> (code hash, similarity) at or above `near`

Three memories, each keyed to the first stored program that had the key:

- `trees`: the syntax tree (`harness.records.tree_key`). A candidate with a stored tree
  differs from a program only in comments, layout or docstrings: it would score the same.
- `families`: `Problem.family`, where a problem has one (an equation's terms up to their fitted
  constants).
- the island's newest `window` programs as text with comments and layout dropped (their syntax
  tree printed back). A candidate whose text is `near` or more similar to one of them (rapidfuzz's
  normalised Indel similarity, `fuzz.ratio` / 100) is a near-duplicate. `near = 1` turns this
  off: an edit that only moves a constant is often the step a search needs, so the threshold is
  the user's call.

Filled from the database when a run starts and after each batch, so a resumed campaign and a
worker beside others know what every process stored.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from harness.records import tree_key


def comparable_text(code: str) -> str:
    """The code as its syntax tree prints it back (no comments, one layout), or as written when
    it does not parse."""
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code


@dataclass
class Novelty:
    entry: str | None = None  # the problem's entry function (`Problem.entry`)
    family: Callable[[str], str | None] | None = None  # `Problem.family`
    near: float = 1.0  # similarity at or above which a candidate is a near-duplicate; 1: off
    window: int = 200  # the newest programs per island compared as text
    trees: dict[str, str] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)
    texts: dict[int, deque[tuple[str, str]]] = field(default_factory=dict)

    def add(self, code: str, code_hash: str, island: int) -> None:
        """Remember a stored program (the first of each tree and family)."""
        key = tree_key(code, self.entry)
        if key is not None:
            self.trees.setdefault(key, code_hash)
        if self.family is not None:
            try:
                kind = self.family(code)
            except Exception:  # a key that fails on a stored text: that program has none
                kind = None
            if kind is not None:
                self.families.setdefault(kind, code_hash)
        if self.near < 1.0:
            texts = self.texts.setdefault(island, deque(maxlen=self.window))
            texts.append((code_hash, comparable_text(code)))

    def nearest(self, code: str, island: int) -> tuple[str, float] | None:
        """The code hash of the island's most similar recent program and the similarity,
        when it is `near` or more; None otherwise (or when off)."""
        texts = self.texts.get(island)
        if self.near >= 1.0 or not texts:
            return None
        found = process.extractOne(
            comparable_text(code),
            [text for _, text in texts],
            scorer=fuzz.ratio,
            score_cutoff=100.0 * self.near,
        )
        if found is None:
            return None
        _, score, index = found
        return texts[index][0], score / 100.0
