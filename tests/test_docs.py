"""The README stays short, names every `vpo` command, and no relative link in it or in docs/ is
broken; the project carries its licence. The commands are read from the real parser's `--help`,
in a subprocess, so the test does not depend on how the CLI's modules are laid out."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
README_LIMIT = 12 * 1024  # bytes; the README is the front page, details live in docs/

LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def vpo_help(*args: str) -> str:
    """`vpo ARGS --help` as a user runs it: the console script beside this interpreter, or the
    module where no script is installed."""
    script = Path(sys.executable).with_name("vpo")
    if not script.exists():
        found = shutil.which("vpo")
        script = Path(found) if found else None
    command = [str(script)] if script else [sys.executable, "-m", "harness.cli"]
    done = subprocess.run(
        [*command, *args, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, f"vpo {' '.join(args)} --help failed: {done.stderr.strip()}"
    return done.stdout


def subcommands(help_text: str) -> list[str]:
    """The choices of the first `{a,b,c}` group in argparse's usage, [] when there is none."""
    found = re.search(r"\{([\w,-]+)\}", help_text)
    return found.group(1).split(",") if found else []


@pytest.fixture(scope="module")
def commands() -> dict[str, list[str]]:
    """Each `vpo` subcommand with its own subcommands (`db` -> stats, top, ...)."""
    top = subcommands(vpo_help())
    assert top, "vpo --help lists no subcommands"
    return {name: subcommands(vpo_help(name)) for name in top}


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; move detail to docs/"


def test_readme_names_every_command(commands: dict[str, list[str]]) -> None:
    text = README.read_text()
    missing = [f"vpo {name}" for name in commands if not re.search(rf"\bvpo {name}\b", text)]
    for name, subs in commands.items():
        lines = [line for line in text.splitlines() if re.search(rf"\bvpo {name}\b", line)]
        missing += [
            f"vpo {name} {sub}"
            for sub in subs
            if not any(re.search(rf"(?<![\w-]){re.escape(sub)}(?![\w-])", line) for line in lines)
        ]
    assert not missing, f"README.md does not mention: {', '.join(missing)}"


def test_readme_starts_with_the_two_commands() -> None:
    text = README.read_text()
    first_block = FENCE.search(text)
    assert first_block, "README.md has no code block"
    assert "make demo" in first_block.group(0) and "make test" in first_block.group(0)
    before = [line for line in text[: first_block.start()].splitlines() if line.strip()]
    assert len(before) <= 1 and all(line.startswith("# ") for line in before), (
        "README.md must open with `make demo` and `make test`, before any prose"
    )


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"


def test_docs_are_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(prose(README.read_text()))
    }
    orphans = [p.name for p in markdown_files()[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages not linked from README.md: {', '.join(orphans)}"


def test_licence_matches_the_package() -> None:
    licence = ROOT / "LICENSE"
    assert licence.exists(), "LICENSE is missing"
    text = licence.read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text, "LICENSE is not the full Apache 2.0 text"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    declared = declared["text"] if isinstance(declared, dict) else declared
    assert declared == "Apache-2.0", f"pyproject.toml declares {declared!r}, LICENSE is Apache-2.0"


LAYOUT = ROOT / "docs" / "layout.md"
SECTION = re.compile(r"^`(harness/(?:[a-z_]+/)?)`\s*$")
ENTRY = re.compile(r"^- `(\w+/?)`", re.M)


def layout_sections() -> dict[str, str]:
    """docs/layout.md's sections on harness/, by folder: `harness/` and `harness/<room>/`."""
    parts = re.split(r"^## ", LAYOUT.read_text(), flags=re.M)[1:]
    sections = {}
    for part in parts:
        heading, _, body = part.partition("\n")
        if match := SECTION.match(heading):
            sections[match.group(1)] = body
    return sections


def folder_entries(folder: Path) -> set[str]:
    """What a harness folder holds: its modules, and its sub-folders as `name/`; for harness/
    itself, the modules beside the rooms."""
    modules = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    if folder.name == "harness":
        return modules
    folders = {f"{p.name}/" for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return modules | folders


def test_layout_has_a_section_per_room() -> None:
    rooms = {f"harness/{p.parent.name}/" for p in (ROOT / "harness").glob("*/__init__.py")}
    assert set(layout_sections()) == rooms | {"harness/"}


@pytest.mark.parametrize("section", sorted(layout_sections()))
def test_layout_names_every_module_and_only_those(section: str) -> None:
    named = ENTRY.findall(layout_sections()[section])
    assert len(named) == len(set(named)), f"docs/layout.md names one twice in {section}"
    there = folder_entries(ROOT / section)
    assert set(named) == there, (
        f"docs/layout.md, {section}: missing {sorted(there - set(named))}, "
        f"not there {sorted(set(named) - there)}"
    )


@pytest.mark.parametrize("section", sorted(set(layout_sections()) - {"harness/"}))
def test_layout_repeats_each_rooms_map(section: str) -> None:
    """The room's `May import:` line, word for word as its `__init__` has it."""
    init = (ROOT / section / "__init__.py").read_text()
    doc = ast.get_docstring(ast.parse(init)) or ""
    line = next(line.strip() for line in doc.splitlines() if line.startswith("May import:"))
    assert f"\n{line}\n" in layout_sections()[section], f"docs/layout.md, {section}: {line}"
