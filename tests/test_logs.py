"""What `vpo` says: levels on stderr (-v, -q) and the log file a long command leaves behind."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.config import logs

FIXTURE = Path(__file__).parent / "data" / "before-alembic.db"


@pytest.fixture(autouse=True)
def fresh_logging() -> None:
    logs.configure(0)


@pytest.mark.parametrize(
    ("verbosity", "shown"),
    [(1, ["debug", "info", "warning"]), (0, ["info", "warning"]), (-1, ["warning"]), (-2, [])],
)
def test_levels_on_stderr(
    verbosity: int, shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(verbosity)
    logger = logging.getLogger("harness.somewhere")
    logger.debug("debug")
    logger.info("info")
    logger.warning("warning")
    assert capsys.readouterr().err.split() == shown


def test_the_log_file_holds_the_command_progress_and_messages_with_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure(0, "run circle_packing --db runs/x.db")
    path = logs.attach_file(str(tmp_path / "x.db"))
    assert path == tmp_path / "x.log"
    logs.say("iteration 1/3 | best n26 0.9")
    logging.getLogger("harness.store").warning("migrated x")
    out, err = capsys.readouterr()
    assert out == "iteration 1/3 | best n26 0.9\n"
    assert err == "migrated x\n"  # the progress line is not repeated on stderr
    lines = path.read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "$ vpo run circle_packing --db runs/x.db",
        "iteration 1/3 | best n26 0.9",
        "migrated x",
    ]
    assert lines[2].split()[2] == "WARNING"


def test_where_the_log_file_goes(tmp_path: Path) -> None:
    assert logs.log_file_for("runs/a.db", None) == Path("runs/a.log")
    assert logs.log_file_for("runs/a.db", tmp_path) == tmp_path / "a.log"
    url = "postgresql://vpo@db.lab:5432/campaigns?sslmode=require"
    assert logs.log_file_for(url, None) == Path("runs/campaigns.log")
    assert logs.log_file_for(url, tmp_path) == tmp_path / "campaigns.log"


def test_a_crash_leaves_its_traceback_in_the_log_and_one_line_on_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An internal error is a bug, which no input causes on purpose: one is raised inside
    `vpo train --db` once the database is open."""
    import harness.cli.train as train_command

    database = tmp_path / "campaign.db"
    shutil.copy(FIXTURE, database)

    def broken(*_args: object) -> int:
        raise RuntimeError("the trainer fell over")

    monkeypatch.setattr(train_command, "_train_offline", broken)
    monkeypatch.delenv("VPO_DEBUG", raising=False)
    status = main(["train", "--db", str(database), "--out", str(tmp_path / "model"), "-qq"])
    assert status == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "vpo: internal error: RuntimeError: the trainer fell over "
        "(set VPO_DEBUG=1 to see the traceback)"
    ]
    text = (tmp_path / "campaign.log").read_text()
    assert f"$ vpo train --db {database}" in text
    assert "Traceback (most recent call last)" in text
    assert 'raise RuntimeError("the trainer fell over")' in text


def test_vpo_run_logs_beside_its_database_and_prints_each_progress_line_once(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "run.db"
    run = [
        "run", "circle_packing", "--db", str(db), "--model", tiny_model,
        "--backend", "transformers", "--iterations", "2", "--concurrency", "1",
        "-G", "2", "-m", "2", "--max-tokens", "16", "--workers", "2",
    ]  # fmt: skip
    assert main(run) == 0
    out, err = capsys.readouterr()
    progress = [line for line in out.splitlines() if line.startswith("iteration ")]
    assert [line.split(" |")[0] for line in progress] == ["iteration 1/2", "iteration 2/2"]
    assert "iteration " not in err
    text = (tmp_path / "run.log").read_text()
    assert f"$ vpo {' '.join(run)}" in text
    assert f"campaign 'circle_packing' created in {db}" in text
    for line in progress:
        assert line in text
    # Resumed, the same file goes on.
    assert main([*run[:9], "3", *run[10:]]) == 0
    capsys.readouterr()
    again = (tmp_path / "run.log").read_text()
    assert again.startswith(text) and "resumed from" in again and "iteration 3/3" in again
