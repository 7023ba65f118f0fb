"""What the `vpo` commands say, through stdlib logging: on stderr at a level, and in a log file
that a crashed run leaves behind.

Messages are records of the `harness`, `trainer` and `problems` loggers. On stderr each shows
as its message alone, as the commands printed it before: INFO and above by default, DEBUG with
`-v`, WARNING and above with `-q`, ERROR with `-qq`; a traceback never reaches the terminal.

The commands that run for long (`vpo run`, `vpo worker`, `vpo train --db`) also append every
record (DEBUG with `-v`) with its time and level to a log file beside the database (`runs/x.db`
-> `runs/x.log`), or in `--log-dir` (a PostgreSQL campaign writes there, by default `runs/`):
the command line first, then each progress line and training step as printed, warnings, and an
internal error with its traceback, which the terminal shows as one line.

    logs.configure(verbosity, command)   # once, from `vpo`'s flags
    logs.attach_file(store.where, log_dir)  # a long command, once it knows its database
    logs.say(line)                        # a line of output: stdout, and the file
    logs.progress(line)                   # a line the command printed itself: the file only
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

LOGGERS = ("harness", "trainer", "problems")
FILE_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

log = logging.getLogger("harness")

_progress = logging.getLogger("harness.progress")
_file_handler: logging.FileHandler | None = None
_command = ""  # the command line, the log file's first record


class _MessageOnly(logging.Formatter):
    """The message alone, on one line: no level, no traceback (that goes to the file)."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(record.getMessage().split("\n"))


class _NotProgress(logging.Filter):
    """Progress lines are printed by the command itself; the terminal must not see them twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith(_progress.name)


def level_for(verbosity: int) -> int:
    """-qq .. -v as a stderr level: ERROR, WARNING, INFO (default), DEBUG."""
    if verbosity >= 1:
        return logging.DEBUG
    return {0: logging.INFO, -1: logging.WARNING}.get(verbosity, logging.ERROR)


def configure(verbosity: int = 0, command: str = "") -> None:
    """stderr at the level `verbosity` asks for; `command` (the arguments after `vpo`) heads a
    log file attached later. Idempotent: tests call `main` many times in one process."""
    global _file_handler, _command
    _command = command
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(level_for(verbosity))
    stderr.setFormatter(_MessageOnly())
    stderr.addFilter(_NotProgress())
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        logger.addHandler(stderr)
        logger.setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
        logger.propagate = False
    _file_handler = None


def log_file_for(where: str, log_dir: str | Path | None) -> Path:
    """`runs/x.db` -> `runs/x.log`; in `log_dir` when given; a database URL -> its name's log
    in `log_dir` or `runs/`."""
    if "://" in where or where == ":memory:":
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", where.rsplit("/", 1)[-1].split("?")[0]) or "vpo"
        return Path(log_dir or "runs") / f"{name}.log"
    database = Path(where)
    return Path(log_dir or database.parent) / f"{database.stem}.log"


def attach_file(where: str, log_dir: str | Path | None = None) -> Path:
    """Append every record from now on to the log file of the database at `where` (see
    `log_file_for`), starting with the command line; returns the file's path."""
    global _file_handler
    path = log_file_for(where, log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _file_handler is not None:
            logger.removeHandler(_file_handler)
        logger.addHandler(handler)
    if _file_handler is not None:
        _file_handler.close()
    _file_handler = handler
    to_file(logging.INFO, f"$ vpo {_command}".rstrip())
    return path


def progress(line: str) -> None:
    """A progress line the command printed itself, into the log file (never the terminal)."""
    _progress.info("%s", line)


def say(line: str) -> None:
    """A line of a command's output on stdout, at once (a log follows a long run as it goes),
    and into the log file."""
    print(line, flush=True)
    progress(line)


def to_file(level: int, message: str, error: BaseException | None = None) -> None:
    """A record for the log file only (what the terminal was shown otherwise): an error the
    command ends with, an internal error with its traceback."""
    if _file_handler is not None:
        exc_info = None if error is None else (type(error), error, error.__traceback__)
        _file_handler.emit(log.makeRecord(log.name, level, "", 0, message, (), exc_info))
