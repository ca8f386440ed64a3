"""The process keeper: spawns the workers, hears them over their pipes, notices their death at once
(process sentinel on the event loop), enforces job timeouts and recycles workers between jobs."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import psutil

from jobsup.job import Job
from jobsup.outcomes import Answer
from jobsup.supervisor.config import Config
from jobsup.supervisor.log import EventLog, about
from jobsup.supervisor.tally import restart_cause
from jobsup.supervisor.wire import Reader, send
from jobsup.supervisor.worker import job_fields, worker_main

# A worker that dies before it is ready is started again after this delay, doubled per failure.
START_BACKOFF_FIRST = 0.5
START_BACKOFF_MAX = 10.0
# What a terminal sends its whole process group (Ctrl-C, closing it): the supervisor alone acts on them.
TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGHUP}
# The start of every cause of a worker's end that the keeper or the shutdown brought about and that
# costs its job no attempt: the dispatcher hands such a job back instead of failing it.
INTERRUPTED = "interrupted"
# Recycling after --max-jobs-per-proc is spread by up to this fraction, so workers started together
# are not all replaced together.
RECYCLE_JITTER = 0.1


def exit_cause(exitcode: int | None) -> str:
    """Why a worker process ended, in the words last_error uses.

    >>> exit_cause(-11), exit_cause(-9), exit_cause(3)
    ('worker exited with signal SIGSEGV', 'worker killed (SIGKILL; out of memory?)', 'worker exited with code 3')
    """
    if exitcode is None:
        return "worker vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGKILL":
            return "worker killed (SIGKILL; out of memory?)"
        return f"worker exited with signal {name}"
    return f"worker exited with code {exitcode}"


def stop_status(reason: str) -> str:
    """What a worker's run middleware are told of an attempt the keeper stops for `reason` (a
    jobsup.middleware.RunOutcome status).

    >>> stop_status("timed out after 30s"), stop_status("cancelled by alice"), stop_status("interrupted: x")
    ('timed_out', 'cancelled', 'interrupted')
    >>> stop_status("worker killed: rss 900 MB over twice --max-memory 400 MB")
    'failed'
    """
    if reason.startswith("timed out"):
        return "timed_out"
    if reason.startswith("cancelled"):
        return "cancelled"
    if reason.startswith(INTERRUPTED):
        return "interrupted"
    return "failed"


@dataclass(eq=False)
class Worker:
    slot: int
    process: Any  # multiprocessing process
    inbox: Connection  # to the worker; its fd is written through wire
    outbox: Connection  # from the worker; its fd is read through wire
    reader: Reader
    state: str = "starting"  # starting, idle, busy, stopping
    # The jobs handed to it, in the order it runs them: the first is running, the rest have not started.
    jobs: deque[Job] = field(default_factory=deque)
    job_started: float = 0.0  # loop clock, when the first of `jobs` started
    job_started_wall: float = 0.0
    jobs_done: int = 0
    recycle_after: int | None = None
    stop_reason: str | None = None  # set when the keeper terminates it: the cause to record
    kill_at: float | None = None
    ps: psutil.Process | None = None
    rss: int = 0
    cpu: float = 0.0
    over_memory: bool = False
    # The trace and span of the attempt it answered last, when its run was traced (jobsup.otel): the
    # dispatcher's log lines about that answer carry them.
    trace: tuple[str, str] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def job(self) -> Job | None:
        """The job it is running."""
        return self.jobs[0] if self.jobs else None


@dataclass
class Slot:
    """What stays with a place in the pool across the processes that fill it."""

    index: int
    restarts: int = 0
    start_failures: int = 0
    last_exit: str | None = None


Outcome = Callable[[Worker, Job, Answer], None]
Lost = Callable[[Worker, Job, str, list[Job]], None]


@dataclass
class Keeper:
    config: Config
    log: EventLog
    on_ready: Callable[[Worker], None]
    on_outcome: Outcome
    on_lost: Lost  # the worker died or was stopped running job; the jobs after it never started
    on_fatal: Callable[[str], None]  # no worker can start at all
    workers: dict[int, Worker] = field(default_factory=dict)  # slot -> current process
    retiring: set[Worker] = field(default_factory=set)
    slots: list[Slot] = field(default_factory=list)
    # What the app handles, told by the first ready worker; None: any kind (an app that finds them).
    kinds: frozenset[str] | None = None
    timeouts: dict[str, float] = field(default_factory=dict)
    schedules: list = field(default_factory=list)  # the app's Schedules, told by the first ready worker
    limits: dict[str, dict] = field(default_factory=dict)  # kind -> the limits its handler declares (JSON)
    ever_ready: bool = False
    stopping: bool = False
    restarts_by_cause: dict[str, int] = field(default_factory=dict)  # for jobsup_worker_restarts_total

    def __post_init__(self) -> None:
        # forkserver: workers are forked from a clean server process, never from this one, which
        # holds connections and an event loop.
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["jobsup.supervisor.worker"])
        self.slots = [Slot(i) for i in range(self.config.procs)]
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- starting -------------------------------------------------------------------------------

    def spawn_all(self) -> None:
        """Start every worker; called before the supervisor opens any connection or thread.

        The first spawn starts the fork server, a new interpreter. A Ctrl-C or hangup sent to the
        terminal's process group while it imports would kill it with a traceback (or "Fatal Python
        error: init_import_site"), so those signals are blocked while it starts, as multiprocessing does
        for its resource tracker: the server inherits them blocked and ignores them for good, and one
        that reached us meanwhile is delivered here when they are unblocked. The resource tracker is
        started first: starting it unblocks SIGINT on its way out, which would undo the block."""
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
        try:
            for slot in self.slots:
                self._spawn(slot)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the pipes and sentinels of the workers from the running loop."""
        self.loop = loop
        for worker in self.workers.values():
            self._watch(worker)

    def _spawn(self, slot: Slot) -> Worker:
        # Two one-way pipes: a pipe costs less per message than the socket pair of a duplex Pipe.
        their_inbox, inbox = self.ctx.Pipe(duplex=False)
        outbox, their_outbox = self.ctx.Pipe(duplex=False)
        process = self.ctx.Process(
            target=worker_main,
            name=f"jobsup-worker-{slot.index}",
            args=(their_inbox, their_outbox, self.config.app, os.getpid(), os.getcwd(), self.config.django),
            daemon=False,
        )
        process.start()
        their_inbox.close()  # so our end reads EOF the moment the worker is gone
        their_outbox.close()
        worker = Worker(slot.index, process, inbox, outbox, Reader(outbox.fileno()))
        if self.config.max_jobs_per_proc:
            worker.recycle_after = int(self.config.max_jobs_per_proc * (1 + random.random() * RECYCLE_JITTER))
        try:
            worker.ps = psutil.Process(process.pid)
        except psutil.Error:
            worker.ps = None
        self.workers[slot.index] = worker
        self.log("worker.spawned", pid=process.pid, slot=slot.index)
        if self.loop is not None:
            self._watch(worker)
        return worker

    def _now(self) -> float:
        # Jobs are handed out and timed only once attach() has given the keeper the loop.
        assert self.loop is not None
        return self.loop.time()

    def _watch(self, worker: Worker) -> None:
        assert self.loop is not None
        self.loop.add_reader(worker.outbox.fileno(), self._readable, worker)
        self.loop.add_reader(worker.process.sentinel, self._exited, worker)

    def _unwatch(self, worker: Worker) -> None:
        assert self.loop is not None
        for fd in (worker.outbox.fileno(), worker.process.sentinel):
            try:
                self.loop.remove_reader(fd)
            except (ValueError, OSError):
                pass

    # --- hearing from workers ----------------------------------------------------------------------

    def _readable(self, worker: Worker) -> None:
        try:
            messages = worker.reader.read_available()
        except OSError:
            messages = None
        if messages is None:
            # The worker is gone; its sentinel tells how. Stop listening to the dead pipe.
            assert self.loop is not None
            try:
                self.loop.remove_reader(worker.outbox.fileno())
            except (ValueError, OSError):
                pass
            return
        for message in messages:
            self._message(worker, message)

    def _message(self, worker: Worker, message: tuple) -> None:
        tag = message[0]
        if tag == "answer":
            # A traced run's answer carries the trace and span of the attempt after the Answer's fields.
            answer = Answer(*message[1:7])
            worker.trace = message[7] if len(message) > 7 else None
            job = worker.job
            if job is None or job.id != answer.id:
                return  # an answer for a job we already counted as lost
            worker.jobs.popleft()
            worker.jobs_done += 1
            self.on_outcome(worker, job, answer)
            if worker.stop_reason is not None:
                # It was being stopped for the job it just answered (a timeout, a cancel, memory) and
                # that job ended within the kill grace: the worker takes nothing more. It is killed now;
                # a job behind it in its hand-out goes back with the attempt it barely began given back,
                # not failed with the first job's cause at the kill time.
                worker.stop_reason = f"{INTERRUPTED}: its worker was being stopped ({worker.stop_reason})"
                worker.state = "busy" if worker.jobs else "stopping"
                self._signal(worker, signal.SIGKILL)
                worker.kill_at = None
                return
            if worker.jobs:
                worker.job_started = self._now()
                worker.job_started_wall = time.time()
                return
            worker.state = "idle"
            if self.stopping:
                self.stop_worker(worker)
            elif not self._retire_if_due(worker):
                self.on_ready(worker)
        elif tag == "ready":
            _, pid, kinds, timeouts, schedules, limits = message
            worker.state = "idle"
            slot = self.slots[worker.slot]
            slot.start_failures = 0
            if not self.ever_ready:
                self.ever_ready = True
                self.kinds = frozenset(kinds) if kinds is not None else None
                self.timeouts = dict(timeouts)
                self.schedules = list(schedules)
                self.limits = dict(limits)
                self.log(
                    "app.loaded",
                    app=self.config.app or None,
                    django=self.config.django or None,
                    kinds=sorted(kinds) if kinds is not None else "any",
                )
            self.log("worker.ready", "debug", pid=pid, slot=worker.slot)
            if self.stopping:
                self.stop_worker(worker)
            else:
                self.on_ready(worker)
        elif tag == "fatal":
            worker.stop_reason = message[1]

    def _exited(self, worker: Worker) -> None:
        if not worker.outbox.closed and worker.outbox.poll():
            self._readable(worker)  # an answer written just before the end still counts
        self._unwatch(worker)
        worker.process.join(0)
        exitcode = worker.process.exitcode
        worker.inbox.close()
        worker.outbox.close()
        slot = self.slots[worker.slot]
        cause = worker.stop_reason or exit_cause(exitcode)
        retired = worker in self.retiring
        self.retiring.discard(worker)
        current = self.workers.get(worker.slot) is worker
        if current:
            del self.workers[worker.slot]
        jobs = list(worker.jobs)
        worker.jobs.clear()
        job = jobs[0] if jobs else None
        if job is not None:
            self.log(
                # An interruption is the keeper's own stop (a shutdown, or a kill that a job behind the
                # one it stopped for was caught in): the job goes back unspent, the worker did not die.
                "worker.stopped" if cause.startswith(INTERRUPTED) else "worker.died",
                "warning",
                pid=worker.pid,
                slot=worker.slot,
                cause=cause,
                **about(job),
            )
            slot.last_exit = cause
            self.on_lost(worker, job, cause, jobs[1:])
        elif retired or worker.state == "stopping":
            if worker.stop_reason is not None:
                # Killed by the keeper itself (a hard stop, a worker that outstayed the shutdown, one
                # stopped for a job it already answered): that is the cause, not the signal's own
                # words, which would read as the OOM killer.
                self.log("worker.stopped", pid=worker.pid, slot=worker.slot, cause=worker.stop_reason)
            else:
                self.log("worker.stopped", "debug", pid=worker.pid, slot=worker.slot, exitcode=exitcode)
        elif worker.state == "starting":
            slot.start_failures += 1
            slot.last_exit = cause
            self.log("worker.start_failed", "error", pid=worker.pid, slot=worker.slot, cause=cause)
            # A bad --app fails the same way in every worker: one report is enough. A worker that dies
            # at start without saying why is tried a few times in each slot first.
            if not self.ever_ready and (
                worker.stop_reason is not None or sum(s.start_failures for s in self.slots) >= 3 * len(self.slots)
            ):
                self.on_fatal(cause)
                return
        else:
            slot.last_exit = cause
            self.log("worker.died", "warning", pid=worker.pid, slot=worker.slot, cause=cause)
        if current and not self.stopping:
            self._count_restart("start_failed" if worker.state == "starting" else restart_cause(cause))
            self._respawn(slot, after_start_failure=worker.state == "starting" and job is None)

    def _count_restart(self, cause: str) -> None:
        self.restarts_by_cause[cause] = self.restarts_by_cause.get(cause, 0) + 1

    def _respawn(self, slot: Slot, after_start_failure: bool) -> None:
        slot.restarts += 1
        if not after_start_failure:
            self._spawn(slot)
            return
        delay = min(START_BACKOFF_MAX, START_BACKOFF_FIRST * 2 ** (slot.start_failures - 1))
        self.log("worker.restart_later", "warning", slot=slot.index, delay=f"{delay:g}s")
        assert self.loop is not None
        self.loop.call_later(delay, self._respawn_due, slot)

    def _respawn_due(self, slot: Slot) -> None:
        if not self.stopping and slot.index not in self.workers:
            self._spawn(slot)

    # --- giving work, timeouts, recycling --------------------------------------------------------

    def idle(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == "idle"]

    def assign(self, worker: Worker, jobs: list[Job]) -> None:
        """Hand `jobs` to an idle worker, which runs them in this order."""
        worker.state = "busy"
        worker.jobs.extend(jobs)
        worker.job_started = self._now()
        worker.job_started_wall = time.time()
        try:
            send(worker.inbox.fileno(), ("jobs", [job_fields(j) for j in jobs]))
        except (OSError, ValueError):
            pass  # the worker died this instant; its sentinel fires and the job counts as lost

    def timeout_of(self, kind: str) -> float:
        return self.timeouts.get(kind, self.config.timeout)

    def check_timeouts(self) -> None:
        now = self._now()
        for worker in self.all_processes():
            if worker.kill_at is not None and now >= worker.kill_at:
                self._signal(worker, signal.SIGKILL)
                worker.kill_at = None
            elif worker.state == "busy" and worker.job is not None and worker.stop_reason is None:
                limit = self.timeout_of(worker.job.kind)
                if now - worker.job_started > limit:
                    self.log(
                        "job.timed_out",
                        "warning",
                        pid=worker.pid,
                        limit=f"{limit:g}s",
                        **about(worker.job),
                    )
                    self.interrupt(worker, f"timed out after {limit:g}s")

    def interrupt(self, worker: Worker, reason: str) -> None:
        """Terminate a worker, then kill it after the grace period; `reason` becomes its exit cause."""
        worker.stop_reason = reason
        worker.state = "stopping" if worker.job is None else worker.state
        # Told first, so a worker with run middleware can tell them why its attempt ends (worker.py).
        try:
            send(worker.inbox.fileno(), ("interrupt", stop_status(reason), reason))
        except (OSError, ValueError):
            pass
        self._signal(worker, signal.SIGTERM)
        worker.kill_at = self._now() + self.config.kill_grace

    def _signal(self, worker: Worker, sig: int) -> None:
        pid = worker.pid
        if pid is None:  # not started: there is no process to signal
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _retire_if_due(self, worker: Worker) -> bool:
        why = None
        if worker.recycle_after is not None and worker.jobs_done >= worker.recycle_after:
            why = f"{worker.jobs_done} jobs"
        elif worker.over_memory:
            why = f"rss {worker.rss // 2**20} MB over --max-memory {self.config.max_memory_mb} MB"
        if why is None or self.stopping:
            return False
        self.log("worker.recycled", pid=worker.pid, slot=worker.slot, reason=why)
        self.stop_worker(worker)
        self.retiring.add(worker)
        del self.workers[worker.slot]
        self.slots[worker.slot].restarts += 1
        self._count_restart("recycled")
        self._spawn(self.slots[worker.slot])
        return True

    def stop_worker(self, worker: Worker) -> None:
        """Ask an idle worker to exit after its current message."""
        worker.state = "stopping"
        try:
            send(worker.inbox.fileno(), ("stop",))
        except (OSError, ValueError):
            pass

    def sample(self) -> None:
        """Read RSS and CPU of every worker (for the heartbeat and --max-memory)."""
        limit = self.config.max_memory_mb * 2**20
        for worker in self.workers.values():
            if worker.ps is None:
                continue
            try:
                with worker.ps.oneshot():
                    worker.rss = worker.ps.memory_info().rss
                    worker.cpu = worker.ps.cpu_percent(None)
            except psutil.Error:
                continue
            if limit and worker.rss > limit:
                worker.over_memory = True
                if worker.state == "idle":
                    self._retire_if_due(worker)
                elif worker.state == "busy" and worker.rss > 2 * limit and worker.stop_reason is None:
                    # Between jobs is the polite time to recycle; a job that doubles the limit is not
                    # let run until the kernel's OOM killer picks a victim on its own.
                    self.log(
                        "worker.over_memory",
                        "warning",
                        job=worker.job.id if worker.job else None,
                        pid=worker.pid,
                        rss_mb=worker.rss // 2**20,
                    )
                    self.interrupt(
                        worker,
                        f"worker killed: rss {worker.rss // 2**20} MB over twice "
                        f"--max-memory {self.config.max_memory_mb} MB",
                    )

    def all_processes(self) -> list[Worker]:
        return list(self.workers.values()) + list(self.retiring)

    def alive(self) -> bool:
        return any(w.process.is_alive() for w in self.all_processes())

    def kill_all(self, reason: str | None = None) -> None:
        """SIGKILL every worker. `reason`, the keeper's own cause of the kill, is what each worker's
        end is logged with (a worker already being stopped keeps the cause it has): the signal alone
        would read as the OOM killer's. None only where nothing is logged any more."""
        for worker in self.all_processes():
            if reason is not None:
                if worker.stop_reason is None:
                    worker.stop_reason = reason
                if not worker.jobs:  # one still holding a job ends as that job's loss, with its cause
                    worker.state = "stopping"
            self._signal(worker, signal.SIGKILL)
