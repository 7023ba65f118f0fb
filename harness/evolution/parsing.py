"""Extract the candidates of one completion: full programs or SEARCH/REPLACE edits to the parent.

The expected answer (the prompt asks for it, `format_full` and `format_edits` write it):

    <candidate_1>
    ```python
    a whole program
    ```
    </candidate_1>
    <candidate_2>
    <<<<<<< SEARCH
    lines copied from the parent
    =======
    the lines that replace them
    >>>>>>> REPLACE
    </candidate_2>

Completions are untrusted model output and often malformed. `parse_completion` never raises: it
returns one `ParsedCandidate` per candidate asked for, each with code or a one-line reason. The
rules, in the order they apply:

- Only the first `MAX_COMPLETION_CHARS` characters are read; a leading, closed
  `<think>...</think>` is dropped (a reasoning model drafts its answers there).
- Tags are tolerant of case and spacing (`<Candidate 2>`); numbers outside 1..candidates are
  ignored.
- A candidate runs from its opening tag to the next tag of any kind. It is complete when that
  tag is its own closing tag, and is still used when it is another tag (the model moved on and
  forgot to close). When its number opens several times, the first complete one wins, else
  the last one: a tag mentioned while reasoning does not shadow the real answer.
- A candidate that runs to the end of the completion is rejected as "truncated": generation
  stopped mid-answer, and half a program is more likely to fail than to teach anything.
- Tags inside a closed fenced code block are code, not structure, so a program that contains
  the text `</candidate_1>` stays whole. Sloppy fences (one left open) would then swallow the
  following tags, so the completion is also read ignoring fences, and the reading with more
  usable candidates wins (fence-aware on ties).
- A candidate with a `<<<<<<< SEARCH` line is a list of edits, applied in order to the parent:
  each SEARCH matches the first place its lines occur exactly, else the first place they occur
  ignoring indentation and trailing spaces (the replacement is then re-indented to the
  parent's indentation); one failed edit rejects the candidate, since a partial edit is not
  the program the model meant. A full program that itself holds a `<<<<<<< SEARCH` line
  reads as edits: the two cannot be told apart.
- Otherwise the candidate is a full program: the longest fenced block in it, the rest of the
  text after an opening fence that never closes (the closing tag ended it), or the raw text.
- No tags at all, as small models often write: SEARCH/REPLACE blocks, or else one closed
  fenced python block, become candidate 1. Several untagged code blocks are rejected: which
  ones are candidates would be a guess.
"""

from __future__ import annotations

import re
import textwrap
from bisect import bisect_right
from dataclasses import dataclass
from typing import Literal, NamedTuple

from harness.evolution.edits import EditError, apply_edits, has_edits, parse_edits

MAX_COMPLETION_CHARS = 200_000  # ~50k tokens; more is a runaway generation
MAX_CODE_CHARS = 50_000  # per candidate program, after edits

Kind = Literal["full", "edit", "none"]


@dataclass(frozen=True)
class ParsedCandidate:
    """Candidate `index` (1..candidates); `code` is None exactly when `error` says why."""

    index: int
    code: str | None
    kind: Kind
    error: str | None


def normalise_code(code: str) -> str:
    """LF line ends, no trailing spaces or tabs, no leading/trailing blank lines, one final LF.

    Only layout noise goes, the noise `records.code_hash` ignores too, so the hash of the
    normalised code equals the hash of the original.
    """
    lines = [line.rstrip(" \t") for line in _lf(code).split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    start = 0
    while start < len(lines) and not lines[start]:
        start += 1
    return "\n".join(lines[start:]) + "\n" if start < len(lines) else ""


def fence_for(code: str) -> str:
    """A backtick fence longer than any backtick run in `code`, so the code cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def format_full(index: int, code: str) -> str:
    """Candidate `index` as a whole program, in the format `parse_completion` reads."""
    fence = fence_for(code)
    body = code if code.endswith("\n") else code + "\n"
    return f"<candidate_{index}>\n{fence}python\n{body}{fence}\n</candidate_{index}>"


def parse_completion(
    text: str,
    candidates: int,
    parent_code: str,
    *,
    max_chars: int = MAX_COMPLETION_CHARS,
    max_code_chars: int = MAX_CODE_CHARS,
) -> list[ParsedCandidate]:
    """Candidates 1..`candidates` from one completion, all of them; never raises on any text."""
    if candidates <= 0:
        return []
    if not text.strip():
        return [_none(index, "empty completion") for index in range(1, candidates + 1)]
    text = _drop_thinking(_lf(text[:max_chars]))
    parent = _lf(parent_code)
    fences = _fenced_blocks(text)
    tags = _tags(text)
    aware = _outside(tags, [b for b in fences if b.closed])
    best = _read(text, candidates, parent, aware, fences, max_code_chars)
    if len(aware) != len(tags):
        lenient = _read(text, candidates, parent, tags, fences, max_code_chars)
        if _usable(lenient, tags) > _usable(best, aware):
            best = lenient
    return best


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _usable(parsed: list[ParsedCandidate], tags: list[_Tag]) -> tuple[int, bool]:
    # A reading that found tags beats the no-tag fallback with as many candidates: the
    # fallback may have taken a whole tagged answer wrapped in one fence as "the program".
    return sum(c.code is not None for c in parsed), bool(tags)


# -- structure: tags, fences, thinking ---------------------------------------------------------

# Bounded repeats only: `\s*(/?)\s*` backtracks quadratically on a long run of spaces.
_TAG = re.compile(r"<[ \t]{0,3}(/?)[ \t]{0,3}candidate[ _-]?(\d{1,6})[ \t]{0,3}>", re.IGNORECASE)
_FENCE = re.compile(r"^[ \t]*(`{3,})([^`\n]*)$", re.MULTILINE)
_PYTHON_INFO = {"", "python", "py", "python3"}


class _Tag(NamedTuple):
    start: int
    end: int
    closing: bool
    number: int


class _Block(NamedTuple):
    start: int  # the opening fence line
    end: int  # past the closing fence line, or the end of the text when never closed
    code_start: int
    code_end: int
    info: str
    closed: bool


def _drop_thinking(text: str) -> str:
    # Only a leading block: a reasoning model opens with it, while `<think>` further on may
    # be a string inside a program.
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        end = stripped.find("</think>")
        if end >= 0:
            return stripped[end + len("</think>") :]
    return text


def _tags(text: str) -> list[_Tag]:
    return [
        _Tag(match.start(), match.end(), bool(match.group(1)), int(match.group(2)))
        for match in _TAG.finditer(text)
    ]


def _outside(tags: list[_Tag], blocks: list[_Block]) -> list[_Tag]:
    """The tags that are not inside one of the (sorted, disjoint) blocks."""
    starts = [b.start for b in blocks]
    kept = []
    for tag in tags:
        i = bisect_right(starts, tag.start) - 1
        if i < 0 or tag.start >= blocks[i].end:
            kept.append(tag)
    return kept


def _fenced_blocks(text: str) -> list[_Block]:
    """Fenced code blocks in order, paired as CommonMark does: a closing fence is backticks
    only, at least as many as the opening one; the last may be left open."""
    end = len(text)
    blocks: list[_Block] = []
    opening: re.Match[str] | None = None
    for fence in _FENCE.finditer(text):
        if opening is None:
            opening = fence
        elif len(fence.group(1)) >= len(opening.group(1)) and not fence.group(2).strip():
            blocks.append(_block(text, opening, fence.start(), fence.end(), closed=True))
            opening = None
    if opening is not None:
        blocks.append(_block(text, opening, end, end, closed=False))
    return blocks


def _block(text: str, opening: re.Match[str], code_end: int, end: int, closed: bool) -> _Block:
    code_start = min(opening.end() + 1, code_end)  # past the newline ending the fence line
    info = opening.group(2).strip().lower()
    return _Block(opening.start(), end, code_start, max(code_start, code_end), info, closed)


# -- candidates --------------------------------------------------------------------------------


def _read(
    text: str,
    candidates: int,
    parent: str,
    tags: list[_Tag],
    fences: list[_Block],
    max_code_chars: int,
) -> list[ParsedCandidate]:
    if not tags:
        return _untagged(text, candidates, parent, fences, max_code_chars)
    # Each opening tag's span: up to the next tag of any kind, and how it ended.
    spans: dict[int, list[tuple[int, int, str]]] = {}
    for i, tag in enumerate(tags):
        if tag.closing or not 1 <= tag.number <= candidates:
            continue
        after = tags[i + 1] if i + 1 < len(tags) else None
        if after is None:
            ending = "eof"
        elif after.closing and after.number == tag.number:
            ending = "closed"
        else:
            ending = "next"
        spans.setdefault(tag.number, []).append(
            (tag.end, after.start if after else len(text), ending)
        )
    parsed = []
    for index in range(1, candidates + 1):
        found = spans.get(index)
        if not found:
            parsed.append(_none(index, f"no <candidate_{index}> in the completion"))
            continue
        closed = [s for s in found if s[2] == "closed"]
        # Without a closed one, the last opening is the real attempt (earlier ones are
        # mentions while reasoning); when it runs to the end, generation stopped inside it.
        start, end, ending = closed[0] if closed else found[-1]
        if ending == "eof" and not _complete(text[start:end]):
            parsed.append(_none(index, f"truncated: <candidate_{index}> is never closed"))
        else:
            parsed.append(_candidate(index, text[start:end], parent, max_code_chars))
    return parsed


def _untagged(
    text: str, candidates: int, parent: str, fences: list[_Block], max_code_chars: int
) -> list[ParsedCandidate]:
    python = [b for b in fences if b.info in _PYTHON_INFO]
    if has_edits(text):
        first = _edited(1, text, parent, max_code_chars)
        rest = "no candidate tags; the SEARCH/REPLACE edits were taken as candidate 1"
    elif len(python) == 1 and python[0].closed:
        code = text[python[0].code_start : python[0].code_end]
        first = _full(1, code, max_code_chars)
        rest = "no candidate tags; the one code block was taken as candidate 1"
    else:
        if len(python) == 1:
            reason = "truncated: no candidate tags and the code block is never closed"
        elif python:
            reason = f"no candidate tags and {len(python)} code blocks: cannot tell them apart"
        else:
            reason = "no <candidate_1> tags and no code block in the completion"
        return [_none(i, reason) for i in range(1, candidates + 1)]
    return [first, *(_none(i, rest) for i in range(2, candidates + 1))]


def _complete(body: str) -> bool:
    """A last candidate without its closing tag is whole when its code is: a closed code block
    or a finished SEARCH/REPLACE edit (small models often stop there, forgetting the tag)."""
    if has_edits(body):
        return body.rstrip().endswith(">>>>>>> REPLACE")
    return any(block.closed for block in _fenced_blocks(body))


def _candidate(index: int, body: str, parent: str, max_code_chars: int) -> ParsedCandidate:
    if has_edits(body):
        return _edited(index, body, parent, max_code_chars)
    blocks = _fenced_blocks(body)
    closed = [b for b in blocks if b.closed]
    if closed:
        block = max(closed, key=lambda b: b.code_end - b.code_start)
        return _full(index, body[block.code_start : block.code_end], max_code_chars)
    if blocks:  # the closing tag ended the candidate, so the open fence holds all of it
        return _full(index, body[blocks[0].code_start :], max_code_chars)
    return _full(index, body, max_code_chars)


def _full(index: int, code: str, max_code_chars: int) -> ParsedCandidate:
    if len(code) > 4 * max_code_chars:  # do not even normalise a runaway
        return ParsedCandidate(index, None, "full", _too_long(max_code_chars))
    # A whole program indented as a block (small models indent it under the tag) is dedented.
    code = normalise_code(textwrap.dedent(code))
    if not code:
        return ParsedCandidate(index, None, "none", "empty")
    if len(code) > max_code_chars:
        return ParsedCandidate(index, None, "full", _too_long(max_code_chars))
    return ParsedCandidate(index, code, "full", None)


def _none(index: int, reason: str) -> ParsedCandidate:
    return ParsedCandidate(index, None, "none", reason)


def _too_long(max_code_chars: int) -> str:
    return f"program longer than {max_code_chars} characters"


def _edited(index: int, body: str, parent: str, max_code_chars: int) -> ParsedCandidate:
    try:
        code = apply_edits(parent, parse_edits(body))
    except EditError as exc:
        return ParsedCandidate(index, None, "edit", str(exc))
    if len(code) > max_code_chars:
        return ParsedCandidate(index, None, "edit", _too_long(max_code_chars))
    code = normalise_code(code)
    if not code:
        return ParsedCandidate(index, None, "edit", "the edits leave an empty program")
    return ParsedCandidate(index, code, "edit", None)
