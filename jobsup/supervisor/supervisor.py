"""The supervisor: one asyncio loop that runs the dispatcher, the listener, the reaper, the heartbeat
and the process keeper, and stops them in order on SIGTERM, SIGHUP or Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
from dataclasses import replace
from datetime import UTC, datetime, timezone

import psycopg
from psycopg.types.json import Jsonb

from jobsup import __version__
from jobsup.db import lifecycle
from jobsup.db.dsn import redact
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_WORKERS_FAILED
from jobsup.supervisor.config import Config
from jobsup.supervisor.dispatcher import Dispatcher, Wakeup
from jobsup.supervisor.keeper import Keeper, Worker
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.pruner import prune_loop
from jobsup.supervisor.roster import forget_gone
from jobsup.supervisor.scheduler import Scheduler
from jobsup.supervisor.tally import Tally

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


class Supervisor:
    def __init__(self, config: Config, log: EventLog) -> None:
        self.config = config
        self.log = log
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        self.keeper = Keeper(
            config, log, on_ready=self._worker_ready, on_outcome=self._outcome, on_lost=self._lost, on_fatal=self._fatal
        )
        self.dispatcher: Dispatcher | None = None
        self.signals: list[str] = []
        self.stop_wakeup = Wakeup()
        self.fatal: str | None = None
        self.hard_stop = False
        # --metrics-port: what the metrics duty exports, and its socket (bound before the workers start).
        self.tally = Tally() if config.metrics_port else None
        self.metrics_socket = None
        self.reached_db: float | None = None  # loop clock of the last heartbeat the database took
        self.tasks: list[asyncio.Task] = []

    # The keeper is built before the dispatcher (its workers start before any connection opens), so
    # its callbacks go through these until the dispatcher exists.
    def _worker_ready(self, worker: Worker) -> None:
        if self.dispatcher is not None:
            self.dispatcher.worker_ready(worker)

    def _outcome(self, worker: Worker, job, answer) -> None:
        assert self.dispatcher is not None
        self.dispatcher.outcome(worker, job, answer)

    def _lost(self, worker: Worker, job, cause: str, unstarted: list) -> None:
        assert self.dispatcher is not None
        self.dispatcher.lost(worker, job, cause, unstarted)

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
        self.scheduler = Scheduler(self.config, self.log, self.id, self.keeper, self.links["schedules"])
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
        self.dispatcher = Dispatcher(
            config, self.log, self.id, self.keeper, self.links["claims"], self.links["writes"], self.tally
        )
        for worker in self.keeper.idle():  # workers that became ready before the dispatcher existed
            self.dispatcher.worker_ready(worker)
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
        await self._heartbeat()
        loops = {
            "claim": self.dispatcher.claim_loop,
            "flush": self.dispatcher.flush_loop,
            "lease": self.dispatcher.lease_loop,
            "listen": self._listen_loop,
            "reap": self._reap_loop,
            "heartbeat": self._heartbeat_loop,
            "tick": self._tick_loop,
            "schedule": self.scheduler.run,
            "prune": lambda: prune_loop(self.links["prune"], self.config, self.log),
        }
        if self.metrics_socket is not None:
            from jobsup.supervisor.metrics import serve

            loops["metrics"] = lambda: serve(self.metrics_socket, self)
        self.tasks = tasks = [
            loop.create_task(run(), name=name)
            for name, run in loops.items()
            if name != "listen" or "listen" in self.links
        ]
        for task in tasks:  # a loop that died of a bug must not leave the supervisor half-alive
            task.add_done_callback(lambda _: self.stop_wakeup.set())
        while not (self.signals or self.fatal):
            await self.stop_wakeup.wait(3600)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    error = task.exception()
                    self.log("supervisor.failed", "error", reason=f"the {task.get_name()} loop failed: {error}")
                    raise error  # type: ignore[misc]
        # The shutdown runs as a task of its own, so a second Ctrl-C stops at once whatever it waits for.
        shutdown = loop.create_task(self._shutdown(tasks))
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
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for link in self.links.values():
                await link.close()

    async def _listen_loop(self) -> None:
        link = self.links["listen"]
        d = self.dispatcher
        assert d is not None
        while True:
            try:
                conn = await link.connect()
                await conn.execute(SQL["listen"])
                # Whatever was enqueued while nobody listened (before the first LISTEN too: the claim
                # loop started first) sent its NOTIFY to no one: claim once, and learn when the delayed
                # ones are due.
                self.log("listener.listening", "debug")
                d.poke()
                for run_at in await lifecycle.aupcoming(conn, self.config.queues):
                    d.note_run_at(run_at)
                async for note in conn.notifies():
                    if not d.control(note.payload) and not self.scheduler.notified(note.payload):
                        d.notified(note.payload)
            except LOST as exc:
                link.drop(exc)

    async def _reap_loop(self) -> None:
        link = self.links["house"]
        while True:
            await asyncio.sleep(self.config.reap_interval)
            try:
                reaped = await link.run(lambda c: lifecycle.areap(c, self.id))
                forgotten = await link.run(lambda c: forget_gone(c, self.id))
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

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            self.keeper.sample()
            try:
                await self._heartbeat()
            except psycopg.Error as exc:
                self.log("heartbeat.error", "error", error=str(exc).strip())

    async def _heartbeat(self, state: str = "running", deadline: float | None = None) -> None:
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
                }
            )
        d = self.dispatcher
        params = {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "queues": list(self.config.queues),
            "procs": self.config.procs,
            "state": state,
            "workers": Jsonb(workers),
            "jobs_done": d.jobs_done if d else 0,
        }

        async def beat(conn: psycopg.AsyncConnection) -> list[str]:
            cur = await conn.execute(SQL["heartbeat"], params)
            return (await cur.fetchone())[0]  # type: ignore[index]

        notes = d.pause_notes if d else 0
        paused = await self.links["house"].run(beat, deadline=deadline)
        self.reached_db = asyncio.get_running_loop().time()  # what /healthz asks of the database
        if d is not None and state == "running":  # the backstop of the pause NOTIFYs
            d.paused_read(paused, notes)

    async def _heartbeat_stopping(self, deadline: float) -> None:
        """While it shuts down, the supervisor's row says `stopping` and goes on beating (written by
        the shutdown itself, so no beat can land after the row is removed): the console shows a
        supervisor finishing its jobs, not one whose heartbeat went stale. Best effort: a database
        that is gone costs the shutdown nothing here."""
        self.keeper.sample()
        try:
            await self._heartbeat("stopping", deadline=min(deadline, asyncio.get_running_loop().time() + 1.0))
        except psycopg.Error:
            pass

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self.keeper.check_timeouts()
            self.log.flush_repeats()

    # --- stopping ------------------------------------------------------------------------------

    async def _shutdown(self, tasks: list[asyncio.Task]) -> int:
        loop = asyncio.get_running_loop()
        d = self.dispatcher
        assert d is not None
        d.stopping = True
        d.claim_wakeup.set()
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
                prefetched=len(d.prefetched),
                timeout=f"{self.config.shutdown_timeout:g}s",
            )
        by_name = {t.get_name(): t for t in tasks}
        # A claim in flight lands, and what it took is released below; a claim loop stuck reconnecting
        # to a database that is gone is not waited for.
        if not self.links["claims"].lost:  # a claim loop that is reconnecting has nothing in flight
            await asyncio.wait([by_name["claim"]], timeout=min(CLAIM_LANDING, self.config.shutdown_timeout))
        # From here the shutdown writes outcomes itself, each write bounded by db_deadline; only the
        # lease renewals and the keeper's clock go on.
        stopped = [
            by_name[name]
            for name in ("claim", "flush", "listen", "reap", "heartbeat", "schedule", "prune")
            if name in by_name
        ]
        for task in stopped:
            task.cancel()
        await asyncio.gather(*stopped, return_exceptions=True)
        released = d.release_prefetched()
        if released:
            self.log("shutdown.released", count=released, reason="prefetched, not started")
        deadline = loop.time() + self.config.shutdown_timeout
        # Past this the database is given up on: what is not written back, the reaper returns.
        db_deadline = deadline + self.config.kill_grace + min(DB_GRACE, self.config.shutdown_timeout)
        lost_db = not await self._try(d.flush(deadline=db_deadline))
        await self._heartbeat_stopping(deadline)

        next_report = loop.time() + WAIT_REPORT_EVERY
        next_beat = loop.time() + self.config.heartbeat_interval
        while d.running() and loop.time() < deadline:
            if loop.time() >= next_beat:
                await self._heartbeat_stopping(deadline)
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
            reason = f"interrupted: still running when shutdown timed out after {self.config.shutdown_timeout:g}s"
            self.log("shutdown.interrupting", count=len(still), ids=[j.id for j in still])
            for worker in self.keeper.all_processes():
                if worker.job is not None:
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
                jobs_done=d.jobs_done,
                unwritten=len(d.held),
                note="the database did not answer; the reaper returns unwritten jobs when their leases expire",
            )
            return EXIT_FAILURE
        self.log("shutdown.done", jobs_done=d.jobs_done)
        return EXIT_WORKERS_FAILED if self.fatal else EXIT_OK

    async def _try(self, step) -> bool:
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
        for worker in self.keeper.all_processes():
            if worker.jobs:
                d.release_buffer.append((worker.jobs.popleft(), "interrupted: stopped at once (second Ctrl-C)"))
                d.release_buffer.extend((job, None) for job in worker.jobs)
                worker.jobs.clear()
        self.keeper.kill_all()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(d.flush(deadline=loop.time() + HARD_STOP_BUDGET), HARD_STOP_BUDGET)
            answered = await self._forget_self(HARD_STOP_BUDGET)
        except (TimeoutError, *LOST):
            answered = False
        self.log.flush_repeats(force=True)
        if not answered:
            self.log("shutdown.now", "warning", reason="database did not answer; the reaper will return the rest")
        return EXIT_INTERRUPTED

    async def _stop_workers(self) -> None:
        for worker in self.keeper.all_processes():
            if worker.state in ("idle", "starting"):
                self.keeper.stop_worker(worker)
        await self._wait_workers_gone(5)
        if self.keeper.alive():
            self.keeper.kill_all()
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
