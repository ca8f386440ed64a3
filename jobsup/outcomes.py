"""What a handler can raise besides an ordinary failure: Snooze, RetryAfter, Discard.

    from jobsup import Discard, RetryAfter, Snooze

    raise Snooze(30)                 # not yet: run again in 30 s, the attempt given back
    raise RetryAfter(120, "429")     # this attempt failed; retry in 120 s instead of the backoff
    raise Discard("address bounced") # stop now: the job is `cancelled`, no more attempts

Each is recorded in the job's `errors`. A bad argument (Snooze(-1)) raises BadInput where the handler
builds it, which fails that attempt saying why.

Also how an attempt ended as run middleware (jobsup.middleware) and tracing (jobsup.otel) learn it:
RunOutcome, and AttemptStopped for an attempt stopped from outside its handler.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from jobsup.errors import BadInput, JobsupError

# Times a job may snooze before the next Snooze fails its attempt instead (a handler that snoozes for
# ever would otherwise never be noticed). Per kind: app.handler(..., max_snoozes=N).
MAX_SNOOZES = 100
# Longest delay a Snooze or RetryAfter may ask for: 10 years, in seconds (the claim's make_interval
# takes far more; this only refuses nonsense).
MAX_DELAY = 10 * 365 * 24 * 3600.0


def _seconds(verb: str, seconds: object) -> float:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_DELAY
    ):
        raise BadInput(f"{verb}(seconds) takes a number of seconds from 0 to {MAX_DELAY:g}, not {seconds!r}")
    return float(seconds)


def _format(seconds: float) -> str:
    return f"{seconds:g}s"


class HandlerVerb(JobsupError):
    """Raised by a handler to say what becomes of its job; not an error of jobsup's."""


class Snooze(HandlerVerb):
    """Run the job again after `seconds`; this attempt does not count, the job's `snoozes` grows."""

    def __init__(self, seconds: float) -> None:
        self.seconds = _seconds("Snooze", seconds)
        super().__init__(f"snoozed for {_format(self.seconds)}")


class RetryAfter(HandlerVerb):
    """This attempt failed; retry after `seconds` rather than the backoff (dead at max_attempts)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        self.seconds = _seconds("RetryAfter", seconds)
        self.reason = str(reason)
        super().__init__(f"retry after {_format(self.seconds)}" + (f": {self.reason}" if self.reason else ""))


class Discard(HandlerVerb):
    """Stop now: the job becomes `cancelled`, never retried; `reason` is kept as its last error."""

    def __init__(self, reason: str = "") -> None:
        self.reason = str(reason)
        super().__init__(self.reason)


class Answer(NamedTuple):
    """How one run of a handler ended: what a worker answers the supervisor with, and what
    jobsup.testing.drain runs from. On the pipe it travels as a plain tuple, jobsup.worker.messages'
    ANSWER; jobsup.db.lifecycle.record_of maps it to the statement that writes it."""

    id: int
    error: str | None = None  # None: done
    traceback: str | None = None
    value: str | None = None  # a done job's return value as JSON text; None when it returned None
    verb: tuple | None = None  # a handler's ("snooze", seconds), ("retry", seconds) or ("discard",)
    ran: float = 0.0  # seconds the handler ran, measured by the worker


# What a run middleware learns of an attempt, in RunOutcome.status: the handler returned (done), raised
# (failed: RetryAfter too), snoozed or discarded; or the attempt was stopped from outside while it ran
# (see AttemptStopped): past its timeout (timed_out), by an operator's cancel (cancelled), by a shutdown
# that hands it back unspent (interrupted), or for another reason that costs the attempt (failed).
STATUSES = ("done", "failed", "snoozed", "discarded", "cancelled", "timed_out", "interrupted")


class RunOutcome(NamedTuple):
    """How one attempt ended, as a run middleware's `yield` returns it."""

    status: str  # one of STATUSES
    value: Any = None  # done: what the handler returned
    # failed: the exception (a RetryAfter too); snoozed, discarded: the Snooze or Discard; an attempt
    # stopped from outside: an AttemptStopped saying why.
    error: BaseException | None = None


class AttemptStopped(Exception):
    """The error of an attempt stopped from outside its handler (a timeout, a cancel, a shutdown, a
    worker over its memory): the supervisor stops its worker process with SIGTERM, and before it ends,
    the worker finishes the attempt's run middleware with this. What the middleware do then must fit in
    the supervisor's kill grace (2 s): the worker is killed after it."""
