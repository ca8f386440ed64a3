"""How fast the workers finish jobs, and how long a handler runs: what the claimer sizes its claims by
and the hand-out decides by whether jobs are short enough to go to a worker several at a time."""

from __future__ import annotations

import math

# The finishing rate is sampled by the claim loop, over at least RATE_WINDOW. A rising rate is taken at
# once, so a burst's claims grow with every claim: they grew once per 50 ms tick, and a supervisor of two
# workers spent a fifth of a 20,000-job burst claiming 2 to 9 jobs at a time while its workers waited.
# A falling rate decays with this time constant (seconds).
RATE_WINDOW = 0.01
RATE_DECAY = 0.15
# Weight of the newest sample in the smoothed job duration.
DURATION_SMOOTHING = 0.3
# Jobs that take less than this on average go to a worker several at a time (supervisor/handout.py),
# and are claimed and written in good shares rather than one by one.
SHORT_JOB = 0.002


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


class Pace:
    """The run time of handlers, smoothed, overall and per kind, and the jobs finished so far.

    >>> pace = Pace()
    >>> pace.ran("a", 0.001); pace.ran("a", 0.011); round(pace.duration, 4), round(pace.kind_ran["a"], 4)
    (0.004, 0.004)
    >>> pace.short(), pace.finished
    (False, 2)
    """

    def __init__(self) -> None:
        self.finished = 0  # outcomes heard from workers, for the finishing rate
        self.rate = FinishingRate()  # sampled by the claim loop
        self.duration = 1.0  # seconds a handler runs, smoothed; assume slow until the first is measured
        self.kind_ran: dict[str, float] = {}  # the same for each kind; a kind not seen yet counts as slow

    def ran(self, kind: str, seconds: float) -> None:
        """A handler of `kind` ran `seconds`: the worker's own measure, not the time since the hand-out.
        On a loaded machine the trip through the pipes takes milliseconds, and counting it made a no-op
        job look long, so it was sent alone, which made more trips, which kept it looking long (a
        2-worker supervisor sharing a core stayed at one job per message and ran at a tenth of the rate)."""
        self.finished += 1
        self.duration += (DURATION_SMOOTHING if self.finished > 1 else 1.0) * (seconds - self.duration)
        # Each kind's own: whether its jobs are short enough to hand out several at a time.
        before = self.kind_ran.get(kind)
        self.kind_ran[kind] = seconds if before is None else before + DURATION_SMOOTHING * (seconds - before)

    def short(self) -> bool:
        """Handlers run under SHORT_JOB on average."""
        return self.duration < SHORT_JOB
