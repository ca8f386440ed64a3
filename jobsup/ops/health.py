"""The console's one-line health warning: the first two of `jobsup doctor`'s checks (what holds back
vacuum, and the dead tuples of jobsup.jobs), cheap enough for every refresh. One statement, `health`,
reads the server's state through functions and no table: a fraction of a millisecond whatever the
jobs table holds (benchmarks/bench_doctor.py).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.durations import format_age
from jobsup.ops.doctor import Thresholds, dead_share, over, too_dead


def health_line(row: dict[str, Any], thresholds: Thresholds = Thresholds()) -> str | None:
    """The console's warning from the one row of the `health` statement, or None when all is well.

    >>> health_line({"holder": "session", "name": "4211", "state": "idle in transaction", "age": 840.0,
    ...              "xmin_xids": 12, "slot": None, "slot_xmin_xids": None, "live_tuples": 10, "dead_tuples": 5})
    'vacuum held back 14m00s by pid 4211 (idle in transaction)'
    >>> health_line({"holder": "session", "name": "4211", "state": "active", "age": 3.0, "xmin_xids": 1,
    ...              "slot": None, "slot_xmin_xids": None, "live_tuples": 100, "dead_tuples": 5_000}) is None
    True
    >>> line = health_line({"holder": None, "name": None, "state": None, "age": None, "xmin_xids": None,
    ...              "slot": "standby1", "slot_xmin_xids": 52000, "live_tuples": 100, "dead_tuples": 2_000_000})
    >>> print(line.replace("; ", ";\\n"))  # one warning a line
    vacuum held back by inactive replication slot 'standby1' (52,000 transactions);
    jobsup.jobs: 2,000,000 dead tuples (100%)
    """
    t = thresholds
    warnings = []
    if over(row["age"], t.max_xmin_age):
        if row["holder"] == "prepared":
            warnings.append(f"vacuum held back {format_age(row['age'])} by prepared transaction {row['name']!r}")
        else:
            state = f" ({row['state']})" if row["state"] else ""
            warnings.append(f"vacuum held back {format_age(row['age'])} by pid {row['name']}{state}")
    elif row["slot"] is not None:
        warnings.append(
            f"vacuum held back by inactive replication slot {row['slot']!r} ({row['slot_xmin_xids']:,} transactions)"
        )
    live, dead = row["live_tuples"] or 0, row["dead_tuples"] or 0
    if too_dead(live, dead, t):
        warnings.append(f"jobsup.jobs: {dead:,} dead tuples ({dead_share(live, dead):.0%})")
    return "; ".join(warnings) or None


def health_warning(conn: psycopg.Connection, thresholds: Thresholds = Thresholds()) -> str | None:
    """The console's one-line health warning, or None: one statement over the server's state, no table."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["health"])
        return health_line(one_row(cur.fetchone(), "health"), thresholds)


async def ahealth_warning(conn: psycopg.AsyncConnection, thresholds: Thresholds = Thresholds()) -> str | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SQL["health"])
        return health_line(one_row(await cur.fetchone(), "health"), thresholds)
