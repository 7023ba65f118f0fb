"""One iteration as data: what it sampled, and what became of each candidate in it.

    sampled  = SampledIteration(iteration, selection, parent, prompt, completions, migrations)
    group    = classify_group(texts, m, parent.code, seen, entry)       # pure, before evaluation
    evaluate group.new_code                                             # the sandbox, elsewhere
    rollouts = rollout_records(group, completions, evaluations)         # pure, what is stored

`classify_group` parses every completion and gives candidate i of each rollout one outcome:
"new" (code no one evaluated yet: evaluate it), "duplicate" (its code hash was evaluated
before, earlier in this group or in `seen`: never evaluated twice; or the parent again, its
`entry` function and what that reaches unchanged under new docstrings or unused helpers) or
"unparsed" (nothing to run, with the reason). The campaign loop, its workers and
benchmarks/harness_overhead.py all go through these functions, so what is evaluated and
stored is decided in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from harness.evolution.novelty import Novelty
from harness.evolution.parsing import ParsedCandidate, parse_completion
from harness.evolution.selection import Selection
from harness.llm.base import Completion, Message
from harness.records import (
    CASE_PREFIX,
    CandidateRecord,
    NewProgram,
    PolicyVersion,
    ProgramRecord,
    RolloutRecord,
    code_hash,
    entry_key,
    tree_key,
)
from problems.api import Evaluation

MAX_PARSE_ERROR_CHARS = 500  # per rollout, the reasons of its unparsed candidates together

Outcome = Literal["new", "duplicate", "unparsed"]


@dataclass(frozen=True)
class SampledIteration:
    """Iteration k up to its evaluation: where it started (island, parent, drafts, and what the
    population held then), the prompt, the G completions, and the programs migrating after it.
    A skipped iteration has no completions and says why (its prompt did not fit, its request
    failed)."""

    iteration: int
    selection: Selection
    parent: ProgramRecord
    prompt: list[Message]
    completions: Sequence[Completion]
    migrations: Sequence[tuple[int, int]]  # (program id, destination island)
    version: PolicyVersion | None = None  # the policy that sampled the completions; None: base
    skipped: str | None = None
    population: Mapping[str, Any] | None = None  # see harness.evolution.generation.snapshot

    @property
    def prompt_token_ids(self) -> tuple[int, ...] | None:
        return self.completions[0].prompt_token_ids if self.completions else None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens: its ids, else what the server reported, else 0 (skipped)."""
        if not self.completions:
            return 0
        first = self.completions[0]
        return len(first.prompt_token_ids or ()) or first.reported_prompt_tokens or 0


@dataclass(frozen=True)
class Candidate:
    """Candidate `index` (1..candidates) of one rollout, before evaluation.

    `code` and `code_hash` are set for "new" and "duplicate" candidates, `reason` (one line)
    for "unparsed" ones.
    """

    index: int
    outcome: Outcome
    code: str | None = None
    code_hash: str | None = None
    reason: str | None = None
    lazy: bool = False  # a duplicate of the parent or of a program stored before this group
    family: str | None = None  # a new candidate's family key (Problem.family), where it has one
    near: bool = False  # a lazy duplicate by its text's similarity (novelty.Novelty.nearest)


@dataclass(frozen=True)
class ParsedRollout:
    """One completion's candidates, and how its parse went as a whole."""

    candidates: tuple[Candidate, ...]
    status: str  # "ok": every candidate parsed, "partial", "none"
    error: str | None  # "i: reason; ..." for the unparsed candidates, None when all parsed


@dataclass(frozen=True)
class ParsedGroup:
    """The G rollouts of one iteration, classified."""

    rollouts: tuple[ParsedRollout, ...]

    @property
    def new_code(self) -> dict[str, str]:
        """Code hash -> code of every new candidate, in first-seen order: what to evaluate."""
        return {
            c.code_hash: c.code
            for rollout in self.rollouts
            for c in rollout.candidates
            if c.outcome == "new" and c.code_hash is not None and c.code is not None
        }


def classify_group(
    texts: Sequence[str],
    candidates: int,
    parent_code: str,
    seen: Container[str],
    entry: str | None = None,
    expand: Callable[[str], str] | None = None,
    family: Callable[[str], str | None] | None = None,
    memory: Novelty | None = None,
    island: int = 0,
    batch: BatchKeys | None = None,
) -> ParsedGroup:
    """Each completion's candidates 1..`candidates`, parsed against the parent and classified
    by code hash against `seen` (hashes evaluated before) and the candidates before them. With
    `entry`, a candidate whose `entry_key` is the parent's is a lazy duplicate of the parent
    (named by the parent's hash, with the reason), never evaluated: it would score exactly as
    the parent did, and training gives a copy nothing. With `expand` (a compact form's
    `program`), each candidate's text becomes the program it stands for; one it refuses is
    unparsed with its reason. With `family` (`Problem.family`), a candidate of the parent's
    family is a lazy duplicate of the parent.

    With `memory` (what the campaign stored, `harness.evolution.novelty`), a candidate with a
    stored syntax tree or family, or near-duplicate text of a recent program of `island`, is
    a lazy duplicate of that program, never evaluated; one that repeats the tree or family of
    a candidate before it in the batch (`batch`, which this fills) is a duplicate of that one."""
    known = _Known(parent_code, seen, entry, family, memory, island, batch or BatchKeys())
    rollouts = []
    for text in texts:
        try:
            parsed = {c.index: c for c in parse_completion(text, candidates, parent_code)}
        except Exception as exc:  # the parser's failure on this text: every slot unparsed
            reason = f"the harness could not parse this completion: {type(exc).__name__}: {exc}"
            parsed = {
                i: ParsedCandidate(i, None, "none", reason[:200]) for i in range(1, candidates + 1)
            }
        if expand is not None:
            parsed = {index: expanded(c, expand) for index, c in parsed.items()}
        classified = [
            _classified(known, index, parsed.get(index)) for index in range(1, candidates + 1)
        ]
        errors = [
            f"{c.index}: {'NUL byte' if c.reason == NUL_REASON else c.reason}"
            for c in classified
            if c.outcome == "unparsed"
        ]
        parsed_count = sum(1 for c in classified if c.outcome != "unparsed")
        status = "ok" if parsed_count == candidates else ("partial" if parsed_count else "none")
        error = "; ".join(errors)[:MAX_PARSE_ERROR_CHARS] or None
        rollouts.append(ParsedRollout(tuple(classified), status, error))
    return ParsedGroup(tuple(rollouts))


NUL_REASON = "the code contains a NUL byte"


@dataclass
class BatchKeys:
    """The syntax trees and families the new candidates of one batch brought, each to the
    code hash of the first candidate with it."""

    trees: dict[str, str] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)


class _Known:
    """What a group's candidates are classified against: the parent (its hash, its entry's key,
    its family), the hashes evaluated before, what the campaign stored (`memory`), and what
    the candidates before this one brought (hashes, trees, families)."""

    def __init__(
        self,
        parent_code: str,
        seen: Container[str],
        entry: str | None,
        family: Callable[[str], str | None] | None,
        memory: Novelty | None,
        island: int,
        batch: BatchKeys,
    ) -> None:
        self.seen, self.entry, self.family = seen, entry, family
        self.memory, self.island, self.batch = memory, island, batch
        self.fresh: set[str] = set()
        self.parent_hash = code_hash(parent_code)
        self.parent_key = entry_key(parent_code, entry) if entry else None
        self.parent_family = _family_or_none(family, parent_code)

    def classify(self, index: int, candidate: ParsedCandidate | None) -> Candidate:
        if candidate is None or candidate.code is None:
            reason = candidate.error if candidate else f"no candidate {index} in the completion"
            return Candidate(index, "unparsed", reason=reason)
        code = candidate.code
        if "\x00" in code:  # the database cannot store it, and no scorer wants it
            return Candidate(index, "unparsed", reason=NUL_REASON)
        digest = code_hash(code)
        if self.reworded(code, digest):
            reason = (
                f"the current program again: `{self.entry}` and what it calls are unchanged "
                "(only docstrings, comments or code it never calls differ)"
            )
            return Candidate(index, "duplicate", code, self.parent_hash, reason, lazy=True)
        lazy = digest in self.seen or digest == self.parent_hash
        if lazy or digest in self.fresh:
            return Candidate(index, "duplicate", code, digest, lazy=lazy)
        tree = tree_key(code, self.entry) if self.memory is not None else None
        kind = _family_or_none(self.family, code)
        repeated = self.repeats(index, code, tree, kind)
        if repeated is not None:
            return repeated
        self.fresh.add(digest)
        if tree is not None:
            self.batch.trees.setdefault(tree, digest)
        if kind is not None:
            self.batch.families.setdefault(kind, digest)
        return Candidate(index, "new", code, digest, family=kind)

    def repeats(
        self, index: int, code: str, tree: str | None, kind: str | None
    ) -> Candidate | None:
        """A duplicate of what new code repeats: a stored tree, the parent's or a stored family,
        a near-duplicate text of the island's, or a tree or family of the batch; else None."""
        memory = self.memory
        if memory is not None and tree in memory.trees:
            same = memory.trees[tree]
            reason = f"the same syntax tree as program {same[:12]} (comments or layout differ)"
            return Candidate(index, "duplicate", code, same, reason, lazy=True)
        stored = memory.families if memory is not None else {}
        if kind is not None and (kind == self.parent_family or kind in stored):
            same = self.parent_hash if kind == self.parent_family else stored[kind]
            reason = f"the same family as program {same[:12]}: {kind}"[:200]
            return Candidate(index, "duplicate", code, same, reason, lazy=True)
        near = memory.nearest(code, self.island) if memory is not None else None
        if near is not None and memory is not None:
            same, similarity = near
            reason = (
                f"a near-duplicate of program {same[:12]} of island {self.island}: "
                f"{similarity:.3f} similar (near_duplicate {memory.near})"
            )
            return Candidate(index, "duplicate", code, same, reason, lazy=True, near=True)
        batch = ((tree, self.batch.trees, "syntax tree"), (kind, self.batch.families, "family"))
        for key, fresh, what in batch:
            if key is not None and key in fresh:
                reason = f"the same {what} as a candidate before it"
                return Candidate(index, "duplicate", code, fresh[key], reason)
        return None

    def reworded(self, code: str, digest: str) -> bool:
        """The parent with only docstrings, comments or code its entry never calls changed."""
        return (
            self.parent_key is not None
            and self.entry is not None
            and digest != self.parent_hash
            and entry_key(code, self.entry) == self.parent_key
        )


def _family_or_none(family: Callable[[str], str | None] | None, code: str) -> str | None:
    """The family of `code`, or None (compared by code alone) where the problem has none or its
    key failed on this text."""
    if family is None:
        return None
    try:
        return family(code)
    except Exception:
        return None


def _classified(known: _Known, index: int, candidate: ParsedCandidate | None) -> Candidate:
    """`known.classify`, with a failure of any trusted reader of the model's text (a tree key,
    a family, a similarity) recorded as that candidate's refusal: no answer ends a campaign."""
    try:
        return known.classify(index, candidate)
    except Exception as exc:
        reason = f"the harness could not read this candidate: {type(exc).__name__}: {exc}"
        return Candidate(index, "unparsed", reason=reason[:MAX_PARSE_ERROR_CHARS])


def expanded(candidate: ParsedCandidate, expand: Callable[[str], str]) -> ParsedCandidate:
    """A parsed candidate as the program it stands for (a compact form's `program`, or the
    problem's `admit`), or unparsed with the reason it was refused."""
    if candidate.code is None:
        return candidate
    try:
        return replace(candidate, code=expand(candidate.code))
    except ValueError as error:
        return replace(candidate, code=None, kind="none", error=str(error))
    except Exception as exc:  # a reader's failure refuses this candidate, not the campaign
        error = f"the harness could not read this candidate: {type(exc).__name__}: {exc}"
        return replace(candidate, code=None, kind="none", error=error[:MAX_PARSE_ERROR_CHARS])


def rollout_records(
    group: ParsedGroup, completions: Sequence[Completion], evaluations: Mapping[str, Evaluation]
) -> list[RolloutRecord]:
    """What the store writes for each completion: its new candidates as programs with their
    evaluation (`evaluations` by code hash), the others by outcome, hash and reason."""
    return [
        RolloutRecord(
            completion.text,
            completion.token_ids,
            completion.logprobs,
            completion.finish_reason,
            rollout.status,
            rollout.error,
            [_stored(c, evaluations) for c in rollout.candidates],
            num_tokens=completion.num_tokens,
        )
        for completion, rollout in zip(completions, group.rollouts, strict=True)
    ]


def _stored(candidate: Candidate, evaluations: Mapping[str, Evaluation]) -> CandidateRecord:
    c = candidate
    if c.outcome != "new":
        return CandidateRecord(
            c.index, c.outcome, None, c.code_hash, c.reason, lazy=c.lazy, near=c.near
        )
    assert c.code is not None and c.code_hash is not None
    program = new_program(c.code, evaluations[c.code_hash])
    return CandidateRecord(c.index, "new", program, c.code_hash)


def new_program(code: str, evaluation: Evaluation) -> NewProgram:
    """An evaluated candidate as the store takes it."""
    cases = {CASE_PREFIX + name: value for name, value in evaluation.cases.items()}
    case_raw = {CASE_PREFIX + name: value for name, value in evaluation.case_raw.items()}
    return NewProgram(
        code=code,
        status=evaluation.status,
        scores=dict(evaluation.scores) | cases,
        raw=dict(evaluation.raw) | case_raw,
        error=evaluation.reason,
        eval_seconds=evaluation.seconds,
        metrics={"artifacts": dict(evaluation.artifacts)},
    )
