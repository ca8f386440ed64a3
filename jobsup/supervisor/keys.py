"""Where each queue's next claim starts: the claimer's claim keys (queue.claim's `after`).

A claim starts each queue's scan past the last job it took there, so a deep backlog costs the same per
claim as a shallow one: from the head, the scan steps over the dead index entries of every job claimed
since the last vacuum (120,000 into a backlog: 700 buffers and 12 ms for 100 jobs, against 6 buffers).
Levels of a higher priority are read from their head by every claim; within its own level a key skips
what the claimer saw was not claimable (taken, or locked by another claimer), and is forgotten whenever
a job may have come back there:
- a NOTIFY for our queues: a release, reap or requeue (a job back at its old place), an insert with a
  run_at not after our keys (an explicit one, or the now() of a long transaction); an insert that sorts
  after them keeps them, so a steady enqueue during a drain keeps them;
- a claim that came back short, which then runs again from the heads before the claimer concludes
  that nothing is left; a lost claim connection; a listener start;
- poll_interval after the keys were set: the safety net for what nobody announces, such as a row that
  another transaction held locked and let go untaken.
A delayed job or a retry coming due needs none of this: the claims that set the keys ran before it was
due, so its run_at sorts after theirs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence

from jobsup.db import lifecycle
from jobsup.db.lifecycle import ClaimKey
from jobsup.job import Claimed


class ClaimKeys:
    def __init__(self, queues: Sequence[str], life: float) -> None:
        self.queues = tuple(queues)
        self.life = life  # seconds a set of keys is trusted (the poll interval)
        self.keys: dict[str, ClaimKey] = {}
        self._since = 0.0
        self._epoch = 0  # counts forgets: a claim that ran across one must not set keys again
        self._claim_epoch = -1
        # The earliest run_at of inserts announced while a claim ran (that claim may not have seen them).
        self._announced = math.inf

    def forget(self) -> None:
        """The next claim starts at the head of each queue: a job may be claimable before the keys."""
        self.keys.clear()
        self._epoch += 1

    def sorts_after(self, queues: Sequence[str], run_at: float) -> bool:
        """Whether jobs inserted into `queues` (all of ours when empty) with this earliest run_at sort
        after every key held there, in their level, or land in a level above, which every claim reads;
        if so the keys stay, and the claim in flight is checked against it when it ends."""
        keys = [self.keys.get(q) for q in (queues or self.queues)]
        after = all(key is not None and key[1].timestamp() < run_at for key in keys)
        if after:
            self._announced = min(self._announced, run_at)
        return after

    def for_claim(self) -> dict[str, ClaimKey]:
        """The keys for the claim about to run (none once they are older than their life)."""
        if self.keys and time.monotonic() - self._since > self.life:
            self.forget()
        self._claim_epoch, self._announced = self._epoch, math.inf
        return dict(self.keys)

    def claimed(self, jobs: Iterable[Claimed]) -> None:
        """A claim took as many jobs as it asked for: its last job in each queue is the new key there,
        unless the keys were forgotten meanwhile or an insert it may not have seen sorts before them."""
        if self._claim_epoch != self._epoch:
            return
        keys = lifecycle.claim_keys(jobs)
        if any(key[1].timestamp() >= self._announced for key in keys.values()):
            self.forget()
            return
        if not self.keys:
            self._since = time.monotonic()
        self.keys.update(keys)
