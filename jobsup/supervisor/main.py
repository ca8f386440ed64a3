"""`jobsup start`: build the supervisor, start its workers first, then connect and run the loop."""

from __future__ import annotations

import asyncio
import os
import signal

from jobsup import middleware, otel
from jobsup.db import dsn as dsns
from jobsup.db.migrate import require_schema
from jobsup.errors import EXIT_INTERRUPTED, DatabaseUnavailable, WorkersFailed
from jobsup.supervisor.config import Config
from jobsup.supervisor.keeper import TERMINAL_SIGNALS
from jobsup.supervisor.log import EventLog, capture_warnings, route
from jobsup.supervisor.supervisor import Supervisor


def main(config: Config, *, dsn: str | None = None, data_dir: str | None = None) -> int:
    dsns.given(dsn)  # a DSN that does not parse is refused before any worker starts
    if config.listen_dsn:
        # Before any worker starts: a listener that cannot connect would leave the supervisor deaf.
        try:
            dsns.connect(config.listen_dsn).close()
        except DatabaseUnavailable as exc:
            raise DatabaseUnavailable(f"--listen-dsn: {exc}") from None
    log = EventLog(config.log_format, config.log_level)
    # psycopg logs through `logging` (at WARNING and above: its own default); its lines go through our
    # log too, in its format, not bare on stderr.
    route(log, "psycopg", "db.driver")
    capture_warnings(log)
    if middleware.traced_by_env():
        missing = otel.unavailable()
        if missing:
            # Its workers could not trace either: said once, here, in the log's format, rather than by
            # each worker as a bare warning on the stderr they share with this process.
            log("otel.unavailable", "warning", variable=middleware.OTEL_ENV, reason=missing)
            os.environ.pop(middleware.OTEL_ENV)
    supervisor = Supervisor(config, log)
    if config.metrics_port:  # before any worker: a port in use is one line and exit 2, nothing started
        from jobsup.supervisor.exporter import bind

        supervisor.metrics_socket = bind(config.metrics_host, config.metrics_port)
    # While the workers spawn, Ctrl-C and a hangup are only recorded, not raised inside
    # multiprocessing's start of its fork server; the start then stops with exit 130, nothing left
    # behind. After that they raise KeyboardInterrupt, so connecting stays interruptible, until the loop
    # makes them a graceful stop. A signal this process inherited as ignored (`nohup`, a shell's `&`)
    # stays ignored until then.
    # Resolved before the workers spawn (the embedded server started if need be), and exported to them:
    # the fork server, and so every worker, inherits this environment, and a handler reaches the
    # database its supervisor uses through jobsup.dsn() or JOBSUP_DSN, whatever named it here (a flag,
    # DATABASE_URL, the embedded server). A Ctrl-C here finds nothing started yet.
    resolved = dsns.resolve(dsn, data_dir)
    os.environ["JOBSUP_DSN"] = resolved
    early: list[int] = []
    ignored = {sig for sig in TERMINAL_SIGNALS if signal.getsignal(sig) is signal.SIG_IGN}
    for sig in TERMINAL_SIGNALS - ignored:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    # Workers first, before this process opens any connection or thread (docs/design/architecture.md): they come from
    # the fork server, and import the app while we connect.
    try:
        supervisor.keeper.spawn_all()
        for sig in TERMINAL_SIGNALS - ignored:
            signal.signal(sig, signal.default_int_handler)
        if early:
            raise KeyboardInterrupt
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
