"""The errors jobsup raises, each with a message a user can act on, and the exit codes of the CLI."""

from __future__ import annotations

# Exit codes of every jobsup command; the README's table is this one.
EXIT_OK = 0
EXIT_FAILURE = 1  # the database could not be reached, the schema is missing, a run failed
EXIT_USAGE = 2  # bad flags, bad JSON, a DSN that does not parse, bad input of any kind: nothing was changed
EXIT_WORKERS_FAILED = 3  # `jobsup start`: no worker process could be started (e.g. --app does not import)
EXIT_INTERRUPTED = 130  # stopped at once by a second Ctrl-C
# Standard output was closed early (`jobsup stats | head -c 1`): the status a shell reports for a tool
# killed by SIGPIPE, 128 + 13. Python ignores SIGPIPE, so the closed pipe is a BrokenPipeError instead.
EXIT_BROKEN_PIPE = 141


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none: what a log line or a
    one-line message shows of a database error (psycopg's messages go on with LINE and HINT lines).

    >>> first_line(ValueError("bad\\nLINE 1: x")), first_line(KeyError())
    ('bad', 'KeyError')
    """
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class JobsupError(Exception):
    """Root of jobsup's errors. The message is meant for the person at the terminal."""

    exit_code = EXIT_FAILURE


class BadInput(JobsupError):
    """Input that jobsup refuses before it changes anything."""

    exit_code = EXIT_USAGE


class PayloadTooLarge(BadInput):
    pass


class DatabaseUnavailable(JobsupError):
    """The server could not be reached."""


class InvalidDSN(BadInput, DatabaseUnavailable):
    """A DSN that libpq cannot parse: bad input (exit 2, nothing was tried), and still one of the
    DatabaseUnavailable that callers catching "no database" have always been given for it."""


class SchemaMissing(JobsupError):
    """The jobsup schema is absent or older than this version of jobsup."""


class AppNotFound(BadInput):
    """`--app module:attribute` does not name an importable jobsup App."""


class ReturnValueError(JobsupError):
    """A handler returned what jobsup cannot store: not JSON, a NUL character, or too large. That
    attempt fails (the return value is written with the outcome, so there is nowhere else for it)."""


class NoHandler(JobsupError):
    """A job's kind has no handler in the app."""


class WorkersFailed(JobsupError):
    """`jobsup start` could not start any worker process."""

    exit_code = EXIT_WORKERS_FAILED
