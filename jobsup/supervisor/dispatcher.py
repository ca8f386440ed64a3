"""The dispatcher: claims what the workers can start soon, hands it out, buffers the outcomes and
writes them in batches, and renews the leases of everything it holds.

A job is held from the claim that takes it to the write that records its outcome (or hands it back);
every held job's lease is renewed together, whether it runs, waits in the prefetch, or waits for its
outcome to be written, so no job is reaped while its supervisor lives.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import psycopg

from jobsup.db import lifecycle, notify
from jobsup.db.lifecycle import Cancel, ClaimKey, Failure, Snoozed
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import arun_together
from jobsup.job import Job
from jobsup.ops.latency import Recorder
from jobsup.outcomes import Answer
from jobsup.supervisor.config import Config
from jobsup.supervisor.declaration import RETRY as RETRY_DECLARATION
from jobsup.supervisor.declaration import Declaration
from jobsup.supervisor.keeper import INTERRUPTED, TOOK_ITS_PROCESS, Keeper, Worker
from jobsup.supervisor.keys import ClaimKeys
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.log import EventLog, about
from jobsup.supervisor.tally import Tally

# Besides --prefetch, claim what the workers are expected to start within this horizon at the rate
# they have been finishing jobs: many short jobs are claimed in few statements (each one a commit the
# server must flush), while slow jobs are claimed about one per idle worker.
PREFETCH_HORIZON = 0.05
# The prefetch holds at most this many claims of --batch, and a claim of short jobs waits until it can
# take half the prefetch, a whole --batch at most: under a stream of short jobs a full claim is on its
# way while the workers still have one to run. With one claim's worth at most, each claim began when
# half of it was left; under CPU contention a claim took longer than that half lasted, the workers ran
# dry before every claim came back, and a supervisor of two workers claimed ~130 jobs at a time against
# ~250 for one of eight.
PREFETCH_CLAIMS = 2
# The finishing rate is sampled by the claim loop, over at least RATE_WINDOW. A rising rate is taken at
# once, so a burst's claims grow with every claim: they grew once per 50 ms tick, and a supervisor of two
# workers spent a fifth of a 20,000-job burst claiming 2 to 9 jobs at a time while its workers waited.
# A falling rate decays with this time constant (seconds).
RATE_WINDOW = 0.01
RATE_DECAY = 0.15
# Weight of the newest sample in the smoothed job duration.
DURATION_SMOOTHING = 0.3
# Jobs that take less than this on average go to a worker several at a time (at most HANDOUT_MAX), so
# the supervisor writes one message per few jobs instead of one per job. A worker runs them in order
# and answers each as it ends; if it dies, the one it was running fails and the rest are handed back.
# Each message wakes its worker (a pipe write that, on a loaded machine, costs the supervisor's one
# thread tens of µs): 32 rather than 8 cut the supervisor's CPU per no-op job by about a sixth.
SHORT_JOB = 0.002
HANDOUT_MAX = 32
# The most short jobs of a limited kind handed to one worker while the limit holds the kind back.
LIMITED_HANDOUT_MAX = 4
# Most outcomes one statement writes: after a stall, a backlog of outcomes goes in several statements of
# a bounded cost rather than one that holds every row lock for as long as it runs.
WRITE_MAX = 1000
# Future run_at times remembered to wake for (retries, delayed jobs); beyond these the poll finds them.
KNOWN_RUN_ATS = 10_000
# Failures alike for the log (EventLog.alike): the same kind with the same error. Each is still written
# to its job; the log writes the first of a burst in full and counts the rest.
_ALIKE = ("kind", "error")
# How long before a rate's next start its supervisor wakes to claim it (claim_limited waits the rest).
RATE_WAKE_AHEAD = 0.010
# Jobs that share processes are claimed once this share of their room is free (a claim for each job
# that ends would cost a commit each), or once a whole --batch is.
SHARED_CLAIM_SHARE = 0.1
# The crash rule of jobs that share a process: a job whose process died under it, with neighbours and
# no way to tell which of them crashed it, runs again (the same attempt, no attempt counted); once it
# has been through RERUNS_UNKNOWN such deaths, or RERUNS_MOST deaths of any cause, it runs alone, where
# a death is its own failed attempt. So no attempt is rerun more than RERUNS_MOST times.
RERUNS_UNKNOWN = 2
RERUNS_MOST = 3
# Why a process that runs shared jobs takes no more: an alone job waits for a process.
DRAIN_FOR_ALONE = "an alone job waits for a process"


class Wakeup:
    """A flag the loop can wait on with a timeout, without a task per wait."""

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """True if set (now or before), False after `timeout` seconds."""
        if not self._flag:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            handle = loop.call_later(max(0.0, timeout), _wake, waiter)
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None
        woke, self._flag = self._flag, False
        return woke


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # set() may have woken it within the same loop iteration
        waiter.set_result(None)


class FinishingRate:
    """Jobs finished per second, from samples of a running count at least RATE_WINDOW apart: a rise
    is taken at once, a fall decays with the time constant RATE_DECAY.

    >>> rate = FinishingRate()
    >>> rate.sample(0.0, 0); rate.sample(0.005, 50)  # the second is too soon: no figure yet
    >>> rate.per_second
    0.0
    >>> rate.sample(0.05, 500); round(rate.per_second)  # 500 jobs in 50 ms, taken at once
    10000
    >>> rate.sample(0.20, 500); round(rate.per_second)  # none for 150 ms: down by 1 - 1/e
    3679
    """

    def __init__(self) -> None:
        self.per_second = 0.0
        self._last: tuple[float, int] | None = None  # (when, count) of the last sample taken

    def sample(self, now: float, count: int) -> None:
        if self._last is None:
            self._last = (now, count)
            return
        then, before = self._last
        if now - then < RATE_WINDOW:
            return
        current = (count - before) / (now - then)
        weight = 1.0 if current > self.per_second else -math.expm1(-(now - then) / RATE_DECAY)
        self.per_second += weight * (current - self.per_second)
        self._last = (now, count)


class Dispatcher:
    def __init__(
        self,
        config: Config,
        log: EventLog,
        supervisor_id: str,
        keeper: Keeper,
        claims: Link,
        writes: Link,
        tally: Tally | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.keeper = keeper
        self.claims = claims
        self.writes = writes
        self.held: dict[int, Job] = {}  # claimed and not yet written back
        self.prefetched: deque[Job] = deque()
        self.done_buffer: list[Job] = []
        self.return_values: dict[int, str] = {}  # job id -> JSON text, for done jobs that returned one
        # job id -> (trace id, span id) of its traced attempt, until its outcome's log line is written
        self.traces: dict[int, tuple[str, str]] = {}
        self.fail_buffer: list[Failure] = []
        self.release_buffer: list[tuple[Job, str | None]] = []
        self.snooze_buffer: list[Snoozed] = []  # control: Snooze
        self.cancel_buffer: list[Cancel] = []  # control: Discard, and operators' cancels
        self.cancelling: dict[int, str] = {}  # held jobs an operator asked to cancel -> who asked
        self.paused: set[str] = set()  # our queues that are paused: left out of every claim
        self.pause_notes = 0  # pause NOTIFYs heard: a heartbeat's older answer must not undo one
        self.renew_wakeup = Wakeup()
        self.more = True  # ready jobs may be waiting: a claim is worth a round trip
        self.pokes = 0  # how many times `more` was set from outside the claim loop
        self.run_ats: list[float] = []  # heap of future run_at times we know of (epoch seconds)
        self.stopping = False
        self.orphans_possible = False
        self.claim_wakeup = Wakeup()
        self.keys = ClaimKeys(config.queues, config.poll_interval)  # where each queue's next claim starts
        self.flush_wakeup = asyncio.Event()
        self.idle_wakeup = Wakeup()  # shutdown waits on it for running jobs to end
        self.jobs_done = 0
        self.finished = 0  # outcomes heard from workers, for the finishing rate
        self.rate = FinishingRate()  # sampled by the claim loop
        self.duration = 1.0  # seconds a handler runs, smoothed; assume slow until the first is measured
        self.kind_ran: dict[str, float] = {}  # the same for each kind; a kind not seen yet counts as slow
        # Queue latency and run time per kind, added to jobsup.latency with the outcome writes.
        self.tally = tally
        self.latency = Recorder(keep_totals=tally is not None)
        self._latency_due: dict[str, list] | None = None  # taken for the next outcome write to carry
        self._latency_timer: asyncio.TimerHandle | None = None
        # Limits: the kinds with a limit in force (the database's, told by the heartbeat and the jobsup
        # channel), whose jobs only claim_limited takes; held jobs of those kinds; kinds of which this
        # supervisor wrote an outcome since the last flush (a slot freed: others may claim).
        self.limits_in_force: frozenset[str] = frozenset()
        self.keyed_limits: frozenset[str] = frozenset()  # those of them with per-key limits
        self.limited_more = False  # a limited job may be claimable: a claim_limited is worth a round trip
        self.limited_held: set[int] = set()
        self.limited_claiming = 0  # jobs asked of claims of limited kinds in flight, for idle workers
        self.limited_room = 0  # how many the last claim of limited kinds that limits cut short took
        # The last claim of limited kinds took fewer than it asked for: a limit holds them back (or
        # their backlog ran out). Their jobs then turn slots over: each is handed out and written
        # at once, not held back to share a message or a write (_handout, flush_loop).
        self.limited_short = False
        self._freed: Counter[str] = Counter()  # slots freed by our outcome writes not yet taken again, by kind
        self.refused: str | None = None  # why the schema refuses our claims (a newer claim protocol)
        # Records the app's limits before the first claim (supervisor/declaration.py); None once done.
        self.declaration: Declaration | None = None
        # The crash rule of shared jobs: how often each held job ran again after its process died with
        # neighbours (unknown culprit, any cause), and the jobs of shared kinds that now must run alone.
        self.reruns: dict[int, tuple[int, int]] = {}
        self.alone: set[int] = set()
        self.backlog = False  # the last claim took all it asked for: more may be ready behind it

    # --- what the keeper tells us ------------------------------------------------------------

    def worker_ready(self, worker: Worker) -> None:
        if self.prefetched and not self.stopping:
            if self.keeper.shared_kinds:
                self.hand_out()
            else:
                self.keeper.assign(worker, self._handout(worker, 1))
        if self.more or (self.limited_more and self.limits_in_force):
            self.claim_wakeup.set()

    def outcome(self, worker: Worker, job: Job, answer: Answer) -> None:
        """A worker's answer for `job`, buffered for the write its record goes to (lifecycle.record_of).
        A cancel requested meanwhile wins in the statements themselves: a snoozed or failed job with
        a request is written cancelled."""
        self.finished += 1
        # The handler's own run time, not the time since the handout: on a loaded machine the trip
        # through the pipes takes milliseconds, and counting it made a no-op job look long, so it was
        # sent alone, which made more trips, which kept it looking long (a 2-worker supervisor
        # sharing a core stayed at one job per message and ran at a tenth of the rate).
        self.duration += (DURATION_SMOOTHING if self.finished > 1 else 1.0) * (answer.ran - self.duration)
        # Each kind's own: whether its jobs are short enough to hand out several at a time.
        ran = self.kind_ran.get(job.kind)
        self.kind_ran[job.kind] = answer.ran if ran is None else ran + DURATION_SMOOTHING * (answer.ran - ran)
        self._timed(job, answer.ran)
        record = lifecycle.record_of(job, answer)
        if worker.trace is not None:
            self.traces[job.id] = worker.trace
        if record is None:
            self.done_buffer.append(job)
            if answer.value is not None:
                self.return_values[job.id] = answer.value
        elif isinstance(record, Failure):  # a RetryAfter too
            # The attempt that buries the job is logged once, by its write, as job.dead: a job.failed
            # line here too counted that failure twice. (One whose cancel was requested is written
            # cancelled, not dead: it stays a failure here.)
            if job.attempts < job.max_attempts or job.id in self.cancelling:
                self.log.alike(
                    "job.failed",
                    "warning",
                    like=_ALIKE,
                    pid=worker.pid,
                    error=answer.error,
                    **about(job, worker.trace),
                )
            self.fail_buffer.append(record)
        elif isinstance(record, Snoozed):
            self.log(
                "job.snoozed",
                "debug",
                pid=worker.pid,
                delay=f"{record.delay:g}s",
                **about(job, worker.trace),
            )
            self.snooze_buffer.append(record)
        else:  # a Discard
            self.log(
                "job.discarded",
                pid=worker.pid,
                error=answer.error,
                **about(job, worker.trace),
            )
            self.cancel_buffer.append(record)
        self.flush_wakeup.set()
        self.idle_wakeup.set()

    def lost(self, worker: Worker, job: Job, cause: str, unstarted: list[Job]) -> None:
        """The worker running `job` died, or was stopped for a timeout, a shutdown or a cancel."""
        if job.id in self.cancelling:  # stopped on an operator's request (or died meanwhile): cancelled
            self.cancel_buffer.append(Cancel(job.id, job.attempts, by=self.cancelling[job.id]))
        elif cause.startswith(INTERRUPTED):
            self.release_buffer.append((job, cause))  # a shutdown is not the job's fault
        else:
            self._timed(job, asyncio.get_running_loop().time() - worker.job_started)
            self.fail_buffer.append(Failure(job.id, job.attempts, cause, None))
        self.release_buffer.extend((j, None) for j in unstarted)
        self.flush_wakeup.set()
        self.idle_wakeup.set()

    def recalled(self, worker: Worker, jobs: list[Job]) -> None:
        """A worker gave back `jobs`, handed to it behind one that turned out slow and not started:
        they go first to the next free worker (or back to the queue, at a shutdown)."""
        self.log(
            "jobs.recalled",
            "debug",
            pid=worker.pid,
            behind=worker.job.id if worker.job else None,
            ids=[j.id for j in jobs],
        )
        self._first_in_line(jobs)

    def _first_in_line(self, jobs: list[Job]) -> None:
        """Held jobs no worker runs: first for the next free worker, or back to the queue at a shutdown."""
        if self.stopping:
            self.release_buffer.extend((j, None) for j in jobs)
            self.flush_wakeup.set()
            return
        self.prefetched.extendleft(reversed(jobs))
        self.hand_out()

    def room(self, worker: Worker) -> None:
        """A shared job ended and its process runs others: its place goes to a prefetched job, or to
        the next claim (which waits until a share of the room is free)."""
        if self.stopping:
            return
        if self.prefetched:
            self.hand_out()
        if self.more or (self.limited_more and self.limits_in_force):
            self.claim_wakeup.set()

    def lost_shared(self, worker: Worker, jobs: list[Job], culprit: int | None, cause: str) -> None:
        """A process that ran shared jobs ended with `jobs` (the crash rule, docs/guides/waiting.md):
        the job it could blame (`culprit`), or the only one it ran, fails as an alone job's death
        does; its neighbours run again under the same attempt, none lost; a job rerun too often, or
        twice after deaths no one could be blamed for, runs alone next. A shutdown's stop returns them
        all, as for alone jobs."""
        interrupted = cause.startswith(INTERRUPTED)
        again: list[Job] = []
        for job in jobs:
            if job.id in self.cancelling:
                self.cancel_buffer.append(Cancel(job.id, job.attempts, by=self.cancelling[job.id]))
            elif interrupted:
                self.release_buffer.append((job, cause))
            elif job.id == culprit or len(jobs) == 1:
                self._timed(
                    job, asyncio.get_running_loop().time() - worker.shared_started.get(job.id, worker.job_started)
                )
                self.fail_buffer.append(Failure(job.id, job.attempts, cause, None))
            else:
                unknown, total = self.reruns.get(job.id, (0, 0))
                unknown, total = unknown + (culprit is None), total + 1
                self.reruns[job.id] = (unknown, total)
                if unknown >= RERUNS_UNKNOWN or total >= RERUNS_MOST:
                    self.alone.add(job.id)
                again.append(job)
        if again:
            self.log(
                "jobs.rerun",
                "warning",
                count=len(again),
                ids=[j.id for j in again],
                cause=cause,
                blamed=culprit,
                alone=sorted(j.id for j in again if j.id in self.alone),
                note="their process died under them: they run again, no attempt counted",
            )
            self._first_in_line(again)
        self.flush_wakeup.set()
        self.idle_wakeup.set()

    def control(self, message: notify.Control) -> None:
        """Act on a NOTIFY of a cancel, of a queue's pause or resume, of a limit set or removed, or of
        slots freed; the insert notifications go to notified()."""
        match message:
            case notify.CancelRequested(None, _):  # too many to name: the renewal returns our requests
                self.renew_wakeup.set()
            case notify.CancelRequested(ids, by):
                self.cancel_requested(dict.fromkeys(ids or (), by))
            case notify.LimitChanged(kind, limited, keyed):
                kinds, keyed_kinds = self.limits_in_force, self.keyed_limits
                self.set_limits_in_force(
                    kinds | {kind} if limited else kinds - {kind},
                    keyed_kinds | {kind} if keyed else keyed_kinds - {kind},
                )
                self.log("limit.changed", kind=kind, limited=limited)
                self.poke()
            case notify.SlotsFreed(kinds):  # another supervisor wrote outcomes of limited jobs
                if self.limits_in_force.intersection(kinds):
                    self.limited_more = True
                    self.claim_wakeup.set()
            case notify.QueuePaused(queue_name, paused):
                self.pause_notes += 1
                self.set_paused(self.paused | {queue_name} if paused else self.paused - {queue_name})

    def cancel_requested(self, requests: Mapping[int, str]) -> None:
        """Stop the held jobs an operator cancelled: a prefetched one is written `cancelled` at once;
        a running one's worker is stopped (SIGTERM, SIGKILL after the kill grace, as for a timeout) and
        replaced, and lost() writes it. One handed to a worker behind another, or already finished and
        not yet written, ends as it ends (done stays done; a failure or snooze is written cancelled)."""
        for job_id, by in requests.items():
            job = self.held.get(job_id)
            if job is None or job_id in self.cancelling:
                continue
            self.cancelling[job_id] = by
            if any(j.id == job_id for j in self.prefetched):
                self.prefetched = deque(j for j in self.prefetched if j.id != job_id)
                self.cancel_buffer.append(Cancel(job.id, job.attempts, by=by))
                self.flush_wakeup.set()
                continue
            for worker in self.keeper.all_processes():
                if job_id in worker.sharing:
                    self.log("job.cancelling", pid=worker.pid, by=by, **about(job))
                    self.keeper.stop_job(worker, job, f"cancelled by {by}")
                    break
                if worker.job is not None and worker.job.id == job_id:
                    self.log(
                        "job.cancelling",
                        pid=worker.pid,
                        by=by,
                        **about(job),
                    )
                    if worker.stop_reason is None:  # one being stopped already (a timeout) is let be
                        self.keeper.interrupt(worker, f"cancelled by {by}")
                    break

    def set_paused(self, paused: set[str]) -> None:
        """The paused queues, from a NOTIFY or a heartbeat: claims leave them out at once; prefetched
        jobs of a queue just paused go back unstarted (they could wait behind a long job); a queue just
        resumed is claimed from its head."""
        paused = paused & set(self.config.queues)
        added, removed = paused - self.paused, self.paused - paused
        self.paused = paused
        if added:
            self.log("queue.paused", queues=sorted(added))
            back = [j for j in self.prefetched if j.queue in added]
            if back:
                self.prefetched = deque(j for j in self.prefetched if j.queue not in added)
                self.release_buffer.extend((j, None) for j in back)
                self.flush_wakeup.set()
        if removed:
            self.log("queue.resumed", queues=sorted(removed))
            self.poke()

    def paused_read(self, queues: Iterable[str], notes_before: int) -> None:
        """The paused queues as a heartbeat read them; ignored if a pause NOTIFY came meanwhile (it is
        at least as new)."""
        if self.pause_notes == notes_before:
            self.set_paused(set(queues))

    def _timed(self, job: Job, took: float) -> None:
        """Count a finished attempt's queue latency (the database's clock) and run time (`took`: what
        the worker measured, or our own clock for a worker that died)."""
        if job.started_at is not None and job.run_at is not None:
            self.latency.record(job.kind, "queue_latency", (job.started_at - job.run_at).total_seconds())
        self.latency.record(job.kind, "run_time", took)

    def notified(self, message: notify.JobsQueued) -> None:
        """A NOTIFY of the insert trigger (or a release, reap or requeue)."""
        queues, run_at = message
        if queues and not set(queues) & set(self.config.queues):
            return
        if run_at is not None and run_at > time.time():
            self.note_run_at(run_at)
            return
        if run_at is not None and self.keys.sorts_after(queues, run_at):
            self.more = True  # an insert past our claim keys (see keys.py): they still hold
            self.claim_wakeup.set()
        else:
            self.poke()
        if self.tally is not None:  # a NOTIFY that woke the claimer
            self.tally.wakeups += 1

    def poke(self) -> None:
        """Something may be ready: claim at the next chance, scanning every queue from its head."""
        self.keys.forget()
        self.more = True
        self.limited_more = True
        self.pokes += 1
        self.claim_wakeup.set()

    def set_limits_in_force(self, kinds: Iterable[str], keyed: Iterable[str] = ()) -> None:
        """The kinds with a limit in force, and those of them with per-key limits, as the database says
        (a heartbeat, a NOTIFY)."""
        kinds = frozenset(kinds)
        self.keyed_limits = frozenset(keyed)
        if kinds - self.limits_in_force:
            self.limited_more = True
            self.claim_wakeup.set()
        self.limits_in_force = kinds

    def limited_kinds(self) -> list[str]:
        """The limited kinds this supervisor claims: those its app can run (any, for an app that finds
        kinds by name), sorted, the order claim_limited locks them in."""
        kinds = self.keeper.kinds
        return sorted(self.limits_in_force if kinds is None else self.limits_in_force & kinds)

    def refuse_claims(self, why: str) -> None:
        """The schema requires a newer claim than ours: stop claiming (what is held is finished and
        written as usual), and say why once."""
        if self.refused is None:
            self.refused = why
            self.log("claim.refused", "error", reason=why)

    def note_run_at(self, run_at: float) -> None:
        if len(self.run_ats) >= KNOWN_RUN_ATS:
            return  # the poll finds the rest
        if not self.run_ats or run_at < self.run_ats[0]:
            self.claim_wakeup.set()  # the claim loop recomputes how long it may sleep
        heapq.heappush(self.run_ats, run_at)

    # --- claiming ---------------------------------------------------------------------------

    def prefetch(self) -> int:
        # Bounded by what the handlers' own run time lets the workers start in the horizon: a window in
        # which several slow jobs happened to end together reads as a high rate, taken at once.
        expected = min(self.rate.per_second, self.config.procs / max(self.duration, 1e-6)) * PREFETCH_HORIZON
        return max(self.config.prefetch, min(PREFETCH_CLAIMS * self.config.batch, int(expected)))

    def capacity(self) -> int:
        if self.keeper.shared_kinds:
            return min(self.config.batch, self.shared_room() + self.prefetch() - len(self.prefetched))
        return min(self.config.batch, len(self.keeper.idle()) + self.prefetch() - len(self.prefetched))

    def shared_room(self) -> int:
        """How many more shared jobs the processes could start now: the free room of those running
        shared jobs, and a whole --capacity for each idle one."""
        capacity = self.config.capacity
        room = 0
        for worker in self.keeper.workers.values():
            if worker.state == "idle":
                room += capacity
            elif worker.sharing and worker.draining is None and worker.stop_reason is None:
                room += capacity - len(worker.sharing)
        return room

    async def claim_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self.config.poll_interval
        while not self.stopping:
            if self.declaration is not None and self.keeper.ever_ready:
                in_force = await self.declaration.record()
                if in_force is None:
                    await asyncio.sleep(RETRY_DECLARATION)
                    continue
                self.declaration = None
                self.set_limits_in_force(*in_force)
            self.rate.sample(loop.time(), self.finished)
            claimed = False
            want = self.capacity()
            # Short jobs with some still prefetched: wait until a claim can take a good share of what
            # is wanted (half, or a whole --batch), rather than spend a commit on one or two. Slower jobs
            # top the prefetch up at once.
            threshold = 1
            if self.prefetched and self.duration < SHORT_JOB:
                threshold = max(1, min(self.config.batch, (self.config.procs + self.prefetch()) // 2))
            if self.backlog and self.keeper.shared_kinds and self.keeper.kinds is not None and self.running_count():
                # Shared jobs behind a backlog: wait for a share of the room, so one claim starts many
                # (not one a job). A job announced once the queue had run dry is claimed at once.
                share = int(self.config.procs * self.config.capacity * SHARED_CLAIM_SHARE)
                threshold = max(threshold, min(self.config.batch, share))
            if (
                self.more
                and want >= threshold
                and self.keeper.ever_ready
                and self.refused is None
                and not (self.paused and self.paused.issuperset(self.config.queues))
            ):
                claimed = True
                pokes = self.pokes
                # An app of shared and alone kinds claims each in a statement of its own (mixed()),
                # where the claim keys of one would skip the other's jobs: it claims from the heads.
                keys = self.keys.for_claim() if self.mixed() is None else {}
                keyed = bool(keys)
                jobs = await self._claim(want, keys)
                next_poll = loop.time() + self.config.poll_interval
                if jobs is None or len(jobs) < want:
                    self.keys.forget()
                    # Short from the heads of the queues: nothing else was ready when its snapshot was
                    # taken. A poke that came while it was in flight (a NOTIFY, the listener's first
                    # LISTEN) may be for a job committed after that snapshot: it must lead to another claim.
                    if jobs is not None and not keyed and self.pokes == pokes:
                        self.more = False
                else:
                    self.keys.claimed(jobs)
                if jobs is not None:
                    self.backlog = len(jobs) >= want
                    self._take(jobs)
            limited_want = self._limited_want()
            # For short jobs, as for the claim above, a good share at once; but a limit caps what may be
            # held, and waiting for half a prefetch that the limit never lets fill would claim a limited
            # kind in lockstep: all of its slots, then none until all are free.
            if limited_want >= min(threshold, max(1, self.limited_room // 4)):
                claimed = True
                await self._claim_limited(limited_want)
            if claimed:
                continue
            timeout = next_poll - loop.time()
            if self.run_ats:
                timeout = min(timeout, self.run_ats[0] - time.time())
            await self.claim_wakeup.wait(timeout)
            now = time.time()
            if self.run_ats and now >= self.run_ats[0]:
                while self.run_ats and now >= self.run_ats[0]:
                    heapq.heappop(self.run_ats)
                self.more = self.limited_more = True
            if loop.time() >= next_poll:
                self.more = self.limited_more = True  # the safety net: a NOTIFY may have been missed
                next_poll = loop.time() + self.config.poll_interval

    def _limited_want(self) -> int:
        """How many limited jobs to claim now: one per idle worker that no prefetched job will take, so
        a slot is held only by a job about to start, never by one waiting in a prefetch while another
        supervisor's workers are idle. Short jobs (under SHORT_JOB) start moments after their claim
        wherever they wait, so for them the prefetch is filled as for jobs without limits: a kind
        limited to 64 is then claimed in batches, not one job per round trip."""
        if not (self.limited_more and self.limits_in_force and self.keeper.ever_ready) or self.refused is not None:
            return 0
        if self.paused and self.paused.issuperset(self.config.queues):
            return 0
        if self.duration < SHORT_JOB:
            return max(0, self.capacity() - self.limited_claiming)
        free = self.shared_room() if self.limited_shared() else len(self.keeper.idle())
        want = free - len(self.prefetched) - self.limited_claiming
        return min(want, self.config.batch)

    def limited_shared(self) -> bool:
        """Some limited kind of ours shares processes: idle room is counted in jobs, not processes."""
        shared = self.keeper.shared_kinds
        return bool(shared) and any(kind in shared for kind in self.limits_in_force)

    async def _claim_limited(self, want: int) -> None:
        kinds = self.limited_kinds()
        if not kinds:
            self.limited_more = False
            return
        pokes = self.pokes
        queues = [q for q in self.config.queues if q not in self.paused]
        self.limited_claiming += want
        try:
            conn = await self.claims.connect()
            await self._release_orphans(conn)
            jobs, wake = await lifecycle.aclaim_limited(conn, kinds, queues, want, self.id, self.config.lease)
        except LOST as exc:
            self.claims.drop(exc)
            self.orphans_possible = True
            return
        except psycopg.Error as exc:
            if exc.sqlstate == lifecycle.CLAIM_REFUSED:
                self.refuse_claims(str(exc.diag.message_primary))
                return
            raise
        finally:
            self.limited_claiming -= want
        self._took_limited(jobs, wake, want, pokes)

    def _took_limited(
        self, jobs: list[Job], wake: datetime | None, want: int, pokes: int, handoff: bool = False
    ) -> None:
        self.limited_short = len(jobs) < want
        if len(jobs) < want:
            if not handoff:  # what the limits let a claim take: about the room they leave (a write's own
                self.limited_room = len(jobs)  # claim takes what that write freed)
            if self.pokes == pokes:
                self.limited_more = False
        elif not handoff:
            self.limited_room = max(self.limited_room, len(jobs))
        if wake is not None:
            # A little ahead: a claim that comes before the start is due waits for it in the database
            # (claim_limited), so the start is on time rather than a wake-up and a round trip late.
            self.note_run_at(wake.timestamp() - RATE_WAKE_AHEAD)
        if not jobs:
            return
        if self.tally is not None:
            self.tally.claims += 1
            self.tally.claimed += len(jobs)
        self.limited_held.update(j.id for j in jobs)
        if self.keeper.shared_kinds:
            self._crashed_before(jobs)
        for job in jobs:
            self.held[job.id] = job
        self._first_in_line(jobs)  # each holds a slot, so it starts first

    async def _claim(self, want: int, keys: Mapping[str, ClaimKey]) -> list[Job] | None:
        if self.tally is None:
            return await self._claim_once(want, keys)
        started = time.perf_counter()
        jobs = await self._claim_once(want, keys)
        if jobs is not None:
            self.tally.claims += 1
            self.tally.claimed += len(jobs)
            self.tally.claim_seconds.observe(time.perf_counter() - started)
        return jobs

    async def _release_orphans(self, conn: psycopg.AsyncConnection) -> None:
        if not self.orphans_possible:
            return
        released = await lifecycle.arelease_orphans(conn, self.id, list(self.held))
        self.orphans_possible = False
        if released:
            self.log("jobs.released", reason="claim answer lost with the connection", count=len(released), ids=released)

    async def _claim_once(self, want: int, keys: Mapping[str, ClaimKey]) -> list[Job] | None:
        try:
            conn = await self.claims.connect()
            await self._release_orphans(conn)
            # Paused queues are left out of the claim's list: no pause costs the claim nothing.
            queues = self.config.queues if not self.paused else [q for q in self.config.queues if q not in self.paused]
            mixed = self.mixed()
            if mixed is not None:
                return await self._claim_mixed(conn, queues, want, *mixed)
            return await self._claim_kinds(conn, queues, want, self.keeper.kinds, keys)
        except LOST as exc:
            # The claim may have been committed without our hearing of it: hand back what we do not
            # know we hold before the next claim.
            self.claims.drop(exc)
            self.orphans_possible = True
            return None
        except psycopg.Error as exc:
            if exc.sqlstate == lifecycle.CLAIM_REFUSED:
                self.refuse_claims(str(exc.diag.message_primary))
                return None
            raise

    def mixed(self) -> tuple[list[str], list[str]] | None:
        """(alone kinds, shared kinds) of an app that has both, else None."""
        shared, kinds = self.keeper.shared_kinds, self.keeper.kinds
        if not shared or kinds is None or kinds.issubset(shared):
            return None
        return sorted(kinds - shared.keys()), sorted(shared)

    async def _claim_mixed(
        self,
        conn: psycopg.AsyncConnection,
        queues: list[str] | tuple[str, ...],
        want: int,
        alone: list[str],
        shared: list[str],
    ) -> list[Job]:
        """Claim for an app of alone and shared kinds: alone jobs for the idle processes (and the
        prefetch), shared ones for the room left; never more alone jobs than processes can start."""
        prefetched_alone = sum(1 for j in self.prefetched if j.kind not in self.keeper.shared_kinds)
        alone_want = min(want, len(self.keeper.idle()) + self.config.prefetch - prefetched_alone)
        jobs: list[Job] = []
        if alone_want > 0:
            jobs = await self._claim_kinds(conn, queues, alone_want, alone)
        # Idle processes the alone jobs will take hold no room for shared ones.
        shared_want = min(want, self.shared_room() - self.config.capacity * len(jobs)) - sum(
            1 for j in self.prefetched if j.kind in self.keeper.shared_kinds
        )
        if shared_want > 0:
            jobs += await self._claim_kinds(conn, queues, shared_want, shared)
        return jobs

    async def _claim_kinds(
        self,
        conn: psycopg.AsyncConnection,
        queues: Sequence[str],
        want: int,
        kinds: Collection[str] | None,
        keys: Mapping[str, ClaimKey] | None = None,
    ) -> list[Job]:
        """One claim of `kinds` (None: any) from `queues`, from `keys` on."""
        if not self.claims.pooled:  # synchronous_commit=off is a setting of the claims session
            return await lifecycle.aclaim(conn, queues, want, self.id, self.config.lease, keys, kinds)
        # Through a transaction pooler there is no session to hold it: the claim's own
        # transaction sets it, sent in one pipeline with the claim.
        async with conn.pipeline(), conn.transaction():
            await conn.execute(SQL["claim_without_flush_wait"])
            return await lifecycle.aclaim(conn, queues, want, self.id, self.config.lease, keys, kinds)

    def _crashed_before(self, jobs: Iterable[Job]) -> None:
        """Jobs of shared kinds whose earlier attempt took its process down run alone from now on."""
        shared = self.keeper.shared_kinds
        for job in jobs:
            errors: object = job.errors  # the JSON text of the claims link
            if errors and isinstance(errors, str) and job.kind in shared and any(c in errors for c in TOOK_ITS_PROCESS):
                self.alone.add(job.id)

    def _take(self, jobs: list[Job]) -> None:
        if self.keeper.shared_kinds:
            self._crashed_before(jobs)
        ready = []
        for job in jobs:
            self.held[job.id] = job
            if self.stopping or (self.paused and job.queue in self.paused):  # paused while the claim ran
                self.release_buffer.append((job, None))
            else:
                ready.append(job)
        self._prefetch(ready)
        self.hand_out()
        if self.fail_buffer or self.release_buffer:
            self.flush_wakeup.set()

    def _prefetch(self, claimed: list[Job]) -> None:
        """Queue a claim's jobs for the workers, keeping the prefetch in priority order (a claim returns
        its jobs in that order): a job of a higher priority claimed mid-drain goes before the lower ones
        prefetched earlier, so it waits only for what the workers were already handed, not for up to
        two claims of others. Equal priorities keep the order they were claimed in."""
        if not claimed:
            return
        if not self.prefetched or self.prefetched[-1].priority >= claimed[0].priority:
            self.prefetched.extend(claimed)  # as nearly always
        else:
            self.prefetched = deque(heapq.merge(self.prefetched, claimed, key=lambda job: -job.priority))

    def hand_out(self) -> None:
        if self.stopping:
            return
        if self.keeper.shared_kinds:
            self._hand_out_shared()
            return
        idle = self.keeper.idle()
        while idle and self.prefetched:
            worker = idle.pop()
            self.keeper.assign(worker, self._handout(worker, len(idle) + 1))

    def _handout(self, worker: Worker, idle: int) -> list[Job]:
        """The next jobs for `worker`, one of `idle` idle workers: one, or a few when jobs are short,
        but no more than it may run before --max-jobs-per-proc recycles it."""
        count = 1
        if self.duration < SHORT_JOB:
            count = min(HANDOUT_MAX, -(-len(self.prefetched) // idle))
            if self.limited_short and self.prefetched[0].id in self.limited_held:
                # Each holds a slot while it waits behind the others, which no idle worker can take.
                count = min(count, LIMITED_HANDOUT_MAX)
            if worker.recycle_after is not None:
                count = max(1, min(count, worker.recycle_after - worker.jobs_done))
        jobs = [self.prefetched.popleft()]
        # Only jobs of kinds whose own run time is short share a hand-out: one of a kind that is slow, or
        # not seen yet, would hold up the others while another worker is idle.
        ran = self.kind_ran
        if count > 1 and ran.get(jobs[0].kind, SHORT_JOB) < SHORT_JOB:
            while len(jobs) < count and self.prefetched and ran.get(self.prefetched[0].kind, SHORT_JOB) < SHORT_JOB:
                jobs.append(self.prefetched.popleft())
        return jobs

    def _hand_out_shared(self) -> None:
        """Hand out an app's mix of shared and alone jobs, in the prefetch's order. Shared jobs fill the
        process that runs the most shared jobs and has room (processes left idle stay free for alone
        jobs), and open an idle process only when none has room and no alone job needs it; an alone job
        takes an idle process. An alone job that finds none has one process drain (it takes no more
        shared jobs and is handed the alone job once empty), so shared jobs never starve alone ones."""
        if not self.prefetched:
            return
        keeper = self.keeper
        shared_kinds = keeper.shared_kinds
        capacity = self.config.capacity
        idle = keeper.idle()
        alone_waiting = sum(1 for j in self.prefetched if j.kind not in shared_kinds or j.id in self.alone)
        open_ = sorted(
            (w for w in keeper.workers.values() if w.sharing and w.draining is None and w.stop_reason is None),
            key=lambda w: -len(w.sharing),
        )
        given: dict[Worker, list[Job]] = {}
        load: dict[Worker, int] = {w: len(w.sharing) for w in open_}
        kinds: Counter[tuple[Worker, str]] = Counter()
        kept: deque[Job] = deque()
        for job in self.prefetched:
            if job.kind not in shared_kinds or job.id in self.alone:
                if idle:
                    keeper.assign(idle.pop(), [job])
                    alone_waiting -= 1
                else:
                    kept.append(job)
                continue
            cap = shared_kinds[job.kind]
            target = None
            for worker in open_:
                if load[worker] < capacity and worker.shared_kinds[job.kind] + kinds[worker, job.kind] < cap:
                    target = worker
                    break
            if target is None and len(idle) > alone_waiting:
                target = idle.pop()
                open_.append(target)
                load[target] = 0
            if target is None:
                kept.append(job)
                continue
            given.setdefault(target, []).append(job)
            load[target] += 1
            kinds[target, job.kind] += 1
        self.prefetched = kept
        for worker, jobs in given.items():
            keeper.assign_shared(worker, jobs)
        if alone_waiting > 0 and not any(w.draining == DRAIN_FOR_ALONE for w in keeper.workers.values()):
            sharing = [w for w in keeper.workers.values() if w.sharing and w.draining is None and w.stop_reason is None]
            if sharing and not keeper.idle():
                min(sharing, key=lambda w: len(w.sharing)).draining = DRAIN_FOR_ALONE

    def running_count(self) -> int:
        return sum(len(w.sharing) or len(w.jobs) for w in self.keeper.workers.values())

    # --- writing outcomes -------------------------------------------------------------------

    def buffered(self) -> int:
        return (
            len(self.done_buffer)
            + len(self.fail_buffer)
            + len(self.release_buffer)
            + len(self.snooze_buffer)
            + len(self.cancel_buffer)
        )

    async def flush_loop(self) -> None:
        while True:
            await self.flush_wakeup.wait()
            # Let a few more outcomes share the write, unless one frees a slot of a limited job that
            # another job waits for: a limit's throughput is its slots' turnover, and the claim sent
            # with the write takes the slots it frees. Short jobs wait for a share unless their limit
            # holds them back: a kind limited to 64 whose short jobs waited 2 ms for each write ran at
            # 0.72 of its speed without the limit, at 0.93 written at once (benchmarks/bench_limits.py).
            slot_awaited = self._holds_limited_outcome() and (self.duration >= SHORT_JOB or self.limited_short)
            if self.buffered() < self.config.batch and not slot_awaited:
                await asyncio.sleep(self.config.flush_interval)
            self.flush_wakeup.clear()
            await self.flush()
            # Figures counted since the last write that no outcome write has carried yet (the last
            # jobs of a burst): a flush with nothing else to write takes them when they are due.
            due = self.latency.due_in(asyncio.get_running_loop().time())
            if due is not None and self._latency_timer is None:

                def wake() -> None:
                    self._latency_timer = None
                    self.flush_wakeup.set()

                self._latency_timer = asyncio.get_running_loop().call_later(due, wake)

    def _holds_limited_outcome(self) -> bool:
        if not self.limited_held:
            return False
        held = self.limited_held
        return any(j.id in held for j in self.done_buffer) or any(f.id in held for f in self.fail_buffer)

    async def flush(self, *, deadline: float | None = None) -> None:
        """Write every buffered outcome: one statement per kind of outcome present. What is not
        written (the database gave out past `deadline`, or the flush was cancelled) stays buffered."""
        done, self.done_buffer = self.done_buffer, []
        failures, self.fail_buffer = self.fail_buffer, []
        releases, self.release_buffer = self.release_buffer, []
        snoozes, self.snooze_buffer = self.snooze_buffer, []
        cancels, self.cancel_buffer = self.cancel_buffer, []
        # Once a second (or at shutdown, with its deadline), the latency figures go with the first write.
        taken = self.latency.take(asyncio.get_running_loop().time(), force=deadline is not None)
        if taken is not None:
            self._latency_due = taken
        try:
            if done:
                await self._write_done(done, deadline)
                done = []
            if failures:
                await self._write_failures(failures, deadline)
                failures = []
            if releases:
                await self._write_releases(releases, deadline)
                releases = []
            if snoozes:
                await self._write_snoozes(snoozes, deadline)
                snoozes = []
            if cancels:
                await self._write_cancels(cancels, deadline)
                cancels = []
            if self._latency_due is not None:  # no outcome write to carry them
                params, self._latency_due = self._latency_due, None
                await self.writes.run(lambda c: c.execute(SQL["latency_merge"], params), deadline=deadline)
            if self._freed:
                await self._slots_freed(deadline)
        finally:
            self.done_buffer[:0] = done
            self.fail_buffer[:0] = failures
            self.release_buffer[:0] = releases
            self.snooze_buffer[:0] = snoozes
            self.cancel_buffer[:0] = cancels

    async def _slots_freed(self, deadline: float | None) -> None:
        """Outcomes of limited jobs were written and freed slots that the claim sent with the write did
        not take again (none of our workers was idle, or nothing of ours was ready): claim at the next
        chance, and tell the other supervisors, whose idle workers may be waiting for one."""
        # A slot of a kind with per-key limits that we took again may have been another key's: its next
        # job may be claimable by an idle worker elsewhere.
        kinds = sorted(kind for kind, count in self._freed.items() if count > 0 or kind in self.keyed_limits)
        self._freed.clear()
        if not kinds:
            return
        self.limited_more = True
        self.claim_wakeup.set()
        await self.writes.run(lambda c: c.execute(SQL["limit_slots_freed"], {"kinds": kinds}), deadline=deadline)

    async def _write_done(self, done: list[Job], deadline: float | None) -> None:
        for chunk in _chunks(done):
            pairs = [(j.id, j.attempts) for j in chunk]
            # None when no job of the chunk returned anything: the write is then what it always was.
            values = [self.return_values.get(j.id) for j in chunk] if self.return_values else None
            want = self._handoff_want(chunk)
            if want:
                written = await self._write(partial(self._complete_and_claim, pairs, values, want), deadline)
            else:
                complete = partial(lifecycle.acomplete, jobs=pairs, locked_by=self.id, return_values=values)
                written = await self._write(complete, deadline)
            self.jobs_done += len(written)
            if self.tally is not None:
                self._tally_written(chunk, written, "done")
            if values is not None:
                for job in chunk:
                    self.return_values.pop(job.id, None)
            self._forget(chunk, written, "done")

    def _handoff_want(self, chunk: list[Job]) -> int:
        """How many limited jobs to claim in the round trip that writes `chunk`: when it frees limited
        slots, the workers that ran those jobs are idle, and the next jobs for them are claimed with the
        write instead of a round trip after it (a limit's throughput is its slots' turnover)."""
        if self.stopping or self.refused or not self.limited_held or not any(j.id in self.limited_held for j in chunk):
            return 0
        self.limited_more = True
        return self._limited_want()

    async def _complete_and_claim(
        self, pairs: list[tuple[int, int]], values: list[str | None] | None, want: int, conn: psycopg.AsyncConnection
    ) -> list[int]:
        queues = [q for q in self.config.queues if q not in self.paused]
        pokes = self.pokes
        self.limited_claiming += want
        try:
            written, (jobs, wake) = await arun_together(
                conn,
                lifecycle.complete_op(pairs, self.id, values),
                lifecycle.claim_limited_op(self.limited_kinds(), queues, want, self.id, self.config.lease),
            )
        except LOST:
            self.orphans_possible = True  # the claim may have committed unheard of
            raise
        except psycopg.Error as exc:
            if exc.sqlstate != lifecycle.CLAIM_REFUSED:
                raise
            # The schema refuses our claims now: stop claiming, and write the outcomes alone (a write
            # is fenced, so one the pipeline applied already changes nothing the second time).
            self.refuse_claims(str(exc.diag.message_primary))
            return await lifecycle.acomplete(conn, pairs, self.id, values)
        finally:
            self.limited_claiming -= want
        for job in jobs:
            self._freed[job.kind] -= 1  # a slot this write frees, taken again at once: no one need be told
        # The writes link decodes JSON, the claims link leaves it as the text the workers parse.
        jobs = [_as_claimed(job) for job in jobs]
        self._took_limited(jobs, wake, want, pokes, handoff=True)
        return written

    async def _write_failures(self, failures: list[Failure], deadline: float | None) -> None:
        for chunk in _chunks(failures):
            await self._write_failure_chunk(chunk, deadline)

    async def _write_failure_chunk(self, failures: list[Failure], deadline: float | None) -> None:
        outcomes = await self._write(
            lambda c: lifecycle.afail(
                c,
                failures,
                self.id,
                backoff_base=self.config.backoff_base,
                backoff_cap=self.config.backoff_cap,
                jitter=self.config.backoff_jitter,
            ),
            deadline,
        )
        by_id = {o.id: o for o in outcomes}
        if self.tally is not None:
            for outcome in outcomes:
                job = self.held.get(outcome.id)
                if job is not None:
                    # a failure of a job whose cancel was requested is written cancelled
                    self.tally.outcome(
                        job.kind, outcome.status if outcome.status in ("dead", "cancelled") else "failed"
                    )
        for failure in failures:
            outcome = by_id.get(failure.id)
            job = self.held.get(failure.id)
            if outcome is not None and outcome.status == "dead" and job is not None:
                self.log.alike(
                    "job.dead",
                    "warning",
                    like=_ALIKE,
                    error=failure.error,
                    **about(job, self.traces.get(job.id)),
                )
            elif outcome is not None and outcome.run_at is not None:
                self.note_run_at(outcome.run_at.timestamp())
        self._forget([self.held[f.id] for f in failures if f.id in self.held], list(by_id), "failed")

    async def _write_releases(self, releases: list[tuple[Job, str | None]], deadline: float | None) -> None:
        for chunk in _chunks(releases):
            pairs = [(j.id, j.attempts) for j, _ in chunk]
            reasons = [reason for _, reason in chunk]
            release = partial(lifecycle.arelease, jobs=pairs, locked_by=self.id, reasons=reasons)
            written = await self._write(release, deadline)
            if self.tally is not None:
                self._tally_written([j for j, _ in chunk], written, "released")
            for job, reason in chunk:
                if reason is not None:
                    self.log(
                        "job.interrupted",
                        "warning",
                        reason=reason,
                        **about(job),
                    )
            self._forget([j for j, _ in chunk], written, "released")

    async def _write_snoozes(self, snoozes: list[Snoozed], deadline: float | None) -> None:
        for chunk in _chunks(snoozes):
            outcomes = await self._write(partial(lifecycle.asnooze, snoozed=chunk, locked_by=self.id), deadline)
            if self.tally is not None:
                for outcome in outcomes:
                    job = self.held.get(outcome.id)
                    if job is not None:  # a snooze of a job whose cancel was requested ends it cancelled
                        self.tally.outcome(job.kind, "snoozed" if outcome.status == "queued" else "cancelled")
            for outcome in outcomes:
                if outcome.status == "queued" and outcome.run_at is not None:
                    self.note_run_at(outcome.run_at.timestamp())
            self._forget([self.held[s.id] for s in chunk if s.id in self.held], [o.id for o in outcomes], "snoozed")

    async def _write_cancels(self, cancels: list[Cancel], deadline: float | None) -> None:
        for chunk in _chunks(cancels):
            written = await self._write(partial(lifecycle.acancel_held, cancels=chunk, locked_by=self.id), deadline)
            if self.tally is not None:
                self._tally_written([self.held[c.id] for c in chunk if c.id in self.held], written, "cancelled")
            for cancel in chunk:
                job = self.held.get(cancel.id)
                if cancel.id in written and job is not None and cancel.reason is None:
                    self.log(
                        "job.cancelled",
                        by=cancel.by,
                        **about(job, self.traces.get(job.id)),
                    )
            self._forget([self.held[c.id] for c in chunk if c.id in self.held], written, "cancelled")

    async def _write(self, op: Callable[[psycopg.AsyncConnection], Awaitable[Any]], deadline: float | None) -> Any:
        """One outcome statement through the writes link. Latency figures taken for writing
        (flush) go in the same round trip: sent ahead of it in one pipeline, so they cost the
        server one more statement a second and the supervisor no extra wait."""
        latency, self._latency_due = self._latency_due, None
        if latency is not None:
            op = _carrying(latency, op)
        if self.tally is None:
            return await self.writes.run(op, deadline=deadline)
        started = time.perf_counter()
        result = await self.writes.run(op, deadline=deadline)
        self.tally.writes += 1
        self.tally.write_seconds.observe(time.perf_counter() - started)
        return result

    def _tally_written(self, jobs: list[Job], written: list[int], outcome: str) -> None:
        assert self.tally is not None  # counted only when the metrics are exported
        kinds: dict[str, int] = {}
        if len(written) == len(jobs):  # as nearly always: no write was fenced out
            for job in jobs:
                kinds[job.kind] = kinds.get(job.kind, 0) + 1
        else:
            kept = set(written)
            for job in jobs:
                if job.id in kept:
                    kinds[job.kind] = kinds.get(job.kind, 0) + 1
        for kind, count in kinds.items():
            self.tally.outcome(kind, outcome, count)

    def _forget(self, jobs: list[Job], written: list[int], what: str) -> None:
        kept = set(written)
        lost = [j.id for j in jobs if j.id not in kept]
        for job in jobs:
            self.held.pop(job.id, None)
            if self.traces:
                self.traces.pop(job.id, None)
            if self.cancelling:
                self.cancelling.pop(job.id, None)
            if self.alone:
                self.reruns.pop(job.id, None)
                self.alone.discard(job.id)
            elif self.reruns:
                self.reruns.pop(job.id, None)
            if self.limited_held and job.id in self.limited_held:
                self.limited_held.discard(job.id)
                self._freed[job.kind] += 1
        if lost:
            # Fenced out: the lease lapsed and the reaper (or another supervisor) has the job now.
            self.log("lease.lost", "warning", outcome=what, count=len(lost), ids=lost)

    def release_prefetched(self) -> int:
        """Queue every job claimed but not started for hand-back at the next flush."""
        count = len(self.prefetched)
        while self.prefetched:
            self.release_buffer.append((self.prefetched.popleft(), None))
        return count

    # --- leases ------------------------------------------------------------------------------

    async def lease_loop(self) -> None:
        # A third of the lease: two renewals in a row may fail (a reconnect, a stall) before it lapses.
        interval = self.config.lease / 3
        while True:
            await self.renew_wakeup.wait(interval)  # set: a cancel too large to name its jobs
            await self.renew()

    async def renew(self) -> None:
        held = list(self.held.values())
        if not held:
            return
        pairs = [(j.id, j.attempts) for j in held]
        try:
            ids, requests = await self.writes.run(
                lambda c: lifecycle.arenew(c, pairs, self.id, self.config.lease),
                deadline=asyncio.get_running_loop().time() + self.config.lease / 3,
            )
        except LOST:
            return  # the next round tries again
        renewed = set(ids)
        if requests:  # the backstop of a cancel's NOTIFY
            self.cancel_requested(requests)
        # A job may have been written back while the renewal was in flight: only those still held count.
        lost = [j for j in held if j.id not in renewed and j.id in self.held]
        if lost:
            self.log("lease.lost", "warning", outcome="renew", count=len(lost), ids=[j.id for j in lost])
            lost_ids = {j.id for j in lost}
            self.prefetched = deque(j for j in self.prefetched if j.id not in lost_ids)
            for job in lost:
                if not any(j.id == job.id for w in self.keeper.all_processes() for j in w.held):
                    self.held.pop(job.id, None)
                    self.limited_held.discard(job.id)

    def running(self) -> list[Job]:
        """Jobs handed to workers: running, or next in a worker's hand-out."""
        return [job for w in self.keeper.all_processes() for job in w.held]


def _as_claimed(job: Job) -> Job:
    """`job` with its payload and errors as JSON text, as a claim on the claims link returns them (the
    Job of a claim there holds text where a handler's holds what it decodes to)."""
    payload = None if job.payload is None else json.dumps(job.payload)
    errors = None if job.errors is None else json.dumps(job.errors)
    return Job._make((*job[:2], payload, *job[3:10], errors, *job[11:]))


def _carrying(
    latency: dict[str, list], write: Callable[[psycopg.AsyncConnection], Awaitable[Any]]
) -> Callable[[psycopg.AsyncConnection], Awaitable[Any]]:
    """`write` with the `latency_merge` of `latency` sent ahead of it, in one round trip."""

    async def carried(conn: psycopg.AsyncConnection) -> Any:
        async with conn.pipeline():
            await conn.execute(SQL["latency_merge"], latency)
            return await write(conn)

    return carried


def _chunks(items: list, size: int = WRITE_MAX) -> list[list]:
    """
    >>> _chunks([1, 2, 3], 2)
    [[1, 2], [3]]
    """
    return [items[i : i + size] for i in range(0, len(items), size)]
