"""What this supervisor holds: every job from the claim that takes it to the write that records its
outcome (or hands it back), and what is known of each meanwhile. The claimer adds to it, the outcome
writer forgets, the lease renewer renews all of it; the hand-out and the worker events read it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from jobsup.job import Claimed


class Held:
    def __init__(self) -> None:
        self.jobs: dict[int, Claimed] = {}  # claimed and not yet written back
        # Those of kinds with a limit in force (claimed by claim_limited): each holds a slot of its kind.
        self.limited: set[int] = set()
        # The last claim of limited kinds took fewer than it asked for: a limit holds them back (or their
        # backlog ran out). Their jobs then turn slots over: each is handed out and written at once, not
        # held back to share a message or a write (handout.py, writer.py).
        self.limited_short = False
        # Slots freed by our outcome writes and not yet taken again, by kind (writer.py tells the others).
        self.freed: Counter[str] = Counter()
        self.cancelling: dict[int, str] = {}  # held jobs an operator asked to cancel -> who asked
        # job id -> (trace id, span id) of its traced attempt, until its outcome's log line is written
        self.traces: dict[int, tuple[str, str]] = {}
        # The crash rule of shared jobs (docs/guides/waiting.md): how often each held job ran again after
        # its process died with neighbours (unknown culprit, any cause), and the jobs of shared kinds that
        # now must run alone.
        self.reruns: dict[int, tuple[int, int]] = {}
        self.alone: set[int] = set()

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, jobs: Iterable[Claimed], limited: bool = False) -> None:
        for job in jobs:
            self.jobs[job.id] = job
            if limited:
                self.limited.add(job.id)

    def forget(self, jobs: Iterable[Claimed], written: Iterable[int]) -> list[int]:
        """No longer held: `jobs`, whose outcome write wrote `written`. The ids of those it did not
        write (fenced out: the lease lapsed and the reaper, or another supervisor, has them now)."""
        kept = set(written)
        lost = []
        for job in jobs:
            if job.id not in kept:
                lost.append(job.id)
            self.jobs.pop(job.id, None)
            if self.traces:
                self.traces.pop(job.id, None)
            if self.cancelling:
                self.cancelling.pop(job.id, None)
            if self.alone:
                self.reruns.pop(job.id, None)
                self.alone.discard(job.id)
            elif self.reruns:
                self.reruns.pop(job.id, None)
            if self.limited and job.id in self.limited:
                self.limited.discard(job.id)
                self.freed[job.kind] += 1
        return lost

    def drop(self, job_id: int) -> None:
        """A job whose lease another took: no outcome of ours will be written for it."""
        self.jobs.pop(job_id, None)
        self.limited.discard(job_id)
