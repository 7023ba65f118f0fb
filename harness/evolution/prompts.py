"""The prompt: problem statement, parent and drafts with their score vectors, feedback, the ask.

One completion answers with several candidates in numbered tags (see `parsing`). The
prompt fits a budget counted in tokens (`PromptBudget`: the model's context length minus the
completion's `max_tokens`): drafts are dropped first, then the feedback is shortened, and the
parent is never cut, since edits must be able to target any of its lines and a rewrite must
see all of it. A parent that cannot fit is `PromptTooLong`, and the campaign records that
iteration as skipped with the reason. Drafts, shown only for ideas, are clipped in the middle
to `draft_chars` each (saying so in the prompt).

Program code and stderr are untrusted text. They are shown verbatim (a SEARCH block must match
the parent exactly) inside a fence longer than any backtick run in them, so they cannot close
their fence and pass for instructions. The prompt itself is never parsed: `parse_completion`
reads only the completion. A program holding `</candidate_1>` that the model copies into its
answer stays inside its code fence, and the parser takes tags inside a closed fence as code.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.evolution.edits import Edit, format_edits
from harness.evolution.parsing import fence_for, format_full
from harness.records import ProgramRecord
from problems.api import Compact, Problem, record_note

DRAFT_CHARS = 4_000  # each draft, clipped in the middle beyond this
FEEDBACK_CHARS = 2_000  # the parent's status, error and stderr tails
MIN_FEEDBACK_CHARS = 200  # shortened down to this, then dropped, before the parent would be cut

SYSTEM = (
    "You are an expert programmer and mathematician. You improve Python programs that are "
    "scored automatically, and you answer in exactly the format you are asked for."
)

# A compact answer is its tagged parts and nothing else, so its opening is written for the
# model: the answer continues `<candidate_1>` (harness.llm.base.answer_start). A 0.5B model
# asked for tags opened with a preamble, a heading or a code fence in most of its answers.
# A form with an `opening` (an equation's "+": a term added to the current expression) has
# the first candidate start with it too.
ANSWER_START = "<candidate_1>"

_EXAMPLE_EDIT = Edit("    lines copied exactly from the current program", "    their replacement")

Messages = list[dict[str, str]]


class PromptTooLong(Exception):
    """The prompt does not fit its token budget even with no drafts and no feedback; the
    message (one line) says by how much."""


@dataclass(frozen=True)
class PromptBudget:
    """How much prompt the model takes: `tokens` as counted by `count` (the generator's
    tokenizer on the chat-templated messages)."""

    tokens: int
    count: Callable[[Messages], int]
    draft_chars: int = DRAFT_CHARS
    feedback_chars: int = FEEDBACK_CHARS
    why: str = ""  # where `tokens` came from, for the PromptTooLong message


def build_prompt(
    problem: Problem,
    parent: ProgramRecord,
    drafts: Sequence[ProgramRecord],
    candidates: int = 3,
    budget: PromptBudget | None = None,
    compact: Compact | None = None,
) -> Messages:
    """Chat messages (system, user) asking for `candidates` different programs improving `parent`.

    With `compact` (the problem's compact form) the statement is the form's, the parent and the
    drafts are shown as their evolved parts, the candidates are asked for as parts, and a third
    message, the assistant's, opens the answer with ANSWER_START (and the form's `opening`) for
    the model to continue.

    Drafts are shown in the order given. Without a budget every part is shown at its own
    limit; with one, drafts are dropped from the end while the prompt is over `budget.tokens`,
    then the feedback is shortened and dropped; the problem statement, the instructions and
    the parent are never cut (PromptTooLong when they alone are over).
    """
    if candidates < 1:
        raise ValueError(f"candidates must be at least 1, got {candidates}")
    objectives = [o.name for o in problem.objectives]
    draft_chars = budget.draft_chars if budget else DRAFT_CHARS
    feedback_chars = budget.feedback_chars if budget else FEEDBACK_CHARS
    kept = list(drafts)

    def messages() -> Messages:
        user = _user_message(
            problem, objectives, parent, kept, candidates, draft_chars, feedback_chars, compact
        )
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        if compact is not None:
            opening = f"\n{compact.opening}" if compact.opening else ""
            prompt.append({"role": "assistant", "content": ANSWER_START + opening})
        return prompt

    prompt = messages()
    if budget is None:
        return prompt
    # Drop drafts one at a time from the end; a binary search would save counts, but there are
    # at most 4 drafts and a count is a tokenizer pass over a few thousand characters.
    while (used := budget.count(prompt)) > budget.tokens:
        if kept:
            kept.pop()
        elif feedback_chars > MIN_FEEDBACK_CHARS:
            feedback_chars = max(MIN_FEEDBACK_CHARS, feedback_chars // 2)
        elif feedback_chars > 0:
            feedback_chars = 0
        else:
            where = f" ({budget.why})" if budget.why else ""
            raise PromptTooLong(
                f"the prompt needs {used} tokens with the parent alone (no drafts, no "
                f"feedback); the budget is {budget.tokens}{where}"
            )
        prompt = messages()
    return prompt


def _user_message(
    problem: Problem,
    objectives: list[str],
    parent: ProgramRecord,
    drafts: Sequence[ProgramRecord],
    candidates: int,
    draft_chars: int,
    feedback_chars: int,
    compact: Compact | None = None,
) -> str:
    what = compact.what if compact else "program"
    statement = compact.statement if compact else problem.description
    # A compact statement says how its part is scored (`Compact`), so the objectives are not
    # listed again, and scores are shown without their raw values: Qwen2.5-Coder-0.5B copied
    # those ten-digit numbers into its candidates, and the section was a third of the prompt.
    parts = [
        "# Problem\n\n" + statement.strip(),
        *([] if compact else [_objectives_section(problem)]),
        f"# Current {what}\n\n"
        + _scored_program(parent, objectives, None, f"the current {what}", compact),
    ]
    feedback = _feedback(parent, feedback_chars) if feedback_chars > 0 else ""
    if feedback:
        parts.append(f"# Feedback from evaluating the current {what}\n\n" + feedback)
    if drafts:
        shown = [
            f"## {what.capitalize()} {_letter(i)}\n\n"
            + _scored_program(draft, objectives, draft_chars, f"this {what}", compact)
            for i, draft in enumerate(drafts)
        ]
        parts.append(f"# Other {what}s, for ideas\n\n" + "\n\n".join(shown))
    parts.append(
        _compact_task(problem, candidates, compact) if compact else _task(problem, candidates)
    )
    return "\n\n".join(parts) + "\n"


def _objectives_section(problem: Problem) -> str:
    lines = [
        "# Objectives",
        "",
        "Each objective scores 0 or more, higher is better; 1 is the best known value, and a "
        "score above 1 beats it (1.02: 2% better).",
    ]
    for o in problem.objectives:
        goal = "maximise" if o.direction == "max" else "minimise"
        about = f"{o.description}, " if o.description else ""
        lines.append(f"- {o.name}: {about}{goal} (best known {o.best_known:.10g})")
    return "\n".join(lines)


def _scored_program(
    program: ProgramRecord,
    objectives: list[str],
    limit: int | None,
    what: str,
    compact: Compact | None = None,
) -> str:
    """The program's scores and its code (its evolved part, with `compact`, where it has one),
    clipped in the middle to `limit` characters (None: whole)."""
    scores = ", ".join(_score(program, name, raw=compact is None) for name in objectives)
    status = "" if program.status == "ok" else f" [{program.status}]"
    text = (compact.part(program.code) if compact else None) or program.code
    code, omitted = _clip(text, limit) if limit is not None else (text, 0)
    code = code if code.endswith("\n") else code + "\n"
    note = f"\n({omitted} lines in the middle of {what} are not shown.)" if omitted else ""
    fence = fence_for(code)
    return f"Scores{status}: {scores}\n{fence}python\n{code}{fence}{note}"


def _score(program: ProgramRecord, name: str, raw: bool = True) -> str:
    """`n26 0.9000 (raw 2.372384772)`; a record says so: `n26 1.0200 (record: +2.0% over best
    known; raw ...)`, since four decimals alone would hide a record by a hair. `raw=False`
    leaves the raw value out."""
    score = program.scores.get(name, 0.0)
    value = program.raw.get(name) if raw else None
    shown = None if value is None else f"raw {value:.10g}"
    notes = "; ".join(note for note in (record_note(score), shown) if note)
    return f"{name} {score:.4f} ({notes})" if notes else f"{name} {score:.4f}"


def _clip(code: str, limit: int) -> tuple[str, int]:
    """The code, or its first and last lines within `limit` characters, and how many lines
    were left out: the head holds the imports and signatures, the tail the final result."""
    code = code if code.endswith("\n") else code + "\n"
    if len(code) <= limit:
        return code, 0
    lines = code.splitlines(keepends=True)
    head: list[str] = []
    tail: list[str] = []
    used, low, high = 0, 0, len(lines) - 1
    while low <= high:
        # Alternate, two lines of head for each of tail: the top matters more.
        line, take_head = (
            (lines[low], True) if len(head) < 2 * len(tail) + 2 else (lines[high], False)
        )
        if used + len(line) > limit:
            break
        used += len(line)
        if take_head:
            head.append(line)
            low += 1
        else:
            tail.append(line)
            high -= 1
    omitted = len(lines) - len(head) - len(tail)
    marker = f"# ... {omitted} lines not shown ...\n"
    return "".join(head) + marker + "".join(reversed(tail)), omitted


def _feedback(program: ProgramRecord, limit: int) -> str:
    """The status, error and stderr tails of the program's evaluation, within `limit` chars."""
    parts: list[str] = []
    if program.status != "ok":
        parts.append(f"Status: {program.status}")
    if program.error:
        parts.append("Error: " + _tail(" ".join(program.error.split()), limit // 3))
    for call, stderr in _stderr_by_call(program.metrics):
        room = limit - sum(len(p) for p in parts)
        if room < 80:
            break
        text = _tail(stderr, room - 40)
        fence = fence_for(text)
        label = f"stderr ({call})" if call else "stderr"
        parts.append(f"{label}, last lines:\n{fence}\n{text}\n{fence}")
    return "\n".join(parts)


def _stderr_by_call(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    # Artifacts are keyed by call ({"n26": {"stderr": ...}}); a problem with one call may
    # also store a flat {"stderr": ...}.
    artifacts = metrics.get("artifacts") if isinstance(metrics, Mapping) else None
    if not isinstance(artifacts, Mapping):
        return []
    if isinstance(artifacts.get("stderr"), str):
        found = [("", artifacts["stderr"])]
    else:
        found = [
            (str(call), value["stderr"])
            for call, value in artifacts.items()
            if isinstance(value, Mapping) and isinstance(value.get("stderr"), str)
        ]
    return [(call, text.strip()) for call, text in found if text.strip()]


def _tail(text: str, limit: int) -> str:
    """The end of `text` within `limit` characters, from a line start when one is near."""
    if len(text) <= limit:
        return text
    cut = text[len(text) - max(0, limit - 4) :]
    newline = cut.find("\n")
    if 0 <= newline < len(cut) // 2:
        cut = cut[newline + 1 :]
    return "... " + cut


def _task(problem: Problem, candidates: int) -> str:
    spread = _spread(problem, candidates)
    each = "each candidate" if candidates > 1 else "the candidate"
    plural = "s" if candidates > 1 else ""
    if problem.edits:
        example = "\n".join(
            [
                format_full(1, "...a complete program..."),
                format_edits(min(2, candidates), [_EXAMPLE_EDIT]),
            ]
        )
        form = (
            f"Make {each} either a complete program in a ```python block, or edits to the "
            "current program as SEARCH/REPLACE blocks whose SEARCH lines are copied exactly "
            "from it."
        )
    else:
        # Programs short enough to rewrite whole: one form, which a small model copies right,
        # shown as the seed's imports and `entry` header, so the change lands in `entry`.
        example = "\n".join(
            format_full(i, _skeleton(problem, f"...candidate {i}'s own new body..."))
            for i in range(1, min(2, candidates) + 1)
        )
        form = (
            f"Make {each} a complete program in a ```python block. Only `{problem.entry}` "
            "is scored: change what it computes (a new docstring or a function it never "
            "calls leaves it a copy)."
        )
    return (
        "# Your task\n\n"
        f"Write {candidates} candidate program{plural} that improve on the current "
        f"program. Make each one a genuinely different approach, not a variation of the "
        f"others; a copy of the current program scores nothing.{spread} Every program must "
        f"define `{problem.entry}` as the problem states.\n\n"
        f"Put candidate i between <candidate_i> and </candidate_i> (i = 1..{candidates}). "
        f"{form} For example:\n\n"
        f"{example}\n\n"
        "Think briefly first if it helps; write nothing after the last candidate."
    )


def _spread(problem: Problem, candidates: int) -> str:
    """The sentence asking for candidates that differ in the objectives they excel at."""
    names = [o.name for o in problem.objectives]
    if len(names) > 1 and candidates > 1:
        return (
            f" A set whose members excel at different objectives ({', '.join(names)}) is worth "
            "more than near copies."
        )
    return ""


def _compact_task(problem: Problem, candidates: int, compact: Compact) -> str:
    """The ask for `candidates` parts in the compact form, each alone in its tags."""
    what = compact.what
    spread = _spread(problem, candidates)
    shown = compact.sketches or tuple(
        f"...candidate {i}'s {what}..." for i in range(1, min(2, candidates) + 1)
    )
    example = "\n".join(
        f"<candidate_{i}>\n{sketch}\n</candidate_{i}>"
        for i, sketch in enumerate(shown[:candidates], start=1)
    )
    plural = "s" if candidates > 1 else ""
    how = (
        f"{compact.advice} The current {what} again scores nothing.{spread}"
        if compact.advice
        else f"Make each one a genuinely different form, not a variation of the others; the "
        f"current {what} again scores nothing.{spread}"
    )
    return (
        "# Your task\n\n"
        f"Write {candidates} {what}{plural} that improve on the current {what}. {how}\n\n"
        f"Put candidate i between <candidate_i> and </candidate_i> (i = 1..{candidates}), the "
        f"{what} alone, no code fence, nothing else. For example:\n\n"
        f"{example}\n\n"
        "Write nothing before the first candidate or after the last."
    )


def _skeleton(problem: Problem, body: str) -> str:
    """The seed program's imports and the header of its `entry` function, with `body` in place
    of the function's body; "...a complete program..." when the seed has no such function."""
    try:
        tree = ast.parse(problem.seed_program)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    lines = problem.seed_program.splitlines()
    imports = [
        ast.get_source_segment(problem.seed_program, s) or ""
        for s in tree.body
        if isinstance(s, (ast.Import, ast.ImportFrom))
    ]
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == problem.entry:
            header = lines[statement.lineno - 1 : statement.body[0].lineno - 1]
            indent = " " * statement.body[0].col_offset
            return "\n".join([*imports, "", *header, indent + body]).lstrip("\n")
    return "...a complete program..."


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else str(i + 1)
