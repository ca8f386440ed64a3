"""The messages of the one `jobsup` NOTIFY channel, as typed values: `decode` reads a payload, `encode`
writes the exact text the SQL sends. Nothing else in jobsup reads a payload; each listener routes by
type (`match`), never by a word found in the text.

The SQL builds every payload with `json_build_object(...)::text`, and a supervisor of the previous
commit sends and reads these same texts: they keep their format exactly (tests/test_notify.py triggers
each statement below against a real PostgreSQL and checks that `encode(decode(payload)) == payload`).

Each message and its payload, as PostgreSQL writes it:

| message | payload |
|---|---|
| `JobsQueued` | `{"queues" : ["q1","q2"], "run_at" : 1733370000.123456}` or, due now, `{"queues" : ["q"]}` |
| `CancelRequested` | `{"cancel" : [1,2], "by" : "who"}`; `"cancel" : null` past 500 ids |
| `QueuePaused` | `{"queue" : "q", "paused" : true}`; `false`: resumed |
| `LimitChanged` | `{"limit" : "kind", "limited" : true, "keyed" : false}` |
| `SlotsFreed` | `{"slots" : ["kind"]}` |
| `SchedulePaused` | `{"schedule" : "name", "paused" : true}`; `false`: resumed |

`queues` `[]` means every queue (past 20 queues, or 2000 bytes of names); `run_at` is the earliest
job's, in epoch seconds with six decimals. What builds each:

| SQL file | statement or function | message |
|---|---|---|
| migrations/0001_initial.sql, 0008_limits.sql | insert trigger `jobsup.notify_inserted()` | `JobsQueued`, `run_at` |
| migrations/0009_workflows.sql | `jobsup.settle_children()`: the children it queues | `JobsQueued`, `run_at` |
| queries/lifecycle.sql | `release`, `release_orphans`, `reap` | `JobsQueued` |
| queries/control.sql | `retry_now`, `requeue_dead` | `JobsQueued` |
| queries/control.sql | `cancel_jobs`, when it reaches a running job | `CancelRequested` |
| queries/control.sql | `queue_pause`, `queue_resume` | `QueuePaused` |
| queries/limits.sql | `limit_notify` | `LimitChanged` |
| queries/limits.sql | `limit_slots_freed` | `SlotsFreed` |
| queries/schedules.sql | `schedule_pause` | `SchedulePaused` |

Whatever else arrives (not JSON, or no key above: a message of a newer release, or a test's marker)
decodes to `Unknown`. The key that names a message is its first, and no two messages share it.

>>> decode('{"queues" : ["default"], "run_at" : 1733370000.123456}')
JobsQueued(queues=('default',), run_at=1733370000.123456)
>>> encode(QueuePaused("mail", paused=False))
'{"queue" : "mail", "paused" : false}'
>>> decode("marker")
Unknown(payload='marker')
"""

from __future__ import annotations

import json
from typing import NamedTuple

from jobsup.db import json_text

CHANNEL = "jobsup"

# filter() with this C predicate checks each queue's type without a Python generator (half the time).
_is_str = str.__instancecheck__


# NamedTuples rather than frozen dataclasses: one is built per notification, thousands a second on the
# insert path, and a NamedTuple is built in 0.22 µs against a frozen dataclass's 0.33 (with slots).
class JobsQueued(NamedTuple):
    """Jobs became ready in these queues (empty: look at every queue); `run_at` is the earliest one's
    time (epoch seconds) when the sender knows it, else they are due now."""

    queues: tuple[str, ...]
    run_at: float | None = None


class CancelRequested(NamedTuple):
    """An operator (`by`) asked to cancel these running jobs; `ids` is None when there were too many
    to name: every supervisor then renews its leases, which returns the requests among its jobs."""

    ids: tuple[int, ...] | None
    by: str


class QueuePaused(NamedTuple):
    """A queue was paused (`paused` true) or resumed."""

    queue: str
    paused: bool


class LimitChanged(NamedTuple):
    """A kind gained its first limit or lost its last (`limited`); `keyed`: it has per-key limits."""

    kind: str
    limited: bool
    keyed: bool = False


class SlotsFreed(NamedTuple):
    """A supervisor wrote the outcomes of jobs of these limited kinds: their slots are free again."""

    kinds: tuple[str, ...]


class SchedulePaused(NamedTuple):
    """A schedule was paused (`paused` true) or resumed."""

    name: str
    paused: bool


class Unknown(NamedTuple):
    """A payload none of the above: not JSON, or a message this release does not know."""

    payload: str


Message = JobsQueued | CancelRequested | QueuePaused | LimitChanged | SlotsFreed | SchedulePaused | Unknown
# What every supervisor must obey at once (a cancel, a pause, a limit) or may claim now (slots freed).
Control = CancelRequested | QueuePaused | LimitChanged | SlotsFreed


def decode(payload: str) -> Message:
    """The message a payload carries; `Unknown` for one that is none of the messages above."""
    try:
        note = json_text.loads(payload)
    except ValueError:
        return Unknown(payload)
    if not isinstance(note, dict):
        return Unknown(payload)
    # The insert notification first: it is the one that arrives by the thousand.
    queues = note.get("queues")
    if queues is not None:
        if isinstance(queues, list):
            run_at = note.get("run_at")
            if isinstance(run_at, bool) or not isinstance(run_at, (int, float)):
                run_at = None
            return JobsQueued(tuple(filter(_is_str, queues)), run_at)
        return Unknown(payload)
    if "cancel" in note:
        ids = note["cancel"]
        by = str(note.get("by") or "?")
        if ids is None:
            return CancelRequested(None, by)
        if isinstance(ids, list):
            return CancelRequested(tuple(i for i in ids if type(i) is int), by)
        return Unknown(payload)
    kind, limited = note.get("limit"), note.get("limited")
    if isinstance(kind, str) and isinstance(limited, bool):
        return LimitChanged(kind, limited, note.get("keyed") is True)
    kinds = note.get("slots")
    if isinstance(kinds, list):
        return SlotsFreed(tuple(filter(_is_str, kinds)))
    paused = note.get("paused")
    if isinstance(paused, bool):
        queue, schedule = note.get("queue"), note.get("schedule")
        if isinstance(queue, str):
            return QueuePaused(queue, paused)
        if isinstance(schedule, str):
            return SchedulePaused(schedule, paused)
    return Unknown(payload)


def encode(message: Message) -> str:
    """The payload the SQL sends for `message`, byte for byte: json_build_object's text, with its
    " : " between key and value and no space inside arrays."""
    match message:
        case JobsQueued(queues, run_at):
            if run_at is None:
                return _object(queues=_array(queues))
            # extract(epoch FROM timestamptz) is a numeric of six decimals (PostgreSQL 14 and later).
            return _object(queues=_array(queues), run_at=f"{run_at:.6f}")
        case CancelRequested(ids, by):
            return _object(cancel="null" if ids is None else _array(ids), by=_string(by))
        case QueuePaused(queue, paused):
            return _object(queue=_string(queue), paused=_bool(paused))
        case LimitChanged(kind, limited, keyed):
            return _object(limit=_string(kind), limited=_bool(limited), keyed=_bool(keyed))
        case SlotsFreed(kinds):
            return _object(slots=_array(kinds))
        case SchedulePaused(name, paused):
            return _object(schedule=_string(name), paused=_bool(paused))
        case Unknown(payload):
            return payload
    raise TypeError(f"not a message of the {CHANNEL} channel: {message!r}")


def _object(**fields: str) -> str:
    return "{" + ", ".join(f'"{key}" : {value}' for key, value in fields.items()) + "}"


def _array(items: tuple[str, ...] | tuple[int, ...]) -> str:
    return "[" + ",".join(_string(i) if isinstance(i, str) else str(i) for i in items) + "]"


def _string(text: str) -> str:
    # PostgreSQL's JSON escapes match Python's without ensure_ascii: \" \\ \b \f \n \r \t, other
    # control characters as \u00XX, everything else as it is.
    return json.dumps(text, ensure_ascii=False)


def _bool(value: bool) -> str:
    return "true" if value else "false"
