"""The outcome writer: the outcomes of held jobs, buffered by what writes them, and written in
batches, one statement per kind of outcome; each written job is then no longer held.

Done, failed, handed back, snoozed or cancelled: each has a buffer and a statement (jobsup.db.lifecycle).
Every write is fenced by the job's attempt and this supervisor's id, so one whose lease lapsed changes
nothing and is logged as lost. The latency figures ride with the writes, and so may a claim of limited
jobs: when a write frees slots, the claimer takes the next jobs for them in the same round trip.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import psycopg

from jobsup.db import lifecycle
from jobsup.db.lifecycle import Cancel, Failure, Snoozed
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.job import Claimed
from jobsup.ops.latency import Recorder
from jobsup.supervisor.config import Config
from jobsup.supervisor.held import Held
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog, about
from jobsup.supervisor.pace import SHORT_JOB, Pace
from jobsup.supervisor.tally import Tally

if TYPE_CHECKING:
    from jobsup.supervisor.claimer import Claimer

# Most outcomes one statement writes: after a stall, a backlog of outcomes goes in several statements of
# a bounded cost rather than one that holds every row lock for as long as it runs.
WRITE_MAX = 1000
# Failures alike for the log (EventLog.alike): the same kind with the same error. Each is still written
# to its job; the log writes the first of a burst in full and counts the rest.
ALIKE = ("kind", "error")


class OutcomeWriter:
    def __init__(
        self,
        config: Config,
        log: EventLog,
        supervisor_id: str,
        link: Link,
        held: Held,
        pace: Pace,
        tally: Tally | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.link = link
        self.held = held
        self.pace = pace
        self.tally = tally
        # Set by the dispatcher once the claimer exists (it is built on this writer): it is told of the
        # retry times and freed slots the writes learn of, and may claim limited jobs with a write.
        self.claimer: Claimer | None = None
        self._done: list[Claimed] = []
        self._return_values: dict[int, str] = {}  # job id -> JSON text, for done jobs that returned one
        self._failures: list[Failure] = []
        self._releases: list[tuple[Claimed, str | None]] = []  # a reason: the job was interrupted
        self._snoozes: list[Snoozed] = []  # control: Snooze
        self._cancels: list[Cancel] = []  # control: Discard, and operators' cancels
        self._wakeup = asyncio.Event()
        self.stopping = False  # a shutdown: the loop ends once the write in flight is answered
        self.jobs_done = 0
        # Queue latency and run time per kind, added to jobsup.latency with the outcome writes.
        self.latency = Recorder(keep_totals=tally is not None)
        self._latency_due: dict[str, list] | None = None  # taken for the next outcome write to carry
        self._latency_timer: asyncio.TimerHandle | None = None

    # --- what to write ------------------------------------------------------------------------

    def done(self, job: Claimed, value: str | None) -> None:
        """`job` ended done; `value`: what its handler returned, as JSON text (None for nothing)."""
        self._done.append(job)
        if value is not None:
            self._return_values[job.id] = value
        self._wakeup.set()

    def fail(self, failure: Failure) -> None:
        self._failures.append(failure)
        self._wakeup.set()

    def snooze(self, snoozed: Snoozed) -> None:
        self._snoozes.append(snoozed)
        self._wakeup.set()

    def cancel(self, cancel: Cancel) -> None:
        self._cancels.append(cancel)
        self._wakeup.set()

    def release(self, jobs: list[Claimed], reason: str | None = None) -> None:
        """Hand `jobs` back to the queue, their attempt given back; `reason`: they were interrupted
        (a shutdown), logged with each."""
        self._releases.extend((job, reason) for job in jobs)
        if jobs:
            self._wakeup.set()

    def timed(self, job: Claimed, took: float) -> None:
        """Count a finished attempt's queue latency (the database's clock) and run time (`took`: what
        the worker measured, or our own clock for a worker that died)."""
        if job.started_at is not None and job.run_at is not None:
            self.latency.record(job.kind, "queue_latency", (job.started_at - job.run_at).total_seconds())
        self.latency.record(job.kind, "run_time", took)

    def buffered(self) -> int:
        return len(self._done) + len(self._failures) + len(self._releases) + len(self._snoozes) + len(self._cancels)

    # --- writing ------------------------------------------------------------------------------

    def stop(self) -> None:
        """A shutdown, which writes what is left itself: the loop ends after the write in flight, whose
        answer it must read. Cancelled mid-write, a write the database had committed was sent again by
        the shutdown and found its jobs no longer ours: their job.dead lines were lost and a false
        lease.lost logged in their place."""
        self.stopping = True
        self._wakeup.set()

    async def loop(self) -> None:
        while not self.stopping:
            await self._wakeup.wait()
            if self.stopping:
                return
            # Let a few more outcomes share the write, unless one frees a slot of a limited job that
            # another job waits for: a limit's throughput is its slots' turnover, and the claim sent
            # with the write takes the slots it frees. Short jobs wait for a share unless their limit
            # holds them back: a kind limited to 64 whose short jobs waited 2 ms for each write ran at
            # 0.72 of its speed without the limit, at 0.93 written at once (benchmarks/bench_limits.py).
            slot_awaited = self._holds_limited_outcome() and (
                self.pace.duration >= SHORT_JOB or self.held.limited_short
            )
            if self.buffered() < self.config.batch and not slot_awaited:
                await asyncio.sleep(self.config.flush_interval)
            self._wakeup.clear()
            await self.flush()
            # Figures counted since the last write that no outcome write has carried yet (the last
            # jobs of a burst): a flush with nothing else to write takes them when they are due.
            due = self.latency.due_in(asyncio.get_running_loop().time())
            if due is not None and self._latency_timer is None:

                def wake() -> None:
                    self._latency_timer = None
                    self._wakeup.set()

                self._latency_timer = asyncio.get_running_loop().call_later(due, wake)

    def _holds_limited_outcome(self) -> bool:
        limited = self.held.limited
        if not limited:
            return False
        return any(j.id in limited for j in self._done) or any(f.id in limited for f in self._failures)

    async def flush(self, *, deadline: float | None = None) -> None:
        """Write every buffered outcome: one statement per kind of outcome present. What is not
        written (the database gave out past `deadline`, or the flush was cancelled) stays buffered."""
        done, self._done = self._done, []
        failures, self._failures = self._failures, []
        releases, self._releases = self._releases, []
        snoozes, self._snoozes = self._snoozes, []
        cancels, self._cancels = self._cancels, []
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
                await self.link.run(lambda c: c.execute(SQL["latency_merge"], params), deadline=deadline)
            if self.held.freed:
                await self._slots_freed(deadline)
        finally:
            self._done[:0] = done
            self._failures[:0] = failures
            self._releases[:0] = releases
            self._snoozes[:0] = snoozes
            self._cancels[:0] = cancels

    async def _slots_freed(self, deadline: float | None) -> None:
        """Outcomes of limited jobs were written and freed slots that the claim sent with the write did
        not take again (none of our workers was idle, or nothing of ours was ready): claim at the next
        chance, and tell the other supervisors, whose idle workers may be waiting for one."""
        # A slot of a kind with per-key limits that we took again may have been another key's: its next
        # job may be claimable by an idle worker elsewhere.
        freed = self.held.freed
        keyed = self.claimer.keyed_limits if self.claimer is not None else frozenset()
        kinds = sorted(kind for kind, count in freed.items() if count > 0 or kind in keyed)
        freed.clear()
        if not kinds:
            return
        if self.claimer is not None:
            self.claimer.slots_freed()
        await self.link.run(lambda c: c.execute(SQL["limit_slots_freed"], {"kinds": kinds}), deadline=deadline)

    async def _write_done(self, done: list[Claimed], deadline: float | None) -> None:
        for chunk in _chunks(done):
            pairs = [(j.id, j.attempts) for j in chunk]
            # None when no job of the chunk returned anything: the write is then what it always was.
            values = [self._return_values.get(j.id) for j in chunk] if self._return_values else None
            want = self.claimer.handoff_want(chunk) if self.claimer is not None else 0
            if want:
                assert self.claimer is not None
                written = await self._write(partial(self.claimer.complete_and_claim, pairs, values, want), deadline)
            else:
                complete = partial(lifecycle.acomplete, jobs=pairs, locked_by=self.id, return_values=values)
                written = await self._write(complete, deadline)
            self.jobs_done += len(written)
            if self.tally is not None:
                self._tally_written(chunk, written, "done")
            if values is not None:
                for job in chunk:
                    self._return_values.pop(job.id, None)
            self._forget(chunk, written, "done")

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
        held = self.held.jobs
        by_id = {o.id: o for o in outcomes}
        if self.tally is not None:
            for outcome in outcomes:
                job = held.get(outcome.id)
                if job is not None:
                    # a failure of a job whose cancel was requested is written cancelled
                    self.tally.outcome(
                        job.kind, outcome.status if outcome.status in ("dead", "cancelled") else "failed"
                    )
        for failure in failures:
            outcome = by_id.get(failure.id)
            job = held.get(failure.id)
            if outcome is not None and outcome.status == "dead" and job is not None:
                self.log.alike(
                    "job.dead",
                    "warning",
                    like=ALIKE,
                    error=failure.error,
                    **about(job, self.held.traces.get(job.id)),
                )
            elif outcome is not None and outcome.run_at is not None:
                self._retry_at(outcome.run_at.timestamp())
        self._forget([held[f.id] for f in failures if f.id in held], list(by_id), "failed")

    async def _write_releases(self, releases: list[tuple[Claimed, str | None]], deadline: float | None) -> None:
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
        held = self.held.jobs
        for chunk in _chunks(snoozes):
            outcomes = await self._write(partial(lifecycle.asnooze, snoozed=chunk, locked_by=self.id), deadline)
            if self.tally is not None:
                for outcome in outcomes:
                    job = held.get(outcome.id)
                    if job is not None:  # a snooze of a job whose cancel was requested ends it cancelled
                        self.tally.outcome(job.kind, "snoozed" if outcome.status == "queued" else "cancelled")
            for outcome in outcomes:
                if outcome.status == "queued" and outcome.run_at is not None:
                    self._retry_at(outcome.run_at.timestamp())
            self._forget([held[s.id] for s in chunk if s.id in held], [o.id for o in outcomes], "snoozed")

    async def _write_cancels(self, cancels: list[Cancel], deadline: float | None) -> None:
        held = self.held.jobs
        for chunk in _chunks(cancels):
            written = await self._write(partial(lifecycle.acancel_held, cancels=chunk, locked_by=self.id), deadline)
            if self.tally is not None:
                self._tally_written([held[c.id] for c in chunk if c.id in held], written, "cancelled")
            for cancel in chunk:
                job = held.get(cancel.id)
                if cancel.id in written and job is not None and cancel.reason is None:
                    self.log(
                        "job.cancelled",
                        by=cancel.by,
                        **about(job, self.held.traces.get(job.id)),
                    )
            self._forget([held[c.id] for c in chunk if c.id in held], written, "cancelled")

    def _retry_at(self, when: float) -> None:
        """A job written back to run again at `when` (epoch seconds): the claimer wakes for it."""
        if self.claimer is not None:
            self.claimer.note_run_at(when)

    async def _write(self, op: Callable[[psycopg.AsyncConnection], Awaitable[Any]], deadline: float | None) -> Any:
        """One outcome statement through the writes link. Latency figures taken for writing
        (flush) go in the same round trip: sent ahead of it in one pipeline, so they cost the
        server one more statement a second and the supervisor no extra wait."""
        latency, self._latency_due = self._latency_due, None
        if latency is not None:
            op = _carrying(latency, op)
        if self.tally is None:
            return await self.link.run(op, deadline=deadline)
        started = time.perf_counter()
        result = await self.link.run(op, deadline=deadline)
        self.tally.writes += 1
        self.tally.write_seconds.observe(time.perf_counter() - started)
        return result

    def _tally_written(self, jobs: list[Claimed], written: list[int], outcome: str) -> None:
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

    def _forget(self, jobs: list[Claimed], written: list[int], what: str) -> None:
        lost = self.held.forget(jobs, written)
        if lost:
            # Fenced out: the lease lapsed and the reaper (or another supervisor) has the job now.
            self.log("lease.lost", "warning", outcome=what, count=len(lost), ids=lost)


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
