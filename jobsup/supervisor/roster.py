"""Removing the rows of supervisors that are gone, from the reaper's pass of every live supervisor.

A supervisor removes its own row when it stops; one that was killed (SIGKILL, OOM, power loss) leaves
it, and the console would show it as stale. A row of this host whose process no longer exists is
certainly gone, and goes after FORGET_GONE_AFTER of silence; a row of another host, which we cannot
check, goes after FORGET_STALE_AFTER. A row removed by mistake costs nothing but the console's "up"
time: its supervisor's next heartbeat writes it again (the heartbeat is an upsert).
"""

from __future__ import annotations

import socket

import psutil
import psycopg

from jobsup.db.sql import STATEMENTS as SQL

# A row of this host whose pid has ended goes once its heartbeat is this old. Not 0: containers may
# share a host name (compose replicas with a fixed `hostname:`) without sharing their pids, and a live
# supervisor there beats every second or so; ten seconds of silence and no such pid is certainly gone.
FORGET_GONE_AFTER = 10.0
# A row of another host goes once its heartbeat is this old. Its jobs were reaped long before (their
# leases are seconds); a host back after a longer outage writes its row again.
FORGET_STALE_AFTER = 300.0


async def forget_gone(conn: psycopg.AsyncConnection, own_id: str) -> list[str]:
    """Delete the rows of supervisors that are gone; their ids."""
    host = socket.gethostname()
    cur = await conn.execute(
        SQL["silent_supervisors_of_host"], {"host": host, "id": own_id, "older_than": FORGET_GONE_AFTER}
    )
    ended = [sup_id for sup_id, pid in await cur.fetchall() if not psutil.pid_exists(pid)]
    forgotten: list[str] = []
    if ended:
        cur = await conn.execute(SQL["forget_supervisors"], {"ids": ended, "older_than": FORGET_GONE_AFTER})
        forgotten += [row[0] for row in await cur.fetchall()]
    cur = await conn.execute(SQL["forget_stale_supervisors"], {"older_than": FORGET_STALE_AFTER})
    forgotten += [row[0] for row in await cur.fetchall()]
    return forgotten
