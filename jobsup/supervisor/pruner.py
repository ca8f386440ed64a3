"""The pruner: a timed duty that deletes finished jobs and events past their retention window.

Every supervisor runs it; the pruning turn in the database (jobsup/ops/prune.py) lets one of them at a
time delete, so no leader is kept in memory and a supervisor that dies hands the duty on at once.
"""

from __future__ import annotations

import asyncio

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import first_line
from jobsup.ops.latency import KEEP_PERIODS
from jobsup.ops.prune import BatchSize, Pruned, Retention, aprune
from jobsup.supervisor.config import Config
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog

# Between two batches of one round, the hot path has the server to itself for this long.
PAUSE = 0.01


async def prune_loop(link: Link, config: Config, log: EventLog) -> None:
    retention = Retention(keep_done=config.keep_done, keep_dead=config.keep_dead)
    batch = BatchSize()  # kept across rounds: a size that timed out stays small until batches are quick
    while True:
        pruned = Pruned()
        try:
            await link.run(lambda conn: aprune(conn, retention, batch=batch, pause=PAUSE, pruned=pruned))
            # The latency histograms past the longest window: a few rows per kind and minute, deleted
            # by every supervisor's round (no turn needed: deleting them twice deletes nothing).
            await link.run(lambda conn: conn.execute(SQL["latency_trim"], {"keep_periods": KEEP_PERIODS}))
        except psycopg.Error as exc:
            log("pruner.error", "error", error=first_line(exc))
        finally:  # a round cut short by the shutdown still says what it deleted
            if pruned.total:
                log("pruned", **pruned.to_json(), batch=batch.size)
        await asyncio.sleep(config.prune_interval)
