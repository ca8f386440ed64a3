"""The supervisor: one asyncio loop that wires the process keeper, the dispatcher and the duties
(listener, reaper, heartbeat, scheduler, pruner, metrics), and stops them in order on SIGTERM, SIGHUP or
Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
from collections.abc import Awaitable
from dataclasses import replace

from jobsup import __version__
from jobsup.db.dsn import redact
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_WORKERS_FAILED
from jobsup.supervisor.config import Config
from jobsup.supervisor.declaration import Declaration
from jobsup.supervisor.dispatcher import Dispatcher
from jobsup.supervisor.duty import Duties, Duty, Loop
from jobsup.supervisor.heartbeat import Heartbeat
from jobsup.supervisor.keeper import INTERRUPTED, Keeper
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.listener import Listener
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.pruner import Pruner
from jobsup.supervisor.reaper import Reaper
from jobsup.supervisor.scheduler import Scheduler
from jobsup.supervisor.tally import Tally
from jobsup.supervisor.wakeup import Wakeup

# How often the keeper checks job timeouts and kills workers past their grace period.
TICK = 0.05
# Every connection of the supervisor plans each statement for its actual arguments and the table as it
# is now. A generic plan cached while the table was small (psycopg prepares a statement after five
# runs) stays in use as the table grows a thousandfold: a plan that scanned a 40-row table once per
# outcome took 27 s to write 15,000 outcomes on a 20,000-row one, and the leases lapsed meanwhile.
SESSION = {"plan_cache_mode": "force_custom_plan"}
# The claiming connection does not wait for the WAL flush of its claims: that flush was most of a
# pickup's latency. A server crash can then forget claims of its last moments, and those jobs run
# again: at-least-once, as ever. Outcome writes stay synchronous, and their flush makes every earlier
# claim durable too.
CLAIMS_SESSION = {"synchronous_commit": "off"}
# Behind a transaction pooler with no --listen-dsn, the claim loop polls at least this often instead of
# waiting for NOTIFY: an empty claim reads one empty index page, so five a second per supervisor cost
# the server little, and a job waits at most this long to be picked up.
POLL_WITHOUT_LISTEN = 0.2
# How long a hard stop (second Ctrl-C) may spend handing jobs back before it gives up on the database.
HARD_STOP_BUDGET = 2.0
# What a hard stop is called wherever it is the cause: of each worker's end, and (as an interruption)
# of each running job's hand-back.
HARD_STOP = "stopped at once (second Ctrl-C)"
# At the end of a graceful stop, how long a worker told to exit may take before it is killed.
EXIT_WAIT = 5.0
# While waiting for running jobs at shutdown, say what is still running this often.
WAIT_REPORT_EVERY = 5.0
# At shutdown, how long past the shutdown timeout (and the kill grace) outcome writes keep trying a
# database that is down; at most the shutdown timeout again.
DB_GRACE = 10.0
# At shutdown, how long a claim in flight may take to land.
CLAIM_LANDING = 5.0
# At shutdown, how long removing this supervisor's row may wait for a database that is down. The row
# only feeds the console: left behind, it shows as stale, and a live supervisor deletes it later. An
# idle supervisor stopped while the database was down used to wait out the whole outcome deadline
# (47 s with the defaults) for it.
FORGET_BUDGET = 2.0
# The duties the shutdown stops together once a claim in flight has landed: it writes the outcomes and
# the heartbeat itself from then on. The rest (lease renewals, the keeper's clock, /healthz) run to the
# end, because the jobs still running are still held and still timed.
STOPPED_FIRST = ("claim", "flush", "listen", "reap", "heartbeat", "schedule", "prune")


class Supervisor:
    def __init__(self, config: Config, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.keeper = Keeper(config, log, on_fatal=self._fatal)
        self.dispatcher: Dispatcher | None = None
        self.signals: list[str] = []
        self.stop_wakeup = Wakeup()
        self.fatal: str | None = None
        self.hard_stop = False
        # --metrics-port: what the metrics duty exports, and its socket (bound before the workers start).
        self.tally = Tally() if config.metrics_port else None
        self.metrics_socket: socket.socket | None = None
        self.duties = Duties()  # listed and started by run()

    def _fatal(self, reason: str) -> None:
        self.fatal = reason
        self.stop_wakeup.set()

    def _on_signal(self, name: str) -> None:
        # Runs in the loop (asyncio's signal handling), but still only records: the loop acts on it.
        self.signals.append(name)
        if len(self.signals) > 1 and name == "SIGINT":
            self.hard_stop = True
        self.stop_wakeup.set()

    # --- running -------------------------------------------------------------------------------

    async def run(self, dsn: str) -> int:
        loop = asyncio.get_running_loop()
        # SIGHUP (the terminal closed) is a graceful stop like SIGTERM, not gunicorn's reload: the
        # supervisor has no configuration to reread, and a supervisor killed by a hangup left its jobs
        # to the reaper and its row behind. Any signal during a shutdown only records itself, so a
        # hangup then cannot cut the shutdown short and leave the row `stopping`.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._on_signal, sig.name)
        self.keeper.attach(loop)
        pooled = self.config.pooled
        self.links = {name: Link(dsn, name, self.log, SESSION, pooled=pooled) for name in ("writes", "house", "prune")}
        self.links["claims"] = Link(
            dsn, "claims", self.log, {**SESSION, **CLAIMS_SESSION}, pooled=pooled, json_as_text=True
        )  # payloads are parsed by the workers
        # Connects only if the app has schedules. A fire's job and its watermark commit together, so an
        # unflushed commit lost in a server crash loses both, and the fire is due again after it: like
        # the claims, it need not wait for the WAL flush, which was most of a fire's latency.
        self.links["schedules"] = Link(dsn, "schedules", self.log, {**SESSION, **CLAIMS_SESSION}, pooled=pooled)
        listen_dsn = self.config.listen_dsn or (None if pooled else dsn)
        config = self.config
        if listen_dsn:
            self.links["listen"] = Link(listen_dsn, "listen", self.log, SESSION)
        else:
            # A transaction pooler hands each statement to any server connection: a LISTEN there
            # hears nothing (or another client's notifications), so the claim loop polls instead.
            config = replace(config, poll_interval=min(config.poll_interval, POLL_WITHOUT_LISTEN))
            self.log(
                "listener.off",
                "warning",
                reason="--pooler transaction without --listen-dsn",
                poll=f"{config.poll_interval * 1000:g}ms",
            )
        self.dispatcher = d = Dispatcher(
            config,
            self.log,
            self.id,
            self.keeper,
            self.links["claims"],
            self.links["writes"],
            self.tally,
            Declaration(dsn, self.log, self.id, self.keeper),
        )
        self.keeper.events = d  # it hears of the jobs from now on
        for worker in self.keeper.idle():  # workers that became ready before the dispatcher existed
            d.worker_ready(worker)
        scheduler = Scheduler(self.config, self.log, self.id, self.keeper, self.links["schedules"])
        self.heartbeat = Heartbeat(self.config, self.log, self.id, self.keeper, d, self.links["house"])
        self.log(
            "supervisor.started",
            version=__version__,
            id=self.id,
            dsn=redact(dsn),
            procs=self.config.procs,
            queues=list(self.config.queues),
            app=self.config.app or None,
            django=self.config.django or None,
            pid=os.getpid(),
        )
        await self.heartbeat.beat()
        # Started in this order: the claim loop before the listener's first LISTEN, which then claims
        # once for whatever was announced before anyone listened.
        duties: list[Duty] = d.duties()
        if "listen" in self.links:
            duties.append(Listener(self.config, self.log, self.links["listen"], d, scheduler))
        duties += [
            Reaper(self.config, self.log, self.id, self.links["house"], self.tally),
            self.heartbeat,
            Loop("tick", self._tick_loop),
            scheduler,
            Pruner(self.config, self.log, self.links["prune"]),
        ]
        if self.metrics_socket is not None:
            from jobsup.supervisor.exporter import Exporter

            duties.append(Exporter(self.metrics_socket, self))
        self.duties = Duties(duties)
        self.duties.start(on_end=self.stop_wakeup.set)
        while not (self.signals or self.fatal):
            await self.stop_wakeup.wait(3600)
            failed = self.duties.failed()
            if failed is not None:
                name, error = failed
                self.log("supervisor.failed", "error", reason=f"the {name} loop failed: {error}")
                raise error
        # The shutdown runs as a task of its own, so a second Ctrl-C stops at once whatever it waits for.
        shutdown = loop.create_task(self._shutdown())
        shutdown.add_done_callback(lambda _: self.stop_wakeup.set())
        try:
            while not shutdown.done():
                await self.stop_wakeup.wait(3600)
                if self.hard_stop and not shutdown.done():
                    shutdown.cancel()
                    await asyncio.gather(shutdown, return_exceptions=True)
                    return await self._hard_stop()
            return shutdown.result()
        finally:
            await self.duties.stop()
            for link in self.links.values():
                await link.close()
            self.keeper.close()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self.keeper.check_timeouts()
            self.log.flush_repeats()

    # --- stopping ------------------------------------------------------------------------------

    async def _shutdown(self) -> int:
        loop = asyncio.get_running_loop()
        d = self.dispatcher
        assert d is not None
        d.stop()
        self.keeper.stopping = True  # no respawns; a worker that finishes its job is told to exit
        for worker in self.keeper.all_processes():
            if worker.state in ("idle", "starting"):
                self.keeper.stop_worker(worker)
        if self.fatal:
            self.log("supervisor.failed", "error", reason=f"no worker could start: {self.fatal}")
        else:
            self.log(
                "shutdown.started",
                signal=self.signals[0],
                running=len(d.running()),
                prefetched=d.prefetched(),
                timeout=f"{self.config.shutdown_timeout:g}s",
            )
        # A claim in flight lands, and what it took is released below; a claim loop stuck reconnecting
        # to a database that is gone is not waited for.
        if not self.links["claims"].lost:  # a claim loop that is reconnecting has nothing in flight
            await self.duties.wait("claim", timeout=min(CLAIM_LANDING, self.config.shutdown_timeout))
        # So does an outcome write: its answer says which jobs it wrote (and logs the dead ones).
        if not self.links["writes"].lost:
            await self.duties.wait("flush", timeout=min(CLAIM_LANDING, self.config.shutdown_timeout))
        # From here the shutdown writes outcomes itself, each write bounded by db_deadline; only the
        # lease renewals and the keeper's clock go on.
        await self.duties.stop(STOPPED_FIRST)
        released = d.release_prefetched()
        if released:
            self.log("shutdown.released", count=released, reason="prefetched, not started")
        deadline = loop.time() + self.config.shutdown_timeout
        # Past this the database is given up on: what is not written back, the reaper returns.
        db_deadline = deadline + self.config.kill_grace + min(DB_GRACE, self.config.shutdown_timeout)
        lost_db = not await self._try(d.flush(deadline=db_deadline))
        await self.heartbeat.beat_stopping(deadline)

        next_report = loop.time() + WAIT_REPORT_EVERY
        next_beat = loop.time() + self.config.heartbeat_interval
        while d.running() and loop.time() < deadline:
            if loop.time() >= next_beat:
                await self.heartbeat.beat_stopping(deadline)
                next_beat = loop.time() + self.config.heartbeat_interval
            if loop.time() >= next_report:
                running = d.running()
                self.log(
                    "shutdown.waiting",
                    running=len(running),
                    ids=[j.id for j in running],
                    left=f"{deadline - loop.time():.0f}s",
                )
                next_report = loop.time() + WAIT_REPORT_EVERY
            await d.idle_wakeup.wait(0.5)
            if d.buffered():
                lost_db |= not await self._try(d.flush(deadline=db_deadline))

        still = d.running()
        if still:
            reason = f"{INTERRUPTED}: still running when shutdown timed out after {self.config.shutdown_timeout:g}s"
            self.log("shutdown.interrupting", count=len(still), ids=[j.id for j in still])
            for worker in self.keeper.all_processes():
                if worker.job is not None or worker.sharing:
                    self.keeper.interrupt(worker, reason)
            await self._wait_workers_gone(self.config.kill_grace + 2)
        lost_db |= not await self._try(d.flush(deadline=db_deadline))
        await self._stop_workers()
        if not await self._forget_self(FORGET_BUDGET):
            self.log(
                "shutdown.row_left",
                "warning",
                note="the database did not answer: the console shows "
                "this supervisor as stale until a live supervisor removes its row",
            )
        self.log.flush_repeats(force=True)
        if lost_db:
            self.log(
                "shutdown.done",
                "error",
                jobs_done=d.jobs_done(),
                unwritten=d.holding(),
                note="the database did not answer; the reaper returns unwritten jobs when their leases expire",
            )
            return EXIT_FAILURE
        self.log("shutdown.done", jobs_done=d.jobs_done)
        return EXIT_WORKERS_FAILED if self.fatal else EXIT_OK

    async def _try(self, step: Awaitable[object]) -> bool:
        try:
            await step
            return True
        except LOST:
            return False

    async def _hard_stop(self) -> int:
        d = self.dispatcher
        assert d is not None
        self.log("shutdown.now", "warning", reason="second Ctrl-C", running=len(d.running()))
        self.keeper.stopping = True
        d.release_prefetched()  # claimed, not yet in a worker: handed back like the unstarted ones
        d.release_running(HARD_STOP)
        self.keeper.kill_all(HARD_STOP)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(d.flush(deadline=loop.time() + HARD_STOP_BUDGET), HARD_STOP_BUDGET)
            answered = await self._forget_self(HARD_STOP_BUDGET)
        except (TimeoutError, *LOST):
            answered = False
        # The killed workers' ends are logged as their sentinels fire: a moment, unless the database
        # answered before the kernel had reaped them all.
        await self._wait_workers_gone(0.5)
        self.log.flush_repeats(force=True)
        if not answered:
            self.log("shutdown.now", "warning", reason="database did not answer; the reaper will return the rest")
        return EXIT_INTERRUPTED

    async def _stop_workers(self) -> None:
        for worker in self.keeper.all_processes():
            if worker.state in ("idle", "starting"):
                self.keeper.stop_worker(worker)
        await self._wait_workers_gone(EXIT_WAIT)
        if self.keeper.alive():
            self.keeper.kill_all(f"killed: still running {EXIT_WAIT:g}s after the shutdown told it to exit")
            await self._wait_workers_gone(2)

    async def _wait_workers_gone(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.keeper.all_processes() and loop.time() < deadline:
            self.keeper.check_timeouts()
            await asyncio.sleep(0.02)

    async def _forget_self(self, budget: float) -> bool:
        """Remove this supervisor's row; False if the database did not answer within `budget` seconds
        (a connection attempt to an unreachable host can outlast a deadline of the link on its own)."""
        deadline = asyncio.get_running_loop().time() + budget
        try:
            await asyncio.wait_for(
                self.links["house"].run(
                    lambda c: c.execute(SQL["supervisor_gone"], {"id": self.id}), deadline=deadline
                ),
                budget,
            )
            return True
        except (TimeoutError, *LOST):
            return False
