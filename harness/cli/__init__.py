"""The `vpo` command: a face over problems, the sandbox and the solution database.

Every error a user can cause is printed as one line (`vpo: error: ...`) without a traceback:
exit status 2 for usage errors, 1 when an evaluated program is not ok, 0 otherwise.

    parser.py      every command, each added by the module of its group:
    programs.py    vpo problems, vpo eval
    campaigns.py   vpo run, vpo worker, vpo config show
    train.py       vpo train (also `python -m harness.cli.train`, for accelerate and torchrun)
    database.py    vpo status, vpo db ..., vpo ui
    flags.py       argument types, and a flag per campaign setting, made from the config's fields
    render.py      the tables and lines the commands print
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from harness.errors import UserError


def main(argv: Sequence[str] | None = None) -> int:
    # Imported here: `python -m harness.cli.train` runs a module the parser imports, which
    # must not be imported before it runs.
    from harness.cli.parser import build_parser
    from problems.registry import ProblemLoadError

    # vLLM logs every engine detail at INFO, and on CPU a warning per generate call; a campaign
    # shows its own progress. Its errors still show; VLLM_LOGGING_LEVEL=INFO brings back the rest.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except (UserError, ProblemLoadError) as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        print("vpo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("VPO_DEBUG"):
            raise
        print(
            f"vpo: internal error: {type(exc).__name__}: {exc} "
            "(set VPO_DEBUG=1 to see the traceback)".replace("\n", " "),
            file=sys.stderr,
        )
        return 3


def _fail(message: str) -> NoReturn:
    print(f"vpo: error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)
