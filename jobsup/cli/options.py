"""Argument types and options that several commands share, below every CLI module (no command
module imports another). Each type turns a refusal into argparse's one line and exit 2."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

from jobsup.db import embedded
from jobsup.durations import parse_duration
from jobsup.errors import EXIT_USAGE, BadInput

if TYPE_CHECKING:
    import psycopg
    from _typeshed import SupportsWrite

# PostgreSQL's integer: the columns priority and max_attempts, and every count a flag gives.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


# What argparse takes for a value rather than an option: anything a minus and a digit begin (argparse's
# own rule, -5 or -0.5, would leave `--delay -5s` and `--rate -1/s` "expected one argument" instead of
# the option's own refusal). No jobsup option is a minus and a digit.
_NEGATIVE_LOOKING = re.compile(r"^-\.?\d")
# How an option's help names the variable it comes from (env_note's words).
_ENV_IN_HELP = re.compile(r"\benv (JOBSUP_[A-Z0-9_]+)")


class Parser(argparse.ArgumentParser):
    """argparse that exits with EXIT_USAGE and one line, like every other refusal of jobsup."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_LOOKING

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._typed = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        # A default that came from a JOBSUP_* variable is checked by the option's type like a value
        # typed after the flag: a refusal then names the variable the user set, not a flag never typed.
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            named = _ENV_IN_HELP.search(action.help or "")
            typed = any(a.split("=")[0] in action.option_strings for a in getattr(self, "_typed", ()))
            if named and not typed and arg_string == action.default and os.environ.get(named[1]) == arg_string:
                raise argparse.ArgumentError(
                    None, f"{named[1]} (the default of {action.option_strings[0]}): {exc.message}"
                ) from None
            raise

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        # argparse's own print_help swallows a write error: `jobsup start --help | head -c 1` would
        # exit 0 where every other output closed early exits 141 (jobsup.cli.main handles it).
        (file or sys.stdout).write(self.format_help())


def duration(text: str) -> float:
    try:
        return parse_duration(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


ID_MAX = 2**63 - 1  # bigint, the type of job and workflow ids


def record_id(what: str) -> Callable[[str], int]:
    """The argparse type of the id of `what` (a job, a workflow): a whole number from 1 up.

    >>> record_id("job")("42")
    42
    >>> record_id("workflow")("x")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: a workflow id is a whole number from 1 up, not 'x'
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if not 1 <= value <= ID_MAX:
            raise argparse.ArgumentTypeError(f"a {what} id is a whole number from 1 up, not {text.strip()!r}")
        return value

    parse.__name__ = f"{what}_id"  # what argparse names in an error
    return parse


job_id = record_id("job")
workflow_id = record_id("workflow")


def job_ids(text: str) -> list[int]:
    """Job ids separated by commas.

    >>> job_ids("12"), job_ids("12, 13")
    ([12], [12, 13])
    >>> job_ids("12,abc")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: a job id is a whole number from 1 up, not 'abc'
    """
    return [job_id(part) for part in text.split(",")]


def kind(text: str) -> str:
    """A KIND argument: anything the queue takes as a kind, except `-`, which a shell user means as
    standard input (`jobsup enqueue -`), not as a job of kind "-".

    >>> kind("-")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '-' is not a kind (for jobs on standard input: jobsup enqueue --file -)
    """
    if text == "-":
        raise argparse.ArgumentTypeError("'-' is not a kind (for jobs on standard input: jobsup enqueue --file -)")
    return text


def positive_int(text: str) -> int:
    """A whole number from 1 to 2147483647.

    >>> positive_int("7")
    7
    >>> positive_int("99999999999")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be from 1 to 2147483647, not 99999999999
    """
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    if value > INT_MAX:
        raise argparse.ArgumentTypeError(f"must be from 1 to {INT_MAX}, not {value}")
    return value


def count(text: str) -> int:
    """A whole number from 0 to 2147483647 (0 meaning none, or never)."""
    value = _whole(text)
    if not 0 <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(f"must be from 0 to {INT_MAX}, not {value}")
    return value


def integer(text: str) -> int:
    """A whole number within PostgreSQL's integer, -2147483648 to 2147483647."""
    value = _whole(text)
    if not INT_MIN <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(f"must be from {INT_MIN} to {INT_MAX}, not {value}")
    return value


def iso_time(text: str) -> datetime:
    """An ISO 8601 time with its zone (`--run-at`, and `run_at` in the lines of `enqueue --file`).

    A time without a zone is refused, as the Python API refuses a naive datetime: read as the local
    time of whichever terminal or host ran the command, the same line would mean another moment on
    another machine.

    >>> iso_time("2030-01-01T00:00Z").isoformat()
    '2030-01-01T00:00:00+00:00'
    >>> iso_time("2030-01-01T00:00")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '2030-01-01T00:00' has no time zone: add one, e.g. 2030-01-01T00:00+01:00, or Z for UTC
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO time: {text!r} (e.g. 2026-12-01T09:30:00+00:00)") from None
    if moment.tzinfo is None:
        # The example is the user's own time with a zone added (to the minute when it has no seconds).
        example = moment.isoformat(timespec="minutes" if (moment.second, moment.microsecond) == (0, 0) else "auto")
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone: add one, e.g. {example}+01:00, or Z for UTC")
    return moment


def truthy(value: object) -> bool:
    """A yes/no variable's value: 1, true, yes or on, in any case, is yes.

    >>> truthy("On"), truthy("0"), truthy(None)
    (True, False, False)
    """
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def env_note(variable: str, builtin: object) -> str:
    """The end of a flag's help: its variable, and the default in effect, which is the variable's value
    when it is set (a --help that showed the built-in default then would tell the user the wrong one).
    `%` is doubled because argparse formats help strings.

    >>> env_note("JOBSUP_EXAMPLE", "8")
    'env JOBSUP_EXAMPLE; default 8'
    >>> os.environ["JOBSUP_EXAMPLE"] = "4"; env_note("JOBSUP_EXAMPLE", "8")
    'env JOBSUP_EXAMPLE, set to 4; built-in default 8'
    >>> del os.environ["JOBSUP_EXAMPLE"]
    """
    value = os.environ.get(variable)
    note = (
        f"env {variable}; default {builtin}"
        if value is None
        else f"env {variable}, set to {value or repr(value)}; built-in default {builtin}"
    )
    return note.replace("%", "%%")


def database_options(dsn: bool = True) -> Parser:
    """--dsn and --data-dir, shared by every command that talks to the database. `dsn=False`: a command
    of the embedded server alone, whose --help does not offer --dsn (given, the command says why it
    refuses it)."""
    # A Parser like the subcommands it is a parent of (typeshed's add_parser wants that; argparse
    # takes only its arguments).
    parent = Parser(add_help=False)
    group = parent.add_argument_group("database")
    # The DSN variables are never shown: they may hold a password.
    group.add_argument(
        "--dsn",
        help="PostgreSQL DSN (env JOBSUP_DSN, then DATABASE_URL; default: the embedded server of --data-dir)"
        if dsn
        else argparse.SUPPRESS,
    )
    group.add_argument(
        "--data-dir",
        help=f"data directory of the embedded PostgreSQL ({env_note('JOBSUP_DATA_DIR', embedded.DEFAULT_DATA_DIR)})",
    )
    return parent


def connect(args: argparse.Namespace, *, check_schema: bool = True) -> psycopg.Connection:
    """The database of a command's --dsn / --data-dir options (see database_options), its schema
    checked to be current unless `check_schema` is False."""
    from jobsup.db import dsn as dsns
    from jobsup.db.migrate import require_schema

    conn = dsns.connect(dsns.resolve(args.dsn, args.data_dir))
    if check_schema:
        require_schema(conn)
    return conn
