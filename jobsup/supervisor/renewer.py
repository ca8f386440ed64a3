"""The lease renewer: every held job's lease renewed together, a third of a lease apart, whether it
runs, waits in the prefetch, or waits for its outcome to be written, so no job is reaped while its
supervisor lives. The renewal also returns the cancels requested of held jobs: the backstop of the
cancel NOTIFY, and the whole answer to one that named too many jobs to fit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from jobsup.db import lifecycle
from jobsup.supervisor.config import Config
from jobsup.supervisor.handout import HandOut
from jobsup.supervisor.held import Held
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.wakeup import Wakeup


class LeaseRenewer:
    def __init__(
        self,
        config: Config,
        log: EventLog,
        supervisor_id: str,
        link: Link,
        held: Held,
        handout: HandOut,
        cancel_requested: Callable[[Mapping[int, str]], None],
    ) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.link = link
        self.held = held
        self.handout = handout
        self.cancel_requested = cancel_requested
        self.wakeup = Wakeup()  # set: a cancel too large to name its jobs

    async def loop(self) -> None:
        # A third of the lease: two renewals in a row may fail (a reconnect, a stall) before it lapses.
        interval = self.config.lease / 3
        while True:
            await self.wakeup.wait(interval)
            await self.renew()

    async def renew(self) -> None:
        held = list(self.held.jobs.values())
        if not held:
            return
        pairs = [(j.id, j.attempts) for j in held]
        try:
            ids, requests = await self.link.run(
                lambda c: lifecycle.arenew(c, pairs, self.id, self.config.lease),
                deadline=asyncio.get_running_loop().time() + self.config.lease / 3,
            )
        except LOST:
            return  # the next round tries again
        renewed = set(ids)
        if requests:  # the backstop of a cancel's NOTIFY
            self.cancel_requested(requests)
        # A job may have been written back while the renewal was in flight: only those still held count.
        lost = [j for j in held if j.id not in renewed and j.id in self.held.jobs]
        if lost:
            self.log("lease.lost", "warning", outcome="renew", count=len(lost), ids=[j.id for j in lost])
            lost_ids = {j.id for j in lost}
            self.handout.drop(lost_ids)
            running = self.handout.handed(lost_ids)
            for job in lost:
                if job.id not in running:
                    self.held.drop(job.id)
