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
import time
from collections import deque
from collections.abc import Iterable, Mapping

from .. import queue
from ..job import Job
from ..queue import ClaimKey, Failure
from ..sql import STATEMENTS as SQL
from .config import Config
from .keeper import Keeper, Worker
from .keys import ClaimKeys
from .link import LOST, Link
from .log import EventLog

# Besides --prefetch, claim what the workers are expected to start within this horizon at the rate
# they have been finishing jobs: many short jobs are claimed in few statements (each one a commit the
# server must flush), while slow jobs are claimed about one per idle worker.
PREFETCH_HORIZON = 0.05
# Weight of the newest sample in the smoothed finishing rate and job duration.
RATE_SMOOTHING = 0.3
# Jobs that take less than this on average go to a worker several at a time (at most HANDOUT_MAX), so
# the supervisor writes one message per few jobs instead of one per job. A worker runs them in order
# and answers each as it ends; if it dies, the one it was running fails and the rest are handed back.
# Each message wakes its worker (a pipe write that, on a loaded machine, costs the supervisor's one
# thread tens of µs): 32 rather than 8 cut the supervisor's CPU per no-op job by about a sixth.
SHORT_JOB = 0.002
HANDOUT_MAX = 32
# Most outcomes one statement writes: after a stall, a backlog of outcomes goes in several statements of
# a bounded cost rather than one that holds every row lock for as long as it runs.
WRITE_MAX = 1000
# Future run_at times remembered to wake for (retries, delayed jobs); beyond these the poll finds them.
KNOWN_RUN_ATS = 10_000
# Failures alike for the log (EventLog.alike): the same kind with the same error. Each is still written
# to its job; the log writes the first of a burst in full and counts the rest.
_ALIKE = ("kind", "error")


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
            handle = loop.call_later(max(0.0, timeout), lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None
        woke, self._flag = self._flag, False
        return woke


class Dispatcher:
    def __init__(self, config: Config, log: EventLog, supervisor_id: str, keeper: Keeper,
                 claims: Link, writes: Link) -> None:
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
        self.fail_buffer: list[Failure] = []
        self.release_buffer: list[tuple[Job, str | None]] = []
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
        self.rate = 0.0  # jobs finished per second, smoothed
        self.duration = 1.0  # seconds a handler runs, smoothed; assume slow until measured
        self._rate_sample: tuple[float, int] | None = None

    # --- what the keeper tells us ------------------------------------------------------------

    def worker_ready(self, worker: Worker) -> None:
        if self.prefetched and not self.stopping:
            self.keeper.assign(worker, self._handout(1))
        if self.more:
            self.claim_wakeup.set()

    def outcome(self, worker: Worker, job: Job, error: str | None, tb: str | None,
                value: str | None = None) -> None:
        self.finished += 1
        # The handler's own run time, not the time since the handout: on a loaded machine the trip
        # through the pipes takes milliseconds, and counting it made a no-op job look long, so it was
        # sent alone, which made more trips, which kept it looking long (a 2-worker supervisor
        # sharing a core stayed at one job per message and ran at a tenth of the rate).
        self.duration += RATE_SMOOTHING * (worker.ran - self.duration)
        if error is None:
            self.done_buffer.append(job)
            if value is not None:
                self.return_values[job.id] = value
        else:
            self.log.alike("job.failed", "warning", like=_ALIKE, job=job.id, kind=job.kind,
                           attempt=job.attempts, pid=worker.pid, error=error)
            self.fail_buffer.append(Failure(job.id, job.attempts, error, tb))
        self.flush_wakeup.set()
        self.idle_wakeup.set()

    def lost(self, worker: Worker, job: Job, cause: str, unstarted: list[Job]) -> None:
        """The worker running `job` died, or was stopped for a timeout or a shutdown."""
        if cause.startswith("interrupted"):
            self.release_buffer.append((job, cause))  # a shutdown is not the job's fault
        else:
            self.fail_buffer.append(Failure(job.id, job.attempts, cause, None))
        self.release_buffer.extend((j, None) for j in unstarted)
        self.flush_wakeup.set()
        self.idle_wakeup.set()

    def notified(self, payload: str) -> None:
        """A NOTIFY of the insert trigger (or a release, reap or requeue)."""
        try:
            note = json.loads(payload) if payload else {}
        except ValueError:
            note = {}
        queues = note.get("queues") or []
        if queues and not set(queues) & set(self.config.queues):
            return
        run_at = note.get("run_at")
        if isinstance(run_at, (int, float)) and run_at > time.time():
            self.note_run_at(run_at)
        elif isinstance(run_at, (int, float)) and self.keys.sorts_after(queues, run_at):
            self.more = True  # an insert past our claim keys (see keys.py): they still hold
            self.claim_wakeup.set()
        else:
            self.poke()

    def poke(self) -> None:
        """Something may be ready: claim at the next chance, scanning every queue from its head."""
        self.keys.forget()
        self.more = True
        self.pokes += 1
        self.claim_wakeup.set()

    def note_run_at(self, run_at: float) -> None:
        if len(self.run_ats) >= KNOWN_RUN_ATS:
            return  # the poll finds the rest
        if not self.run_ats or run_at < self.run_ats[0]:
            self.claim_wakeup.set()  # the claim loop recomputes how long it may sleep
        heapq.heappush(self.run_ats, run_at)

    # --- claiming ---------------------------------------------------------------------------

    def prefetch(self) -> int:
        return max(self.config.prefetch, min(self.config.batch, int(self.rate * PREFETCH_HORIZON)))

    def capacity(self) -> int:
        return min(self.config.batch, len(self.keeper.idle()) + self.prefetch() - len(self.prefetched))

    def sample_rate(self, now: float) -> None:
        """Update the smoothed finishing rate; called every tick of the supervisor."""
        if self._rate_sample is not None:
            then, count = self._rate_sample
            if now > then:
                current = (self.finished - count) / (now - then)
                self.rate += RATE_SMOOTHING * (current - self.rate)
        self._rate_sample = (now, self.finished)

    async def claim_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + self.config.poll_interval
        while not self.stopping:
            want = self.capacity()
            # Short jobs with some still prefetched: wait until a claim can take a good share of what
            # is wanted, rather than spend a commit on one or two. Slower jobs top the prefetch up at once.
            threshold = 1
            if self.prefetched and self.duration < SHORT_JOB:
                threshold = max(1, (self.config.procs + self.prefetch()) // 2)
            if self.more and want >= threshold and self.keeper.ever_ready:
                pokes = self.pokes
                keys = self.keys.for_claim()
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
                    self._take(jobs)
                continue
            timeout = next_poll - loop.time()
            if self.run_ats:
                timeout = min(timeout, self.run_ats[0] - time.time())
            await self.claim_wakeup.wait(timeout)
            now = time.time()
            if self.run_ats and now >= self.run_ats[0]:
                while self.run_ats and now >= self.run_ats[0]:
                    heapq.heappop(self.run_ats)
                self.more = True
            if loop.time() >= next_poll:
                self.more = True  # the safety net: a NOTIFY may have been missed
                next_poll = loop.time() + self.config.poll_interval

    async def _claim(self, want: int, keys: Mapping[str, ClaimKey]) -> list[Job] | None:
        try:
            conn = await self.claims.connect()
            if self.orphans_possible:
                released = await queue.arelease_orphans(conn, self.id, list(self.held))
                self.orphans_possible = False
                if released:
                    self.log("jobs.released", reason="claim answer lost with the connection",
                             count=len(released), ids=released)
            if not self.claims.pooled:  # synchronous_commit=off is a setting of the claims session
                return await queue.aclaim(conn, self.config.queues, want, self.id, self.config.lease, keys)
            # Through a transaction pooler there is no session to hold it: the claim's own
            # transaction sets it, sent in one pipeline with the claim.
            async with conn.pipeline(), conn.transaction():
                await conn.execute(SQL["claim_without_flush_wait"])
                return await queue.aclaim(conn, self.config.queues, want, self.id, self.config.lease, keys)
        except LOST as exc:
            # The claim may have been committed without our hearing of it: hand back what we do not
            # know we hold before the next claim.
            self.claims.drop(exc)
            self.orphans_possible = True
            return None

    def _take(self, jobs: Iterable[Job]) -> None:
        kinds = self.keeper.kinds
        for job in jobs:
            self.held[job.id] = job
            if self.stopping:
                self.release_buffer.append((job, None))
            elif kinds is not None and job.kind not in kinds:
                self.log.alike("job.failed", "warning", like=_ALIKE, job=job.id, kind=job.kind,
                               attempt=job.attempts, error=f"no handler for {job.kind}")
                self.fail_buffer.append(Failure(job.id, job.attempts, f"no handler for {job.kind}"))
            else:
                self.prefetched.append(job)
        self.hand_out()
        if self.fail_buffer or self.release_buffer:
            self.flush_wakeup.set()

    def hand_out(self) -> None:
        if self.stopping:
            return
        idle = self.keeper.idle()
        while idle and self.prefetched:
            self.keeper.assign(idle.pop(), self._handout(len(idle) + 1))

    def _handout(self, idle: int) -> list[Job]:
        """The next jobs for one of `idle` idle workers: one, or a few when jobs are short."""
        count = 1
        if self.duration < SHORT_JOB:
            count = min(HANDOUT_MAX, -(-len(self.prefetched) // idle))
        return [self.prefetched.popleft() for _ in range(min(count, len(self.prefetched)))]

    # --- writing outcomes -------------------------------------------------------------------

    def buffered(self) -> int:
        return len(self.done_buffer) + len(self.fail_buffer) + len(self.release_buffer)

    async def flush_loop(self) -> None:
        while True:
            await self.flush_wakeup.wait()
            if self.buffered() < self.config.batch:
                await asyncio.sleep(self.config.flush_interval)  # let a few more outcomes share the write
            self.flush_wakeup.clear()
            await self.flush()

    async def flush(self, *, deadline: float | None = None) -> None:
        """Write every buffered outcome: one statement per kind of outcome present. What is not
        written (the database gave out past `deadline`, or the flush was cancelled) stays buffered."""
        done, self.done_buffer = self.done_buffer, []
        failures, self.fail_buffer = self.fail_buffer, []
        releases, self.release_buffer = self.release_buffer, []
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
        finally:
            self.done_buffer[:0] = done
            self.fail_buffer[:0] = failures
            self.release_buffer[:0] = releases

    async def _write_done(self, done: list[Job], deadline: float | None) -> None:
        for chunk in _chunks(done):
            pairs = [(j.id, j.attempts) for j in chunk]
            # None when no job of the chunk returned anything: the write is then what it always was.
            values = [self.return_values.get(j.id) for j in chunk] if self.return_values else None
            written = await self.writes.run(lambda c: queue.acomplete(c, pairs, self.id, values),
                                            deadline=deadline)
            self.jobs_done += len(written)
            if values is not None:
                for job in chunk:
                    self.return_values.pop(job.id, None)
            self._forget(chunk, written, "done")

    async def _write_failures(self, failures: list[Failure], deadline: float | None) -> None:
        for chunk in _chunks(failures):
            await self._write_failure_chunk(chunk, deadline)

    async def _write_failure_chunk(self, failures: list[Failure], deadline: float | None) -> None:
        outcomes = await self.writes.run(lambda c: queue.afail(
            c, failures, self.id, backoff_base=self.config.backoff_base,
            backoff_cap=self.config.backoff_cap, jitter=self.config.backoff_jitter), deadline=deadline)
        by_id = {o.id: o for o in outcomes}
        for failure in failures:
            outcome = by_id.get(failure.id)
            job = self.held.get(failure.id)
            if outcome is not None and outcome.status == "dead" and job is not None:
                self.log.alike("job.dead", "warning", like=_ALIKE, job=job.id, kind=job.kind,
                               attempt=job.attempts, error=failure.error)
            elif outcome is not None and outcome.run_at is not None:
                self.note_run_at(outcome.run_at.timestamp())
        self._forget([self.held[f.id] for f in failures if f.id in self.held], list(by_id), "failed")

    async def _write_releases(self, releases: list[tuple[Job, str | None]], deadline: float | None) -> None:
        for chunk in _chunks(releases):
            pairs = [(j.id, j.attempts) for j, _ in chunk]
            reasons = [reason for _, reason in chunk]
            written = await self.writes.run(lambda c: queue.arelease(c, pairs, self.id, reasons),
                                            deadline=deadline)
            for job, reason in chunk:
                if reason is not None:
                    self.log("job.interrupted", "warning", job=job.id, kind=job.kind, attempt=job.attempts,
                             reason=reason)
            self._forget([j for j, _ in chunk], written, "released")

    def _forget(self, jobs: list[Job], written: list[int], what: str) -> None:
        kept = set(written)
        lost = [j.id for j in jobs if j.id not in kept]
        for job in jobs:
            self.held.pop(job.id, None)
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
            await asyncio.sleep(interval)
            await self.renew()

    async def renew(self) -> None:
        held = list(self.held.values())
        if not held:
            return
        pairs = [(j.id, j.attempts) for j in held]
        try:
            renewed = set(await self.writes.run(lambda c: queue.aextend(c, pairs, self.id, self.config.lease),
                                                deadline=asyncio.get_running_loop().time() + self.config.lease / 3))
        except LOST:
            return  # the next round tries again
        # A job may have been written back while the renewal was in flight: only those still held count.
        lost = [j for j in held if j.id not in renewed and j.id in self.held]
        if lost:
            self.log("lease.lost", "warning", outcome="renew", count=len(lost), ids=[j.id for j in lost])
            lost_ids = {j.id for j in lost}
            self.prefetched = deque(j for j in self.prefetched if j.id not in lost_ids)
            for job in lost:
                if not any(j.id == job.id for w in self.keeper.all_processes() for j in w.jobs):
                    self.held.pop(job.id, None)

    def running(self) -> list[Job]:
        """Jobs handed to workers: running, or next in a worker's hand-out."""
        return [job for w in self.keeper.all_processes() for job in w.jobs]


def _chunks(items: list, size: int = WRITE_MAX) -> list[list]:
    """
    >>> _chunks([1, 2, 3], 2)
    [[1, 2], [3]]
    """
    return [items[i:i + size] for i in range(0, len(items), size)]
