"""The pruner: a timed duty that deletes finished jobs and events past their retention window, and
finished workflows past theirs; it also marks finished the workflows whose jobs have all finished.

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


class Pruner:
    name = "prune"

    def __init__(self, config: Config, log: EventLog, link: Link) -> None:
        self.config = config
        self.log = log
        self.link = link
        self.retention = Retention(keep_done=config.keep_done, keep_dead=config.keep_dead)
        self.batch = BatchSize()  # kept across rounds: a size that timed out stays small until batches are quick

    async def run(self) -> None:
        while True:
            await self._round()
            await asyncio.sleep(self.config.prune_interval)

    async def _round(self) -> None:
        pruned = Pruned()
        try:
            await self.link.run(lambda conn: aprune(conn, self.retention, batch=self.batch, pause=PAUSE, pruned=pruned))
            # The latency histograms past the longest window: a few rows per kind and minute, deleted
            # by every supervisor's round (no turn needed: deleting them twice deletes nothing).
            await self.link.run(lambda conn: conn.execute(SQL["latency_trim"], {"keep_periods": KEEP_PERIODS}))
        except psycopg.Error as exc:
            self.log("pruner.error", "error", error=first_line(exc))
        finally:  # a round cut short by the shutdown still says what it deleted
            if pruned.total or pruned.workflows_finished:
                self.log(
                    "pruned", **pruned.to_json(), workflows_finished=pruned.workflows_finished, batch=self.batch.size
                )
