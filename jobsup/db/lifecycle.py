"""The supervisor's statements: claim, complete, fail, snooze, cancel, release, renew, reap.

Each in a sync and an asyncio form that share one statement of `queries/lifecycle.sql`. A claim comes in
two shapes: `claim` and `claim_limited` return the rows as the connection reads them (a default
connection decodes their JSON: Jobs as a handler sees them), `claim_text` and `claim_limited_text`
return Claimed, the JSON columns as text on any connection, as the supervisor hands them to its
workers. They expect an autocommit connection, and every outcome write is fenced: it applies only
while the row is still running under the caller's `locked_by` and the same attempt, so a late answer
after a reap changes nothing.
`jobsup.testing.drain` writes through these too, so its statuses are the supervisor's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from jobsup.db.sql import Op, arun, run, sorted_ids
from jobsup.job import Claimed, Job
from jobsup.outcomes import Answer

# Retry delay of attempt n: min(BACKOFF_CAP, BACKOFF_BASE * 2^(n-1)) seconds, less up to JITTER of it.
BACKOFF_BASE = 1.0
BACKOFF_CAP = 3600.0
BACKOFF_JITTER = 0.1


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt to record: the job, the attempt it failed, and why."""

    id: int
    attempt: int
    error: str
    traceback: str | None = None
    delay: float | None = None  # seconds until the retry instead of the backoff (RetryAfter)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a fail or reap did to one job: `queued` again (at run_at) or `dead`."""

    id: int
    status: str
    run_at: datetime | None = None


# The SQLSTATE of the schema's refusal of a claim that speaks an older claim protocol (migration 0008).
CLAIM_REFUSED = "JS001"
# The claim protocol this release speaks: the schema version its claims were written for.
CLAIM_PROTOCOL = 8

# Where a queue's claim may start: the (priority, run_at, id) of the last job the claimer took there.
ClaimKey = tuple[int, datetime, int]


def _claim_op(
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
    after: Mapping[str, ClaimKey] | None,
    kinds: Collection[str] | None,
    text: bool = False,
) -> Op:
    shape: type[Job] | type[Claimed] = Claimed if text else Job  # the columns of both, in their order

    def parse(rows: list[tuple]) -> list[Job | Claimed]:
        jobs: list[Job | Claimed] = list(map(shape._make, rows))
        jobs.sort(key=_claim_order)  # UPDATE ... RETURNING keeps no order
        return jobs

    keys = [(after or {}).get(q) or (None, None, None) for q in queues]
    return Op(
        "claim",
        {
            "queues": list(queues),
            "limit": limit,
            "locked_by": locked_by,
            "lease": lease,
            "after_priorities": [k[0] for k in keys],
            "after_run_ats": [k[1] for k in keys],
            "after_ids": [k[2] for k in keys],
            "kinds": None if kinds is None else list(kinds),
        },
        parse,
        json_text=text,
    )


def _claim_order(job: Job | Claimed) -> tuple[int, Any, int]:
    return (-job.priority, job.run_at, job.id)


def claim(
    conn: psycopg.Connection,
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
    after: Mapping[str, ClaimKey] | None = None,
    kinds: Collection[str] | None = None,
) -> list[Job]:
    """Take up to `limit` ready jobs of `queues` (priority, then run_at, then id), leased for `lease` s.

    `after` maps a queue to the key of the last job this claimer took there: its scan starts past it,
    skipping the dead index entries of the jobs claimed before. The caller vouches that nothing before
    that key has become claimable since (the claimer's rules: supervisor/keys.py). `kinds`
    limits the claim to the kinds the caller can run (None: any); other jobs stay queued as they are."""
    return run(conn, _claim_op(queues, limit, locked_by, lease, after, kinds))


async def aclaim(
    conn: psycopg.AsyncConnection,
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
    after: Mapping[str, ClaimKey] | None = None,
    kinds: Collection[str] | None = None,
) -> list[Job]:
    return await arun(conn, _claim_op(queues, limit, locked_by, lease, after, kinds))


def claim_text(
    conn: psycopg.Connection,
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
    after: Mapping[str, ClaimKey] | None = None,
    kinds: Collection[str] | None = None,
) -> list[Claimed]:
    """claim(), each job a Claimed: its JSON columns as text, on any connection."""
    return run(conn, _claim_op(queues, limit, locked_by, lease, after, kinds, text=True))


async def aclaim_text(
    conn: psycopg.AsyncConnection,
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
    after: Mapping[str, ClaimKey] | None = None,
    kinds: Collection[str] | None = None,
) -> list[Claimed]:
    return await arun(conn, _claim_op(queues, limit, locked_by, lease, after, kinds, text=True))


def claim_limited_op(
    kinds: Sequence[str], queues: Sequence[str], limit: int, locked_by: str, lease: float, text: bool = False
) -> Op:
    """The statement of claim_limited (`text`: of claim_limited_text), for a caller that sends it with
    another (jobsup/supervisor/dispatcher.py, in the round trip of an outcome write)."""
    shape: type[Job] | type[Claimed] = Claimed if text else Job

    def parse(rows: list[tuple]) -> tuple[list[Job | Claimed], datetime | None]:
        jobs: list[Job | Claimed] = [shape._make(row[:-1]) for row in rows if row[0] is not None]
        wake = [row[-1] for row in rows if row[0] is None]
        return jobs, (wake[0] if wake else None)

    params = {"kinds": sorted(kinds), "queues": list(queues), "limit": limit, "locked_by": locked_by, "lease": lease}
    return Op("claim_limited", params, parse, json_text=text)


def claim_limited(
    conn: psycopg.Connection, kinds: Sequence[str], queues: Sequence[str], limit: int, locked_by: str, lease: float
) -> tuple[list[Job], datetime | None]:
    """Take up to `limit` ready jobs of the limited `kinds` of `queues`, as their limits allow, and when
    a rate next lets one start (None: no rate holds a ready job back). By priority; within one, keys in
    turn. The limits hold across every claimer: claims of a kind run one at a time (its limits row is
    locked), and count what the kind and its keys hold from the rows themselves."""
    return run(conn, claim_limited_op(kinds, queues, limit, locked_by, lease))


async def aclaim_limited(
    conn: psycopg.AsyncConnection,
    kinds: Sequence[str],
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
) -> tuple[list[Job], datetime | None]:
    return await arun(conn, claim_limited_op(kinds, queues, limit, locked_by, lease))


def claim_limited_text(
    conn: psycopg.Connection, kinds: Sequence[str], queues: Sequence[str], limit: int, locked_by: str, lease: float
) -> tuple[list[Claimed], datetime | None]:
    """claim_limited(), each job a Claimed: its JSON columns as text, on any connection."""
    return run(conn, claim_limited_op(kinds, queues, limit, locked_by, lease, text=True))


async def aclaim_limited_text(
    conn: psycopg.AsyncConnection,
    kinds: Sequence[str],
    queues: Sequence[str],
    limit: int,
    locked_by: str,
    lease: float,
) -> tuple[list[Claimed], datetime | None]:
    return await arun(conn, claim_limited_op(kinds, queues, limit, locked_by, lease, text=True))


def claim_keys(jobs: Iterable[Job | Claimed]) -> dict[str, ClaimKey]:
    """The key of the last job taken in each queue, from a claim's jobs (in claim order).

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> jobs = [Job(1, "k", {}, "a", 1, 3, 5, t, t), Job(7, "k", {}, "b", 1, 3, 0, t, t),
    ...         Job(2, "k", {}, "a", 1, 3, 0, t, t)]
    >>> {q: (p, i) for q, (p, _, i) in claim_keys(jobs).items()}
    {'a': (0, 2), 'b': (0, 7)}
    """
    keys: dict[str, ClaimKey] = {}
    for job in jobs:
        assert job.run_at is not None  # a claimed row's: the column is NOT NULL (None is Job's default)
        keys[job.queue] = (job.priority, job.run_at, job.id)
    return keys


def _held(jobs: Sequence[tuple[int, int]]) -> dict[str, list[int]]:
    return {"ids": [j[0] for j in jobs], "attempts": [j[1] for j in jobs]}


def complete_op(jobs: Sequence[tuple[int, int]], locked_by: str, return_values: Sequence[str | None] | None) -> Op:
    params = {
        **_held(jobs),
        "locked_by": locked_by,
        "return_values": list(return_values) if return_values is not None else None,
    }
    return Op("complete", params, sorted_ids)


def complete(
    conn: psycopg.Connection,
    jobs: Sequence[tuple[int, int]],
    locked_by: str,
    return_values: Sequence[str | None] | None = None,
) -> list[int]:
    """Mark (id, attempt) pairs done, each with its return value (JSON text, or None), in one write;
    the ids that were still ours to complete."""
    return run(conn, complete_op(jobs, locked_by, return_values))


async def acomplete(
    conn: psycopg.AsyncConnection,
    jobs: Sequence[tuple[int, int]],
    locked_by: str,
    return_values: Sequence[str | None] | None = None,
) -> list[int]:
    return await arun(conn, complete_op(jobs, locked_by, return_values))


def _fail_op(failures: Sequence[Failure], locked_by: str, backoff_base: float, backoff_cap: float, jitter: float) -> Op:
    params = {
        "ids": [f.id for f in failures],
        "attempts": [f.attempt for f in failures],
        "errors": [f.error for f in failures],
        "tracebacks": [f.traceback for f in failures],
        "delays": [f.delay for f in failures],
        "locked_by": locked_by,
        "backoff_base": backoff_base,
        "backoff_cap": backoff_cap,
        "jitter": jitter,
    }
    return Op("fail", params, lambda rows: [Outcome(*row) for row in rows])


def fail(
    conn: psycopg.Connection,
    failures: Sequence[Failure],
    locked_by: str,
    *,
    backoff_base: float = BACKOFF_BASE,
    backoff_cap: float = BACKOFF_CAP,
    jitter: float = BACKOFF_JITTER,
) -> list[Outcome]:
    """Record failed attempts: each job is queued again after its backoff, or dead at max_attempts."""
    return run(conn, _fail_op(failures, locked_by, backoff_base, backoff_cap, jitter))


async def afail(
    conn: psycopg.AsyncConnection,
    failures: Sequence[Failure],
    locked_by: str,
    *,
    backoff_base: float = BACKOFF_BASE,
    backoff_cap: float = BACKOFF_CAP,
    jitter: float = BACKOFF_JITTER,
) -> list[Outcome]:
    return await arun(conn, _fail_op(failures, locked_by, backoff_base, backoff_cap, jitter))


def _release_op(jobs: Sequence[tuple[int, int]], locked_by: str, reasons: Sequence[str | None] | None) -> Op:
    params = {
        **_held(jobs),
        "reasons": list(reasons) if reasons is not None else [None] * len(jobs),
        "locked_by": locked_by,
    }
    return Op("release", params, sorted_ids)


def release(
    conn: psycopg.Connection,
    jobs: Sequence[tuple[int, int]],
    locked_by: str,
    reasons: Sequence[str | None] | None = None,
) -> list[int]:
    """Hand back held jobs, giving back their attempt; a reason (interrupted) is kept in the history."""
    return run(conn, _release_op(jobs, locked_by, reasons))


async def arelease(
    conn: psycopg.AsyncConnection,
    jobs: Sequence[tuple[int, int]],
    locked_by: str,
    reasons: Sequence[str | None] | None = None,
) -> list[int]:
    return await arun(conn, _release_op(jobs, locked_by, reasons))


def _extend_op(
    jobs: Sequence[tuple[int, int]], locked_by: str, lease: float, parse: Callable[[list[tuple]], Any] = sorted_ids
) -> Op:
    return Op("extend", {**_held(jobs), "locked_by": locked_by, "lease": lease}, parse)


def extend(conn: psycopg.Connection, jobs: Sequence[tuple[int, int]], locked_by: str, lease: float) -> list[int]:
    """Renew the leases of held jobs to `lease` seconds from now; the ids still held."""
    return run(conn, _extend_op(jobs, locked_by, lease))


async def aextend(
    conn: psycopg.AsyncConnection, jobs: Sequence[tuple[int, int]], locked_by: str, lease: float
) -> list[int]:
    return await arun(conn, _extend_op(jobs, locked_by, lease))


def _renewal(rows: list[tuple]) -> tuple[list[int], dict[int, str]]:
    return sorted(row[0] for row in rows), {row[0]: row[1] for row in rows if row[1] is not None}


async def arenew(
    conn: psycopg.AsyncConnection, jobs: Sequence[tuple[int, int]], locked_by: str, lease: float
) -> tuple[list[int], dict[int, str]]:
    """aextend, and which of the renewed jobs an operator asked to cancel (id -> who): the same
    statement, so the renewal is the backstop of the cancel's NOTIFY at no extra statement."""
    return await arun(conn, _extend_op(jobs, locked_by, lease, _renewal))


# --- the handler's verbs: Snooze and Discard (RetryAfter is a Failure with a delay) -----------------


@dataclass(frozen=True, slots=True)
class Snoozed:
    """A held job to queue again after `delay` seconds, its attempt given back (Snooze)."""

    id: int
    attempt: int
    delay: float
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """A held job to record `cancelled`: a Discard (`reason`, by "handler"), or a worker stopped on an
    operator's request (no reason: "cancelled by" whoever asked)."""

    id: int
    attempt: int
    reason: str | None = None
    traceback: str | None = None
    by: str | None = None


def record_of(job: Job | Claimed, answer: Answer) -> Failure | Snoozed | Cancel | None:
    """What writes `answer` of `job`'s attempt: None for done (complete), a Failure (fail; a
    RetryAfter's with its delay), a Snoozed (snooze) or a Cancel (cancel_held, for a Discard).

    >>> from datetime import datetime, timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> job = Job(7, "k", {}, "default", 2, 3, 0, t, t)
    >>> record_of(job, Answer(7)) is None
    True
    >>> record_of(job, Answer(7, "Snooze: snoozed for 5s", verb=("snooze", 5.0)))
    Snoozed(id=7, attempt=2, delay=5.0, reason='Snooze: snoozed for 5s')
    >>> record_of(job, Answer(7, "RetryAfter: 429", "tb", verb=("retry", 60.0))).delay
    60.0
    >>> record_of(job, Answer(7, "Discard: gone", verb=("discard",))).by
    'handler'
    """
    if answer.error is None:
        return None
    verb = answer.verb or ("fail",)
    if verb[0] == "snooze":
        return Snoozed(job.id, job.attempts, verb[1], answer.error)
    if verb[0] == "discard":
        return Cancel(job.id, job.attempts, answer.error, answer.traceback, by="handler")
    return Failure(job.id, job.attempts, answer.error, answer.traceback, delay=verb[1] if verb[0] == "retry" else None)


def _snooze_op(snoozed: Sequence[Snoozed], locked_by: str) -> Op:
    params = {
        "ids": [s.id for s in snoozed],
        "attempts": [s.attempt for s in snoozed],
        "delays": [s.delay for s in snoozed],
        "reasons": [s.reason for s in snoozed],
        "locked_by": locked_by,
    }
    return Op("snooze", params, lambda rows: [Outcome(*row) for row in rows])


def snooze(conn: psycopg.Connection, snoozed: Sequence[Snoozed], locked_by: str) -> list[Outcome]:
    """Queue held jobs again after their delay, attempt given back, snooze counted (fenced)."""
    return run(conn, _snooze_op(snoozed, locked_by))


async def asnooze(conn: psycopg.AsyncConnection, snoozed: Sequence[Snoozed], locked_by: str) -> list[Outcome]:
    return await arun(conn, _snooze_op(snoozed, locked_by))


def _cancel_held_op(cancels: Sequence[Cancel], locked_by: str) -> Op:
    params = {
        "ids": [c.id for c in cancels],
        "attempts": [c.attempt for c in cancels],
        "reasons": [c.reason for c in cancels],
        "tracebacks": [c.traceback for c in cancels],
        "bys": [c.by for c in cancels],
        "locked_by": locked_by,
    }
    return Op("cancel_held", params, sorted_ids)


def cancel_held(conn: psycopg.Connection, cancels: Sequence[Cancel], locked_by: str) -> list[int]:
    """Record held jobs `cancelled` (fenced); the ids that were still ours."""
    return run(conn, _cancel_held_op(cancels, locked_by))


async def acancel_held(conn: psycopg.AsyncConnection, cancels: Sequence[Cancel], locked_by: str) -> list[int]:
    return await arun(conn, _cancel_held_op(cancels, locked_by))


def _reap_op(reaper: str, limit: int) -> Op:
    return Op(
        "reap",
        {"reaper": reaper, "limit": limit},
        lambda rows: sorted((Outcome(r[0], r[2]) for r in rows), key=lambda o: o.id),
    )


def reap(conn: psycopg.Connection, reaper: str, limit: int = 1000) -> list[Outcome]:
    """Return jobs whose lease expired to the queue (the lost attempt counts; dead when exhausted)."""
    return run(conn, _reap_op(reaper, limit))


async def areap(conn: psycopg.AsyncConnection, reaper: str, limit: int = 1000) -> list[Outcome]:
    return await arun(conn, _reap_op(reaper, limit))


def _orphans_op(locked_by: str, held: Sequence[int]) -> Op:
    return Op("release_orphans", {"locked_by": locked_by, "held": list(held)}, sorted_ids)


def release_orphans(conn: psycopg.Connection, locked_by: str, held: Sequence[int]) -> list[int]:
    """Hand back, attempt not counted, every job running under `locked_by` whose id is not in `held`."""
    return run(conn, _orphans_op(locked_by, held))


async def arelease_orphans(conn: psycopg.AsyncConnection, locked_by: str, held: Sequence[int]) -> list[int]:
    return await arun(conn, _orphans_op(locked_by, held))


def _upcoming_op(queues: Sequence[str], limit: int) -> Op:
    return Op("upcoming", {"queues": list(queues), "limit": limit}, lambda rows: [row[0] for row in rows])


def upcoming(conn: psycopg.Connection, queues: Sequence[str], limit: int = 100) -> list[float]:
    """The soonest future run_at times (epoch seconds) of queued jobs of `queues`, soonest first."""
    return run(conn, _upcoming_op(queues, limit))


async def aupcoming(conn: psycopg.AsyncConnection, queues: Sequence[str], limit: int = 100) -> list[float]:
    return await arun(conn, _upcoming_op(queues, limit))
