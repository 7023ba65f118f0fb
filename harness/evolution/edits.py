"""SEARCH/REPLACE edits to a parent program: how a candidate that changes a few lines is
written (`format_edits`), read (`parse_edits`) and applied (`apply_edits`). An edit's SEARCH
matches the first place its lines occur exactly, else the first place they occur ignoring
indentation and trailing spaces (the replacement is then re-indented to the parent's
indentation); one edit that cannot be read or applied is an EditError naming it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

MAX_EDITS = 64  # per candidate; each edit scans the whole parent


class Edit(NamedTuple):
    """Whole lines to find and the lines that replace them; a final newline is optional.

    `replace` "" deletes the searched lines; "\n" replaces them with one blank line.
    """

    search: str
    replace: str


def format_edits(index: int, edits: Sequence[Edit]) -> str:
    """Candidate `index` as SEARCH/REPLACE edits, in the format `parse_completion` reads."""
    blocks = [
        "<<<<<<< SEARCH\n"
        + "".join(line + "\n" for line in _lines(e.search))
        + "=======\n"
        + "".join(line + "\n" for line in _lines(e.replace))
        + ">>>>>>> REPLACE\n"
        for e in edits
    ]
    return f"<candidate_{index}>\n" + "".join(blocks) + f"</candidate_{index}>"


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


_SEARCH = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH[ \t]*$", re.MULTILINE)
_DIVIDER = re.compile(r"^[ \t]*={5,9}[ \t]*$")
_REPLACE = re.compile(r"^[ \t]*>{5,9}[ \t]*REPLACE[ \t]*$")


def has_edits(body: str) -> bool:
    return _SEARCH.search(body) is not None


class EditError(ValueError):
    """An edit that cannot be read or applied; the message starts with "edit N:"."""


def parse_edits(body: str) -> list[Edit]:
    """The SEARCH/REPLACE blocks of one candidate; text outside the blocks is ignored.

    Raises EditError ("edit N: ...") for a block that is not closed or not divided.
    """
    edits: list[Edit] = []
    search: list[str] | None = None
    replace: list[str] | None = None
    for line in body.split("\n"):
        if search is None:
            if _SEARCH.match(line):
                search = []
        elif replace is None:
            if _DIVIDER.match(line):
                replace = []
            elif _SEARCH.match(line) or _REPLACE.match(line):
                raise EditError(f"edit {len(edits) + 1}: no ======= between SEARCH and REPLACE")
            else:
                search.append(line)
        elif _REPLACE.match(line):
            edits.append(Edit(_text(search), _text(replace)))
            if len(edits) > MAX_EDITS:
                raise EditError(f"more than {MAX_EDITS} edits; rewrite the program instead")
            search = replace = None
        elif _SEARCH.match(line):
            raise EditError(f"edit {len(edits) + 1}: no >>>>>>> REPLACE before the next SEARCH")
        else:
            replace.append(line)
    if search is not None:
        raise EditError(f"edit {len(edits) + 1}: truncated, no >>>>>>> REPLACE")
    return edits


def apply_edits(parent: str, edits: Sequence[Edit]) -> str:
    """The parent with each edit applied in turn; raises EditError naming the edit that failed."""
    lines = parent.split("\n")
    for number, edit in enumerate(edits, 1):
        search, replace = _lines(edit.search), _lines(edit.replace)
        if not any(line.strip() for line in search):
            raise EditError(f"edit {number}: empty SEARCH")
        at = _find(lines, search, _exact)
        if at is not None:
            lines[at : at + len(search)] = replace
            continue
        # Blank lines around the SEARCH text are the likeliest mismatch; the replacement
        # loses as many, no more, so an intended blank line survives.
        lead, trail = _blank_edges(search)
        search = search[lead : len(search) - trail]
        replace_lead, replace_trail = _blank_edges(replace)
        replace = replace[min(lead, replace_lead) : len(replace) - min(trail, replace_trail)]
        at = _find(lines, search, _loose)
        if at is None:
            raise EditError(f"edit {number}: SEARCH text not found in the parent")
        matched = lines[at : at + len(search)]
        lines[at : at + len(search)] = _reindent(replace, search, matched)
    return "\n".join(lines)


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _exact(line: str) -> str:
    return line


def _loose(line: str) -> str:
    return line.strip()


def _find(lines: list[str], search: list[str], key: Callable[[str], str]) -> int | None:
    """Index of the first line where `search` occurs in `lines`, comparing key(line)."""
    # One substring search over the joined lines (lines hold no "\n"), not a slice compare
    # at every line: that is quadratic when a long SEARCH nearly matches everywhere.
    haystack = "\n" + "\n".join(map(key, lines)) + "\n"
    at = haystack.find("\n" + "\n".join(map(key, search)) + "\n")
    return None if at < 0 else haystack.count("\n", 0, at)


def _blank_edges(lines: list[str]) -> tuple[int, int]:
    """How many blank lines lead and trail `lines`."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return start, len(lines) - end


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _reindent(replace: list[str], search: list[str], matched: list[str]) -> list[str]:
    """Move the replacement by the indentation difference between the SEARCH text and the
    parent lines it matched, so a block the model dedented lands at the parent's depth."""
    model = next((_indent(s) for s in search if s.strip()), "")
    actual = next((_indent(p) for p in matched if p.strip()), "")
    if model == actual:
        return replace
    shift = len(actual.expandtabs(4)) - len(model.expandtabs(4))
    moved = []
    for line in replace:
        if not line.strip():
            moved.append("")
        elif line.startswith(model):
            moved.append(actual + line[len(model) :])
        else:
            width = max(0, len(_indent(line).expandtabs(4)) + shift)
            moved.append(" " * width + line.lstrip(" \t"))
    return moved
