"""One log line per lifecycle event, with the same fields everywhere: action first, then job, kind,
attempt, pid and the rest. Text for a terminal, or one JSON object per line (`--log-format json`)."""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from typing import Any, TextIO

from jobsup.otel import trace_fields

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_ORDER = ("job", "kind", "attempt", "pid", "slot")
# Lines alike (same action and the same `like` fields: a kind's failures with the same error) are
# written once per this many seconds, the first in full and then one line that counts the rest.
# 200,000 jobs of a kind with no handler once wrote 77,040 `job.failed` lines within seconds.
REPEAT_INTERVAL = 5.0


def about(job: Any, trace: tuple[str, str] | None = None) -> dict[str, Any]:
    """The fields of a line about `job` (a jobsup.Job): its id, kind and attempt, and the trace of
    otel.trace_fields (`trace`: the ids its worker reported for the attempt, if it traced it)."""
    return {"job": job.id, "kind": job.kind, "attempt": job.attempts, **trace_fields(job.meta, trace)}


class _Run:
    """The lines alike since the one written in full."""

    __slots__ = ("since", "count", "level", "fields")

    def __init__(self, since: float, level: str, fields: dict[str, Any]) -> None:
        self.since, self.count, self.level, self.fields = since, 0, level, fields


class EventLog:
    def __init__(self, fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.threshold = _LEVELS[level]
        self.stream = stream or sys.stderr
        self.repeat_interval = REPEAT_INTERVAL
        self._runs: dict[tuple, _Run] = {}

    def alike(self, action: str, level: str = "info", *, like: tuple[str, ...], **fields: Any) -> None:
        """Log as __call__ does, unless a line of this action with the same values of the `like` fields
        was written in full within the repeat interval: then it is only counted, and
        `flush_repeats` writes the count as one line of those fields with `more` (the count) and
        `over` (seconds): "(and 77,039 more like it in the last 5s)" in text."""
        if _LEVELS[level] < self.threshold:
            return
        key = (action, *(fields.get(name) for name in like))
        now = time.monotonic()
        run = self._runs.get(key)
        if run is not None and now - run.since < self.repeat_interval:
            run.count += 1
            return
        if run is not None:
            self._summary(action, run, now)
        self._runs[key] = _Run(now, level, {name: fields.get(name) for name in like})
        self(action, level, **fields)

    def flush_repeats(self, force: bool = False) -> None:
        """Write the count of each run whose interval is over (every run, with `force`); called often by
        the supervisor's clock, and at the end of a shutdown."""
        if not self._runs:
            return
        now = time.monotonic()
        for key, run in list(self._runs.items()):
            if force or now - run.since >= self.repeat_interval:
                del self._runs[key]
                if run.count:
                    self._summary(key[0], run, now)

    def _summary(self, action: str, run: _Run, now: float) -> None:
        self(action, run.level, **run.fields, more=run.count, over=round(now - run.since, 1))

    # `action` and `level` are positional-only, so a line's fields spread from a dict can never be
    # taken for them.
    def __call__(self, action: str, level: str = "info", /, **fields: Any) -> None:
        if _LEVELS[level] < self.threshold:
            return
        now = time.time()
        if self.fmt == "json":
            record = {"ts": round(now, 3), "level": level, "action": action, **fields}
            line = json.dumps(record, default=str, separators=(",", ":"))
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
            more = fields.pop("more", None) if "over" in fields else None
            over = fields.pop("over", None) if more is not None else None
            keys = [k for k in _ORDER if k in fields] + [k for k in fields if k not in _ORDER]
            parts = [f"{k}={_text(fields[k])}" for k in keys if fields[k] is not None]
            if more is not None:
                parts.append(f"(and {more:,} more like it in the last {over:g}s)")
            marker = "" if level == "info" else f"{level.upper()} "
            line = f"{stamp} {marker}{action:<18} {' '.join(parts)}".rstrip()
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not stop the supervisor
            pass


class Routed(logging.Handler):
    """Writes the records of a library's `logging` (psycopg's) as lines of an EventLog, so every line
    the supervisor writes has its format: with no handler of its own, Python wrote them bare on stderr
    (`error ignored terminating <psycopg.AsyncPipeline [BAD] at 0x…>: the connection is lost`), a line
    no JSON reader of the log could take."""

    def __init__(self, log: EventLog, action: str) -> None:
        super().__init__()
        self.log = log
        self.action = action

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format
            message = str(record.msg)
        level = _level_of(record.levelno)
        # psycopg says "error ignored …" of a second error met while cleaning up after a first, which
        # goes on up to the supervisor: a lost connection, logged as db.lost (or a failed loop, as
        # supervisor.failed). The second adds nothing but noise, once per broken pipeline.
        if message.startswith("error ignored"):
            level = "debug"
        self.log(self.action, level, logger=record.name, message=message)


def route(log: EventLog, logger: str, action: str) -> None:
    """Send the records of `logger` (and its children) to `log` as `action` lines, and nowhere else."""
    target = logging.getLogger(logger)
    for handler in [h for h in target.handlers if isinstance(h, Routed)]:
        target.removeHandler(handler)  # routed again: to the newer log only
    target.addHandler(Routed(log, action))
    target.propagate = False


def capture_warnings(log: EventLog) -> None:
    """This process's Python warnings (a library's deprecation, say) as `python.warning` lines of `log`,
    in its format: Python writes them on stderr as two bare lines, which no JSON reader could take."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        log("python.warning", "warning", category=category.__name__, message=str(message), at=f"{filename}:{lineno}")

    warnings.showwarning = show


def _level_of(levelno: int) -> str:
    """
    >>> [_level_of(n) for n in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)]
    ['debug', 'info', 'warning', 'error', 'error']
    """
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


def _text(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return repr(text) if (" " in text or not text) else text
