"""What is in the queue, as plain values: the figures of `jobsup stats` and of the console.

Every query reads a partial index of live jobs or the small per-kind totals, so its cost follows the
backlog, never the number of finished jobs; the workflows are counted from their table, a row for each
that retention keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.limits import Limits
from jobsup.ops.latency import KindLatency, summarize

LIVE_COLUMNS = ("ready", "scheduled", "running")  # counted from the partial indexes of live jobs
# Jobs whose parents have not all finished (workflows, `after=`): counted from their partial index as the
# live ones are, but no backlog of a queue (no claim takes them), so apart from LIVE_COLUMNS, which are a
# queue's figures in the console too.
WAITING_COLUMNS = ("waiting",)
# Read from the per-kind totals the supervisors keep; cancelled: by `jobsup cancel` or a Discard.
TOTAL_COLUMNS = ("done", "failed", "dead", "cancelled")
COUNT_COLUMNS = LIVE_COLUMNS + TOTAL_COLUMNS
# Every count of a kind, in the order `jobsup stats` shows them: a job waits, is ready, runs, finishes.
KIND_COLUMNS = WAITING_COLUMNS + COUNT_COLUMNS
# The ready jobs of a limited kind (throttled: held back by its limits; startable: allowed to start, they
# wait for a worker) are counted up to this many: a kind may have a million ready, and each refresh of
# the console and each scrape reads them (limited_kinds, snapshot.sql).
THROTTLED_COUNTED = 10_000


@dataclass(frozen=True)
class KindCounts:
    kind: str
    waiting: int = 0  # for its parents to finish
    ready: int = 0
    scheduled: int = 0  # queued with a future run_at
    running: int = 0
    done: int = 0  # ever
    failed: int = 0  # failed attempts, ever
    dead: int = 0  # dead now
    cancelled: int = 0  # ever


@dataclass(frozen=True)
class LimitedKind:
    """A kind with a limit in force, the jobs held against it, and its ready jobs: those its limits hold
    back (throttled) and those they allow to start now (startable), which wait for a free worker."""

    kind: str
    limits: Limits
    held: int = 0  # running jobs of the kind: what its concurrency limit counts
    throttled: int = 0  # ready jobs of the kind its limits hold back now, counted up to THROTTLED_COUNTED
    throttled_capped: bool = False  # more than THROTTLED_COUNTED ready, some throttled: `throttled` stopped there
    throttled_age: float | None = None  # seconds the oldest throttled job has waited; None with none throttled
    set_by: str | None = None  # the operator whose values are in force; None: the app's declaration
    declared: Limits | None = None  # what the app of the last supervisor to start declared; None: no app did
    startable: int = 0  # ready jobs of the kind its limits allow to start now: they wait for a free worker

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LimitedKind:
        """From a row of limited_kinds."""
        return cls(
            row["kind"],
            Limits.from_columns(row),
            held=row["held"],
            throttled=min(row["throttled"], THROTTLED_COUNTED),
            throttled_capped=row["throttled"] > 0 and row["ready"] > THROTTLED_COUNTED,
            throttled_age=row["throttled_age"],
            set_by=row["set_by"],
            declared=None if row["declared"] is None else Limits.from_json(row["kind"], row["declared"]),
            startable=min(row["startable"], THROTTLED_COUNTED),
        )

    @property
    def throttled_text(self) -> str:
        """
        >>> LimitedKind("a", Limits(), throttled=1234).throttled_text
        '1,234'
        >>> LimitedKind("a", Limits(), throttled=THROTTLED_COUNTED, throttled_capped=True).throttled_text
        '10,000+'
        """
        return f"{self.throttled:,}" + ("+" if self.throttled_capped else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "limits": self.limits.to_json(),
            "held": self.held,
            "throttled": self.throttled,
            "throttled_capped": self.throttled_capped,
            "throttled_age": self.throttled_age,
            "startable": self.startable,
            "set_by": self.set_by,
            "declared": None if self.declared is None else self.declared.to_json(),
        }


def limited_kinds(rows: Iterable[Mapping[str, Any]]) -> list[LimitedKind]:
    return [LimitedKind.from_row(row) for row in rows]


@dataclass(frozen=True)
class WorkflowCounts:
    """Workflows open, and finished (done or failed) for as long as retention keeps them."""

    open: int = 0  # a job of it has not finished, or the pruner has not seen yet that all have
    done: int = 0  # every job of it done
    failed: int = 0  # a job of it ended dead or cancelled

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Snapshot:
    taken_at: datetime
    kinds: list[KindCounts]
    oldest_ready: dict[str, float]  # queue -> age in seconds of its oldest ready job
    dead_jobs: list[dict[str, Any]]
    dead_groups: list[dict[str, Any]]
    supervisors: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    paused_queues: list[dict[str, Any]] = field(default_factory=list)  # {queue, paused_at, paused_by}
    latency: list[KindLatency] = field(default_factory=list)  # per kind, from jobsup.ops.latency
    expiring_leases: list[dict[str, Any]] = field(default_factory=list)  # running jobs, soonest first
    attempts: list[dict[str, Any]] = field(default_factory=list)  # (status, attempts, count) of live and dead
    limits: list[LimitedKind] = field(default_factory=list)  # the kinds with a limit in force
    workflows: WorkflowCounts = WorkflowCounts()

    @property
    def total(self) -> KindCounts:
        return KindCounts("total", **column_sums(self.kinds))

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at.isoformat(),
            "kinds": [asdict(k) for k in self.kinds],
            "total": asdict(self.total),
            "oldest_ready": self.oldest_ready,
            "dead_jobs": [_jsonable(row) for row in self.dead_jobs],
            "dead_groups": [_jsonable(row) for row in self.dead_groups],
            "supervisors": [_jsonable(row) for row in self.supervisors],
            "events": [_jsonable(row) for row in self.events],
            "paused_queues": [_jsonable(row) for row in self.paused_queues],
            "latency": [k.to_json() for k in self.latency],
            "expiring_leases": [_jsonable(row) for row in self.expiring_leases],
            "attempts": [_jsonable(row) for row in self.attempts],
            "limits": [k.to_json() for k in self.limits],
            "workflows": self.workflows.to_json(),
        }


def column_sums(kinds: Iterable[KindCounts]) -> dict[str, int]:
    """Each count column summed over `kinds`: the figures of a total row."""
    kinds = list(kinds)
    return {name: sum(getattr(k, name) for k in kinds) for name in KIND_COLUMNS}


def counts_by_kind(live: Iterable[Mapping[str, Any]], totals: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Counts by kind from the rows of `live_counts` (one per kind and queue) and of `kind_totals`.

    >>> live = [{"kind": "a", "queue": "q1", "ready": 2, "scheduled": 0, "running": 1, "waiting": 0},
    ...         {"kind": "a", "queue": "q2", "ready": 0, "scheduled": 0, "running": 0, "waiting": 5},
    ...         {"kind": "a", "queue": "q2", "ready": 1, "scheduled": 3, "running": 0, "waiting": 0}]
    >>> totals = [{"kind": "a", "done": 9, "failed": 1, "dead": 0, "cancelled": 0},
    ...           {"kind": "b", "done": 4, "failed": 0, "dead": 2, "cancelled": 1}]
    >>> counts = counts_by_kind(live, totals)
    >>> counts["a"]
    {'waiting': 5, 'ready': 3, 'scheduled': 3, 'running': 1, 'done': 9, 'failed': 1, 'dead': 0, 'cancelled': 0}
    >>> counts["b"]  # no live job: KindCounts' defaults stand for the rest
    {'done': 4, 'failed': 0, 'dead': 2, 'cancelled': 1}
    """
    merged: dict[str, dict[str, int]] = {}
    for row in live:
        counts = merged.setdefault(row["kind"], {})
        for name in WAITING_COLUMNS + LIVE_COLUMNS:
            counts[name] = counts.get(name, 0) + row[name]
    for row in totals:
        merged.setdefault(row["kind"], {}).update({name: row[name] for name in TOTAL_COLUMNS})
    return merged


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


# (statement, parameters) of one snapshot, in the order build() takes them.
def _queries(dead_limit: int, event_limit: int, lease_limit: int = 10) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("live_counts", {}),
        ("kind_totals", {}),
        ("oldest_ready", {}),
        ("dead_jobs", {"limit": dead_limit, "match": None}),
        ("dead_groups", {"limit": dead_limit, "match": None}),
        ("supervisors", {}),
        ("recent_events", {"limit": event_limit}),
        ("queue_pauses", {}),
        ("latency_read", {}),
        ("expiring_leases", {"limit": lease_limit}),
        ("attempts_histogram", {}),
        ("limited_kinds", {"counted": THROTTLED_COUNTED + 1}),
        ("workflow_counts", {}),
    ]


def _build(results: list[list[dict[str, Any]]]) -> Snapshot:
    (
        live,
        totals,
        oldest,
        dead_jobs,
        dead_groups,
        supervisors,
        events,
        paused,
        latency,
        leases,
        attempts,
        limits,
        workflows,
    ) = results
    kinds = [KindCounts(kind, **counts) for kind, counts in sorted(counts_by_kind(live, totals).items())]
    return Snapshot(
        taken_at=datetime.now(UTC),
        kinds=kinds,
        oldest_ready={row["queue"]: row["age"] for row in oldest},
        dead_jobs=dead_jobs,
        dead_groups=dead_groups,
        supervisors=supervisors,
        events=events,
        paused_queues=paused,
        latency=summarize(latency),
        expiring_leases=leases,
        attempts=attempts,
        limits=limited_kinds(limits),
        workflows=WorkflowCounts(**workflows[0]),
    )


def snapshot(conn: psycopg.Connection, *, dead_limit: int = 20, event_limit: int = 20) -> Snapshot:
    results = []
    with conn.cursor(row_factory=dict_row) as cur:
        for name, params in _queries(dead_limit, event_limit):
            cur.execute(SQL[name], params)
            results.append(cur.fetchall())
    return _build(results)


async def asnapshot(conn: psycopg.AsyncConnection, *, dead_limit: int = 20, event_limit: int = 20) -> Snapshot:
    results = []
    async with conn.cursor(row_factory=dict_row) as cur:
        for name, params in _queries(dead_limit, event_limit):
            await cur.execute(SQL[name], params)
            results.append(await cur.fetchall())
    return _build(results)


def rows(conn: psycopg.Connection, name: str, **params: Any) -> list[dict[str, Any]]:
    """The rows of one named query of db/queries, e.g. rows(conn, "expiring_leases", limit=10)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL[name], params)
        return cur.fetchall()


async def arows(conn: psycopg.AsyncConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SQL[name], params)
        return await cur.fetchall()
