"""Errors a user can cause and fix; the CLI prints each message as one line, no traceback."""


class UserError(Exception):
    """Something the user gave us (a flag, a file, a database, a config value) is wrong.

    The message says what was wrong and, where it helps, what to do; it is one line.
    """


class SchemaError(UserError):
    """The database was written by another schema version, or is not a vpo-evolve database."""


class ProblemError(UserError):
    """A problem could not be found or loaded."""


class IterationRecorded(UserError):
    """An iteration is already recorded: another process ran it (a worker whose claim ran out
    loses it quietly; a second `vpo run` on one campaign is an error)."""
