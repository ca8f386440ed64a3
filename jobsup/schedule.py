"""Schedules: what `app.every(...)` declares, checked at once, and the fire times it yields.

No database here. A schedule is a cron expression (five fields, or @hourly, @daily...) read in a time
zone, or an interval such as `30s`, whose fires fall on whole multiples of it since the Unix epoch, so
every supervisor computes the same fire times without talking to the others.

Cron times come from cronsim, which follows Debian's cron on daylight saving days: a fixed time that
the spring-forward gap skips fires at the first minute after the gap, and a fixed time that the
fall-back hour repeats fires once, at its first (summer-time) occurrence. Expressions whose minute or
hour is `*` (`*/15 * * * *`) run in real time, so they fire in both copies of a repeated hour.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobsup.durations import parse_duration
from jobsup.errors import BadInput
from jobsup.job import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE

MISSED_POLICIES = ("latest", "none", "all")
# With missed="all", at most this many missed fires are enqueued (the most recent ones), unless the
# schedule says otherwise: a minutely schedule after a day away would otherwise queue 1,440 jobs.
DEFAULT_MISSED_LIMIT = 100
# Keys a fire adds to its schedule's payload, so a handler can tell which run it is.
FIRE_KEYS = ("schedule", "fire_at")

SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_US = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Schedule:
    """One declared schedule. Build it with App.every, which checks it; the fields are what the
    supervisor and the schedules table keep."""

    name: str
    kind: str
    expression: str  # as written: "0 3 * * *", "@daily", "30s"
    tz: str = "UTC"
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    missed: str = "latest"
    missed_limit: int = DEFAULT_MISSED_LIMIT

    def __post_init__(self) -> None:
        self._check()

    def _bad(self, what: str) -> BadInput:
        return BadInput(f"schedule {self.name!r}: {what}")

    def _check(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise BadInput(f"a schedule of kind {self.kind!r} needs a name: a non-empty string")
        if not isinstance(self.kind, str) or not self.kind.strip():
            raise self._bad("needs a kind: a non-empty string")
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise self._bad("needs a cron expression or an interval such as 30s")
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise self._bad(f"unknown time zone {self.tz!r} (use an IANA name such as Europe/Berlin)") from None
        if self.interval_us is None:
            cron = self.cron
            if len(cron.split()) != 5:
                raise self._bad(
                    f"bad cron expression {self.expression!r}: five fields (minute hour day "
                    "month weekday), @hourly/@daily/@weekly/@monthly/@yearly, or an interval "
                    "such as 30s"
                )
            try:
                CronSim(cron, datetime.now(ZoneInfo(self.tz)))
            except (CronSimError, ValueError) as exc:
                raise self._bad(f"bad cron expression {self.expression!r}: {exc}") from None
        if self.missed not in MISSED_POLICIES:
            raise self._bad(f"missed must be one of {', '.join(MISSED_POLICIES)}, not {self.missed!r}")
        if isinstance(self.missed_limit, bool) or not isinstance(self.missed_limit, int) or self.missed_limit < 1:
            raise self._bad("missed_limit must be a whole number >= 1")
        if self.payload is not None and not isinstance(self.payload, dict):
            raise self._bad("payload must be a dict (a JSON object): each fire adds schedule and fire_at to it")
        if isinstance(self.payload, dict) and set(self.payload) & set(FIRE_KEYS):
            raise self._bad(f"payload cannot use the keys {' and '.join(FIRE_KEYS)}: each fire sets them")
        try:
            json.dumps(self.payload or {}, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise self._bad(f"payload is not JSON: {exc}") from None
        if not isinstance(self.queue, str) or not self.queue.strip():
            raise self._bad("queue must be a non-empty string")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise self._bad("priority must be an integer")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise self._bad("max_attempts must be a whole number >= 1")

    # --- what kind of schedule -------------------------------------------------------------------

    @property
    def interval_us(self) -> int | None:
        """The interval in microseconds, or None for a cron expression."""
        text = self.expression.strip()
        if text.startswith("@") or len(text.split()) > 1:
            return None
        if text.startswith("-"):
            raise self._bad(f"the interval {text!r} must be more than 0")
        try:
            seconds = parse_duration(text)
        except BadInput:
            return None  # not a duration: read as a cron expression, which reports what is wrong
        if round(seconds * _US) <= 0:
            raise self._bad(f"the interval {text!r} must be more than 0")
        return round(seconds * _US)

    @property
    def cron(self) -> str:
        text = self.expression.strip()
        return SHORTHANDS.get(text.lower(), text)

    # --- fire times ------------------------------------------------------------------------------

    def fires_after(self, after: datetime) -> Iterator[datetime]:
        """Every fire time after `after` (exclusive), ascending, in UTC."""
        interval = self.interval_us
        if interval is not None:
            k = _micros(after) // interval + 1
            while True:
                yield _EPOCH + timedelta(microseconds=k * interval)
                k += 1
        zone = ZoneInfo(self.tz)
        for moment in CronSim(self.cron, after.astimezone(zone)):
            yield moment.astimezone(UTC)

    def next_fire(self, after: datetime) -> datetime:
        return next(self.fires_after(after))

    def due(self, after: datetime, now: datetime, keep: int) -> tuple[list[datetime], bool]:
        """The latest `keep` fires in (after, now], ascending, and whether earlier ones were left out.

        After a long absence the window is searched from its end backwards in doubling steps, so a
        minutely schedule away for a year costs a few thousand steps, not half a million.
        """
        span = timedelta(hours=1)
        while True:
            start = max(after, now - span)
            fires = []
            for moment in self.fires_after(start):
                if moment > now:
                    break
                fires.append(moment)
            if len(fires) >= keep or start == after:
                return fires[-keep:] if keep else [], len(fires) > keep or (start > after and bool(fires))
            span *= 4
