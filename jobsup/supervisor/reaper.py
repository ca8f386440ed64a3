"""The reaper duty: returns to the queue the running jobs whose lease expired (their supervisor died or
lost the database for longer than a lease), and removes the rows of supervisors that are gone.

Every supervisor runs one and none leads: the reap statement takes each expired job with SKIP LOCKED,
so two reapers never return the same job, and a job comes back as long as any supervisor lives. A
returned job counts the attempt it lost; one that has used all its attempts is made `dead`, and one
whose cancel was requested ends `cancelled`.
"""

from __future__ import annotations

import asyncio

import psycopg

from jobsup.db import lifecycle
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.supervisor.config import Config
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.roster import forget_gone
from jobsup.supervisor.tally import Tally


class Reaper:
    name = "reap"

    def __init__(self, config: Config, log: EventLog, supervisor_id: str, link: Link, tally: Tally | None) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.link = link
        self.tally = tally

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval)
            try:
                reaped = await self.link.run(lambda c: lifecycle.areap(c, self.id))
                forgotten = await self.link.run(lambda c: forget_gone(c, self.id))
                await self.link.run(lambda c: c.execute(SQL["limit_keys_prune"]))
            except psycopg.Error as exc:
                self.log("reaper.error", "error", error=str(exc).strip())
                continue
            if forgotten:
                self.log("supervisors.forgotten", count=len(forgotten), ids=forgotten)
            if reaped:
                if self.tally is not None:
                    self.tally.reaped += len(reaped)
                dead = [o.id for o in reaped if o.status == "dead"]
                self.log("reaped", count=len(reaped), ids=[o.id for o in reaped], dead=dead or None)
