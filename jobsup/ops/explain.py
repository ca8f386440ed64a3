"""Why a job is where it is: `jobsup explain ID` and the console's job screen.

The answer is read from the database only (the job's row, its parents, its queue's pause, its kind's
limits, the supervisors' heartbeats), by statements that cost the same whatever the backlog
(`db/queries/explain.sql`). The first condition that holds the job back is the answer, in the order a
job meets them: finished, running, waiting for its parents, not due yet, its queue paused, its kind's
limits (concurrency, then the key's, then the kind's rate, then the key's), no live supervisor that can
run it, every worker that could run it busy (it waits for a worker, not for a limit); else it is ready.
Each answer has a short stable `reason` for scripts and a line or two of text for a person.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.durations import format_age
from jobsup.errors import BadInput
from jobsup.limits import Rate
from jobsup.ops.unserved import STALE_AFTER
from jobsup.otel import trace_fields

# Holders of a limit named in the text; `details` has as many.
SHOWN_HOLDERS = 10
# Unfinished parents of a waiting job named in the text; `details` has as many.
SHOWN_PARENTS = 10
# Job ids are bigint: a larger number cannot be one, and would be a database error rather than "no job".
_MAX_ID = 2**63 - 1

Row = Mapping[str, Any]
# What each condition answers when it holds the job: its reason, its text, and details of its own.
Answer = tuple[str, str, dict[str, Any]]


@dataclass(frozen=True)
class Explanation:
    """Why job `id` is where it is: `reason` is a short stable code (done, dead, cancelled, running,
    waiting, scheduled, retry, paused, concurrency, key_concurrency, rate, key_rate, no_supervisor_queue,
    no_supervisor_kind, workers_busy, ready), `text` what a person reads, `details` the figures behind it
    (JSON-ready)."""

    id: int
    kind: str
    status: str
    reason: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "text": self.text,
            "details": self.details,
        }


def explain(conn: psycopg.Connection[Any], job_id: int) -> Explanation:
    """Why job `job_id` is where it is; BadInput (exit 2) when there is no such job."""
    with conn.cursor(row_factory=dict_row) as cur:
        job = _found(cur.execute(SQL["explain_job"], _job_params(job_id)).fetchone(), job_id)
        limits = cur.execute(SQL["explain_limits"], _limit_params(job)).fetchone() if _limits_matter(job) else None
        parents = cur.execute(SQL["explain_parents"], _parent_params(job)).fetchone() if _waiting_job(job) else None
    return _explain(job, limits, parents)


async def aexplain(conn: psycopg.AsyncConnection[Any], job_id: int) -> Explanation:
    """explain on an async connection (the console's)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        job = _found(await (await cur.execute(SQL["explain_job"], _job_params(job_id))).fetchone(), job_id)
        limits = parents = None
        if _limits_matter(job):
            limits = await (await cur.execute(SQL["explain_limits"], _limit_params(job))).fetchone()
        if _waiting_job(job):
            parents = await (await cur.execute(SQL["explain_parents"], _parent_params(job))).fetchone()
    return _explain(job, limits, parents)


def explain_text(conn: psycopg.Connection[Any], job_id: int) -> str:
    """The explanation's text alone, for a screen that shows the job's other fields itself."""
    return explain(conn, job_id).text


async def aexplain_text(conn: psycopg.AsyncConnection[Any], job_id: int) -> str:
    return (await aexplain(conn, job_id)).text


def _job_params(job_id: int) -> dict[str, Any]:
    # Anything that cannot be a job id is "no such job", not a database error about its type or range.
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 1 <= job_id <= _MAX_ID:
        raise BadInput(f"no job with id {job_id}")
    return {"id": job_id, "stale_after": STALE_AFTER}


def _found(row: Row | None, job_id: int) -> Row:
    if row is None:
        raise BadInput(f"no job with id {job_id}")
    return row


def _limits_matter(job: Row) -> bool:
    """Whether the answer may be a limit: the job is limited, due, and nothing before limits holds it."""
    return job["status"] == "queued" and job["limited"] and job["run_at"] <= job["now"] and job["paused_at"] is None


def _limit_params(job: Row) -> dict[str, Any]:
    return {"kind": job["kind"], "key": job["key"], "shown": SHOWN_HOLDERS}


def _waiting_job(job: Row) -> bool:
    return job["status"] == "waiting"


def _parent_params(job: Row) -> dict[str, Any]:
    return {"id": job["id"], "shown": SHOWN_PARENTS}


def _explain(job: Row, limits: Row | None, parents: Row | None = None) -> Explanation:
    """The first condition that holds the job, as (reason, text, details of its own)."""
    reason, text, own = (
        _finished(job)
        or _running(job)
        or _waiting(job, parents)
        or _not_due(job)
        or _paused(job)
        or _limited(job, limits)
        or _unserved(job)
        or _ready(job, limits)
    )
    details = {**_common(job), **own}
    return Explanation(job["id"], job["kind"], job["status"], reason, text, details)


def _common(job: Row) -> dict[str, Any]:
    return {
        "queue": job["queue"],
        "attempts": job["attempts"],
        "max_attempts": job["max_attempts"],
        "run_at": _iso(job["run_at"]),
        "key": job["key"],
        "limited": job["limited"],
        "workflow_id": job["workflow_id"],
        # What enqueue middleware stored with the job, and the trace it was enqueued in (tracing).
        "meta": job["meta"],
        **trace_fields(job["meta"]),
    }


def _finished(job: Row) -> Answer | None:
    status, now = job["status"], job["now"]
    of = _attempt(job)
    if status == "done":
        return "done", f"done {_when(job['done_at'], now, 'at')}, on {of}", {"done_at": _iso(job["done_at"])}
    if status == "dead":
        text = f"dead since {_when(job['done_at'], now)}, after {of} failed: {job['last_error']}"
        return "dead", text, {"done_at": _iso(job["done_at"]), "last_error": job["last_error"]}
    if status == "cancelled":
        by, at = job["cancelled_by"], _when(job["done_at"], now, "at")
        # A handler's Discard gives its reason as the error, and so does the workflow that cancels a job
        # whose parent failed ("cancelled: job N, which it waits for, ended dead"); an operator's cancel
        # only says who.
        if by == "handler":
            text = f"cancelled by its handler {at}: {job['last_error']}"
        elif by == "workflow":
            text = f"cancelled {at}: {(job['last_error'] or 'a job it waits for failed').removeprefix('cancelled: ')}"
        else:
            text = f"cancelled by {by or 'an unknown operator'} {at}"
        details = {"done_at": _iso(job["done_at"]), "cancelled_by": by, "last_error": job["last_error"]}
        return "cancelled", text, details
    return None


def _running(job: Row) -> Answer | None:
    if job["status"] != "running":
        return None
    holder, now = job["locked_by"], job["now"]
    handed = job["handed_to"]
    if handed is not None:  # a slot it holds (a running row) while it waits behind a worker's job
        lines = [
            f"handed to a worker of supervisor {holder} (pid {handed['pid']}), waiting behind job "
            f"{handed['job_id']}: not started yet ({_attempt(job)}); it moves to a free worker if that job "
            "runs long"
        ]
    else:
        lines = [f"running on supervisor {holder} since {_when(job['started_at'], now)} ({_attempt(job)})"]
    if not job["holder_live"]:
        # Its supervisor died or is stopping: the job comes back through a reaper, not by itself.
        lines.append(
            f"its supervisor has not beaten its heartbeat in the last {STALE_AFTER:g}s: the reaper returns the "
            f"job when its lease expires, {_when(job['locked_until'], now)}"
        )
    if job["cancelled_by"]:
        lines.append(f"a cancel was requested by {job['cancelled_by']}: its supervisor stops it")
    details = {
        "supervisor": holder,
        "supervisor_live": bool(job["holder_live"]),
        "host": job["holder_host"],
        "pid": job["holder_pid"],
        "started_at": _iso(job["started_at"]),
        "locked_until": _iso(job["locked_until"]),
        "cancel_requested_by": job["cancelled_by"],
        "waiting_behind": handed["job_id"] if handed is not None else None,
    }
    return "running", "\n".join(lines), details


def _waiting(job: Row, parents: Row | None) -> Answer | None:
    """A job with parents that have not all finished: which ones (a waiting job is claimed by no one,
    whatever its queue, limits and supervisors, until the last of them finishes)."""
    if job["status"] != "waiting" or parents is None:
        return None
    total, left = parents["parents"], parents["unfinished"]
    shown = list(zip(parents["ids"] or [], parents["kinds"] or [], parents["statuses"] or [], strict=True))
    details = {
        "parents": total,
        "parents_left": left,
        "waiting_for": [{"id": i, "kind": k, "status": s} for i, k, s in shown],
    }
    if not left:
        # Seen only inside the transaction that settles its last parent: settled and queued together.
        said = f"all {_parents(total)} have finished" if total else "it has no parent"
        return "waiting", f"waiting, though {said}", details
    ids = ", ".join(str(i) for i, _, _ in shown) + (", …" if left > len(shown) else "")
    text = f"waiting for {left} of {_parents(total)}: {'id' if left == 1 else 'ids'} {ids}"
    if len(shown) == 1:
        text += f" ({shown[0][1]}, {shown[0][2]})"
    return "waiting", text, details


def _parents(n: int) -> str:
    return f"{n} parent{'' if n == 1 else 's'}"


def _not_due(job: Row) -> Answer | None:
    if job["status"] != "queued" or job["run_at"] <= job["now"]:
        return None
    when = _when(job["run_at"], job["now"])
    if job["snoozed"]:
        # A Snooze gave its attempt back: a delay the handler asked for, not a retry after a failure.
        said = job["snooze_reason"]
        return "scheduled", f"snoozed by its handler until {when}" + (f": {said}" if said else ""), {"snoozed": True}
    if job["attempts"] == 0:
        return "scheduled", f"scheduled for {when}", {}
    text = f"waiting for its retry until {when}, after {_attempt(job)} failed: {job['last_error']}"
    return "retry", text, {"last_error": job["last_error"]}


def _paused(job: Row) -> Answer | None:
    if job["status"] != "queued" or job["paused_at"] is None:
        return None
    text = f"its queue {job['queue']} is paused, by {job['paused_by'] or 'an unknown operator'}, since " + _when(
        job["paused_at"], job["now"]
    )
    return "paused", text, {"paused_by": job["paused_by"], "paused_at": _iso(job["paused_at"])}


def _limited(job: Row, lim: Row | None) -> Answer | None:
    """The first limit at which the job's kind or key stands, in claim_limited's terms."""
    if job["status"] != "queued" or lim is None:
        return None
    kind, key, now = job["kind"], job["key"], job["now"]
    if lim["concurrency"] is not None and lim["held"] >= lim["concurrency"]:
        text = (
            f"its kind {kind} is at its concurrency limit, {lim['held']} of {lim['concurrency']}, "
            f"held by {_holders(lim['holders'], lim['held'])}"
        )
        return "concurrency", text, _held(lim["concurrency"], lim["held"], lim["holders"])
    # Jobs without a key are bound by no per-key limit (claim_limited gives them a turn of their own).
    if key is not None and lim["key_concurrency"] is not None and lim["key_held"] >= lim["key_concurrency"]:
        text = (
            f"its key {key!r} of kind {kind} is at its limit, {lim['key_held']} of {lim['key_concurrency']}, "
            f"held by {_holders(lim['key_holders'], lim['key_held'])}"
        )
        return "key_concurrency", text, _held(lim["key_concurrency"], lim["key_held"], lim["key_holders"])
    if lim["rate"] is not None and lim["room"] <= 0:
        rate = str(Rate(lim["rate"], lim["period"], lim["burst"]))
        text = f"the rate of kind {kind} ({rate}) allows the next start {_when(lim['next_start'], now, 'at')}"
        return "rate", text, {"rate": rate, "burst": lim["burst"], "next_start": _iso(lim["next_start"])}
    if key is not None and lim["key_rate"] is not None and lim["key_room"] <= 0:
        rate = str(Rate(lim["key_rate"], lim["key_period"], lim["key_burst"]))
        text = (
            f"the rate of its key {key!r} of kind {kind} ({rate}) allows the key's next start "
            f"{_when(lim['key_next_start'], now, 'at')}"
        )
        return "key_rate", text, {"rate": rate, "burst": lim["key_burst"], "next_start": _iso(lim["key_next_start"])}
    return None


def _unserved(job: Row) -> Answer | None:
    if job["status"] != "queued":
        return None
    queue, kind, live = job["queue"], job["kind"], job["live_supervisors"]
    if not job["queue_served"]:
        text = f"no live supervisor serves its queue {queue}" + (
            f" ({live} live supervisor{' serves' if live == 1 else 's serve'} other queues)"
            if live
            else f": none has beaten its heartbeat in the last {STALE_AFTER:g}s"
        )
        return "no_supervisor_queue", text, {"live_supervisors": live}
    if not job["kind_served"]:
        kinds = list(job["queue_kinds"] or [])
        text = f"live supervisors serve its queue {queue}, but none can run its kind {kind}"
        if kinds:
            more = f" and {len(kinds) - SHOWN_HOLDERS} more" if len(kinds) > SHOWN_HOLDERS else ""
            text += f" (they run {', '.join(kinds[:SHOWN_HOLDERS])}{more})"
        return "no_supervisor_kind", text, {"live_supervisors": live, "queue_kinds": kinds}
    return None


def _ready(job: Row, lim: Row | None) -> Answer:
    if job["status"] != "queued":
        # A status this release does not know (a newer schema's): say what the row says.
        return job["status"], f"status {job['status']}", {}
    allowed = "; its limits allow a start now" if lim is not None else ""
    workers, busy = job["workers"], job["busy_workers"]
    if workers and busy == workers:
        # Not a limit: every worker that could take it was busy at its supervisor's last heartbeat.
        plural = "s" if workers != 1 else ""
        text = (
            f"ready, waiting for a free worker: the {workers} worker{plural} of the live supervisors that run it "
            f"{'were' if plural else 'was'} busy at their last heartbeat{allowed}"
        )
        return "workers_busy", text, {"workers": workers, "busy_workers": busy}
    return "ready", f"ready: it should start within the poll{allowed}", {"workers": workers, "busy_workers": busy}


def _held(limit: int, held: int, holders: Sequence[int] | None) -> dict[str, Any]:
    return {"limit": limit, "held": held, "holders": list(holders or [])}


def _holders(ids: Sequence[int] | None, held: int) -> str:
    """
    >>> _holders([7], 1), _holders([12, 15, 18], 3), _holders([1, 2], 5)
    ('job 7', 'jobs 12, 15, 18', 'jobs 1, 2 and 3 more')
    """
    shown = list(ids or [])
    if not shown:
        return "no job"  # a limit of 0 cannot be set; kept for a row read as it changed
    more = f" and {held - len(shown)} more" if held > len(shown) else ""
    return f"job{'s' if held > 1 else ''} {', '.join(map(str, shown))}{more}"


def _attempt(job: Row) -> str:
    return f"attempt {job['attempts']} of {job['max_attempts']}"


def _when(at: datetime | None, now: datetime, before: str = "") -> str:
    """A moment as the database gave it, and how far from now (the database's now, as every host sees it).

    >>> from datetime import UTC
    >>> now = datetime(2026, 5, 1, 9, 30, tzinfo=UTC)
    >>> _when(datetime(2026, 5, 1, 9, 35, tzinfo=UTC), now, "at")
    'at 2026-05-01 09:35:00+00:00 (in 5m00s)'
    >>> _when(datetime(2026, 5, 1, 9, 29, 58, tzinfo=UTC), now)
    '2026-05-01 09:29:58+00:00 (2.0s ago)'
    """
    if at is None:
        return "at an unknown time"
    delta = (at - now).total_seconds()
    relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(-delta)} ago"
    return f"{before + ' ' if before else ''}{at.isoformat(sep=' ', timespec='seconds')} ({relative})"


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None
