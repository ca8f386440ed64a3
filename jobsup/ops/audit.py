"""The audit: who did what to which jobs, and when, for the actions taken through the web console and
the control commands (cancel, retry, pause, resume, requeue-dead, limit).

The web console writes its row by `arecord` inside the transaction of the action it records, so the
audit holds an action exactly when it committed; a command writes its row by `record` once its action
has committed. Rows are pruned with the events (jobsup.ops.prune).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from jobsup.db.sql import STATEMENTS as SQL

# Rows the audit page shows, newest first.
RECENT = 200


@dataclass(frozen=True)
class Entry:
    id: int
    at: datetime
    who: str
    role: str
    action: str
    target: str
    job_ids: list[int]
    detail: str


def _params(who: str, role: str, action: str, target: str, job_ids: Sequence[int], detail: str) -> dict:
    return {"who": who, "role": role, "action": action, "target": target, "job_ids": list(job_ids), "detail": detail}


def record(
    conn: psycopg.Connection,
    *,
    who: str,
    role: str,
    action: str,
    target: str,
    job_ids: Sequence[int] = (),
    detail: str = "",
) -> None:
    """Record one action of a command."""
    conn.execute(SQL["audit_record"], _params(who, role, action, target, job_ids, detail))


async def arecord(
    conn: psycopg.AsyncConnection,
    *,
    who: str,
    role: str,
    action: str,
    target: str,
    job_ids: Sequence[int] = (),
    detail: str = "",
) -> int:
    """Record one action (in the caller's transaction, if it has one); the row's id."""
    cur = await conn.execute(SQL["audit_record"], _params(who, role, action, target, job_ids, detail))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def arecent(conn: psycopg.AsyncConnection, limit: int = RECENT) -> list[Entry]:
    """The newest `limit` rows, newest first."""
    cur = await conn.execute(SQL["audit_recent"], {"limit": limit})
    return [Entry(*row) for row in await cur.fetchall()]
