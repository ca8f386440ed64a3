"""The process keeper: spawns the workers, hears them over their pipes, notices their death at once
(process sentinel on the event loop), enforces job timeouts and recycles workers between jobs."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import tempfile
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

import psutil

from jobsup.job import Claimed
from jobsup.outcomes import Answer
from jobsup.supervisor.config import Config
from jobsup.supervisor.log import EventLog, about
from jobsup.supervisor.tally import restart_cause
from jobsup.worker import messages
from jobsup.worker.main import exit_cause as _exit_cause
from jobsup.worker.main import worker_main
from jobsup.worker.wire import Reader, send

# A worker that dies before it is ready is started again after this delay, doubled per failure.
START_BACKOFF_FIRST = 0.5
START_BACKOFF_MAX = 10.0
# What a terminal sends its whole process group (Ctrl-C, closing it): the supervisor alone acts on them.
TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGHUP}
# The start of every cause of a worker's end that the keeper or the shutdown brought about and that
# costs its job no attempt: the dispatcher hands such a job back instead of failing it.
INTERRUPTED = "interrupted"
# The end of the cause of a shared job whose process the keeper recycled for it (it blocked the event
# loop, or did not stop when cancelled).
RECYCLED = "its process was recycled"
# Causes in a job's errors that say an earlier attempt took its process down: its next attempts run
# alone, where a crash costs no neighbour anything.
TOOK_ITS_PROCESS = ("worker exited", "worker killed", "worker vanished", RECYCLED)
# Jobs handed to a worker behind one that has run this long are taken back for a free worker: short jobs
# are handed out several at a time, and one of them may turn out slow.
RECALL_AFTER = 0.05
# Recycling after --max-jobs-per-proc is spread by up to this fraction, so workers started together
# are not all replaced together.
RECYCLE_JITTER = 0.1


def __getattr__(name: str) -> Any:
    # exit_cause moved to jobsup.worker.main (jobsup.testing uses it too); the old path warns for one release.
    if name == "exit_cause":
        warnings.warn(
            "jobsup.supervisor.keeper.exit_cause moved to jobsup.worker.main.exit_cause; "
            "the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return _exit_cause
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    jobs: deque[Claimed] = field(default_factory=deque)
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
    # Jobs that share the process (jobsup.worker.sharing), all running at once: id -> job, and when
    # each started (loop clock). A process runs either one alone job at a time (`jobs`) or these.
    sharing: dict[int, Claimed] = field(default_factory=dict)
    shared_started: dict[int, float] = field(default_factory=dict)
    shared_kinds: Counter[str] = field(default_factory=Counter)  # how many of each kind it runs
    # Shared jobs it was told to cancel -> (when to recycle it if the job runs on, why it was stopped).
    shared_stopping: dict[int, tuple[float, str]] = field(default_factory=dict)
    draining: str | None = None  # why it takes no more shared jobs (recycling, memory, an alone job waits)
    culprit: int | None = None  # the job the keeper stops it for, when one job is to blame
    fault_path: str = ""  # where its faulthandler writes the stack of a fatal signal
    blocked: tuple[float, list[int], int | None] | None = None  # its event loop is blocked: since, jobs, by
    lag: float = 0.0  # seconds its event loop came round late at worst in the last second (shared jobs)
    recalling: bool = False  # asked to give back the jobs behind the one it runs (SIGUSR1)

    @property
    def held(self) -> list[Claimed]:
        """Every job handed to it: the alone ones in order, or those that share it."""
        return list(self.sharing.values()) if self.sharing else list(self.jobs)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def job(self) -> Claimed | None:
        """The job it is running."""
        return self.jobs[0] if self.jobs else None


@dataclass
class Slot:
    """What stays with a place in the pool across the processes that fill it."""

    index: int
    restarts: int = 0
    start_failures: int = 0
    last_exit: str | None = None


class Events(Protocol):
    """What the keeper tells of the jobs it handed out, as it hears it: the dispatcher listens."""

    def worker_ready(self, worker: Worker) -> None:
        """`worker` is idle: it may be handed jobs."""

    def outcome(self, worker: Worker, job: Claimed, answer: Answer) -> None:
        """`worker` answered for `job`."""

    def lost(self, worker: Worker, job: Claimed, cause: str, unstarted: list[Claimed]) -> None:
        """`worker` died or was stopped running `job`; the jobs handed to it after that never started."""

    def lost_shared(self, worker: Worker, jobs: list[Claimed], culprit: int | None, cause: str) -> None:
        """A process that ran shared jobs ended with `jobs`; `culprit`: the job to blame, if one is known."""

    def room(self, worker: Worker) -> None:
        """A process running shared jobs has room for one more."""

    def recalled(self, worker: Worker, jobs: list[Claimed]) -> None:
        """`worker` gave back `jobs`, handed to it behind a slow one and not started."""


class _Unheard:
    """The keeper's events before the dispatcher exists: a worker ready then is handed jobs once it does;
    nothing else can happen before a job is handed out."""

    def worker_ready(self, worker: Worker) -> None:
        pass

    def outcome(self, worker: Worker, job: Claimed, answer: Answer) -> None:
        _unheard()

    def lost(self, worker: Worker, job: Claimed, cause: str, unstarted: list[Claimed]) -> None:
        _unheard()

    def lost_shared(self, worker: Worker, jobs: list[Claimed], culprit: int | None, cause: str) -> None:
        _unheard()

    def room(self, worker: Worker) -> None:
        _unheard()

    def recalled(self, worker: Worker, jobs: list[Claimed]) -> None:
        _unheard()


def _unheard() -> None:
    raise AssertionError("a job was handed out before the dispatcher existed")


_UNHEARD: Events = _Unheard()


@dataclass
class Keeper:
    config: Config
    log: EventLog
    on_fatal: Callable[[str], None]  # no worker can start at all
    # Who hears of the jobs: the dispatcher, once the supervisor has connected and built it. Workers start
    # before that; one ready meanwhile is handed jobs when it is set (Supervisor.run).
    events: Events = field(default_factory=lambda: _UNHEARD)
    workers: dict[int, Worker] = field(default_factory=dict)  # slot -> current process
    retiring: set[Worker] = field(default_factory=set)
    slots: list[Slot] = field(default_factory=list)
    # What the app handles, told by the first ready worker; None: any kind (an app that finds them).
    kinds: frozenset[str] | None = None
    timeouts: dict[str, float] = field(default_factory=dict)
    schedules: list = field(default_factory=list)  # the app's Schedules, told by the first ready worker
    limits: dict[str, dict] = field(default_factory=dict)  # kind -> the limits its handler declares (JSON)
    # Kinds whose jobs share a process -> the most of them one process runs (--capacity at most).
    shared_kinds: dict[str, int] = field(default_factory=dict)
    ever_ready: bool = False
    stopping: bool = False
    restarts_by_cause: dict[str, int] = field(default_factory=dict)  # for jobsup_worker_restarts_total
    blocked_count: int = 0  # event loops found blocked, for jobsup_worker_loop_blocked_total

    def __post_init__(self) -> None:
        # forkserver: workers are forked from a clean server process, never from this one, which
        # holds connections and an event loop.
        self.ctx = multiprocessing.get_context("forkserver")
        # What every worker imports, imported once in the fork server: a worker then starts in tens of
        # milliseconds rather than the quarter second jobsup.app's imports (psycopg among them) take,
        # which is what a crash of a process running shared jobs costs its neighbours in waiting.
        # jobsup's modules open nothing at import; the app itself is imported in each worker.
        self.ctx.set_forkserver_preload(["jobsup.worker.main", "jobsup.app", "jobsup.worker.sharing"])
        self.slots = [Slot(i) for i in range(self.config.procs)]
        self.loop: asyncio.AbstractEventLoop | None = None
        # Where each worker's faulthandler report goes: a file a worker makes only once it runs shared
        # jobs, removed when the worker is gone.
        self.fault_prefix = os.path.join(tempfile.gettempdir(), f"jobsup-fault-{os.getpid()}-")
        self._spawned = 0

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
        self._spawned += 1
        fault_path = f"{self.fault_prefix}{self._spawned}.txt"
        process = self.ctx.Process(
            target=worker_main,
            name=f"jobsup-worker-{slot.index}",
            args=(
                their_inbox,
                their_outbox,
                self.config.app,
                os.getpid(),
                os.getcwd(),
                self.config.django,
                self.config.capacity,
                fault_path,
            ),
            daemon=False,
        )
        process.start()
        their_inbox.close()  # so our end reads EOF the moment the worker is gone
        their_outbox.close()
        worker = Worker(slot.index, process, inbox, outbox, Reader(outbox.fileno()), fault_path=fault_path)
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

    def _message(self, worker: Worker, message: messages.Message) -> None:
        tag = message[0]
        if tag == messages.ANSWER:
            # A traced run's answer carries the trace and span of the attempt.
            answer, worker.trace = messages.read_answer(message)
            if worker.sharing:
                self._shared_answer(worker, answer)
                return
            job = worker.job
            if job is None or job.id != answer.id:
                return  # an answer for a job we already counted as lost
            worker.jobs.popleft()
            worker.jobs_done += 1
            self.events.outcome(worker, job, answer)
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
                self.events.worker_ready(worker)
        elif tag == messages.BLOCKED:
            behind, ids, culprit = messages.read_blocked(message)
            worker.blocked = (self._now() - behind, ids, culprit)
            self.blocked_count += 1
            self.log(
                "worker.blocked",
                "warning",
                pid=worker.pid,
                slot=worker.slot,
                seconds=behind,
                jobs=ids,
                by=culprit,
                note="a sync call in an async handler blocks the event loop of every job in the process",
            )
        elif tag == messages.RECALLED:
            worker.recalling = False
            given_back = set(messages.read_recalled(message))
            back = [job for job in worker.jobs if job.id in given_back]
            if back:
                worker.jobs = deque(job for job in worker.jobs if job.id not in given_back)
                self.events.recalled(worker, back)
        elif tag == messages.LAG:
            worker.lag = messages.read_lag(message)
        elif tag == messages.UNBLOCKED:
            if worker.blocked is not None:
                self.log(
                    "worker.unblocked",
                    pid=worker.pid,
                    slot=worker.slot,
                    seconds=round(self._now() - worker.blocked[0], 3),
                )
            worker.blocked = None
        elif tag == messages.READY:
            pid, kinds, timeouts, schedules, limits, shared = messages.read_ready(message)
            worker.state = "idle"
            slot = self.slots[worker.slot]
            slot.start_failures = 0
            if not self.ever_ready:
                self.ever_ready = True
                self.kinds = frozenset(kinds) if kinds is not None else None
                self.timeouts = dict(timeouts)
                self.schedules = list(schedules)
                self.limits = dict(limits)
                capacity = self.config.capacity
                self.shared_kinds = {kind: min(cap or capacity, capacity) for kind, cap in shared.items()}
                for kind, cap in sorted(shared.items()):
                    if cap > capacity:
                        self.log(
                            "app.per_process_capped",
                            "warning",
                            kind=kind,
                            per_process=cap,
                            capacity=capacity,
                            note="a process runs at most --capacity jobs at once: that wins",
                        )
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
                self.events.worker_ready(worker)
        elif tag == messages.FATAL:
            worker.stop_reason = messages.read_fatal(message)

    def _exited(self, worker: Worker) -> None:
        if not worker.outbox.closed and worker.outbox.poll():
            self._readable(worker)  # an answer written just before the end still counts
        self._unwatch(worker)
        worker.process.join(0)
        exitcode = worker.process.exitcode
        worker.inbox.close()
        worker.outbox.close()
        slot = self.slots[worker.slot]
        cause = worker.stop_reason or _exit_cause(exitcode)
        retired = worker in self.retiring
        self.retiring.discard(worker)
        current = self.workers.get(worker.slot) is worker
        if current:
            del self.workers[worker.slot]
        if worker.sharing:
            self._shared_exited(worker, cause)
            self._after_exit(worker, slot, current, busy=True)
            return
        self._forget_fault(worker)
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
            self.events.lost(worker, job, cause, jobs[1:])
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
        self._after_exit(worker, slot, current, busy=job is not None)

    def _after_exit(self, worker: Worker, slot: Slot, current: bool, busy: bool) -> None:
        cause = worker.stop_reason or _exit_cause(worker.process.exitcode)
        if current and not self.stopping:
            self._count_restart("start_failed" if worker.state == "starting" else restart_cause(cause))
            self._respawn(slot, after_start_failure=worker.state == "starting" and not busy)

    # --- jobs that share a process ---------------------------------------------------------------

    def _shared_answer(self, worker: Worker, answer: Answer) -> None:
        job = worker.sharing.pop(answer.id, None)
        if job is None:
            return  # an answer for a job we already counted as lost
        worker.shared_started.pop(job.id, None)
        worker.shared_stopping.pop(job.id, None)
        worker.shared_kinds[job.kind] -= 1
        worker.jobs_done += 1
        if worker.recycle_after is not None and worker.jobs_done >= worker.recycle_after and not worker.draining:
            worker.draining = f"{worker.jobs_done} jobs"
        self.events.outcome(worker, job, answer)
        if worker.sharing:
            if worker.draining is None and worker.stop_reason is None:
                self.events.room(worker)  # room for another shared job: handed out, or claimed
            return
        worker.state = "idle"
        worker.shared_kinds.clear()
        worker.blocked = None
        worker.lag = 0.0
        worker.draining = None  # recycled below if that is what it drained for
        if self.stopping:
            self.stop_worker(worker)
        elif not self._retire_if_due(worker):
            self.events.worker_ready(worker)

    def assign_shared(self, worker: Worker, jobs: list[Claimed]) -> None:
        """Hand `jobs` (of shared kinds, within its room) to `worker`, which starts them all at once."""
        now = self._now()
        if worker.state == "idle":
            worker.state = "busy"
            worker.job_started = now
            worker.job_started_wall = time.time()
        for job in jobs:
            worker.sharing[job.id] = job
            worker.shared_started[job.id] = now
            worker.shared_kinds[job.kind] += 1
        try:
            send(worker.inbox.fileno(), messages.shared(jobs))
        except (OSError, ValueError):
            pass  # the worker died this instant; its sentinel fires and its jobs are accounted for

    def stop_job(self, worker: Worker, job: Claimed, reason: str) -> None:
        """Stop `job`, which `worker` runs: the process, for an alone job; for a shared one, the job's
        task is cancelled, and the process recycled if the job has not ended a kill grace later (a
        sync job in a thread, or a task that ignores its cancellation)."""
        if not worker.sharing:
            self.interrupt(worker, reason)
            return
        if job.id in worker.shared_stopping:
            return
        worker.shared_stopping[job.id] = (self._now() + self.config.kill_grace, reason)
        try:
            send(worker.inbox.fileno(), messages.cancel(messages.Cancel(job.id, stop_status(reason), reason)))
        except (OSError, ValueError):
            pass

    def _check_shared(self, worker: Worker, now: float) -> None:
        if worker.stop_reason is not None:
            return
        for job_id, started in list(worker.shared_started.items()):
            job = worker.sharing[job_id]
            stopping = worker.shared_stopping.get(job_id)
            if stopping is not None:
                if now >= stopping[0]:
                    self.log(
                        "job.stop_ignored",
                        "warning",
                        pid=worker.pid,
                        grace=f"{self.config.kill_grace:g}s",
                        **about(job),
                    )
                    worker.culprit = job_id
                    self.interrupt(
                        worker,
                        f"{stopping[1]}, and did not stop within {self.config.kill_grace:g}s: {RECYCLED}",
                    )
                    return
                continue
            limit = self.timeout_of(job.kind)
            if now - started > limit:
                self.log("job.timed_out", "warning", pid=worker.pid, limit=f"{limit:g}s", **about(job))
                self.stop_job(worker, job, f"timed out after {limit:g}s")
        if worker.blocked is not None and now - worker.blocked[0] > self.config.loop_block_limit:
            since, ids, culprit = worker.blocked
            worker.culprit = culprit
            self.log(
                "worker.recycled",
                "warning",
                pid=worker.pid,
                slot=worker.slot,
                reason=f"event loop blocked for {now - since:.1f}s",
                by=culprit,
            )
            self.interrupt(
                worker, f"blocked the event loop for more than {self.config.loop_block_limit:g}s: {RECYCLED}"
            )

    def _shared_exited(self, worker: Worker, cause: str) -> None:
        """A process that ran shared jobs ended with them: the dispatcher decides what each one's
        attempt comes to (the crash rule), knowing which job to blame when the process could tell."""
        jobs = list(worker.sharing.values())
        culprit = worker.culprit
        if culprit is None:
            culprit = self._fault_culprit(worker)
        self._forget_fault(worker)
        worker.sharing.clear()
        worker.shared_started.clear()
        worker.shared_stopping.clear()
        worker.shared_kinds.clear()
        slot = self.slots[worker.slot]
        slot.last_exit = cause
        self.log(
            "worker.stopped" if cause.startswith(INTERRUPTED) else "worker.died",
            "warning",
            pid=worker.pid,
            slot=worker.slot,
            cause=cause,
            jobs=len(jobs),
            by=culprit,
        )
        self.events.lost_shared(worker, jobs, culprit, cause)

    def _fault_culprit(self, worker: Worker) -> int | None:
        from jobsup.worker.sharing import culprit_of_fault

        try:
            with open(worker.fault_path, errors="replace") as report:
                text = report.read()
        except OSError:
            return None
        culprit = culprit_of_fault(text)
        return culprit if culprit in worker.sharing else None

    def _forget_fault(self, worker: Worker) -> None:
        if worker.fault_path:
            try:
                os.unlink(worker.fault_path)
            except OSError:
                pass

    def close(self) -> None:
        """Remove the fault reports of the workers still known (those gone removed theirs)."""
        for worker in self.all_processes():
            self._forget_fault(worker)

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

    def assign(self, worker: Worker, jobs: list[Claimed]) -> None:
        """Hand `jobs` to an idle worker, which runs them in this order."""
        worker.state = "busy"
        worker.jobs.extend(jobs)
        worker.job_started = self._now()
        worker.job_started_wall = time.time()
        try:
            send(worker.inbox.fileno(), messages.jobs(jobs))
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
            elif worker.sharing:
                self._check_shared(worker, now)
            elif worker.state == "busy" and worker.job is not None and worker.stop_reason is None:
                if len(worker.jobs) > 1 and not worker.recalling and now - worker.job_started > RECALL_AFTER:
                    # Handed out behind a job that turns out slow: they go to a free worker instead.
                    worker.recalling = True
                    self._signal(worker, signal.SIGUSR1)
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
        worker.state = "stopping" if worker.job is None and not worker.sharing else worker.state
        # Told first, so a worker with run middleware can tell them why its attempt ends (jobsup/worker/main.py).
        try:
            send(worker.inbox.fileno(), messages.interrupt(messages.Interrupt(stop_status(reason), reason)))
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
            send(worker.inbox.fileno(), messages.stop())
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
                if worker.sharing and worker.draining is None:  # finishes what it holds, then is replaced
                    worker.draining = f"rss {worker.rss // 2**20} MB over --max-memory {self.config.max_memory_mb} MB"
                if worker.state == "idle":
                    self._retire_if_due(worker)
                elif worker.state == "busy" and worker.rss > 2 * limit and worker.stop_reason is None:
                    # Between jobs is the polite time to recycle; a job that doubles the limit is not
                    # let run until the kernel's OOM killer picks a victim on its own.
                    self.log(
                        "worker.over_memory",
                        "warning",
                        job=worker.job.id if worker.job else sorted(worker.sharing) or None,
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

    def take_jobs(self) -> tuple[list[Claimed], list[Claimed]]:
        """Every job handed to a worker, taken back before a hard stop kills them all: (those running,
        those handed behind one and not started)."""
        running: list[Claimed] = []
        unstarted: list[Claimed] = []
        for worker in self.all_processes():
            running.extend(worker.sharing.values())
            worker.sharing.clear()
            if worker.jobs:
                running.append(worker.jobs.popleft())
                unstarted.extend(worker.jobs)
                worker.jobs.clear()
        return running, unstarted

    def kill_all(self, reason: str | None = None) -> None:
        """SIGKILL every worker. `reason`, the keeper's own cause of the kill, is what each worker's
        end is logged with (a worker already being stopped keeps the cause it has): the signal alone
        would read as the OOM killer's. None only where nothing is logged any more."""
        for worker in self.all_processes():
            if reason is not None:
                if worker.stop_reason is None:
                    worker.stop_reason = reason
                if not worker.jobs and not worker.sharing:  # one holding jobs ends as their loss, with its cause
                    worker.state = "stopping"
            self._signal(worker, signal.SIGKILL)
