"""Which database to use, how to connect to it, and how to show it without its password.

`--dsn`, else JOBSUP_DSN, else DATABASE_URL, else the embedded server in `--data-dir` / JOBSUP_DATA_DIR.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg import conninfo

from jobsup.db import embedded
from jobsup.errors import BadInput, DatabaseUnavailable, InvalidDSN, JobsupError, first_line

T = TypeVar("T")

# libpq ends a URL's user:password at the first @ or /, so a password may hold ? or # unencoded. The
# scheme's colon is not required: a DSN with a typo there ("postgresql//u:pw@h") still hides it.
_URL_PASSWORD = re.compile(r"(//[^:/@]*):[^@/]+@")
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
# A scheme first (a word and a colon or //, no "=" before it): a URL, or one with a typo; else key=value.
_URL_LIKE = re.compile(r"\s*[A-Za-z][\w+.-]*(:|//)")
# For a string that does not parse at all: whatever stands between a colon and an @.
_ANY_USERINFO = re.compile(r":[^:/@\s]+@")


def redact(dsn: str) -> str:
    """`dsn` with any password replaced by ***.

    >>> redact("postgresql://app:s3cret@db:5432/app?password=x&sslmode=require")
    'postgresql://app:***@db:5432/app?password=***&sslmode=require'
    >>> redact("host=db password='a b' user=app")
    'host=db password=*** user=app'
    >>> redact("postgresql//u:secretpw@127.0.0.1:1/x"), redact("postgres:/u:pw@h/x?sslmode=disable")
    ('postgresql//u:***@127.0.0.1:1/x', 'postgres:/u:***@h/x?sslmode=disable')
    """
    if _URL_LIKE.match(dsn):
        dsn = _URL_PASSWORD.sub(r"\1:***@", dsn)
        dsn = re.sub(r"([?&]password=)[^&#]*", r"\1***", dsn, flags=re.IGNORECASE)
        if "://" not in dsn:  # not a URL libpq would read: hide any user:password@ it may hold
            dsn = _ANY_USERINFO.sub(":***@", dsn)
        return dsn
    return _KV_PASSWORD.sub(r"\1***", dsn)


def given(dsn: str | None = None) -> str | None:
    """The DSN the flag or the environment names, checked; None when the embedded server is meant."""
    chosen = dsn or os.environ.get("JOBSUP_DSN") or os.environ.get("DATABASE_URL")
    if chosen:
        check(chosen)
    return chosen or None


def resolve(dsn: str | None = None, data_dir: str | None = None) -> str:
    """The DSN to use, starting the embedded server if nothing else names one."""
    return given(dsn) or embedded.ensure_running(embedded.data_dir_from(data_dir))


def check(dsn: str) -> None:
    """Refuse a string that libpq cannot parse, without echoing it (its error may quote a password).

    >>> check("hello world")
    Traceback (most recent call last):
    jobsup.errors.InvalidDSN: not a valid DSN: 'hello world' (expected postgresql://user@host/db or 'host=… dbname=…')
    """
    try:
        conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise InvalidDSN(
            f"not a valid DSN: {redact(dsn)!r} (expected postgresql://user@host/db or 'host=… dbname=…')"
        ) from None


# What sits between jobsup and PostgreSQL: nothing, or a pooler that hands each transaction to any
# server connection (PgBouncer's pool_mode=transaction). Behind the latter, a connection has no session:
# no server-side prepared statement, setting or LISTEN outlives the transaction that made it.
POOLERS = ("none", "transaction")


def pooler(value: str | None = None) -> str:
    """`--pooler`, else JOBSUP_POOLER, else none; BadInput for a mode jobsup does not know.

    >>> pooler("transaction"), pooler("")
    ('transaction', 'none')
    """
    chosen = (value if value is not None else os.environ.get("JOBSUP_POOLER", "")) or "none"
    if chosen not in POOLERS:
        raise BadInput(f"--pooler (JOBSUP_POOLER) must be none or transaction, not {chosen!r}")
    return chosen


def prepare_threshold(mode: str | None = None) -> int | None:
    """psycopg's prepare_threshold for a connection through `mode`: behind a transaction pooler a
    statement prepared in one transaction is gone (or another client's) in the next, so none is."""
    return None if pooler(mode) == "transaction" else 5


def describe_connect_error(dsn: str, exc: Exception) -> str:
    return f"cannot connect to {redact(dsn)}: {redact(first_line(exc))}"


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection:
    """A connection, or DatabaseUnavailable with a message that names the server but not the password."""
    check(dsn)
    kwargs.setdefault("prepare_threshold", prepare_threshold())
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(describe_connect_error(dsn, exc)) from None


async def aconnect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.AsyncConnection:
    check(dsn)
    kwargs.setdefault("prepare_threshold", prepare_threshold())
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(describe_connect_error(dsn, exc)) from None


async def in_thread(dsn: str, work: Callable[[psycopg.Connection], T], application_name: str) -> T:
    """`work(conn)` on a connection of its own, in a thread: for a synchronous operator's write (a change
    of limits may wait seconds for older writers) from a console whose loop must not wait. The server
    out of reach is DatabaseUnavailable, another database error JobsupError: its first line, no password."""

    def run() -> T:
        try:
            with connect(dsn, application_name=application_name) as conn:
                return work(conn)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{redact(dsn)}: {redact(first_line(exc))}") from None
        except psycopg.Error as exc:
            raise JobsupError(f"database error: {redact(first_line(exc))}") from None

    return await asyncio.to_thread(run)
