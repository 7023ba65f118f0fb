"""The problem contract: a statement, a seed program, objectives and a trusted scorer.

A problem knows nothing of the harness. It says which function the candidate must define and
with which arguments to call it (`calls`), and it scores the *data* each call returned
(`score`). The harness runs the calls in its sandbox and turns the raw values into an
`Evaluation` with every objective normalised: 1 is the best known value, above 1 beats it.
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Direction = Literal["max", "min"]
Status = Literal["ok", "invalid", "error", "timeout"]

# The largest normalised score. Not a cap on records (a record 10^300 times the best known is
# no record but a scorer's bug); it keeps every score a finite number the database can check:
# its table refuses NaN and infinity by refusing anything above this.
MAX_SCORE = 1e300


class Infeasible(Exception):
    """The candidate returned data that breaks the problem's rules; the message says which rule."""


@dataclass(frozen=True)
class Anchor:
    """A published value for an objective, with where it comes from."""

    value: float
    source: str


@dataclass(frozen=True)
class Objective:
    """One component of the reward vector.

    `best_known` is the value that maps to 1.0. For a maximised objective the score is
    raw / best_known, for a minimised one best_known / raw, never below 0 and not clipped
    above: a new record scores above 1 (1.02 beats the best known by 2%), so parent selection,
    rewards and every view tell records apart. The scorer is trusted and has checked the data
    (an infeasible answer raised `Infeasible`); a raw value that is not finite scores 0.
    """

    name: str
    direction: Direction
    best_known: float
    source: str
    description: str = ""
    anchors: tuple[Anchor, ...] = ()

    def __post_init__(self) -> None:
        if self.direction not in ("max", "min"):
            raise ValueError(f"objective {self.name!r}: direction must be 'max' or 'min'")
        if not math.isfinite(self.best_known) or self.best_known <= 0:
            raise ValueError(f"objective {self.name!r}: best_known must be a positive number")

    def normalise(self, raw: float) -> float:
        if not math.isfinite(raw):
            return 0.0
        if self.direction == "max":
            ratio = raw / self.best_known
        else:
            ratio = self.best_known / raw if raw > 0 else 0.0
        # Only an overflow reaches MAX_SCORE (raw near the float maximum, or a tiny positive
        # raw for a minimised objective); it keeps the score finite.
        return min(MAX_SCORE, max(0.0, ratio))


@dataclass(frozen=True)
class Call:
    """One invocation of the candidate's entry function; its data scores `objectives`.

    `entry` names the function the sandbox calls when it is not the problem's (a problem whose
    work takes stages calls a driver function per stage). `context` is trusted data the scorer
    keeps beside the call, for instance what an earlier stage claimed: it never reaches the
    sandbox."""

    key: str
    args: tuple[Any, ...] = ()
    objectives: tuple[str, ...] = ()
    entry: str = ""
    context: Any = field(default=None, compare=False)
    cases: tuple[str, ...] = ()  # the problem's cases its data score beside `objectives`


@dataclass(frozen=True)
class Evaluation:
    """The scored result of one candidate program.

    `scores` holds every objective normalised (see `Objective`: >= 0, finite, 1 = the best
    known, above 1 a record; 0 where the candidate failed that part);
    `raw` the unnormalised values (None where there is none); `status` is "ok" only when every
    call returned valid data, else the first failure's status, explained in `reason`.
    `cases` holds the problem's case scores (`Problem.cases`), normalised likewise, and
    `case_raw` their raw values: never objectives, kept to train and select on.
    """

    status: Status
    scores: Mapping[str, float]
    raw: Mapping[str, float | None]
    reason: str | None = None
    seconds: float = 0.0
    artifacts: Mapping[str, Any] = field(default_factory=dict)
    cases: Mapping[str, float] = field(default_factory=dict)
    case_raw: Mapping[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        found = {
            "status": self.status,
            "scores": dict(self.scores),
            "raw": dict(self.raw),
            "reason": self.reason,
        }
        if self.cases:
            found |= {"cases": dict(self.cases), "case_raw": dict(self.case_raw)}
        return found


class Compact(ABC):
    """A problem's compact answer form: the model writes only the part of the program that is
    evolved (FunSearch evolves one function; an equation's skeleton is one expression), and
    the harness builds the program around it. A completion of m candidates is then tens of
    tokens, and a prompt showing the parent and its drafts as parts stays short.

    `statement` replaces the problem's description in the prompt (what the part is and how it
    is scored), `what` names a part in the ask ("expression"), `example` is a part of the
    right shape that is not an answer. `advice`, where a form has it, says how a candidate is
    best made from the current part; the ask then uses it in place of asking for forms unlike
    each other (see `harness.evolution.prompts`). `sketches`, where given, are the ask's
    example candidates (placeholders, not answers); `opening` is text the answer's first
    candidate is made to start with (the prompt puts it in the model's mouth)."""

    statement: str
    what: str
    example: str
    advice: str = ""
    sketches: tuple[str, ...] = ()
    opening: str = ""

    @abstractmethod
    def part(self, code: str) -> str | None:
        """The evolved part of a program, or None where the program is not of the form (it is
        then shown whole)."""

    @abstractmethod
    def program(self, text: str) -> str:
        """The program a candidate's text stands for; ValueError with a one-line reason when
        the text is not a part (a complete program is taken as it is)."""

    def reader(self, parent_code: str) -> Callable[[str], str]:
        """`program` for the candidates written against `parent_code`: a form whose candidates
        may refer to their parent (an equation's `+ term`) reads them here."""
        return self.program


class Problem(ABC):
    """Subclass this (or build an instance) to add a problem.

    Class attributes a subclass sets: `name`, `description` (the statement the model reads),
    `seed_program` (a valid starting program), `objectives`, `entry` (the function the
    candidate defines), `time_limit` (seconds of wall clock per call) and `memory_mb`; and, for
    a driven heuristic, `driver` and `driver_entry`, or `referee` and `referee_entry`.
    """

    kind = "program"
    name: str
    description: str
    seed_program: str
    objectives: tuple[Objective, ...]
    entry: str
    time_limit: float = 10.0
    memory_mb: int = 2048
    # Whether the prompt offers SEARCH/REPLACE edits beside complete programs. A problem whose
    # programs are a few lines (an equation) asks for complete programs only: the edit example
    # is what small models copy verbatim instead of answering. Edits still parse either way.
    edits: bool = True
    # For a candidate that is a heuristic the harness drives (FunSearch's priority functions):
    # `driver` is trusted source appended to the candidate's code, and the sandbox calls
    # `driver_entry` instead of `entry`. The driver only maps the heuristic over an instance;
    # `score` runs the fixed algorithm on what it returns, so whatever comes back (a tampered
    # driver included) is judged by trusted code. Empty: `entry` is called directly.
    driver: str = ""
    driver_entry: str = ""
    # For a call whose inputs the candidate must not hold at once (an online heuristic fed one
    # item at a time): `referee` is trusted source that runs in a process of its own, where no
    # candidate code runs; the sandbox calls `referee_entry(*call.args)` there (a call's
    # `entry` names another of its functions), and it reaches the candidate's functions, the
    # driver's among them, only through `call_candidate(name, *args)`, each call crossing to
    # the candidate's process as data. What the referee returns is what `score` gets: the
    # candidate can write no result, and sees only the arguments of the calls made to it (and
    # the reason the call fails, when the referee raises: keep what it must not see out of it).
    referee: str = ""
    referee_entry: str = ""
    # The compact answer form, where the problem has one (`[sampling] form = "compact"`).
    compact: Compact | None = None
    # Cases: a vector of separate pieces of the task (a region of the data, a test), each
    # scored like an objective by `score` (a call lists their names in `Call.cases`), to train
    # and select on beside the objectives a campaign reports (`[training] vector = "cases"`).
    # Where the objectives move together (two fits of one equation), a vector of cases is
    # one whose parts trade off: an equation that captures one regime scores on its part. They
    # are never reported as objectives, on the front or against best known values.
    cases: tuple[Objective, ...] = ()

    def family(self, code: str) -> str | None:
        """A key naming the family of programs `code` belongs to: two programs of one family
        score alike once evaluated (an equation and the same equation with its constants
        written otherwise), so a candidate of its parent's family, or of a program the run
        stored, is a lazy duplicate and is never evaluated. None (the default): compared by
        code alone."""
        return None

    def admit(self, code: str) -> str:
        """The program the sandbox runs for the candidate `code`, or ValueError with a one-line
        reason the model can act on when the problem refuses it before any process starts. By
        default every program is run as written. A problem whose candidates are a small language
        (equation discovery: one expression) reads the text and writes the program itself, so
        nothing the candidate wrote runs as written. Must be idempotent: what it returns, admitted
        again, is the same text (a stored program re-scores as it scored)."""
        return code

    def calls(self) -> Sequence[Call]:
        """The calls to make; by default one call without arguments that scores every objective."""
        return (Call("main", (), tuple(o.name for o in self.objectives)),)

    def follow_up(self, call: Call, value: Any, code: str) -> Call | None:
        """The next stage of `call`: a call to run in a fresh sandboxed process now that `call`
        returned `value`, or None (the default) to score `value` itself.

        Runs in the trusted process on decoded data; raise Infeasible to reject `value`. A stage
        gets only the arguments given here, so a problem can keep apart what one process must
        not hold while it computes what is scored (equation discovery fits its constants where
        the training targets are and predicts, from those constants alone, in a process that
        never holds a target). `code` is the candidate's program as written, for measures of
        its text. The last stage's value goes to `score` with the call that produced it; the
        objectives and the result stay the first call's, and a failure's reason names the stage
        that raised it. What a stage returned before its last is kept beside the scores (its
        artifacts' `returned`), so keep it small: `vpo eval` and `vpo db show` print it."""
        return None

    def private_paths(self) -> Sequence[str]:
        """Files and folders the sandbox hides from this problem's candidates: what a program
        could read instead of computing its answer (held-out targets, published solutions).
        By default the `data` folder beside the module that defines the problem's class. The
        sandbox hides the project's own packages anyway; this is for a problem whose data live
        elsewhere (a problem folder, another package). Whatever the driver needs travels as
        call arguments, never as a file the candidate's process opens."""
        module = sys.modules.get(type(self).__module__)
        source = getattr(module, "__file__", None)
        if not source:
            return ()
        data = Path(source).parent / "data"
        return (str(data),) if data.is_dir() else ()

    @abstractmethod
    def score(self, call: Call, value: Any) -> Mapping[str, float]:
        """Raw objective values for the data one call returned; raise Infeasible to reject it.

        This runs in the trusted parent process on decoded data only (lists, numbers, strings,
        dicts, numpy arrays): recompute everything from the data and trust no claim in it.
        """

    def objective(self, name: str) -> Objective:
        for o in (*self.objectives, *self.cases):
            if o.name == name:
                return o
        raise KeyError(name)

    def empty_evaluation(self, status: Status, reason: str) -> Evaluation:
        """All zeros: what a candidate that did not parse or could not run scores."""
        names = [o.name for o in self.objectives]
        cases = [o.name for o in self.cases]
        return Evaluation(
            status,
            dict.fromkeys(names, 0.0),
            dict.fromkeys(names),
            reason,
            cases=dict.fromkeys(cases, 0.0),
            case_raw=dict.fromkeys(cases),
        )


def combine(
    problem: Problem,
    results: Mapping[str, tuple[Status, Mapping[str, float], str | None]],
    seconds: float = 0.0,
    artifacts: Mapping[str, Any] | None = None,
    stages: Mapping[str, str] | None = None,
) -> Evaluation:
    """Fold per-call results (status, raw values, reason) into one Evaluation.

    Objectives keep the credit of the calls that succeeded: the reward vector is per part, so a
    program that solves n=26 but breaks n=32 still scores on n=26. A failure's reason is
    labelled with its call's key, or with the key of the stage that gave the result where
    `stages` names one (`follow_up`: "predict: ..." for a call that began as "fit").
    """
    scores: dict[str, float] = {}
    raw: dict[str, float | None] = {}
    cases: dict[str, float] = {}
    case_raw: dict[str, float | None] = {}
    status: Status = "ok"
    reasons: list[str] = []
    for call in problem.calls():
        call_status, values, reason = results[call.key]
        for names, normalised, raws in (
            (call.objectives, scores, raw),
            (call.cases, cases, case_raw),
        ):
            for name in names:
                value = values.get(name) if call_status == "ok" else None
                raws[name] = value
                objective = problem.objective(name)
                normalised[name] = objective.normalise(value) if value is not None else 0.0
        if call_status != "ok":
            if status == "ok":
                status = call_status
            reasons.append(f"{(stages or {}).get(call.key, call.key)}: {reason}")
    reason = None
    if reasons:
        reason = reasons[0] if len(reasons) == 1 else f"{reasons[0]} (and {len(reasons) - 1} more)"
    return Evaluation(status, scores, raw, reason, seconds, dict(artifacts or {}), cases, case_raw)


class AnswerProblem(ABC):
    """A problem whose answer is text the model writes, not a program (the maze).

    There is no evolution: instances are generated (`instance(split, index)`, the same on every
    machine), the model reads `prompt(instance, m)` and writes m answers inside numbered
    `<{answer_tag}_i>` tags, and `score_answer` turns one answer into raw objective values in
    [0, 1]. `vpo train --problem NAME` runs VPO reinforcement learning on such a problem. The
    objectives' `best_known` is 1: every component is already a fraction, and a perfect answer
    is the best there is, so these scores stay in [0, 1] (no answer can be a record).
    """

    kind = "answer"
    name: str
    description: str
    objectives: tuple[Objective, ...]
    answer_tag: str

    @abstractmethod
    def instance(self, split: str, index: int) -> Any:
        """Instance `index` of the "train" or "test" split."""

    @abstractmethod
    def prompt(self, instance: Any, candidates: int) -> str:
        """What the model reads, asking for `candidates` answers."""

    @abstractmethod
    def score_answer(self, instance: Any, body: str) -> Mapping[str, float]:
        """Raw values (each in [0, 1]) of one answer's text; raise Infeasible to reject it."""

    def answer_key(self, body: str) -> Any:
        """What makes two answers the same answer (duplicates score once)."""
        return body.strip()

    def score_completion(
        self, instance: Any, text: str, candidates: int
    ) -> tuple[list[dict[str, float] | None], list[str | None]]:
        """Each of the m answers of one completion: its values, or None with the reason when it
        is missing, a repeat of an earlier one, or rejected (a rejected answer scores zero and
        still counts; a missing or repeated one is left out of the set)."""
        names = [o.name for o in self.objectives]
        bodies = answer_blocks(text, self.answer_tag, candidates)
        values: list[dict[str, float] | None] = []
        reasons: list[str | None] = []
        seen: set[Any] = set()
        for index, body in enumerate(bodies, start=1):
            if body is None:
                values.append(None)
                reasons.append(f"no <{self.answer_tag}_{index}> block")
                continue
            try:
                key = self.answer_key(body)
                if key in seen:
                    values.append(None)
                    reasons.append(f"{self.answer_tag} {index} repeats an earlier one")
                    continue
                seen.add(key)
                raw = self.score_answer(instance, body)
                # Fractions by nature (see the class): clamped into [0, 1], unlike a program
                # problem's scores, which exceed 1 for a record.
                values.append({n: min(1.0, max(0.0, float(raw[n]))) for n in names})
                reasons.append(None)
            except Infeasible as error:
                values.append(dict.fromkeys(names, 0.0))
                reasons.append(str(error))
        return values, reasons


RECORD_MARGIN = 1e-7


def record_note(score: float) -> str | None:
    """How a score above 1 reads wherever a best program is shown: "record: +2.0% over best
    known" for 1.02; None for a score that does not beat the best known value.

    Best known values are published to about 8 significant digits, so a margin below
    RECORD_MARGIN is that rounding, not a record (AlphaEvolve's own n = 32 packing scores
    1.0000000089 against its published sum). Above it the margin has two significant digits
    (one decimal at least): 1.0000012 reads "+0.00012%", not "+0.0%"."""
    if not score > 1.0 + RECORD_MARGIN:
        return None
    percent = (score - 1.0) * 100
    if percent >= 1e6:
        return f"record: +{percent:.2e}% over best known"
    shown = float(f"{percent:.2g}")  # two significant digits decide the decimals
    decimals = max(1, 1 - math.floor(math.log10(shown)))
    return f"record: +{percent:.{decimals}f}% over best known"


def answer_blocks(text: str, tag: str, candidates: int) -> list[str | None]:
    """The body of the first `<tag_i>...</tag_i>` for i = 1..candidates; None where absent."""
    import re

    found: list[str | None] = []
    for index in range(1, candidates + 1):
        match = re.search(rf"<{tag}_{index}>(.*?)</{tag}_{index}>", text, re.DOTALL)
        found.append(match.group(1) if match else None)
    return found
