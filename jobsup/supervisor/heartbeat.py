"""The heartbeat duty: this supervisor's row in jobsup.supervisors (host, pid, queues, each worker's pid,
state, current job, RSS and CPU, jobs done, restarts), written every heartbeat interval.

The console reads these rows, so they are all it knows of a supervisor. The same statement reads back
the paused queues: the backstop of their NOTIFY, at no extra statement. When the database last answered
it is what /healthz asks of the database.
"""

from __future__ import annotations

import asyncio
import os
import socket
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobsup import __version__
from jobsup.db.lifecycle import CLAIM_PROTOCOL
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.supervisor.config import Config
from jobsup.supervisor.dispatcher import Dispatcher
from jobsup.supervisor.keeper import Keeper
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog

# While the supervisor shuts down, one beat may wait this long for the database: the shutdown has jobs
# to wait for and outcomes to write, and a row that is not updated only looks stale in the console.
STOPPING_BEAT_BUDGET = 1.0


class Heartbeat:
    name = "heartbeat"

    def __init__(
        self, config: Config, log: EventLog, supervisor_id: str, keeper: Keeper, dispatcher: Dispatcher, link: Link
    ) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.keeper = keeper
        self.dispatcher = dispatcher
        self.link = link
        self.reached_db: float | None = None  # loop clock of the last heartbeat the database took

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            self.keeper.sample()
            try:
                await self.beat()
            except psycopg.Error as exc:
                self.log("heartbeat.error", "error", error=str(exc).strip())

    async def beat(self, state: str = "running", deadline: float | None = None) -> None:
        """Write the row once; raises what the database raised."""
        workers = []
        for worker in sorted(self.keeper.all_processes(), key=lambda w: (w.slot, w.state != "stopping")):
            slot = self.keeper.slots[worker.slot]
            job = worker.job
            workers.append(
                {
                    "slot": worker.slot,
                    "pid": worker.pid,
                    "state": worker.state,
                    "job_id": job.id if job else None,
                    "kind": job.kind if job else None,
                    "job_started_at": datetime.fromtimestamp(worker.job_started_wall, UTC).isoformat() if job else None,
                    "rss": worker.rss,
                    "cpu": round(worker.cpu, 1),
                    "jobs_done": worker.jobs_done,
                    "restarts": slot.restarts,
                    "last_exit": slot.last_exit,
                    # Jobs that share it: how many it runs of --capacity, its event loop's lag, and
                    # since when a job blocks that loop (None: it runs alone jobs, or none).
                    "shared": len(worker.sharing) if worker.sharing else None,
                    "capacity": self.config.capacity if worker.sharing else None,
                    "lag": worker.lag if worker.sharing else None,
                    "blocked_by": worker.blocked[2] if worker.blocked else None,
                    # Alone jobs handed to it behind the one it runs, not started yet.
                    "behind": [j.id for j in list(worker.jobs)[1:]] if len(worker.jobs) > 1 else None,
                }
            )
        d = self.dispatcher
        params: dict[str, Any] = {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "queues": list(self.config.queues),
            # None until the first worker has imported the app, and for an app that finds kinds by name
            "kinds": None if self.keeper.kinds is None else sorted(self.keeper.kinds),
            "procs": self.config.procs,
            "state": state,
            "workers": Jsonb(workers),
            "jobs_done": d.jobs_done(),
        }

        async def write(conn: psycopg.AsyncConnection) -> tuple[list[str], list[str], list[str], int, str]:
            cur = await conn.execute(SQL["heartbeat"], params)
            row = await cur.fetchone()
            assert row is not None  # an upsert with RETURNING returns its row, inserted or updated
            return row[0], row[1], row[2], row[3], row[4]

        notes = d.pause_notes()
        paused, limited, keyed, oldest_protocol, why = await self.link.run(write, deadline=deadline)
        self.reached_db = asyncio.get_running_loop().time()
        if state == "running":  # the backstops of the pause and limit NOTIFYs
            d.paused_read(paused, notes)
            d.set_limits_in_force(limited, keyed)
        if oldest_protocol is not None and oldest_protocol > CLAIM_PROTOCOL:
            d.refuse_claims(
                f"the schema requires claim protocol {oldest_protocol}, this release speaks {CLAIM_PROTOCOL}: {why}"
            )

    async def beat_stopping(self, deadline: float) -> None:
        """While it shuts down, the supervisor's row says `stopping` and goes on beating (written by
        the shutdown itself, so no beat can land after the row is removed): the console shows a
        supervisor finishing its jobs, not one whose heartbeat went stale. Best effort: a database
        that is gone costs the shutdown nothing here."""
        self.keeper.sample()
        try:
            await self.beat(
                "stopping", deadline=min(deadline, asyncio.get_running_loop().time() + STOPPING_BEAT_BUDGET)
            )
        except psycopg.Error:
            pass
