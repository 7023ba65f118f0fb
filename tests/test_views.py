"""`vpo db` views over a small real database whose answers are known."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import read_only_folder

from harness.cli import main
from harness.records import NewGroup, NewProgram
from harness.store import Store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(["db", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_top_by_objective_weights_and_mean(database: str, capsys: pytest.CaptureFixture) -> None:
    db = str(database)
    by_a = run(capsys, "top", "--db", db, "--objective", "a")
    assert [row["id"] for row in by_a] == [5, 2, 1, 3]  # the failed program is not listed
    by_b = run(capsys, "top", "--db", db, "--weights", "0,1", "-n", "2")
    assert [row["id"] for row in by_b] == [3, 1]
    assert by_b[0]["value"] == pytest.approx(0.9)
    by_mean = run(capsys, "top", "--db", db, "-n", "1")
    assert by_mean[0]["id"] == 5 and by_mean[0]["value"] == pytest.approx(0.575)


def test_pareto_front(database: str, capsys: pytest.CaptureFixture) -> None:
    front = run(capsys, "pareto", "--db", str(database))
    assert sorted(row["id"] for row in front) == [1, 3, 5]  # A is beaten by D, C failed


def test_show_diff_and_lineage(database: str, capsys: pytest.CaptureFixture) -> None:
    db = str(database)
    shown = run(capsys, "show", "--db", db, "5")
    assert shown["parent_id"] == 2 and shown["scores"] == {"a": 0.95, "b": 0.2}
    assert shown["raw"]["a"] == pytest.approx(9.5) and shown["raw"]["b"] is None
    detail = shown["origin_detail"]
    assert detail["iteration"] == 1 and detail["draft_ids"] == [3] and detail["island"] == 1
    assert detail["trajectory"]["position"] == 0 and shown["candidate_index"] == 1
    assert run(capsys, "show", "--db", db, "1")["origin_detail"] is None  # the seed

    change = run(capsys, "diff", "--db", db, "5")
    assert change["from"] == 2 and "-    return 1" in change["diff"]
    assert "+    return 11" in change["diff"]
    # Two ids read as `git diff A B`: from A to B.
    between = run(capsys, "diff", "--db", db, "5", "3")
    assert (between["from"], between["to"]) == (5, 3)

    tree = run(capsys, "lineage", "--db", db, "5")
    assert tree["depth"] == 2 and [step["id"] for step in tree["path"]] == [5, 2, 1]
    assert tree["islands"] == [0, 1] and tree["drafts_shown"] == 1
    assert {"from": 3, "to": 5, "kind": "draft"} in tree["edges"]
    assert tree["path"][2]["children"] == 3  # the seed's: A, B, C


def test_export_programs_and_trajectories(
    database: str, hostile_code: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    db = str(database)
    out = tmp_path / "programs.jsonl"
    assert run(capsys, "export", "--db", db, "--out", str(out))["rows"] == 5
    programs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [p["id"] for p in programs] == [1, 2, 3, 4, 5]
    assert programs[3]["code"] == hostile_code and programs[3]["status"] == "error"

    out = tmp_path / "trajectories.jsonl"
    argv = ["export", "--db", db, "--what", "trajectories", "--out", str(out)]
    assert run(capsys, *argv)["rows"] == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["iteration"], r["position"]) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    assert rows[0]["objectives"] == ["a", "b"]
    assert rows[0]["rewards"] == [[0.9, 0.1], [0.1, 0.9]] and rows[0]["mask"] == [True, True]
    assert rows[1]["rewards"] == [[0.0, 0.0], [0.0, 0.0]] and rows[1]["mask"] == [True, False]
    assert rows[2]["draft_ids"] == [3] and rows[2]["prompt_token_ids"] == [7]
    assert rows[2]["token_ids"] == [1, 2, 3] and rows[2]["logprobs"] == [-0.1, -0.2, -0.3]


def test_tables_render_and_untrusted_text_stays_inert(
    database: str, capsys: pytest.CaptureFixture
) -> None:
    db = str(database)
    for argv in (["stats"], ["top"], ["pareto"], ["show", "4"], ["diff", "4"], ["lineage", "5"]):
        assert main(["db", *argv, "--db", db]) == 0
    printed = capsys.readouterr().out
    assert "<script>alert(1)</script>" in printed  # shown as text
    assert "\x1b" not in printed and "\\x1b[2J" in printed  # the ESC is shown, not obeyed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "99"], "no program 99"),
        (["top", "--weights", "1"], "--weights needs 2 numbers"),
        (["top", "--weights", "x,y"], "numbers separated by commas"),
        (["top", "--objective", "c"], "no objective 'c'"),
        (["diff", "1"], "has no parent"),
        (["show", "99999999999999999999"], "ids end at 2^63 - 1"),
        (["lineage", "9223372036854775808"], "ids end at 2^63 - 1"),
        (["diff", "5", "99999999999999999999"], "ids end at 2^63 - 1"),
        (["top", "-n", "99999999999999999999"], "-n is at most 1000000"),
        (["top", "--weights", "inf,1"], "--weights needs 2 numbers, finite and >= 0"),
        (["top", "--weights", "nan,1"], "--weights needs 2 numbers, finite and >= 0"),
        (["top", "--weights", "1e308,1e308"], "--weights needs 2 numbers, finite and >= 0"),
        (["top", "--weights=-1,2"], "--weights needs 2 numbers, finite and >= 0"),
        (["export", "--out", "x", "--format", "xml"], "jsonl or parquet"),
        (["export", "--out", "x", "--what", "groups"], "programs or trajectories"),
    ],
)
def test_bad_requests_are_one_line(
    database: str, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["db", *argv, "--db", str(database)])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_plots_are_written(database: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plots"
    files = run(capsys, "plot", "--db", str(database), "--out", str(out))["files"]
    names = sorted(Path(f).name for f in files)
    assert names == ["best.png", "iterations.png", "pareto_a_b.png", "progress.png", "training.png"]
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
    with pytest.raises(SystemExit):
        main(["db", "plot", "--db", str(database), "--out", str(out), "--pair", "a,c"])
    assert "--pair needs two of the objectives a, b" in capsys.readouterr().err


def test_the_training_plot_draws_every_stored_step_metric() -> None:
    from datetime import UTC, datetime

    from harness.observation.plots import training_panels
    from harness.records import PolicyVersion
    from trainer.train import StepMetrics

    metrics = StepMetrics(
        step=1, groups=1, rollouts=4, tokens=80, loss=0.1, policy_loss=0.1, kl=0.0,
        clip_fraction=0.0, mean_ratio=1.0, sampler_fraction=1.0, staleness=0.0,
        fresh_gap=None, grad_norm=0.5, trained=4, set_score=0.2, zero_std_fraction=0.0,
        diversity=0.1, seconds=1.0, tokens_per_second=80.0, advantage="vpo",
    ).as_dict()  # fmt: skip
    stored = [PolicyVersion(1, 1, 1, "p", metrics, datetime.now(UTC))]
    numbers = {k for k, v in metrics.items() if isinstance(v, int | float) and k != "step"}
    assert set(training_panels(stored)) == numbers
    assert {"loss", "kl", "grad_norm", "set_score", "diversity", "clip_fraction"} <= numbers
    assert training_panels([]) == []


def test_migrant_copies_are_listed_once(database: str, capsys: pytest.CaptureFixture) -> None:
    store = Store.open(database)
    store.record_iteration(
        1,
        NewGroup(
            iteration=2, island=0, parent_id=1, draft_ids=(), prompt=[], prompt_token_ids=None,
            rollouts=[],
        ),
        migrations=[(5, 2), (3, 3)],
    )  # fmt: skip
    assert [p.origin for p in store.programs(1)][-2:] == ["migration", "migration"]
    store.close()
    by_a = run(capsys, "top", "--db", database, "--objective", "a", "-n", "3")
    assert [row["id"] for row in by_a] == [5, 2, 1]
    by_mean = run(capsys, "top", "--db", database)
    assert [row["id"] for row in by_mean] == [5, 1, 2, 3]
    assert sorted(row["id"] for row in run(capsys, "pareto", "--db", database)) == [1, 3, 5]


def test_exports_load_in_hugging_face_datasets(
    database: str, hostile_code: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """What a user fine-tunes from: both exports, both formats, read by `datasets` itself."""
    import datasets

    db = str(database)
    for fmt in ("jsonl", "parquet"):
        files = {}
        for what in ("programs", "trajectories"):
            files[what] = tmp_path / f"{what}.{fmt}"
            argv = ["export", "--db", db, "--what", what, "--format", fmt]
            run(capsys, *argv, "--out", str(files[what]))
        builder = "json" if fmt == "jsonl" else "parquet"
        programs = datasets.load_dataset(
            builder, data_files=str(files["programs"]), split="train", cache_dir=str(tmp_path)
        )
        assert programs.num_rows == 5 and programs["id"] == [1, 2, 3, 4, 5]
        assert programs[3]["code"] == hostile_code
        assert programs[4]["scores"] == {"a": 0.95, "b": 0.2}
        trajectories = datasets.load_dataset(
            builder, data_files=str(files["trajectories"]), split="train", cache_dir=str(tmp_path)
        )
        assert trajectories.num_rows == 3
        first = trajectories[0]
        assert first["rewards"] == [[0.9, 0.1], [0.1, 0.9]] and first["mask"] == [True, True]
        assert first["token_ids"] == [1, 2, 3] and first["prompt_token_ids"] == [5, 6]
        assert trajectories[1]["mask"] == [True, False]


def test_a_record_above_the_best_known_shows_as_one(
    database: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scores are not clipped at 1: a program 20% over the best known value on `a` is the best
    and is marked as a record wherever the best programs are shown; one at 1.0 ties the best
    known value and is no record."""
    monkeypatch.setenv("COLUMNS", "200")  # rich tables one row a line
    with Store.open(database) as store:
        record = store.add_program(1, NewProgram("x = 6\n", "ok", {"a": 1.2, "b": 1.0}, {}))
    db = str(database)
    assert main(["status", "--db", db, "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    assert best["a"] == {
        "score": 1.2,
        "raw": None,
        "program_id": record,
        "record": "record: +20.0% over best known",
        "iteration": 0,  # no rollout wrote it: there from the start, like the seed
    }
    assert best["b"]["program_id"] == record and best["b"]["record"] is None
    assert run(capsys, "stats", "--db", db)["best"]["a"]["record"].startswith("record: +20.0%")
    top = run(capsys, "top", "--db", db, "--objective", "a", "-n", "2")
    assert [(row["id"], row["value"]) for row in top] == [(record, 1.2), (5, 0.95)]
    assert [row["id"] for row in run(capsys, "pareto", "--db", db)] == [record]

    assert main(["status", "--db", db]) == 0
    status = capsys.readouterr().out
    assert (
        f"1.200000 (record: +20.0% over best known; raw -, program {record}, iteration 0)" in status
    )
    assert f"1.000000 (raw -, program {record}, iteration 0)" in status
    assert main(["db", "top", "--db", db, "--objective", "a", "-n", "1"]) == 0
    assert "1.200000 (record: +20.0% over best known)" in capsys.readouterr().out
    assert main(["db", "show", "--db", db, str(record)]) == 0
    assert "a: 1.200000 (record: +20.0% over best known; raw None)" in capsys.readouterr().out
    files = run(capsys, "plot", "--db", db, "--out", str(tmp_path / "plots"))["files"]
    assert all(Path(f).stat().st_size > 0 for f in files)


def test_views_read_a_database_on_a_read_only_mount(
    sqlite_database: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No -wal or -shm can be created there and the journal mode cannot change: every view
    still answers, and `vpo status` too."""
    folder = Path(sqlite_database).parent
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path.with_name(tmp_path.name + "-out")
    out.mkdir()  # export writes into a folder that exists; it makes none
    with read_only_folder(folder) as view:
        db = str(view / Path(sqlite_database).name)
        assert run(capsys, "stats", "--db", db)["programs"] == 5
        assert [row["id"] for row in run(capsys, "top", "--db", db, "-n", "2")] == [5, 1]
        assert sorted(row["id"] for row in run(capsys, "pareto", "--db", db)) == [1, 3, 5]
        assert run(capsys, "show", "--db", db, "5")["parent_id"] == 2
        assert run(capsys, "lineage", "--db", db, "5")["depth"] == 2
        exported = run(capsys, "export", "--db", db, "--out", str(out / "p.jsonl"))
        assert exported["rows"] == 5
        assert main(["status", "--db", db, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["programs"] == 5
        assert main(["db", "show", "--db", db, "4"]) == 0  # tables render too
        assert "\\x1b[2J" in capsys.readouterr().out
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing was written


def test_views_on_a_read_only_mount_see_a_live_writer(
    sqlite_database: str, capsys: pytest.CaptureFixture
) -> None:
    """While a campaign writes the database elsewhere, its -wal and -shm exist: a reader on a
    read-only view of the folder reads through them and sees the newest commits."""
    folder = Path(sqlite_database).parent
    with read_only_folder(folder) as view:
        db = str(view / Path(sqlite_database).name)
        with Store.open(sqlite_database) as writer:
            writer.add_program(1, NewProgram("x = 1\n", "ok", {"a": 1.0, "b": 1.0}, {}))
            assert run(capsys, "stats", "--db", db)["programs"] == 6
            writer.add_program(1, NewProgram("x = 2\n", "ok", {"a": 0.0, "b": 0.0}, {}))
            assert run(capsys, "stats", "--db", db)["programs"] == 7
            assert run(capsys, "top", "--db", db, "-n", "1")[0]["id"] == 6


def test_a_read_only_mount_with_unread_commits_is_a_one_line_error(
    sqlite_database: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A -wal file with commits but no -shm (a copy taken mid-campaign): SQLite can read those
    commits only through a -shm file, which cannot be made there; reading without them would
    show an old database, so it is refused."""
    writer = sqlite3.connect(sqlite_database)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("UPDATE campaign SET status = 'stopped'")
    writer.commit()
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(sqlite_database, copy / "c.db")
    shutil.copy(f"{sqlite_database}-wal", copy / "c.db-wal")
    writer.close()
    with read_only_folder(copy) as view:
        with pytest.raises(SystemExit) as exit:
            main(["db", "stats", "--db", str(view / "c.db")])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "c.db-wal holds commits" in err
