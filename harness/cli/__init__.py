"""The `vpo` command: a face over problems, the sandbox and the solution database.

Every error a user can cause is printed as one line (`vpo: error: ...`) without a traceback.
Messages go through logging (harness/config/logs.py: -v, -q, a long command's log file).
Exit status (`harness.config.errors`): 0 ok, 1 a candidate or campaign failed, 2 a usage error, 3 an
internal error, 4 try again (the database or the model endpoint did not answer).

    parser.py      every command, each added by the module of its group:
    programs.py    vpo problems, vpo eval
    campaigns.py   vpo run, vpo worker, vpo config show
    train.py       vpo train (also `python -m harness.cli.train`, for accelerate and torchrun)
    database.py    vpo status, vpo db ..., vpo ui
    flags.py       argument types, and a flag per campaign setting, made from the config's fields
    render.py      the tables and lines the commands print
    db_render.py   what the `vpo db` views print
    warmup.py      vpo warmup

The top room: it reaches the others only through the ones it names (a generator, say, through
harness.evolution or harness.learning).
May import: evolution, learning, observation, evaluation, store, config
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from harness.config import logs
from harness.config.errors import EXIT_INTERNAL, EXIT_OK, EXIT_TRY_AGAIN, EXIT_USAGE, UserError


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here: `python -m harness.cli.train` runs a module the parser imports, which
    # must not be imported before it runs.
    from harness.cli.parser import build_parser
    from harness.config import allocator
    from problems.registry import ProblemLoadError

    if argv is None:  # a process of its own (not a test calling in): see harness/config/allocator
        allocator.settle()

    # vLLM logs every engine detail at INFO, and on CPU a warning per generate call; a campaign
    # shows its own progress. Its errors still show; VLLM_LOGGING_LEVEL=INFO brings back the rest.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    try:
        args = build_parser().parse_args(argv)
        shown = list(sys.argv[1:] if argv is None else argv)
        logs.configure((args.verbose or 0) - (args.quiet or 0), " ".join(shown))
        status = int(args.handler(args))
        sys.stdout.flush()  # here, so that a reader gone away is met below and not at exit
        return status
    except UserError as exc:
        _fail(str(exc), _exit_status(exc))
    except ProblemLoadError as exc:
        _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        logs.to_file(logging.WARNING, "interrupted")
        print("vpo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if not _stdout_gone():
            return _internal_error(exc)
        # `vpo problems --json | head -1`: the reader has what it wanted. Nothing is left to
        # say, and the interpreter's own flush at exit must not meet the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    logs.to_file(logging.ERROR, f"internal error: {type(exc).__name__}: {exc}", exc)
    if os.environ.get("VPO_DEBUG"):
        raise exc
    if _database_unreachable(exc):  # a server that went away in the middle of a command
        reason = str(getattr(exc, "orig", exc)).strip().splitlines() or [type(exc).__name__]
        _fail(f"the database stopped answering ({reason[0]}); try again", EXIT_TRY_AGAIN)
    print(
        f"vpo: internal error: {type(exc).__name__}: {exc} "
        "(set VPO_DEBUG=1 to see the traceback)".replace("\n", " "),
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def _exit_status(error: UserError) -> int:
    """The status `vpo` exits with for `error`: its own, or 4 when the database refused to
    connect (the store words that error; its cause says what happened)."""
    if _database_unreachable(error.__cause__):
        return EXIT_TRY_AGAIN
    return error.exit_status


def _database_unreachable(error: BaseException | None) -> bool:
    """A PostgreSQL server that did not answer or refused the connection. SQLite raises the
    same class for a file it cannot open, which trying again does not mend."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    return isinstance(error, OperationalError) and not isinstance(error.orig, sqlite3.Error)


def _stdout_gone() -> bool:
    """Whether the reader of stdout has closed its end (a pipe's writer then polls POLLERR)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or no stdout to ask
        return True


def _fail(message: str, status: int = EXIT_USAGE) -> NoReturn:
    logs.to_file(logging.ERROR, f"error: {' '.join(message.split())}")
    print(f"vpo: error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(status)
