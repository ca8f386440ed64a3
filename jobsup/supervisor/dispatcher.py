"""The dispatcher: the rooms that move a job through this supervisor, and what a worker or an operator
says of a held job.

One job's way, one direction:

    claimer.py   claims it (a plain claim, or claim_limited for a kind with a limit in force)
    held.py      holds it, from the claim to the write of its outcome
    handout.py   queues it in the prefetch and hands it to a worker process (keeper.py)
    dispatcher   hears the worker's answer (or its death) and makes it an outcome (this module)
    writer.py    buffers the outcome and writes it in a batch; the job is no longer held
    renewer.py   renews the lease of every held job meanwhile

`Dispatcher` builds the rooms and is the one object the supervisor, the keeper's events and the
duties (listener, heartbeat, exporter) talk to.
"""

from __future__ import annotations

import asyncio
import importlib
import warnings
from collections.abc import Iterable, Mapping

from jobsup.db import lifecycle, notify
from jobsup.db.lifecycle import Cancel, Failure, Snoozed
from jobsup.job import Claimed
from jobsup.ops.latency import Recorder
from jobsup.outcomes import Answer
from jobsup.supervisor.claimer import Claimer
from jobsup.supervisor.config import Config
from jobsup.supervisor.declaration import Declaration
from jobsup.supervisor.duty import Duty, Loop
from jobsup.supervisor.handout import HandOut
from jobsup.supervisor.held import Held
from jobsup.supervisor.keeper import INTERRUPTED, Keeper, Worker
from jobsup.supervisor.link import Link
from jobsup.supervisor.log import EventLog, about
from jobsup.supervisor.pace import Pace
from jobsup.supervisor.renewer import LeaseRenewer
from jobsup.supervisor.tally import Tally
from jobsup.supervisor.wakeup import Wakeup
from jobsup.supervisor.writer import ALIKE, OutcomeWriter

# Names this module held before it was split into rooms: importing one from here warns, for one release.
# (Wakeup, which it uses itself, stays importable from here without a warning.)
_MOVED = {
    "FinishingRate": "pace",
    "SHORT_JOB": "pace",
    "RATE_WINDOW": "pace",
    "RATE_DECAY": "pace",
    "DURATION_SMOOTHING": "pace",
    "HANDOUT_MAX": "handout",
    "LIMITED_HANDOUT_MAX": "handout",
    "DRAIN_FOR_ALONE": "handout",
    "PREFETCH_HORIZON": "claimer",
    "PREFETCH_CLAIMS": "claimer",
    "KNOWN_RUN_ATS": "claimer",
    "RATE_WAKE_AHEAD": "claimer",
    "SHARED_CLAIM_SHARE": "claimer",
    "WRITE_MAX": "writer",
}


def __getattr__(name: str) -> object:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} moved to jobsup.supervisor.{module}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"jobsup.supervisor.{module}"), name)


# The crash rule of jobs that share a process: a job whose process died under it, with neighbours and
# no way to tell which of them crashed it, runs again (the same attempt, no attempt counted); once it
# has been through RERUNS_UNKNOWN such deaths, or RERUNS_MOST deaths of any cause, it runs alone, where
# a death is its own failed attempt. So no attempt is rerun more than RERUNS_MOST times.
RERUNS_UNKNOWN = 2
RERUNS_MOST = 3


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
        declaration: Declaration | None = None,
    ) -> None:
        self.log = log
        self.keeper = keeper
        self.held = held = Held()
        self.pace = pace = Pace()
        self.writer = OutcomeWriter(config, log, supervisor_id, writes, held, pace, tally)
        self.handout = HandOut(config, keeper, held, pace, self.writer)
        self.claimer = Claimer(
            config, log, supervisor_id, keeper, claims, held, pace, self.handout, self.writer, tally, declaration
        )
        self.writer.claimer = self.claimer  # its writes tell the claimer of retries and freed slots
        self.renewer = LeaseRenewer(config, log, supervisor_id, writes, held, self.handout, self.cancel_requested)
        self.idle_wakeup = Wakeup()  # set at every outcome: the shutdown waits on it for running jobs to end

    def duties(self) -> list[Duty]:
        """The rooms' loops, for the supervisor to start and stop with its other duties."""
        return [Loop("claim", self.claimer.loop), Loop("flush", self.writer.loop), Loop("lease", self.renewer.loop)]

    # --- what the keeper tells us ------------------------------------------------------------

    def worker_ready(self, worker: Worker) -> None:
        self.handout.worker_ready(worker)
        self.claimer.room_freed()

    def room(self, worker: Worker) -> None:
        """A shared job ended and its process runs others: its place goes to a prefetched job, or to
        the next claim (which waits until a share of the room is free)."""
        if self.claimer.stopping:
            return
        if len(self.handout):
            self.handout.hand_out()
        self.claimer.room_freed()

    def outcome(self, worker: Worker, job: Claimed, answer: Answer) -> None:
        """A worker's answer for `job`, for the write its record goes to (lifecycle.record_of). A cancel
        requested meanwhile wins in the statements themselves: a snoozed or failed job with a request is
        written cancelled."""
        self.pace.ran(job.kind, answer.ran)
        writer = self.writer
        writer.timed(job, answer.ran)
        record = lifecycle.record_of(job, answer)
        if worker.trace is not None:
            self.held.traces[job.id] = worker.trace
        if record is None:
            writer.done(job, answer.value)
        elif isinstance(record, Failure):  # a RetryAfter too
            # The attempt that buries the job is logged once, by its write, as job.dead: a job.failed
            # line here too counted that failure twice. (One whose cancel was requested is written
            # cancelled, not dead: it stays a failure here.)
            if job.attempts < job.max_attempts or job.id in self.held.cancelling:
                self.log.alike(
                    "job.failed",
                    "warning",
                    like=ALIKE,
                    pid=worker.pid,
                    error=answer.error,
                    **about(job, worker.trace),
                )
            writer.fail(record)
        elif isinstance(record, Snoozed):
            self.log(
                "job.snoozed",
                "debug",
                pid=worker.pid,
                delay=f"{record.delay:g}s",
                **about(job, worker.trace),
            )
            writer.snooze(record)
        else:  # a Discard
            self.log(
                "job.discarded",
                pid=worker.pid,
                error=answer.error,
                **about(job, worker.trace),
            )
            writer.cancel(record)
        self.idle_wakeup.set()

    def lost(self, worker: Worker, job: Claimed, cause: str, unstarted: list[Claimed]) -> None:
        """The worker running `job` died, or was stopped for a timeout, a shutdown or a cancel."""
        cancelling = self.held.cancelling
        if job.id in cancelling:  # stopped on an operator's request (or died meanwhile): cancelled
            self.writer.cancel(Cancel(job.id, job.attempts, by=cancelling[job.id]))
        elif cause.startswith(INTERRUPTED):
            self.writer.release([job], cause)  # a shutdown is not the job's fault
        else:
            self.writer.timed(job, asyncio.get_running_loop().time() - worker.job_started)
            self.writer.fail(Failure(job.id, job.attempts, cause, None))
        self.writer.release(unstarted)
        self.idle_wakeup.set()

    def recalled(self, worker: Worker, jobs: list[Claimed]) -> None:
        """A worker gave back `jobs`, handed to it behind one that turned out slow and not started:
        they go first to the next free worker (or back to the queue, at a shutdown)."""
        self.log(
            "jobs.recalled",
            "debug",
            pid=worker.pid,
            behind=worker.job.id if worker.job else None,
            ids=[j.id for j in jobs],
        )
        self.handout.first_in_line(jobs)

    def lost_shared(self, worker: Worker, jobs: list[Claimed], culprit: int | None, cause: str) -> None:
        """A process that ran shared jobs ended with `jobs` (the crash rule, docs/guides/waiting.md):
        the job it could blame (`culprit`), or the only one it ran, fails as an alone job's death
        does; its neighbours run again under the same attempt, none lost; a job rerun too often, or
        twice after deaths no one could be blamed for, runs alone next. A shutdown's stop returns them
        all, as for alone jobs."""
        interrupted = cause.startswith(INTERRUPTED)
        held = self.held
        again: list[Claimed] = []
        for job in jobs:
            if job.id in held.cancelling:
                self.writer.cancel(Cancel(job.id, job.attempts, by=held.cancelling[job.id]))
            elif interrupted:
                self.writer.release([job], cause)
            elif job.id == culprit or len(jobs) == 1:
                started = worker.shared_started.get(job.id, worker.job_started)
                self.writer.timed(job, asyncio.get_running_loop().time() - started)
                self.writer.fail(Failure(job.id, job.attempts, cause, None))
            else:
                unknown, total = held.reruns.get(job.id, (0, 0))
                unknown, total = unknown + (culprit is None), total + 1
                held.reruns[job.id] = (unknown, total)
                if unknown >= RERUNS_UNKNOWN or total >= RERUNS_MOST:
                    held.alone.add(job.id)
                again.append(job)
        if again:
            self.log(
                "jobs.rerun",
                "warning",
                count=len(again),
                ids=[j.id for j in again],
                cause=cause,
                blamed=culprit,
                alone=sorted(j.id for j in again if j.id in held.alone),
                note="their process died under them: they run again, no attempt counted",
            )
            self.handout.first_in_line(again)
        self.idle_wakeup.set()

    # --- what operators and the database tell us ---------------------------------------------

    def control(self, message: notify.Control) -> None:
        """Act on a NOTIFY of a cancel, of a queue's pause or resume, of a limit set or removed, or of
        slots freed; the insert notifications go to notified()."""
        claimer = self.claimer
        match message:
            case notify.CancelRequested(None, _):  # too many to name: the renewal returns our requests
                self.renewer.wakeup.set()
            case notify.CancelRequested(ids, by):
                self.cancel_requested(dict.fromkeys(ids or (), by))
            case notify.LimitChanged(kind, limited, keyed):
                kinds, keyed_kinds = claimer.limits_in_force, claimer.keyed_limits
                claimer.set_limits_in_force(
                    kinds | {kind} if limited else kinds - {kind},
                    keyed_kinds | {kind} if keyed else keyed_kinds - {kind},
                )
                self.log("limit.changed", kind=kind, limited=limited)
                claimer.poke()
            case notify.SlotsFreed(kinds):  # another supervisor wrote outcomes of limited jobs
                if claimer.limits_in_force.intersection(kinds):
                    claimer.slots_freed()
            case notify.QueuePaused(queue_name, paused):
                claimer.pause_heard(queue_name, paused)

    def cancel_requested(self, requests: Mapping[int, str]) -> None:
        """Stop the held jobs an operator cancelled: a prefetched one is written `cancelled` at once;
        a running one's worker is stopped (SIGTERM, SIGKILL after the kill grace, as for a timeout) and
        replaced, and lost() writes it. One handed to a worker behind another, or already finished and
        not yet written, ends as it ends (done stays done; a failure or snooze is written cancelled)."""
        held = self.held
        for job_id, by in requests.items():
            job = held.jobs.get(job_id)
            if job is None or job_id in held.cancelling:
                continue
            held.cancelling[job_id] = by
            if self.handout.remove(job_id):
                self.writer.cancel(Cancel(job.id, job.attempts, by=by))
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

    def notified(self, message: notify.JobsQueued) -> None:
        self.claimer.notified(message)

    def poke(self) -> None:
        self.claimer.poke()

    def note_run_at(self, run_at: float) -> None:
        self.claimer.note_run_at(run_at)

    def set_limits_in_force(self, kinds: Iterable[str], keyed: Iterable[str] = ()) -> None:
        self.claimer.set_limits_in_force(kinds, keyed)

    def pause_notes(self) -> int:
        """Pause NOTIFYs heard so far: a heartbeat's answer read before the last one is older than it."""
        return self.claimer.pause_notes

    def paused_read(self, queues: Iterable[str], notes_before: int) -> None:
        self.claimer.paused_read(queues, notes_before)

    def refuse_claims(self, why: str) -> None:
        self.claimer.refuse_claims(why)

    # --- what the heartbeat, the metrics and the shutdown read -------------------------------

    def jobs_done(self) -> int:
        return self.writer.jobs_done

    def latency(self) -> Recorder:
        return self.writer.latency

    def holding(self) -> int:
        """Jobs held: claimed and not yet written back."""
        return len(self.held)

    def prefetched(self) -> int:
        return len(self.handout)

    def running(self) -> list[Claimed]:
        """Jobs handed to workers: running, or next in a worker's hand-out."""
        return self.handout.running()

    def buffered(self) -> int:
        return self.writer.buffered()

    async def flush(self, *, deadline: float | None = None) -> None:
        await self.writer.flush(deadline=deadline)

    # --- stopping ------------------------------------------------------------------------------

    def stop(self) -> None:
        """A shutdown: no more claims or hand-outs; what comes back unstarted goes back to the queue."""
        self.handout.stopping = True
        self.claimer.stop()
        self.writer.stop()

    def release_prefetched(self) -> int:
        """Queue every job claimed but not started for hand-back at the next flush; how many."""
        return self.handout.release_all()

    def release_running(self, reason: str) -> None:
        """A hard stop: every job in a worker goes back, the running ones interrupted for `reason`; the
        keeper kills the workers next."""
        running, unstarted = self.keeper.take_jobs()
        self.writer.release(running, f"{INTERRUPTED}: {reason}")
        self.writer.release(unstarted)
