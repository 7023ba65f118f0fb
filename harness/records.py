"""Plain records of what the database holds, and the code hash that identifies a program.

Pure modules (selection, prompts, parsing) take and return these; only `store` makes them from
database rows, so nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# A problem's case scores (problems.api.Problem.cases) are stored beside its objectives' under
# this prefix: "case:id_ring1". Every list of a campaign's objectives leaves them out.
CASE_PREFIX = "case:"


def is_case(name: str) -> bool:
    return name.startswith(CASE_PREFIX)


def code_hash(code: str) -> str:
    """sha256 of the code with trailing whitespace and blank lines removed.

    Two candidates that differ only in layout noise an LLM adds (trailing spaces, extra blank
    lines, CRLF endings) hash alike, so they are evaluated once. Anything else, comments
    included, counts as a different program: stripping more would need a parser and could merge
    programs that behave differently.
    """
    lines = (line.rstrip() for line in code.splitlines())
    normalised = "\n".join(line for line in lines if line)
    return hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()


def entry_key(code: str, entry: str) -> str | None:
    """What of `code` can change what its function `entry` computes, as a comparable string.

    The syntax tree without docstrings and without the module's functions and classes that
    neither `entry` nor the module's other statements name (directly or through each other). A
    candidate whose key equals its parent's rewrote a docstring, renamed nothing, or added a
    helper nothing calls: the parent again, to a scorer. Comments and layout never reach the
    tree. None when the code does not parse, defines a name twice or lacks `entry`: such code is
    compared by `code_hash` alone. A function reached only through a string (`globals()[...]`)
    is not seen; a problem that scores such code is not served by this key.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    definitions: dict[str, ast.stmt] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if statement.name in definitions:
                return None
            definitions[statement.name] = statement
    if entry not in definitions:
        return None
    defined = {id(statement) for statement in definitions.values()}
    reached = {entry}
    waiting = [definitions[entry]] + [s for s in tree.body if id(s) not in defined]
    while waiting:
        for node in ast.walk(waiting.pop()):
            if isinstance(node, ast.Name) and node.id in definitions and node.id not in reached:
                reached.add(node.id)
                waiting.append(definitions[node.id])
    kept = [s for s in tree.body if id(s) not in defined or getattr(s, "name", "") in reached]
    return _dump_without_docstrings(ast.Module(body=kept, type_ignores=[]))


def tree_key(code: str, entry: str | None = None) -> str | None:
    """A short digest of what `code` computes as a syntax tree: `entry_key` with an `entry`,
    else the whole module's tree without docstrings. Two programs with the same key differ
    only in comments, layout, docstrings (or, with `entry`, code nothing calls): they score
    alike. None when the code does not parse."""
    if entry is not None:
        key = entry_key(code, entry)
    else:
        try:
            key = _dump_without_docstrings(ast.parse(code))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            key = None
    if key is None:
        return None
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _dump_without_docstrings(module: ast.Module) -> str | None:
    """The module's tree as a string, docstrings dropped; None when it is too deep to dump."""
    for node in ast.walk(module):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    try:
        return ast.dump(module, annotate_fields=False)
    except RecursionError:
        return None


@dataclass(frozen=True)
class CampaignRecord:
    id: int
    name: str
    problem: str
    config: dict[str, Any]
    seed: int
    created_at: datetime
    status: str


@dataclass(frozen=True)
class ProgramRecord:
    id: int
    campaign_id: int
    code: str
    code_hash: str
    parent_id: int | None
    island: int
    generation: int
    origin: str
    status: str
    error: str | None
    eval_seconds: float
    trajectory_id: int | None
    candidate_index: int | None
    metrics: dict[str, Any]
    created_at: datetime
    scores: dict[str, float]  # objective -> value in [0,1], higher is better
    raw: dict[str, float | None]  # objective -> unnormalised value, None where there is none

    def vector(self, objectives: Sequence[str]) -> tuple[float, ...]:
        """The score vector r(s) in the given objective order."""
        return tuple(self.scores[objective] for objective in objectives)


@dataclass(frozen=True)
class EventRecord:
    id: int
    campaign_id: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class Counts:
    """What a campaign holds, computed by aggregate queries each time it is asked."""

    programs: dict[str, int]  # status -> count, every status present
    events: dict[str, int]  # kind -> count, only kinds that occurred

    @property
    def total_programs(self) -> int:
        return sum(self.programs.values())


@dataclass(frozen=True)
class NewProgram:
    """An evaluated candidate to store; its parent, island and generation come from its group."""

    code: str
    status: str
    scores: Mapping[str, float]
    raw: Mapping[str, float | None]
    error: str | None = None
    eval_seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Lineage:
    """Where a stored program sits: how it came (`seed`, `llm`, `migration`), from which
    parent, on which island and generation, and the rollout and candidate that wrote it."""

    origin: str = "seed"
    parent_id: int | None = None
    island: int = 0
    generation: int = 0
    trajectory_id: int | None = None
    candidate_index: int | None = None


@dataclass(frozen=True)
class CandidateRecord:
    """What became of candidate `index` (1..candidates) of one rollout.

    `new`: evaluated now, stored as `program`; `duplicate`: its normalised code was evaluated
    before (in this iteration or earlier), found by `code_hash`; `unparsed`: nothing to run,
    `reason` says why. Unparsed candidates score zeros. `lazy`: a duplicate of the parent or of
    a program stored before this iteration (ThetaEvolve's lazy output, arXiv 2511.23473), not
    of another candidate of the same group; `near`: lazy because its text is a near-duplicate
    (`harness.evolution.novelty`).
    """

    index: int
    outcome: str
    program: NewProgram | None = None
    code_hash: str | None = None
    reason: str | None = None
    lazy: bool = False
    near: bool = False  # lazy by its text's similarity to a recent program of its island


@dataclass(frozen=True)
class RolloutRecord:
    """One completion of a group with what its candidates became."""

    completion: str
    token_ids: Sequence[int]
    logprobs: Sequence[float] | None
    finish_reason: str
    parse_status: str  # "ok": every candidate parsed, "partial", "none"
    parse_error: str | None
    candidates: Sequence[CandidateRecord]
    num_tokens: int | None = None  # generated tokens where token_ids is empty (a server's usage)


@dataclass(frozen=True)
class NewGroup:
    """One iteration's group to store: the prompt built from `parent_id` and the drafts it
    showed, and the G rollouts that answered it. Its new programs take the group's island and
    the parent's generation + 1."""

    iteration: int
    island: int
    parent_id: int
    draft_ids: Sequence[int]
    prompt: list[dict[str, str]]
    prompt_token_ids: Sequence[int] | None
    rollouts: Sequence[RolloutRecord]
    version: PolicyVersion | None = None  # the policy that sampled the rollouts; None: the base
    skipped: str | None = None  # why it has no rollouts (a prompt too long, a failed request)
    population: Mapping[str, Any] | None = None  # what selection saw (RolloutGroup.population)
    prompt_tokens: int | None = None  # what a server reported, where it gave no prompt ids


@dataclass(frozen=True)
class Summary:
    """What `vpo status` shows; every number is an aggregate query, none is stored."""

    programs: int
    valid_programs: int
    evaluations: int
    groups: int
    trajectories: int
    policy_versions: int
    tokens: int
    best: dict[str, dict[str, Any]]  # objective -> {"score", "raw", "program_id"}
    skipped: int = 0  # groups of iterations that produced nothing (RolloutGroup.skipped)


@dataclass(frozen=True)
class IterationMeasures:
    """What one iteration's candidates measure (trainer/measures.py): the share of its
    rollouts that parsed entirely and the pool diversity of its candidate slots. None where
    there is none: a skipped iteration has neither, fewer than two slots with a program have
    no diversity."""

    group_id: int
    iteration: int
    created_at: datetime
    parse_rate: float | None
    pool_diversity: float | None


@dataclass(frozen=True)
class TrainingRollout:
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    # Per candidate 1..candidates: the evaluated program's scores by objective, None when the
    # candidate has no program (not parsed).
    candidates: tuple[dict[str, float] | None, ...]
    # Per candidate: whether it repeated its parent or a program stored before its iteration.
    lazy: tuple[bool, ...] = ()
    # The step of the policy version that sampled it (the trainer's `Rollout.version`): 0 for
    # the base weights, None where it is not known.
    version: int | None = None
    # Per candidate: the program it names (None: not parsed), and whether that program ran and
    # was scored (status "ok"); empty for rollouts built without them (every slot then counts).
    programs: tuple[int | None, ...] = ()
    valid: tuple[bool, ...] = ()


@dataclass(frozen=True)
class TrainingGroup:
    """A stored group as the trainer needs it: token ids and per-candidate score vectors."""

    id: int
    iteration: int
    rollouts: tuple[TrainingRollout, ...]
    island: int = 0
    parent_id: int | None = None  # the program its prompt showed as the parent


@dataclass(frozen=True)
class PolicyVersion:
    """The one record of a policy version, from the store to the rollout: the row
    `Store.record_train_step` adds and returns, the trainer's current version, the version that
    sampled an iteration (`SampledIteration.version`, `NewGroup.version`, stored as the
    `policy_version_id` columns). `step` is the training step whose weights it holds (the
    step a stored rollout reports as `TrainingRollout.version`); `path` is their folder."""

    id: int
    campaign_id: int
    step: int
    path: str
    metrics: dict[str, Any]
    created_at: datetime
