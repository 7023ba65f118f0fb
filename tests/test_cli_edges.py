"""The `vpo` command at its edges (issue 47): what a user trying it on a demo database met.
Each runs the command in process over the small real campaign of `conftest.fill_small_campaign`
(seed 1 -> A 2, B 3, C 4 failed -> D 5 with parent A and draft B)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.cli.parser import build_parser
from harness.observation import exports, views
from harness.records import CandidateRecord, Lineage, NewGroup, NewProgram, RolloutRecord
from harness.store import Store


@pytest.fixture(autouse=True)
def _piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output as a pipe gets it, whatever width the shell running the suite exported
    (`COLUMNS` set fixes rich's width, as a user's would)."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str, words: str) -> str:
    with pytest.raises(SystemExit) as exit:
        main(list(argv))
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vpo: error:"), err
    assert words in err and "Traceback" not in err, err
    return err


# 1. diff


def test_diff_of_two_programs_reads_like_git_diff(
    sqlite_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = sqlite_database
    change = run_json(capsys, "db", "diff", "--db", db, "2", "5")
    assert (change["from"], change["to"]) == (2, 5)
    assert change["diff"].startswith("--- program 2\n+++ program 5\n")
    assert "-    return 1\n+    return 11\n" in change["diff"]  # B's line added
    back = run_json(capsys, "db", "diff", "--db", db, "5", "2")
    assert back["diff"].startswith("--- program 5\n+++ program 2\n")
    assert "-    return 11\n+    return 1\n" in back["diff"]
    # One program: its parent is the old side.
    assert run_json(capsys, "db", "diff", "--db", db, "5")["diff"] == change["diff"]
    shown = printed(capsys, "db", "diff", "--db", db, "2", "5").splitlines()
    assert shown[:2] == ["--- program 2", "+++ program 5"]


# 2, 3. export


@pytest.mark.parametrize(
    ("name", "fmt", "kind"),
    [
        ("p.parquet", None, "parquet"),
        ("p.PARQUET", None, "parquet"),
        ("p.jsonl", None, "jsonl"),
        ("p.json", None, "jsonl"),
        ("p.txt", "parquet", "parquet"),  # a suffix that names no format takes --format
        ("p", "jsonl", "jsonl"),
        ("p.jsonl", "jsonl", "jsonl"),
    ],
)
def test_export_writes_the_format_its_suffix_names(
    sqlite_database: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    fmt: str | None,
    kind: str,
) -> None:
    out = tmp_path / "out" / name
    out.parent.mkdir()
    argv = ["db", "export", "--db", sqlite_database, "--out", str(out)]
    assert run_json(capsys, *argv, *(["--format", fmt] if fmt else []))["rows"] == 5
    data = out.read_bytes()
    if kind == "parquet":
        assert data.startswith(b"PAR1")
    else:
        assert [json.loads(line)["id"] for line in data.splitlines()] == [1, 2, 3, 4, 5]
    assert sorted(p.name for p in out.parent.iterdir()) == [name]


@pytest.mark.parametrize(
    ("name", "fmt", "words"),
    [
        ("p.csv", None, "CSV is not written"),
        ("p", None, "cannot tell the format of --out p from its suffix"),
        ("p.txt", None, "end it in .jsonl, .json or .parquet, or give --format"),
        ("p.parquet", "jsonl", "--format jsonl and --out p.parquet disagree"),
        ("p.jsonl", "parquet", "--format parquet and --out p.jsonl disagree"),
    ],
)
def test_export_refuses_a_format_it_cannot_tell_or_that_disagrees(
    sqlite_database: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    fmt: str | None,
    words: str,
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    argv = ["db", "export", "--db", sqlite_database, "--out", str(folder / name)]
    one_line_error(capsys, *argv, *(["--format", fmt] if fmt else []), words=words)
    assert list(folder.iterdir()) == []


def test_export_to_a_folder_is_a_one_line_error_and_leaves_nothing(
    sqlite_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out").mkdir()
    folder = tmp_path / "out" / "exports"
    folder.mkdir()
    for fmt in ([], ["--format", "parquet"]):
        argv = ["db", "export", "--db", sqlite_database, "--out", str(folder), *fmt]
        one_line_error(capsys, *argv, words=f"--out {folder} is a folder; name a file in it")
    assert list((tmp_path / "out").iterdir()) == [folder] and list(folder.iterdir()) == []


@pytest.mark.parametrize("name", ["p.jsonl", "p.parquet"])
def test_an_export_that_fails_half_way_leaves_nothing(
    sqlite_database: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    def broken(store: Store, campaign_id: int) -> object:
        yield {"id": 1}
        raise RuntimeError("the database went away")

    monkeypatch.setattr(exports, "_program_rows", broken)
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["db", "export", "--db", sqlite_database, "--out", str(folder / name)]) == 3
    assert "the database went away" in capsys.readouterr().err
    assert list(folder.iterdir()) == []


# 4. plot


def test_plot_into_a_file_is_a_one_line_error(
    sqlite_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "plots.png"
    file.write_bytes(b"mine")
    argv = ["db", "plot", "--db", sqlite_database, "--out", str(file)]
    one_line_error(capsys, *argv, words=f"--out {file} is a file; plot writes several PNG")
    assert file.read_bytes() == b"mine"


# 5. --db DIR


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["db", "stats"],
        ["db", "show", "1"],
        ["db", "export", "--out", "x.jsonl"],
        ["db", "upgrade"],
        ["ui"],
        ["config", "show", "circle_packing"],
        ["run", "circle_packing", "--iterations", "0"],
    ],
)
def test_a_folder_given_as_the_database_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    for db in (str(folder), f"sqlite:///{folder}"):
        one_line_error(capsys, *argv, "--db", db, words=f"{folder} is a folder, not a database")
    assert list(folder.iterdir()) == []


def test_a_file_in_the_way_of_a_new_database_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "runs"
    file.write_text("not a folder")
    db = str(file / "c.db")
    argv = ["run", "circle_packing", "--iterations", "0", "--db", db]
    one_line_error(capsys, *argv, words=f"cannot create a database in {file}: a file is in")


# 6. status of a copied database


def _campaign_with_a_policy_version(tmp_path: Path) -> tuple[Path, Path]:
    """The small campaign in runs/c.db with one policy version in runs/c.policies/c, as
    `vpo run` lays them out; (database, policy folder)."""
    from conftest import fill_small_campaign

    (tmp_path / "runs").mkdir()
    db = tmp_path / "runs" / "c.db"
    fill_small_campaign(str(db))
    folder = tmp_path / "runs" / "c.policies" / "c"
    (folder / "step-000001").mkdir(parents=True)
    (folder / "step-000001" / "adapter.bin").write_bytes(b"w" * 100)
    with Store.open(str(db)) as store:
        store.record_train_step(
            1, step=1, path=str(folder / "step-000001"), metrics={"loss": 0.1}, group_ids=[1]
        )
    return db, folder


def _copy_database(db: Path, to: Path) -> None:
    to.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", f"{to}{suffix}")


def test_status_of_a_copied_database_reports_the_policy_folder_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, original = _campaign_with_a_policy_version(tmp_path)
    where = run_json(capsys, "status", "--db", str(db))
    assert where["policy_folder"] == where["policy_folder_stored"] == str(original)
    assert where["policy_folder_note"] is None and where["policy_bytes"] == 100

    # Copied with its policy folder: the copy's versions, and the folder the database names.
    copy = tmp_path / "elsewhere" / "demo.db"
    _copy_database(db, copy)
    beside = tmp_path / "elsewhere" / "demo.policies" / "c"
    shutil.copytree(original, beside)
    (beside / "step-000002").mkdir()
    (beside / "step-000002" / "adapter.bin").write_bytes(b"w" * 50)
    moved = run_json(capsys, "status", "--db", str(copy))
    assert moved["policy_folder"] == str(beside)
    assert (moved["policy_versions_on_disk"], moved["policy_bytes"]) == (2, 150)
    assert moved["policy_folder_stored"] == str(original)
    assert moved["policy_folder_note"] == f"the database names {original}"
    table = printed(capsys, "status", "--db", str(copy))
    assert f"2, 150 B in {beside} (the database names {original})" in table

    # Copied alone: the original's folder, said to be so.
    alone = tmp_path / "alone" / "demo.db"
    _copy_database(db, alone)
    report = run_json(capsys, "status", "--db", str(alone))
    assert report["policy_folder"] == str(original) and report["policy_bytes"] == 100
    assert report["policy_folder_note"] == (
        f"beside the database this one was copied from; none at "
        f"{tmp_path / 'alone' / 'demo.policies' / 'c'}"
    )

    # The original gone too: nothing on disk, and the folder the database names.
    shutil.rmtree(original)
    report = run_json(capsys, "status", "--db", str(alone))
    assert report["policy_folder"] is None and report["policy_bytes"] is None
    assert report["policy_folder_note"] == f"the database names {original}, not on this machine"
    table = printed(capsys, "status", "--db", str(alone))
    assert f"none found: the database names {original}, not on this machine" in table


# 7. defaults in help


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def test_help_shows_each_default_and_no_default_that_is_none() -> None:
    helps = {p.prog: " ".join(p.format_help().split()) for p in _parsers(build_parser())}
    assert len(helps) > 20
    for prog, text in helps.items():
        for noise in ("default: None", "default: False", "default: True", "==SUPPRESS=="):
            assert noise not in text, (prog, noise)
    assert "-n N how many programs (default: 10)" in helps["vpo db top"]
    assert "--what WHAT programs or trajectories (default: programs)" in helps["vpo db export"]
    assert "--k K the largest k (default 30;" in helps["vpo db bestk"]  # said once, not twice
    assert "--seed SEED random seed (0)" in helps["vpo train"]  # a setting's own words
    assert "--lora-rank LORA_RANK default: 16" in helps["vpo warmup"]  # a flag without help
    lineage = helps["vpo db lineage"]
    assert f"(default: {views.DESCENDANT_DEPTH})" in lineage
    assert f"(default: {views.DESCENDANT_LIMIT})" in lineage


# 8. piped output


def test_piped_output_keeps_each_line_at_its_own_width(
    sqlite_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    long_line = "WIDE = '" + "w" * 300 + "'"
    with Store.open(sqlite_database) as store:
        wide = store.add_program(
            1, NewProgram(f"{long_line}\n\ndef f():\n    return 3\n", "ok", {}, {})
        )
    db = sqlite_database
    show = printed(capsys, "db", "show", "--db", db, str(wide))
    assert f"1 {long_line}\n2\n3 def f():\n" in show  # numbered, never wrapped
    diff = printed(capsys, "db", "diff", "--db", db, "1", str(wide))
    assert f"+{long_line}\n" in diff
    for text in (show, diff, printed(capsys, "db", "show", "--db", db, "5")):
        lines = text.splitlines()
        assert all(line == line.rstrip() for line in lines), [line for line in lines if line]
    table = printed(capsys, "db", "top", "--db", db)
    assert max(len(line) for line in table.splitlines()) < 120  # the table's own width


# 9. lineage


def test_lineage_lists_ancestors_and_descendants_with_scores(
    sqlite_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = sqlite_database
    seed = run_json(capsys, "db", "lineage", "--db", db, "1")
    assert [step["id"] for step in seed["path"]] == [1]
    assert seed["objectives"] == ["a", "b"]
    assert seed["path"][0]["scores"] == {"a": 0.5, "b": 0.5}
    below = [(d["below"], d["id"], d["parent_id"]) for d in seed["descendants"]]
    assert below == [(1, 2, 1), (1, 3, 1), (1, 4, 1), (2, 5, 2)]
    d = {d["id"]: d for d in seed["descendants"]}
    assert d[5]["scores"] == {"a": 0.95, "b": 0.2} and d[5]["generation"] == 2
    assert d[4]["status"] == "error" and d[2]["children"] == 1
    assert seed["descendants_cut"] is None

    # The dashboard's keys are kept, the ancestors now with scores.
    tree = run_json(capsys, "db", "lineage", "--db", db, "5")
    assert [step["id"] for step in tree["path"]] == [5, 2, 1] and tree["depth"] == 2
    assert {"from": 3, "to": 5, "kind": "draft"} in tree["edges"]
    assert tree["path"][1]["scores"] == {"a": 0.9, "b": 0.1} and tree["descendants"] == []

    shallow = run_json(capsys, "db", "lineage", "--db", db, "1", "--depth", "1")
    assert [d["id"] for d in shallow["descendants"]] == [2, 3, 4]
    assert shallow["descendants_cut"] == "1 program 2 generations down, and all below, not shown"
    few = run_json(capsys, "db", "lineage", "--db", db, "1", "-n", "2")
    assert [d["id"] for d in few["descendants"]] == [2, 3]
    assert few["descendants_cut"] == "more than 2 descendants; the first 2 shown"

    table = printed(capsys, "db", "lineage", "--db", db, "1", "-n", "2")
    assert "descendants of program 1: 2" in table and "0.900000" in table
    assert "more than 2 descendants; the first 2 shown (see --depth and -n)" in table
    assert "program 5 has no descendants" in printed(capsys, "db", "lineage", "--db", db, "5")


def test_lineage_reads_a_bounded_number_of_rows(sqlite_database: str) -> None:
    """A seed with 300 children and 300 grandchildren: `limit` programs are read, a handful
    of keyed statements whatever the campaign's size."""
    from sqlalchemy import event

    with Store.open(sqlite_database) as store:
        for i in range(300):
            child = store.add_program(
                1,
                NewProgram(f"x = {i}\n", "ok", {"a": 0.1, "b": 0.1}, {}),
                Lineage("migration", parent_id=1, island=1, generation=1),
            )
            store.add_program(
                1,
                NewProgram(f"y = {i}\n", "ok", {"a": 0.2, "b": 0.1}, {}),
                Lineage("migration", parent_id=child, island=1, generation=2),
            )
    statements = []
    with Store.open(sqlite_database, read_only=True) as store:
        event.listen(
            store.engine,
            "after_cursor_execute",
            lambda conn, cursor, statement, *_: statements.append(statement),
        )
        tree = views.lineage(store, 1, depth=4, limit=50)
    assert len(tree["descendants"]) == 50
    assert [d["id"] for d in tree["descendants"]] == sorted(d["id"] for d in tree["descendants"])
    assert tree["descendants_cut"] == "more than 50 descendants; the first 50 shown"
    assert len(statements) < 20
    # Children are read with a LIMIT; only counted (children_counts) without one.
    children = [s for s in statements if "program.parent_id IN" in s and "count(" not in s]
    assert children and all("LIMIT" in s for s in children)


# 10. show


def test_show_prints_the_completion_and_the_policy_version_that_sampled_it(
    sqlite_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = sqlite_database
    with Store.open(db) as store:
        version = store.record_train_step(1, step=1, path="p", metrics={}, group_ids=[1, 2])
        store.record_iteration(
            1,
            NewGroup(
                iteration=2,
                island=0,
                parent_id=5,
                draft_ids=(),
                prompt=[{"role": "user", "content": "improve"}],
                prompt_token_ids=[1],
                version=version,
                rollouts=[
                    RolloutRecord(
                        "I return 12 now.\n```python\ndef f():\n    return 12\n```\x1b[2J",
                        [1, 2],
                        None,
                        "stop",
                        "ok",
                        None,
                        [
                            CandidateRecord(
                                1,
                                "new",
                                NewProgram("def f():\n    return 12\n", "ok", {"a": 1.0}, {}),
                            )
                        ],
                    )
                ],
            ),
        )
    new = printed(capsys, "db", "show", "--db", db, "6")
    assert "; sampled by policy version 1\n" in new
    code, _, completion = new.partition("completion of rollout 0 (2 tokens, finish stop):\n")
    assert "2     return 12" in code
    assert completion.startswith("I return 12 now.\n```python\n")
    assert "\\x1b[2J" in completion and "\x1b" not in new
    assert run_json(capsys, "db", "show", "--db", db, "6")["policy_version"] == 1

    assert "sampled by policy version 0 (the starting weights)" in printed(
        capsys, "db", "show", "--db", db, "5"
    )
    seed = printed(capsys, "db", "show", "--db", db, "1")
    assert "completion" not in seed and "sampled by" not in seed
    assert run_json(capsys, "db", "show", "--db", db, "1")["policy_version"] is None
