"""`jobsup start`: build the supervisor, start its workers first, then connect and run the loop."""

from __future__ import annotations

import asyncio

from .. import dsn as dsns
from ..errors import EXIT_INTERRUPTED, DatabaseUnavailable, WorkersFailed
from ..migrate import require_schema
from .config import Config
from .log import EventLog
from .supervisor import Supervisor


def main(config: Config, *, dsn: str | None = None, data_dir: str | None = None) -> int:
    if config.listen_dsn:
        # Before any worker starts: a listener that cannot connect would leave the supervisor deaf.
        try:
            dsns.connect(config.listen_dsn).close()
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(f"--listen-dsn: {exc}") from None
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
