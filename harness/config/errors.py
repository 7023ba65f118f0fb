"""Errors a user can cause and fix; the CLI prints each message as one line, no traceback.

What `vpo` exits with (README.md "Commands", docs/campaigns.md):
"""

EXIT_OK = 0
EXIT_FAILED = 1  # a candidate or a campaign failed
EXIT_USAGE = 2  # a flag, file, setting or database given is wrong: fix it first
EXIT_INTERNAL = 3  # a bug in vpo-evolve (VPO_DEBUG=1 shows the traceback)
EXIT_TRY_AGAIN = 4  # the database or the model endpoint did not answer: the same command may work


class UserError(Exception):
    """Something the user gave us (a flag, a file, a database, a config value) is wrong.

    The message says what was wrong and, where it helps, what to do; it is one line.
    """

    exit_status = EXIT_USAGE


class SchemaError(UserError):
    """The database was written by another schema version, or is not a vpo-evolve database."""


class IterationRecorded(UserError):
    """An iteration is already recorded: another process ran it (a worker whose claim ran out
    loses it quietly; a second `vpo run` on one campaign is an error)."""


class CampaignFailed(UserError):
    """A campaign stopped short of its iterations (too many in a row produced nothing)."""

    exit_status = EXIT_FAILED


class Unreachable(UserError):
    """The database or the model endpoint did not answer; nothing given need be wrong, and the
    same command may work once it is up."""

    exit_status = EXIT_TRY_AGAIN
