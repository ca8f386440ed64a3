"""The listener duty: LISTEN on the one `jobsup` channel, on a connection of its own, and route each
NOTIFY, decoded by `jobsup.db.notify`, by its type to whoever it announces something to (a cancel, a
pause, a limit or freed slots to the dispatcher's controls, a schedule's pause to the scheduler, an
insert to the claim loop).

NOTIFY is a wake-up, never the only way work is found: what was announced while nobody listened
(before the first LISTEN, or while the connection was down) is caught by one claim and one look at the
delayed jobs each time the listener (re)connects, and the claim loop's poll stays the backstop.
"""

from __future__ import annotations

from jobsup.db import lifecycle, notify
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.supervisor.config import Config
from jobsup.supervisor.dispatcher import Dispatcher
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.scheduler import Scheduler


class Listener:
    name = "listen"

    def __init__(self, config: Config, log: EventLog, link: Link, dispatcher: Dispatcher, scheduler: Scheduler) -> None:
        self.config = config
        self.log = log
        self.link = link
        self.dispatcher = dispatcher
        self.scheduler = scheduler

    async def run(self) -> None:
        d = self.dispatcher
        while True:
            try:
                conn = await self.link.connect()
                await conn.execute(SQL["listen"])
                # Whatever was enqueued while nobody listened (before the first LISTEN too: the claim
                # loop started first) sent its NOTIFY to no one: claim once, and learn when the delayed
                # ones are due.
                self.log("listener.listening", "debug")
                d.poke()
                for run_at in await lifecycle.aupcoming(conn, self.config.queues):
                    d.note_run_at(run_at)
                async for note in conn.notifies():
                    match message := notify.decode(note.payload):
                        case notify.JobsQueued():
                            d.notified(message)
                        case notify.SchedulePaused():
                            self.scheduler.notified(message)
                        case notify.Unknown():
                            # A newer release's message, maybe: what it announces is unknown, so look
                            # at every queue (one claim) rather than miss it until the poll.
                            d.notified(notify.JobsQueued(()))
                        case _:
                            d.control(message)
            except LOST as exc:
                self.link.drop(exc)
