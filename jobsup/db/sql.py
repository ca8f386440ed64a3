"""The named statements of `jobsup/db/queries/*.sql`, loaded once, and the one way to run them.

Each file holds the statements of one domain; a statement's name is unique across all of them. No
statement is ever assembled from input: callers pick one by name and pass parameters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg.pq import Format
from psycopg.types.string import TextLoader

R = TypeVar("R")
T = TypeVar("T")

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# Comment lines after a statement's last line of SQL: the header of the next section, not this
# statement's. Left on, a placeholder named in such a header would be a parameter of this statement.
_TRAILING_COMMENTS = re.compile(r"(\n\s*(--[^\n]*)?)+\Z")


def load(text: str) -> dict[str, str]:
    """Statements of a file where each begins with a `-- name: NAME` line.

    >>> load("-- name: a\\nSELECT 1\\n\\n-- section\\n-- %(x)s is...\\n-- name: b\\n-- why\\nSELECT 2\\n")
    {'a': 'SELECT 1', 'b': '-- why\\nSELECT 2'}
    """
    parts = _NAME.split(text)  # [before the first name, name, body, name, body, ...]: names and bodies pair up
    return {name: _TRAILING_COMMENTS.sub("", body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load_all() -> dict[str, str]:
    """Every file's statements; a name given twice is a bug caught at import, not a silent override."""
    statements: dict[str, str] = {}
    folder = resources.files("jobsup.db").joinpath("queries")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, body in load(entry.read_text()).items():
            if name in statements:
                raise RuntimeError(f"statement {name!r} of {entry.name} is named twice")
            statements[name] = body
    return statements


STATEMENTS: dict[str, str] = load_all()


@dataclass(frozen=True, slots=True)
class Op:
    """One statement to run: its name, its parameters, and what makes its rows into the answer.

    The sync and asyncio forms of an operation share one Op, so they cannot drift apart.
    """

    name: str
    params: Mapping[str, Any]
    parse: Callable[[list[tuple[Any, ...]]], Any]
    # Its rows' json and jsonb columns as the text PostgreSQL wrote, whatever the connection decodes
    # them to (the supervisor's claims: jobsup.job.Claimed).
    json_text: bool = False


_JSON_OIDS = tuple(psycopg.adapters.types[name].oid for name in ("json", "jsonb"))


def _json_as_text(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Make `cursor` read json and jsonb columns as their text. A connection that reads them so already
    (the supervisor's claims link) is left alone: a cursor's own loaders cost it 2 µs a statement."""
    if cursor.connection.adapters.get_loader(_JSON_OIDS[1], Format.TEXT) is TextLoader:
        return
    for oid in _JSON_OIDS:
        cursor.adapters.register_loader(oid, TextLoader)


# Every statement run here returns rows (RETURNING or SELECT), so they are fetched without asking for
# cur.description, which builds column objects: about 9 µs a statement.
def run(conn: psycopg.Connection[Any], op: Op) -> Any:
    with conn.cursor() as cur:
        if op.json_text:
            _json_as_text(cur)
        cur.execute(STATEMENTS[op.name], op.params)
        return op.parse(cur.fetchall())


async def arun(conn: psycopg.AsyncConnection[Any], op: Op) -> Any:
    async with conn.cursor() as cur:
        if op.json_text:
            _json_as_text(cur)
        await cur.execute(STATEMENTS[op.name], op.params)
        return op.parse(await cur.fetchall())


async def arun_together(conn: psycopg.AsyncConnection[Any], *ops: Op) -> list[Any]:
    """`ops` in order, in one round trip: each statement sent before any answer is read (a pipeline).
    Each is its own transaction on an autocommit connection, and sees what the ones before committed."""
    async with conn.pipeline():
        cursors = []
        for op in ops:
            cursor = conn.cursor()
            if op.json_text:
                _json_as_text(cursor)
            await cursor.execute(STATEMENTS[op.name], op.params)
            cursors.append(cursor)
        return [op.parse(await cursor.fetchall()) for op, cursor in zip(ops, cursors, strict=True)]


def run_steps(conn: psycopg.Connection[Any], steps: Generator[Op, Any, T]) -> T:
    """Run the statements a generator yields, each sent the answer of the one before; its return value.
    A sequence whose next statement depends on what the last one found (a workflow's enqueue, a
    cancel) is written once for the sync and asyncio forms."""
    try:
        op = next(steps)
        while True:
            op = steps.send(run(conn, op))
    except StopIteration as finished:
        return finished.value


async def arun_steps(conn: psycopg.AsyncConnection[Any], steps: Generator[Op, Any, T]) -> T:
    try:
        op = next(steps)
        while True:
            op = steps.send(await arun(conn, op))
    except StopIteration as finished:
        return finished.value


def one_row(row: R | None, name: str) -> R:
    """The row fetched from statement `name`, one that always returns a row (an aggregate, EXISTS, a
    SELECT without FROM): None there is a bug, named here rather than a TypeError on None further on.

    >>> one_row((1,), "schema_exists")
    (1,)
    >>> one_row(None, "schema_exists")
    Traceback (most recent call last):
    ...
    RuntimeError: statement 'schema_exists' returned no row
    """
    if row is None:
        raise RuntimeError(f"statement {name!r} returned no row")
    return row


def sorted_ids(rows: list[tuple[Any, ...]]) -> list[int]:
    """The first column of `rows`, ascending: the ids a statement touched."""
    return sorted(row[0] for row in rows)
