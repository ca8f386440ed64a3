"""The claimer: takes the jobs the workers can start soon, with as few statements as it can.

Plain kinds are claimed from each queue's claim key on (keys.py), as many as the room in the processes
and a prefetch sized by the finishing rate (pace.py) call for. Kinds with a limit in force are claimed
by claim_limited alone, one per idle worker (or a prefetch's worth of short jobs), and with the outcome
writes that free their slots. It wakes for a NOTIFY of an insert, a known run_at, freed slots, or its
poll, the safety net; a pause leaves its queue out of every claim.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime

import psycopg

from jobsup.db import lifecycle, notify
from jobsup.db.lifecycle import ClaimKey
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import arun_together
from jobsup.job import Claimed
from jobsup.supervisor.config import Config
from jobsup.supervisor.declaration import RETRY as RETRY_DECLARATION
from jobsup.supervisor.declaration import Declaration
from jobsup.supervisor.handout import HandOut
from jobsup.supervisor.held import Held
from jobsup.supervisor.keeper import TOOK_ITS_PROCESS, Keeper
from jobsup.supervisor.keys import ClaimKeys
from jobsup.supervisor.link import LOST, Link
from jobsup.supervisor.log import EventLog
from jobsup.supervisor.pace import SHORT_JOB, Pace
from jobsup.supervisor.tally import Tally
from jobsup.supervisor.wakeup import Wakeup
from jobsup.supervisor.writer import OutcomeWriter

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
# Future run_at times remembered to wake for (retries, delayed jobs); beyond these the poll finds them.
KNOWN_RUN_ATS = 10_000
# How long before a rate's next start its supervisor wakes to claim it (claim_limited waits the rest).
RATE_WAKE_AHEAD = 0.010
# Jobs that share processes are claimed once this share of their room is free (a claim for each job
# that ends would cost a commit each), or once a whole --batch is.
SHARED_CLAIM_SHARE = 0.1
# The classes of kinds an app of both claims in statements of their own (Claimer.mixed).
ALONE, SHARED = "alone", "shared"
CLASSES = frozenset((ALONE, SHARED))


class Claimer:
    def __init__(
        self,
        config: Config,
        log: EventLog,
        supervisor_id: str,
        keeper: Keeper,
        link: Link,
        held: Held,
        pace: Pace,
        handout: HandOut,
        writer: OutcomeWriter,
        tally: Tally | None = None,
        declaration: Declaration | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.id = supervisor_id
        self.keeper = keeper
        self.link = link
        self.held = held
        self.pace = pace
        self.handout = handout
        self.writer = writer
        self.tally = tally
        # Records the app's limits before the first claim (supervisor/declaration.py); None once done.
        self.declaration = declaration
        self.wakeup = Wakeup()
        self.stopping = False
        self.more = True  # ready jobs may be waiting: a claim is worth a round trip
        # Of an app of alone and shared kinds, the classes (ALONE, SHARED) whose own claim came back short
        # since `more` was last set: not claimed again until it is, and when both are, `more` is not.
        self.drained: set[str] = set()
        self.pokes = 0  # how many times `more` was set from outside the claim loop
        self.run_ats: list[float] = []  # heap of future run_at times we know of (epoch seconds)
        self.orphans_possible = False
        self.keys = ClaimKeys(config.queues, config.poll_interval)  # where each queue's next claim starts
        self.backlog = False  # the last claim took all it asked for: more may be ready behind it
        self.paused: set[str] = set()  # our queues that are paused: left out of every claim
        self.pause_notes = 0  # pause NOTIFYs heard: a heartbeat's older answer must not undo one
        self.refused: str | None = None  # why the schema refuses our claims (a newer claim protocol)
        # Limits: the kinds with a limit in force (the database's, told by the heartbeat and the jobsup
        # channel), whose jobs only claim_limited takes.
        self.limits_in_force: frozenset[str] = frozenset()
        self.keyed_limits: frozenset[str] = frozenset()  # those of them with per-key limits
        self.limited_more = False  # a limited job may be claimable: a claim_limited is worth a round trip
        self.limited_claiming = 0  # jobs asked of claims of limited kinds in flight, for idle workers
        self.limited_room = 0  # how many the last claim of limited kinds that limits cut short took

    # --- what wakes it ------------------------------------------------------------------------

    def notified(self, message: notify.JobsQueued) -> None:
        """A NOTIFY of the insert trigger (or a release, reap or requeue)."""
        queues, run_at = message
        if queues and not set(queues) & set(self.config.queues):
            return
        if run_at is not None and run_at > time.time():
            self.note_run_at(run_at)
            return
        if run_at is not None and self.keys.sorts_after(queues, run_at):
            self.some_ready()  # an insert past our claim keys (see keys.py): they still hold
            self.wakeup.set()
        else:
            self.poke()
        if self.tally is not None:  # a NOTIFY that woke the claimer
            self.tally.wakeups += 1

    def poke(self) -> None:
        """Something may be ready: claim at the next chance, scanning every queue from its head."""
        self.keys.forget()
        self.some_ready()
        self.limited_more = True
        self.pokes += 1
        self.wakeup.set()

    def some_ready(self) -> None:
        """Jobs of either class may be ready: a claim is worth a round trip (the claim keys are kept)."""
        self.more = True
        self.drained.clear()

    def room_freed(self) -> None:
        """A worker became ready, or a shared job ended: claim at the next chance if that is worth it."""
        if self.more or (self.limited_more and self.limits_in_force):
            self.wakeup.set()

    def slots_freed(self) -> None:
        """Slots of limited kinds are free (our writes, or another supervisor's)."""
        self.limited_more = True
        self.wakeup.set()

    def note_run_at(self, run_at: float) -> None:
        if len(self.run_ats) >= KNOWN_RUN_ATS:
            return  # the poll finds the rest
        if not self.run_ats or run_at < self.run_ats[0]:
            self.wakeup.set()  # the claim loop recomputes how long it may sleep
        heapq.heappush(self.run_ats, run_at)

    def set_limits_in_force(self, kinds: Iterable[str], keyed: Iterable[str] = ()) -> None:
        """The kinds with a limit in force, and those of them with per-key limits, as the database says
        (a heartbeat, a NOTIFY)."""
        kinds = frozenset(kinds)
        self.keyed_limits = frozenset(keyed)
        if kinds - self.limits_in_force:
            self.limited_more = True
            self.wakeup.set()
        self.limits_in_force = kinds

    def set_paused(self, paused: set[str]) -> None:
        """The paused queues, from a NOTIFY or a heartbeat: claims leave them out at once; prefetched
        jobs of a queue just paused go back unstarted (they could wait behind a long job); a queue just
        resumed is claimed from its head."""
        paused = paused & set(self.config.queues)
        added, removed = paused - self.paused, self.paused - paused
        self.paused = paused
        if added:
            self.log("queue.paused", queues=sorted(added))
            self.handout.release_queues(added)
        if removed:
            self.log("queue.resumed", queues=sorted(removed))
            self.poke()

    def pause_heard(self, queue: str, paused: bool) -> None:
        self.pause_notes += 1
        self.set_paused(self.paused | {queue} if paused else self.paused - {queue})

    def paused_read(self, queues: Iterable[str], notes_before: int) -> None:
        """The paused queues as a heartbeat read them; ignored if a pause NOTIFY came meanwhile (it is
        at least as new)."""
        if self.pause_notes == notes_before:
            self.set_paused(set(queues))

    def refuse_claims(self, why: str) -> None:
        """The schema requires a newer claim than ours: stop claiming (what is held is finished and
        written as usual), and say why once."""
        if self.refused is None:
            self.refused = why
            self.log("claim.refused", "error", reason=why)

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()

    # --- how much ----------------------------------------------------------------------------

    def prefetch(self) -> int:
        # Bounded by what the handlers' own run time lets the workers start in the horizon: a window in
        # which several slow jobs happened to end together reads as a high rate, taken at once.
        pace = self.pace
        expected = min(pace.rate.per_second, self.config.procs / max(pace.duration, 1e-6)) * PREFETCH_HORIZON
        return max(self.config.prefetch, min(PREFETCH_CLAIMS * self.config.batch, int(expected)))

    def capacity(self) -> int:
        return min(self.config.batch, self.handout.room() + self.prefetch() - len(self.handout))

    def limited_kinds(self) -> list[str]:
        """The limited kinds this supervisor claims: those its app can run (any, for an app that finds
        kinds by name), sorted, the order claim_limited locks them in."""
        kinds = self.keeper.kinds
        return sorted(self.limits_in_force if kinds is None else self.limits_in_force & kinds)

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
        if self.pace.duration < SHORT_JOB:
            return max(0, self.capacity() - self.limited_claiming)
        free = self.handout.shared_room() if self._limited_shared() else len(self.keeper.idle())
        want = free - len(self.handout) - self.limited_claiming
        return min(want, self.config.batch)

    def _limited_shared(self) -> bool:
        """Some limited kind of ours shares processes: idle room is counted in jobs, not processes."""
        shared = self.keeper.shared_kinds
        return bool(shared) and any(kind in shared for kind in self.limits_in_force)

    def mixed(self) -> tuple[list[str], list[str]] | None:
        """(alone kinds, shared kinds) of an app that has both, else None."""
        shared, kinds = self.keeper.shared_kinds, self.keeper.kinds
        if not shared or kinds is None or kinds.issubset(shared):
            return None
        return sorted(kinds - shared.keys()), sorted(shared)

    # --- claiming ----------------------------------------------------------------------------

    async def loop(self) -> None:
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
            self.pace.rate.sample(loop.time(), self.pace.finished)
            claimed = False
            want = self.capacity()
            # Short jobs with some still prefetched: wait until a claim can take a good share of what
            # is wanted (half, or a whole --batch), rather than spend a commit on one or two. Slower jobs
            # top the prefetch up at once.
            threshold = 1
            if len(self.handout) and self.pace.duration < SHORT_JOB:
                threshold = max(1, min(self.config.batch, (self.config.procs + self.prefetch()) // 2))
            if (
                self.backlog
                and self.keeper.shared_kinds
                and self.keeper.kinds is not None
                and self.handout.running_count()
            ):
                # Shared jobs behind a backlog: wait for a share of the room, so one claim starts many
                # (not one a job). A job announced once the queue had run dry is claimed at once.
                share = int(self.config.procs * self.config.capacity * SHARED_CLAIM_SHARE)
                threshold = max(threshold, min(self.config.batch, share))
            mixed = self.mixed()
            if (
                self.more
                and want >= threshold
                and self.keeper.ever_ready
                and self.refused is None
                and not (self.paused and self.paused.issuperset(self.config.queues))
                and (mixed is None or self._alone_want(want) > 0 or self._shared_want(want, 0) > 0)
            ):
                claimed = True
                pokes = self.pokes
                # An app of shared and alone kinds claims each in a statement of its own (mixed()),
                # where the claim keys of one would skip the other's jobs: it claims from the heads.
                keys = self.keys.for_claim() if mixed is None else {}
                keyed = bool(keys)
                jobs = await self._claim(want, keys)
                next_poll = loop.time() + self.config.poll_interval
                if mixed is not None:
                    # Each class's claim is sized by its own room, so the two together come back short of
                    # `want` with jobs still ready: the queues have run dry when each class's did.
                    if jobs is not None and self.drained.issuperset(CLASSES):
                        self.more = False
                elif jobs is None or len(jobs) < want:
                    self.keys.forget()
                    # Short from the heads of the queues: nothing else was ready when its snapshot was
                    # taken. A poke that came while it was in flight (a NOTIFY, the listener's first
                    # LISTEN) may be for a job committed after that snapshot: it must lead to another claim.
                    if jobs is not None and not keyed and self.pokes == pokes:
                        self.more = False
                else:
                    self.keys.claimed(jobs)
                if jobs is not None:
                    if mixed is None:  # a mixed claim tells whether its shared class had more (_claim_mixed)
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
            await self.wakeup.wait(timeout)
            now = time.time()
            if self.run_ats and now >= self.run_ats[0]:
                while self.run_ats and now >= self.run_ats[0]:
                    heapq.heappop(self.run_ats)
                self.some_ready()
                self.limited_more = True
            if loop.time() >= next_poll:
                self.some_ready()  # the safety net: a NOTIFY may have been missed
                self.limited_more = True
                next_poll = loop.time() + self.config.poll_interval

    async def _claim(self, want: int, keys: Mapping[str, ClaimKey]) -> list[Claimed] | None:
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
        released = await lifecycle.arelease_orphans(conn, self.id, list(self.held.jobs))
        self.orphans_possible = False
        if released:
            self.log("jobs.released", reason="claim answer lost with the connection", count=len(released), ids=released)

    async def _claim_once(self, want: int, keys: Mapping[str, ClaimKey]) -> list[Claimed] | None:
        try:
            conn = await self.link.connect()
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
            self.link.drop(exc)
            self.orphans_possible = True
            return None
        except psycopg.Error as exc:
            if exc.sqlstate == lifecycle.CLAIM_REFUSED:
                self.refuse_claims(str(exc.diag.message_primary))
                return None
            raise

    async def _claim_mixed(
        self,
        conn: psycopg.AsyncConnection,
        queues: list[str] | tuple[str, ...],
        want: int,
        alone: list[str],
        shared: list[str],
    ) -> list[Claimed]:
        """Claim for an app of alone and shared kinds: alone jobs for the idle processes and the
        prefetch (what the processes start within PREFETCH_HORIZON, as in an app of alone jobs), shared
        ones for the room left. A class whose claim comes back short is drained: not claimed again
        until jobs may have come."""
        pokes = self.pokes
        jobs: list[Claimed] = []
        alone_want = self._alone_want(want)
        if alone_want > 0:
            jobs = await self._claim_kinds(conn, queues, alone_want, alone)
            if len(jobs) < alone_want and self.pokes == pokes:  # see the claim loop: a poke meanwhile
                self.drained.add(ALONE)
        shared_want = self._shared_want(want, len(jobs))
        if shared_want > 0:
            claimed = await self._claim_kinds(conn, queues, shared_want, shared)
            self.backlog = len(claimed) >= shared_want
            if not self.backlog and self.pokes == pokes:
                self.drained.add(SHARED)
            jobs += claimed
        return jobs

    def _alone_want(self, want: int) -> int:
        """Alone jobs a mixed app's claim asks for: one for each idle process, and the prefetch."""
        if ALONE in self.drained:
            return 0
        prefetched_alone, _ = self.handout.waiting(self.keeper.shared_kinds)
        return min(want, len(self.keeper.idle()) + self.prefetch() - prefetched_alone)

    def _shared_want(self, want: int, alone_claimed: int) -> int:
        """Shared jobs a mixed app's claim asks for: the room left, where the idle processes that
        `alone_claimed` jobs will take hold none."""
        if SHARED in self.drained:
            return 0
        _, prefetched_shared = self.handout.waiting(self.keeper.shared_kinds)
        taken = min(alone_claimed, len(self.keeper.idle()))
        return min(want, self.handout.shared_room() - self.config.capacity * taken) - prefetched_shared

    async def _claim_kinds(
        self,
        conn: psycopg.AsyncConnection,
        queues: Sequence[str],
        want: int,
        kinds: Collection[str] | None,
        keys: Mapping[str, ClaimKey] | None = None,
    ) -> list[Claimed]:
        """One claim of `kinds` (None: any) from `queues`, from `keys` on."""
        if not self.link.pooled:  # synchronous_commit=off is a setting of the claims session
            return await lifecycle.aclaim_text(conn, queues, want, self.id, self.config.lease, keys, kinds)
        # Through a transaction pooler there is no session to hold it: the claim's own
        # transaction sets it, sent in one pipeline with the claim.
        async with conn.pipeline(), conn.transaction():
            await conn.execute(SQL["claim_without_flush_wait"])
            return await lifecycle.aclaim_text(conn, queues, want, self.id, self.config.lease, keys, kinds)

    def _take(self, jobs: list[Claimed]) -> None:
        if self.keeper.shared_kinds:
            self._crashed_before(jobs)
        self.held.add(jobs)
        if self.stopping:
            self.writer.release(jobs)
            jobs = []
        elif self.paused:  # paused while the claim ran
            self.writer.release([j for j in jobs if j.queue in self.paused])
            jobs = [j for j in jobs if j.queue not in self.paused]
        self.handout.add(jobs)
        self.handout.hand_out()

    def _crashed_before(self, jobs: Iterable[Claimed]) -> None:
        """Jobs of shared kinds whose earlier attempt took its process down run alone from now on."""
        shared = self.keeper.shared_kinds
        alone = self.held.alone
        for job in jobs:
            errors = job.errors  # JSON text
            if errors and job.kind in shared and any(c in errors for c in TOOK_ITS_PROCESS):
                alone.add(job.id)

    # --- claiming limited kinds ---------------------------------------------------------------

    async def _claim_limited(self, want: int) -> None:
        kinds = self.limited_kinds()
        if not kinds:
            self.limited_more = False
            return
        pokes = self.pokes
        queues = [q for q in self.config.queues if q not in self.paused]
        self.limited_claiming += want
        try:
            conn = await self.link.connect()
            await self._release_orphans(conn)
            jobs, wake = await lifecycle.aclaim_limited_text(conn, kinds, queues, want, self.id, self.config.lease)
        except LOST as exc:
            self.link.drop(exc)
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
        self, jobs: list[Claimed], wake: datetime | None, want: int, pokes: int, handoff: bool = False
    ) -> None:
        self.held.limited_short = len(jobs) < want
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
        if self.keeper.shared_kinds:
            self._crashed_before(jobs)
        self.held.add(jobs, limited=True)
        self.handout.first_in_line(jobs)  # each holds a slot, so it starts first

    def handoff_want(self, chunk: list[Claimed]) -> int:
        """How many limited jobs to claim in the round trip that writes `chunk`: when it frees limited
        slots, the workers that ran those jobs are idle, and the next jobs for them are claimed with the
        write instead of a round trip after it (a limit's throughput is its slots' turnover)."""
        limited = self.held.limited
        if self.stopping or self.refused or not limited or not any(j.id in limited for j in chunk):
            return 0
        self.limited_more = True
        return self._limited_want()

    async def complete_and_claim(
        self, pairs: list[tuple[int, int]], values: list[str | None] | None, want: int, conn: psycopg.AsyncConnection
    ) -> list[int]:
        """The outcome writer's write of done jobs, `pairs`, with a claim of `want` limited jobs in the
        same round trip; the ids written."""
        queues = [q for q in self.config.queues if q not in self.paused]
        pokes = self.pokes
        self.limited_claiming += want
        try:
            written, (jobs, wake) = await arun_together(
                conn,
                lifecycle.complete_op(pairs, self.id, values),
                lifecycle.claim_limited_op(self.limited_kinds(), queues, want, self.id, self.config.lease, text=True),
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
            self.held.freed[job.kind] -= 1  # a slot this write frees, taken again at once: no one need be told
        self._took_limited(jobs, wake, want, pokes, handoff=True)
        return written
