"""The hand-out: the jobs claimed and not yet started (the prefetch), in the order they start, and
which worker process starts each.

Alone jobs go to idle processes, one at a time, or a few together when they are short. Shared jobs
(docs/guides/waiting.md) fill the processes that run shared jobs. Jobs it cannot start at a shutdown go
back to the queue through the outcome writer.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Collection, Iterable

from jobsup.job import Claimed
from jobsup.supervisor.config import Config
from jobsup.supervisor.held import Held
from jobsup.supervisor.keeper import Keeper, Worker
from jobsup.supervisor.pace import SHORT_JOB, Pace
from jobsup.supervisor.writer import OutcomeWriter

# Jobs that take less than SHORT_JOB on average go to a worker several at a time (at most HANDOUT_MAX),
# so the supervisor writes one message per few jobs instead of one per job. A worker runs them in order
# and answers each as it ends; if it dies, the one it was running fails and the rest are handed back.
# Each message wakes its worker (a pipe write that, on a loaded machine, costs the supervisor's one
# thread tens of µs): 32 rather than 8 cut the supervisor's CPU per no-op job by about a sixth.
HANDOUT_MAX = 32
# The most short jobs of a limited kind handed to one worker while the limit holds the kind back.
LIMITED_HANDOUT_MAX = 4
# Why a process that runs shared jobs takes no more: an alone job waits for a process.
DRAIN_FOR_ALONE = "an alone job waits for a process"


class HandOut:
    def __init__(self, config: Config, keeper: Keeper, held: Held, pace: Pace, writer: OutcomeWriter) -> None:
        self.config = config
        self.keeper = keeper
        self.held = held
        self.pace = pace
        self.writer = writer
        self.prefetched: deque[Claimed] = deque()
        self.stopping = False

    def __len__(self) -> int:
        return len(self.prefetched)

    # --- what waits ---------------------------------------------------------------------------

    def add(self, claimed: list[Claimed]) -> None:
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

    def first_in_line(self, jobs: list[Claimed]) -> None:
        """Held jobs no worker runs: first for the next free worker, or back to the queue at a shutdown."""
        if self.stopping:
            self.writer.release(jobs)
            return
        self.prefetched.extendleft(reversed(jobs))
        self.hand_out()

    def remove(self, job_id: int) -> bool:
        """Take `job_id` out of the prefetch (an operator cancelled it); False if it is not there."""
        if not any(j.id == job_id for j in self.prefetched):
            return False
        self.prefetched = deque(j for j in self.prefetched if j.id != job_id)
        return True

    def drop(self, ids: Collection[int]) -> None:
        """Forget prefetched jobs whose leases were lost: another has them now."""
        self.prefetched = deque(j for j in self.prefetched if j.id not in ids)

    def release_queues(self, queues: Collection[str]) -> None:
        """Prefetched jobs of `queues` (just paused) go back unstarted: they could wait behind a long job."""
        back = [j for j in self.prefetched if j.queue in queues]
        if back:
            self.prefetched = deque(j for j in self.prefetched if j.queue not in queues)
            self.writer.release(back)

    def release_all(self) -> int:
        """Hand every job claimed but not started back, at the next flush; how many."""
        count = len(self.prefetched)
        self.writer.release(list(self.prefetched))
        self.prefetched.clear()
        return count

    def waiting(self, shared_kinds: Collection[str]) -> tuple[int, int]:
        """(alone, shared) jobs prefetched."""
        shared = sum(1 for j in self.prefetched if j.kind in shared_kinds)
        return len(self.prefetched) - shared, shared

    # --- who runs what ------------------------------------------------------------------------

    def worker_ready(self, worker: Worker) -> None:
        if self.prefetched and not self.stopping:
            if self.keeper.shared_kinds:
                self.hand_out()
            else:
                self.keeper.assign(worker, self._next_for(worker, 1))

    def hand_out(self) -> None:
        if self.stopping:
            return
        if self.keeper.shared_kinds:
            self._hand_out_shared()
            return
        idle = self.keeper.idle()
        while idle and self.prefetched:
            worker = idle.pop()
            self.keeper.assign(worker, self._next_for(worker, len(idle) + 1))

    def _next_for(self, worker: Worker, idle: int) -> list[Claimed]:
        """The next jobs for `worker`, one of `idle` idle workers: one, or a few when jobs are short,
        but no more than it may run before --max-jobs-per-proc recycles it."""
        count = (
            self._share_of(worker, self.prefetched[0], len(self.prefetched), idle)
            if self.pace.duration < SHORT_JOB
            else 1
        )
        jobs = [self.prefetched.popleft()]
        if count > 1:
            ran = self.pace.kind_ran  # _short, inline: this loop takes every short job
            while len(jobs) < count and self.prefetched and ran.get(self.prefetched[0].kind, SHORT_JOB) < SHORT_JOB:
                jobs.append(self.prefetched.popleft())
        return jobs

    def _share_of(self, worker: Worker, first: Claimed, waiting: int, idle: int) -> int:
        """How many of `waiting` short jobs, `first` first, go to `worker`, one of `idle` idle workers:
        an even share, but no more than it may run before --max-jobs-per-proc recycles it."""
        if not self._short(first):
            return 1
        count = min(HANDOUT_MAX, -(-waiting // idle))
        if self.held.limited_short and first.id in self.held.limited:
            # Each holds a slot while it waits behind the others, which no idle worker can take.
            count = min(count, LIMITED_HANDOUT_MAX)
        if worker.recycle_after is not None:
            count = max(1, min(count, worker.recycle_after - worker.jobs_done))
        return count

    def _short(self, job: Claimed) -> bool:
        """Only jobs of kinds whose own run time is short share a hand-out: one of a kind that is slow,
        or not seen yet, would hold up the others while another worker is idle."""
        return self.pace.kind_ran.get(job.kind, SHORT_JOB) < SHORT_JOB

    def _hand_out_shared(self) -> None:
        """Hand out an app's mix of shared and alone jobs, in the prefetch's order. Shared jobs fill the
        process that runs the most shared jobs and has room (processes left idle stay free for alone
        jobs), and open an idle process only when none has room and no alone job needs it; an alone job
        takes an idle process, with the alone jobs behind it if they are short (as _next_for). An alone
        job that finds none has one process drain (it takes no more shared jobs and is handed the alone
        job once empty), so shared jobs never starve alone ones."""
        if not self.prefetched:
            return
        keeper = self.keeper
        shared_kinds = keeper.shared_kinds
        alone = self.held.alone
        capacity = self.config.capacity
        idle = keeper.idle()
        alone_waiting = sum(1 for j in self.prefetched if j.kind not in shared_kinds or j.id in alone)
        open_ = sorted(
            (w for w in keeper.workers.values() if w.sharing and w.draining is None and w.stop_reason is None),
            key=lambda w: -len(w.sharing),
        )
        given: dict[Worker, list[Claimed]] = {}
        load: dict[Worker, int] = {w: len(w.sharing) for w in open_}
        kinds: Counter[tuple[Worker, str]] = Counter()
        kept: deque[Claimed] = deque()
        alone_given: list[tuple[Worker, list[Claimed]]] = []
        share = 0  # how many more short alone jobs the last idle process handed an alone job takes
        for job in self.prefetched:
            if job.kind not in shared_kinds or job.id in alone:
                # A shared kind's job that took its process down runs alone and shares no hand-out.
                short = job.id not in alone and self._short(job)
                if share and short:
                    alone_given[-1][1].append(job)
                    share -= 1
                elif idle:
                    worker = idle.pop()
                    alone_given.append((worker, [job]))
                    share = self._share_of(worker, job, alone_waiting, len(idle) + 1) - 1 if short else 0
                else:
                    kept.append(job)
                    continue
                alone_waiting -= 1
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
        for worker, jobs in alone_given:
            keeper.assign(worker, jobs)
        for worker, jobs in given.items():
            keeper.assign_shared(worker, jobs)
        if alone_waiting > 0 and not any(w.draining == DRAIN_FOR_ALONE for w in keeper.workers.values()):
            sharing = [w for w in keeper.workers.values() if w.sharing and w.draining is None and w.stop_reason is None]
            if sharing and not keeper.idle():
                min(sharing, key=lambda w: len(w.sharing)).draining = DRAIN_FOR_ALONE

    # --- what runs ----------------------------------------------------------------------------

    def room(self) -> int:
        """How many more jobs the processes could start now: idle processes for an app of alone jobs;
        for one with shared jobs, the free room of those running shared jobs and a whole --capacity for
        each idle one."""
        if not self.keeper.shared_kinds:
            return len(self.keeper.idle())
        return self.shared_room()

    def shared_room(self) -> int:
        capacity = self.config.capacity
        room = 0
        for worker in self.keeper.workers.values():
            if worker.state == "idle":
                room += capacity
            elif worker.sharing and worker.draining is None and worker.stop_reason is None:
                room += capacity - len(worker.sharing)
        return room

    def running_count(self) -> int:
        return sum(len(w.sharing) or len(w.jobs) for w in self.keeper.workers.values())

    def running(self) -> list[Claimed]:
        """Jobs handed to workers: running, or next in a worker's hand-out."""
        return [job for w in self.keeper.all_processes() for job in w.held]

    def handed(self, ids: Iterable[int]) -> set[int]:
        """Those of `ids` handed to a worker."""
        wanted = set(ids)
        return {job.id for w in self.keeper.all_processes() for job in w.held if job.id in wanted}
