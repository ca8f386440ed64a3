"""`jobsup start`: build the supervisor, start its workers first, then connect and run the loop."""

from __future__ import annotations

import asyncio
import signal

from .. import dsn as dsns
from ..errors import EXIT_INTERRUPTED, WorkersFailed
from ..migrate import require_schema
from .config import Config
from .log import EventLog
from .supervisor import Supervisor


def main(config: Config, *, dsn: str | None = None, data_dir: str | None = None) -> int:
    # Until the loop runs, a hangup stops a start as Ctrl-C does (exit 130, nothing left behind); the
    # loop then makes it a graceful stop.
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    log = EventLog(config.log_format, config.log_level)
    supervisor = Supervisor(config, log)
    # Workers first, before this process opens any connection or thread (DESIGN.md): they come from
    # the fork server, and import the app while we connect.
    try:
        supervisor.keeper.spawn_all()
        resolved = dsns.resolve(dsn, data_dir)
        with dsns.connect(resolved) as conn:
            require_schema(conn)
        code = asyncio.run(supervisor.run(resolved))
    except BaseException as exc:  # whatever stops us, no worker outlives it
        supervisor.keeper.kill_all()
        for worker in supervisor.keeper.all_processes():
            worker.process.join(5)
        if isinstance(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        raise
    if supervisor.fatal:
        raise WorkersFailed(f"no worker could start: {supervisor.fatal}")
    return code
