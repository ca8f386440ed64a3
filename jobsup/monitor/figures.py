"""What the console shows, as frozen values, and how they are built from the rows source.py reads
(formats.py writes them as text).

Nothing here talks to the database or imports textual: source.py fills these values, the screen only
lays them out. Every age is measured against the database's clock (`Figures.now`), so a console on a
laptop whose clock is off still shows true ages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal

from jobsup.monitor.formats import short_error
from jobsup.ops.latency import KindLatency, summarize

# Re-exported (the `X as X` form): the panels read these through this module, as fig.COUNT_COLUMNS.
from jobsup.ops.snapshot import COUNT_COLUMNS as COUNT_COLUMNS
from jobsup.ops.snapshot import KIND_COLUMNS as KIND_COLUMNS
from jobsup.ops.snapshot import LIVE_COLUMNS, KindCounts, LimitedKind, counts_by_kind, limited_kinds
from jobsup.ops.snapshot import THROTTLED_COUNTED as THROTTLED_COUNTED
from jobsup.ops.snapshot import column_sums as column_sums
from jobsup.ops.unserved import Unserved
from jobsup.ops.workflows import Progress

DEFAULT_REFRESH = 1.0  # seconds between refreshes of `jobsup top`
DEFAULT_WARN_AGE = 60.0  # an oldest ready job older than this (seconds) is shown as a warning
# A supervisor writes its row every second; three missed beats (and some slack) means it is stale.
STALE_AFTER = 5.0
# How far back the throughput sparklines reach, in seconds.
HISTORY_SECONDS = 300.0
# Minutes of reaper activity the rescues sparkline covers.
REAPER_MINUTES = 30
LIMIT_KEYS = 3  # the busiest keys shown under each limited kind
WORKFLOWS_LISTED = 20  # the newest workflows the Workflows tab lists (and its badge looks at)


@dataclass(frozen=True)
class KindRow(KindCounts):
    """The counts `jobsup stats` shows for a kind, and the queues holding its live jobs."""

    queues: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueueRow:
    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    oldest: float | None = None  # age in seconds of the oldest ready job
    kinds: tuple[str, ...] = ()
    paused: bool = False  # `jobsup pause`: no supervisor claims from it


@dataclass(frozen=True)
class Ready:
    """The ready jobs of one kind in one queue (a row of live_counts)."""

    queue: str
    kind: str
    ready: int
    oldest: float | None  # age in seconds of the oldest of them


@dataclass(frozen=True)
class DeadJob:
    id: int
    kind: str
    queue: str
    attempts: int
    max_attempts: int
    done_at: datetime | None
    last_error: str | None


@dataclass(frozen=True)
class DeadGroup:
    kind: str
    error: str | None  # the exact last error shared by the group
    count: int
    last_at: datetime | None


@dataclass(frozen=True)
class Worker:
    pid: int
    state: str  # starting, idle, busy, stopping
    job_id: int | None = None
    kind: str | None = None
    job_started_at: datetime | None = None
    rss: int | None = None  # bytes
    cpu: float | None = None  # percent
    jobs_done: int = 0
    restarts: int = 0
    last_exit: str | None = None
    # A process running jobs that share it: how many of its capacity, its event loop's lag (seconds),
    # and the job blocking that loop, if one does. None for a process of alone jobs.
    shared: int | None = None
    capacity: int | None = None
    lag: float | None = None
    blocked_by: int | None = None
    behind: int = 0  # alone jobs handed to it behind the one it runs, not started yet


@dataclass(frozen=True)
class Supervisor:
    id: str
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]
    procs: int
    started_at: datetime
    heartbeat_age: float  # seconds since its last heartbeat, by the database's clock
    state: str
    jobs_done: int
    workers: tuple[Worker, ...] = ()
    kinds: tuple[str, ...] | None = None  # the kinds its app handles; None: any kind

    def stale(self, after: float = STALE_AFTER) -> bool:
        return self.heartbeat_age > after

    def serves(self, queue: str, kind: str, stale_after: float = STALE_AFTER) -> bool:
        """Whether it would claim a ready job of `kind` in `queue`: running (not stopping), beating,
        and serving the queue with an app that handles the kind."""
        return (
            self.state == "running"
            and not self.stale(stale_after)
            and queue in self.queues
            and (self.kinds is None or kind in self.kinds)
        )


@dataclass(frozen=True)
class ReaperPass:
    id: int
    at: datetime
    supervisor: str | None  # the reaper's supervisor
    count: int
    job_ids: tuple[int, ...]
    sources: tuple[str, ...]  # supervisors whose leases ran out
    dead: int  # of the returned jobs, those that had no attempt left


@dataclass(frozen=True)
class Lease:
    """A running job and how long its lease has left (negative: expired, for the reaper)."""

    id: int
    kind: str
    locked_by: str | None
    attempts: int
    remaining: float | None


@dataclass(frozen=True)
class LimitedKey:
    """One key of a limited kind. Its throttled jobs (and the oldest of them) are counted among the first
    THROTTLED_COUNTED throttled jobs of the kind, as the kind's are."""

    key: str
    held: int = 0
    throttled: int = 0
    throttled_age: float | None = None
    starts: int = 0  # within its key_rate's period (formats.STARTS_SPAN at most)


@dataclass(frozen=True)
class LimitRow(LimitedKind):
    """A kind with a limit in force as the Limits tab shows it: `jobsup stats`' figures, its starts and its
    busiest keys."""

    starts: int = 0  # within its rate's period (formats.STARTS_SPAN at most)
    keys: tuple[LimitedKey, ...] = ()  # the LIMIT_KEYS busiest, by held then throttled
    keys_seen: int = 0  # keys holding a job or among its first THROTTLED_COUNTED throttled ones

    @property
    def at_concurrency(self) -> bool:
        return self.limits.concurrency is not None and self.held >= self.limits.concurrency


@dataclass(frozen=True)
class Figures:
    now: datetime  # the database's clock when the figures were read
    kinds: tuple[KindRow, ...] = ()
    queues: tuple[QueueRow, ...] = ()
    dead_jobs: tuple[DeadJob, ...] = ()
    dead_groups: tuple[DeadGroup, ...] = ()
    supervisors: tuple[Supervisor, ...] = ()
    reaper_passes: tuple[ReaperPass, ...] = ()
    reaped_per_minute: tuple[int, ...] = ()  # oldest minute first, the current one last
    match: str | None = None  # the filter the database applied to the dead jobs and groups
    health: str | None = None  # jobsup.ops.health's one-line warning, None when all is well
    latency: tuple[KindLatency, ...] = ()  # queue latency and run time per kind (jobsup.latency)
    leases: tuple[Lease, ...] = ()  # the running jobs whose lease expires soonest
    attempts: tuple[tuple[str, int, int], ...] = ()  # (status, attempts, jobs) of live and dead jobs
    ready: tuple[Ready, ...] = ()  # ready jobs by queue and kind
    done_last_minute: int | None = None  # jobs done in the last 60 s, by the database's clock
    dead_matching: int | None = None  # dead jobs the filter matches; None with no filter
    limits: tuple[LimitRow, ...] = ()  # the kinds with a limit in force
    # The newest WORKFLOWS_LISTED workflows and their progress, read only while the Workflows tab is in
    # view (Source.list_workflows); None when this refresh did not read them.
    workflows: tuple[Progress, ...] | None = None
    workflows_listed: int = 0  # of the newest WORKFLOWS_LISTED workflows: how many there are
    workflows_unfinished: int = 0  # and how many have a job waiting, queued or running

    @property
    def total(self) -> KindRow:
        return KindRow("total", **column_sums(self.kinds), queues=())  # queues named: the sums fill only counts

    @property
    def oldest_ready(self) -> float | None:
        ages = [q.oldest for q in self.queues if q.oldest is not None]
        return max(ages) if ages else None

    def live_supervisors(self, stale_after: float = STALE_AFTER) -> list[Supervisor]:
        return [s for s in self.supervisors if not s.stale(stale_after)]

    def unserved(self, stale_after: float = STALE_AFTER) -> list[Unserved]:
        """The ready jobs no live supervisor can run, by queue and kind (see `unserved`)."""
        return unserved(self.ready, self.supervisors, [q.queue for q in self.queues if q.paused], stale_after)


def unserved(
    ready: Iterable[Ready],
    supervisors: Iterable[Supervisor],
    paused: Iterable[str] = (),
    stale_after: float = STALE_AFTER,
) -> list[Unserved]:
    """Ready jobs of a queue and kind that no live, running supervisor serves with that kind: what the
    `unserved` statement of jobsup doctor finds, from figures the console has read anyway. A paused
    queue counts as served, its pause is deliberate; a supervisor that is stopping, or whose heartbeat
    is older than `stale_after`, serves nothing.

    >>> t = datetime(2026, 1, 1)
    >>> sups = [
    ...     Supervisor("s1", "h", 1, "0", ("mix",), 2, t, 0.5, "running", 0, kinds=("a", "b")),
    ...     Supervisor("s2", "h", 2, "0", ("mix",), 2, t, 0.5, "stopping", 0, kinds=("c",)),
    ...     Supervisor("s3", "h", 3, "0", ("mix",), 2, t, 60.0, "running", 0),  # any kind, but stale
    ... ]
    >>> ready = [Ready("mix", "a", 3, 2.0), Ready("mix", "c", 5, 75.0), Ready("other", "a", 1, 9.0)]
    >>> [(u.queue, u.kind, u.ready, u.age) for u in unserved(ready, sups)]
    [('mix', 'c', 5, 75.0), ('other', 'a', 1, 9.0)]
    >>> [u.kind for u in unserved(ready, sups, paused=["mix"])]
    ['a']
    >>> unserved(ready, sups, stale_after=120.0)  # s3 is live then, and serves every kind of mix
    [Unserved(queue='other', kind='a', ready=1, age=9.0)]
    """
    sups = list(supervisors)
    held = set(paused)
    return [
        Unserved(r.queue, r.kind, r.ready, r.oldest or 0.0)
        for r in sorted(ready, key=lambda r: (r.queue, r.kind))
        if r.ready > 0 and r.queue not in held and not any(s.serves(r.queue, r.kind, stale_after) for s in sups)
    ]


@dataclass(frozen=True)
class Scope:
    """Which dead jobs a bulk requeue takes: every one, one kind's, or one kind's with one last error."""

    kind: str | None = None
    error: str | None = None
    by_error: bool = False

    def describe(self, count: int) -> str:
        """
        >>> Scope().describe(3)
        '3 dead jobs (all of them, every kind)'
        >>> Scope("email").describe(1)
        '1 dead email job'
        >>> Scope("email", "SMTP timeout", by_error=True).describe(412)
        "412 dead email jobs whose last error is 'SMTP timeout'"
        """
        jobs = f"{count:,} dead {self.kind + ' ' if self.kind else ''}job{'' if count == 1 else 's'}"
        if self.kind is None:
            return jobs + " (all of them, every kind)"
        if self.by_error:
            return jobs + (
                " with no last error" if self.error is None else f" whose last error is {short_error(self.error, 80)!r}"
            )
        return jobs


# --- building the figures from rows ------------------------------------------------------------


def build(
    now: datetime,
    *,
    live: Sequence[Mapping[str, Any]],
    totals: Sequence[Mapping[str, Any]],
    oldest: Sequence[Mapping[str, Any]] = (),
    dead_jobs: Sequence[Mapping[str, Any]],
    dead_groups: Sequence[Mapping[str, Any]],
    supervisors: Sequence[Mapping[str, Any]],
    passes: Sequence[Mapping[str, Any]],
    per_minute: Sequence[Mapping[str, Any]],
    minutes: int = REAPER_MINUTES,
    match: str | None = None,
    health: str | None = None,
    paused: Sequence[Mapping[str, Any]] = (),
    latency: Sequence[Mapping[str, Any]] = (),
    leases: Sequence[Mapping[str, Any]] = (),
    attempts: Sequence[Mapping[str, Any]] = (),
    done_last_minute: int | None = None,
    dead_matching: int | None = None,
    limits: Sequence[Mapping[str, Any]] = (),
    limit_keys: Sequence[Mapping[str, Any]] = (),
    workflows_live: Mapping[str, Any] | None = None,
    workflows: Sequence[Mapping[str, Any]] | None = None,
) -> Figures:
    """Figures from the rows of the console's statements (see source.py for which is which).

    A queue's oldest ready job is the oldest of its kinds' (live_counts); rows of `oldest` (the
    oldest_ready statement), if given, say the same.
    """
    kind_queues: dict[str, set[str]] = {}
    queues: dict[str, dict[str, Any]] = {}
    ready: list[Ready] = []
    for row in live:
        kind_queues.setdefault(row["kind"], set()).add(row["queue"])
        q = queues.setdefault(row["queue"], {"kinds": set()})
        q["kinds"].add(row["kind"])
        for name in LIVE_COLUMNS:
            q[name] = q.get(name, 0) + row[name]
        kind_oldest = row.get("oldest")
        if kind_oldest is not None:
            q["oldest"] = max(q.get("oldest") or 0.0, kind_oldest)
        if row["ready"]:
            ready.append(Ready(row["queue"], row["kind"], row["ready"], kind_oldest))
    for row in oldest:
        queues.setdefault(row["queue"], {"kinds": set()})["oldest"] = row["age"]
    for row in paused:  # a paused queue has a row even with no live job
        queues.setdefault(row["queue"], {"kinds": set()})["paused"] = True
    return Figures(
        now=now,
        kinds=tuple(
            KindRow(kind, **counts, queues=tuple(sorted(kind_queues.get(kind, ()))))
            for kind, counts in sorted(counts_by_kind(live, totals).items())
        ),
        queues=tuple(
            QueueRow(queue, **{**c, "kinds": tuple(sorted(c["kinds"]))}) for queue, c in sorted(queues.items())
        ),
        dead_jobs=tuple(
            DeadJob(**{k: r[k] for k in ("id", "kind", "queue", "attempts", "max_attempts", "done_at", "last_error")})
            for r in dead_jobs
        ),
        dead_groups=tuple(DeadGroup(r["kind"], r["last_error"], r["count"], r["last_at"]) for r in dead_groups),
        supervisors=tuple(supervisor(r) for r in supervisors),
        reaper_passes=tuple(reaper_pass(r) for r in passes),
        reaped_per_minute=per_minute_series(per_minute, minutes),
        match=match,
        health=health,
        latency=tuple(summarize(latency)),
        leases=tuple(Lease(r["id"], r["kind"], r["locked_by"], r["attempts"], r["remaining"]) for r in leases),
        attempts=tuple((r["status"], r["attempts"], r["count"]) for r in attempts),
        ready=tuple(ready),
        done_last_minute=done_last_minute,
        dead_matching=dead_matching if match else None,
        limits=limit_rows(limits, limit_keys),
        workflows=None if workflows is None else tuple(Progress(**row) for row in workflows),
        workflows_listed=(workflows_live or {}).get("listed", 0),
        workflows_unfinished=(workflows_live or {}).get("unfinished", 0),
    )


def limit_rows(kinds: Iterable[Mapping[str, Any]], keys: Iterable[Mapping[str, Any]]) -> tuple[LimitRow, ...]:
    """The Limits tab's rows from those of limited_kinds and console_limit_keys."""
    starts: dict[str, int] = {}
    busiest: dict[str, list[LimitedKey]] = {}
    seen: dict[str, int] = {}
    for row in keys:
        if row["whole_kind"]:
            starts[row["kind"]] = row["starts"]
            continue
        busiest.setdefault(row["kind"], []).append(
            LimitedKey(row["key"], row["held"], row["throttled"], row["throttled_age"], row["starts"])
        )
        seen[row["kind"]] = row["keys_seen"]
    return tuple(
        LimitRow(
            **{f.name: getattr(k, f.name) for f in fields(LimitedKind)},
            starts=starts.get(k.kind, 0),
            keys=tuple(busiest.get(k.kind, ())),
            keys_seen=seen.get(k.kind, 0),
        )
        for k in limited_kinds(kinds)
    )


def supervisor(row: Mapping[str, Any]) -> Supervisor:
    workers = row.get("workers") or []
    return Supervisor(
        id=row["id"],
        host=row["host"],
        pid=row["pid"],
        version=row["version"],
        queues=tuple(row["queues"]),
        procs=row["procs"],
        started_at=row["started_at"],
        heartbeat_age=float(row["heartbeat_age"] or 0.0),
        state=row["state"],
        jobs_done=row["jobs_done"],
        workers=tuple(worker(w) for w in workers if isinstance(w, Mapping)),
        # NULL: any kind (an app that finds its handlers by name, or a supervisor of an earlier release).
        kinds=None if row.get("kinds") is None else tuple(row["kinds"]),
    )


def worker(item: Mapping[str, Any]) -> Worker:
    """A worker of a supervisor's heartbeat row, tolerant of missing fields.

    >>> w = worker({"pid": 7, "state": "busy", "job_id": 3, "job_started_at": "2026-01-01T00:00:00+00:00"})
    >>> w.job_started_at.year
    2026
    >>> worker({"pid": 7}).state
    '?'
    """
    return Worker(
        pid=int(item.get("pid") or 0),
        state=str(item.get("state") or "?"),
        job_id=item.get("job_id"),
        kind=item.get("kind"),
        job_started_at=parse_time(item.get("job_started_at")),
        rss=item.get("rss"),
        cpu=item.get("cpu"),
        jobs_done=int(item.get("jobs_done") or 0),
        restarts=int(item.get("restarts") or 0),
        last_exit=item.get("last_exit"),
        shared=item.get("shared"),
        capacity=item.get("capacity"),
        lag=item.get("lag"),
        blocked_by=item.get("blocked_by"),
        behind=len(item.get("behind") or ()),
    )


def reaper_pass(row: Mapping[str, Any]) -> ReaperPass:
    detail = row.get("detail") or {}
    sources = detail.get("from") or []
    return ReaperPass(
        id=row["id"],
        at=row["at"],
        supervisor=row["supervisor"],
        count=row["count"],
        job_ids=tuple(row["job_ids"] or ()),
        sources=tuple(str(s) for s in sources if s is not None),
        dead=int(detail.get("dead") or 0),
    )


def parse_time(value: Any) -> datetime | None:
    """
    >>> parse_time("2026-03-01T10:00:00.5+00:00").isoformat()
    '2026-03-01T10:00:00.500000+00:00'
    >>> parse_time("not a time") is None, parse_time(None) is None
    (True, True)
    """
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def per_minute_series(rows: Iterable[Mapping[str, Any]], minutes: int) -> tuple[int, ...]:
    """Counts per minute, oldest first, from rows of (minutes_ago, count); missing minutes are 0.

    >>> per_minute_series([{"minutes_ago": 0, "count": 4}, {"minutes_ago": 2, "count": 1}], 4)
    (0, 1, 0, 4)
    """
    series = [0] * minutes
    for row in rows:
        ago = int(row["minutes_ago"])
        if 0 <= ago < minutes:
            series[minutes - 1 - ago] += int(row["count"])
    return tuple(series)


# --- what changed, and throughput from the growth of the per-kind totals ------------------------------------------


@dataclass
class Throughput:
    """Done and failed totals over time; rates come from the differences between refreshes.

    >>> t = Throughput()
    >>> for second, done in enumerate([100, 110, 130, 130]):
    ...     t.add(float(second), done, failed=0)
    >>> t.rates("done")
    [10.0, 20.0, 0.0]
    """

    seconds: float = HISTORY_SECONDS
    samples: deque[tuple[float, int, int]] = field(default_factory=deque)

    def add(self, at: float, done: int, failed: int) -> None:
        if self.samples and at <= self.samples[-1][0]:
            return  # the same figures again (a refresh after a requeue): no time has passed
        self.samples.append((at, done, failed))
        while len(self.samples) > 2 and at - self.samples[1][0] >= self.seconds:
            self.samples.popleft()

    def _index(self, name: str) -> Literal[1, 2]:  # a literal, so a sample's field there is an int
        return 1 if name == "done" else 2

    def rates(self, name: str) -> list[float]:
        """Per-second rates between consecutive samples, oldest first (a total that shrank counts 0)."""
        i = self._index(name)
        pairs = zip(list(self.samples), list(self.samples)[1:], strict=False)  # consecutive pairs: one fewer
        return [max(0, b[i] - a[i]) / (b[0] - a[0]) for a, b in pairs]

    def rate(self, name: str) -> float | None:
        rates = self.rates(name)
        return rates[-1] if rates else None


def changed(previous: Figures | None, current: Figures) -> set[tuple[str, str]]:
    """The (kind, column) cells of the counts table that differ from the previous refresh.

    >>> from datetime import timezone
    >>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> a = Figures(t, kinds=(KindRow("email", ready=2, done=5),))
    >>> b = Figures(t, kinds=(KindRow("email", ready=1, done=6), KindRow("sms", ready=1)))
    >>> sorted(changed(a, b))
    [('email', 'done'), ('email', 'ready'), ('sms', 'ready'), ('total', 'done')]
    >>> changed(None, b)
    set()
    """
    if previous is None:
        return set()
    before = {k.kind: k for k in (*previous.kinds, previous.total)}
    cells: set[tuple[str, str]] = set()
    for row in (*current.kinds, current.total):
        old = before.get(row.kind, KindRow(row.kind))
        cells.update((row.kind, name) for name in KIND_COLUMNS if getattr(row, name) != getattr(old, name))
    return cells
