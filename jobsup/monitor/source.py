"""The console's data source: figures from PostgreSQL over one async connection, and its writes.

No textual here: the screen asks `Source` for `Figures` and shows them. A refresh reads everything in one
read-only repeatable-read transaction sent as a pipeline, so its figures agree with each other and cost
one round trip. Losing the connection is not an error of the console: the next call reconnects, with a
backoff, and until then raises DatabaseUnavailable for the screen to show.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import psycopg
from psycopg.rows import dict_row

from jobsup.db import dsn as dsns
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import BadInput, DatabaseUnavailable, JobsupError, first_line
from jobsup.monitor import figures as fig
from jobsup.ops import audit
from jobsup.ops import limits as kind_limits
from jobsup.ops import schedules as schedule_ops
from jobsup.ops.control import JobAction, acancel, arequeue_dead, aset_paused, operator
from jobsup.ops.doctor import Thresholds
from jobsup.ops.explain import aexplain_text
from jobsup.ops.health import health_line
from jobsup.ops.workflows import WorkflowView, ashow
from jobsup.workflow import Child, Parent, achildren, aparents

# The console's connections are named so an operator (or a test) can find them in pg_stat_activity.
APPLICATION_NAME = "jobsup top"
# A refresh that takes longer than this is abandoned; the console shows the last figures meanwhile.
STATEMENT_TIMEOUT_MS = 5000
CONNECT_TIMEOUT = 5  # seconds
# Reconnection waits 0.5 s after the first failure, doubling up to this.
MAX_BACKOFF = 5.0
DEAD_LIMIT = 50  # rows of the dead-jobs table
GROUP_LIMIT = 50  # rows of the dead-groups table
PASS_LIMIT = 20  # reaper passes listed
LEASE_LIMIT = 20  # running jobs listed by how soon their lease expires

T = TypeVar("T")


class ReadOnly(JobsupError):
    """The console was started with --read-only."""


def backoff(failures: int) -> float:
    """Seconds to wait before the next connection attempt after `failures` failed ones.

    >>> [backoff(n) for n in range(6)]
    [0.0, 0.5, 1.0, 2.0, 4.0, 5.0]
    """
    return 0.0 if failures <= 0 else min(MAX_BACKOFF, 0.5 * 2 ** (failures - 1))


def _statements(match: str | None, minutes: int, workflows: bool = False) -> list[tuple[str, dict[str, Any]]]:
    # In the order figures.build takes them; each reads a partial index of live or dead jobs, the small
    # per-kind totals, the supervisors' rows or the events index, never the finished jobs but those done
    # in the last minute. live_counts gives the queues' oldest ready job too (so oldest_ready is not
    # read) and, with the supervisors' kinds, the jobs no supervisor serves: no scan of their own.
    return [
        ("console_clock", {}),
        ("live_counts", {}),
        ("kind_totals", {}),
        ("console_done_last_minute", {}),
        ("console_dead_matching", {"match": match}),
        ("dead_jobs", {"match": match, "limit": DEAD_LIMIT}),
        ("dead_groups", {"match": match, "limit": GROUP_LIMIT}),
        ("supervisors", {}),
        ("console_reaper_passes", {"limit": PASS_LIMIT}),
        ("console_reaped_per_minute", {"minutes": minutes}),
        ("health", {}),  # reads the server's state through functions, no table (jobsup/ops/health.py)
        ("queue_pauses", {}),  # the paused queues (control): a handful of rows at most
        # The latency tab: 14 rows per kind and metric of jobsup.latency, the running jobs' index, and the
        # partial indexes of live and dead jobs.
        ("latency_read", {}),
        ("expiring_leases", {"limit": LEASE_LIMIT}),
        ("attempts_histogram", {}),
        # The Limits tab: the limits rows, the indexes of held jobs and of throttled ones (the first
        # THROTTLED_COUNTED of each kind) and the last minute of finished jobs, as done/min reads it.
        ("limited_kinds", {"counted": fig.THROTTLED_COUNTED + 1}),
        ("console_limit_keys", {"counted": fig.THROTTLED_COUNTED + 1, "keys": fig.LIMIT_KEYS}),
        # The Workflows tab: a few probes of the newest workflows' jobs; their list, which counts every
        # job of each, only while the tab is in view (the last statement then).
        ("console_workflows_live", {"limit": fig.WORKFLOWS_LISTED}),
        *([("workflows_recent", {"limit": fig.WORKFLOWS_LISTED})] if workflows else []),
    ]


# The role the audit gives the console's actions (jobsup.ops.audit): whoever runs it has the database's
# credentials.
CONSOLE_ROLE = "console"


async def _audit(conn: psycopg.AsyncConnection, action: str, target: str, job_ids: Sequence[int], said: str) -> None:
    """The audit's row of an action of the console, by `user@host`, once the action has committed."""
    await audit.arecord(
        conn, who=operator(), role=CONSOLE_ROLE, action=action, target=target, job_ids=job_ids, detail=said
    )


def _audited(change: kind_limits.Change, conn: psycopg.Connection, action: str = "limit") -> kind_limits.Change:
    """`change` of a kind's limits, recorded in the audit."""
    said = f"limits of kind {change.kind}: {change.before} → {change.after}"
    audit.record(conn, who=operator(), role=CONSOLE_ROLE, action=action, target=f"kind {change.kind}", detail=said)
    return change


class Source:
    """Figures of one database for `jobsup top`."""

    def __init__(
        self,
        dsn: str,
        *,
        read_only: bool = False,
        minutes: int = fig.REAPER_MINUTES,
        thresholds: Thresholds = Thresholds(),
    ) -> None:
        dsns.check(dsn)
        self.dsn = dsn
        self.thresholds = thresholds  # where the health line warns: jobsup doctor's defaults
        self.read_only = read_only
        self.minutes = minutes
        # Whether a refresh reads the Workflows tab's list: the app sets it while the tab is in view.
        self.list_workflows = False
        self._conn: psycopg.AsyncConnection | None = None
        self._failures = 0
        self._next_attempt = 0.0  # time.monotonic() before which no reconnection is tried
        self._last_error: str | None = None
        # One conversation at a time: a requeue must not land inside a refresh's pipeline and its
        # read-only transaction, which share the connection.
        self._lock = asyncio.Lock()

    @property
    def label(self) -> str:
        """The database, as the header shows it: never its password."""
        return dsns.redact(self.dsn)

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def _connection(self) -> psycopg.AsyncConnection:
        if self.connected:
            assert self._conn is not None
            return self._conn
        if time.monotonic() < self._next_attempt and self._last_error:
            raise DatabaseUnavailable(self._last_error)
        # Custom plans: a generic plan cached while the queue was empty would serve it full too.
        options = f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c plan_cache_mode=force_custom_plan"
        if self.read_only:
            # Belt and braces: even a bug in the console cannot write through this connection.
            options += " -c default_transaction_read_only=on"
        try:
            self._conn = await psycopg.AsyncConnection.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                application_name=APPLICATION_NAME,
                options=options,
                prepare_threshold=dsns.prepare_threshold(),
            )
        except psycopg.OperationalError as exc:
            self._failed(dsns.describe_connect_error(self.dsn, exc))
        self._failures = 0
        self._last_error = None
        return self._conn

    def _failed(self, message: str) -> NoReturn:
        self._failures += 1
        self._next_attempt = time.monotonic() + backoff(self._failures)
        self._last_error = message
        raise DatabaseUnavailable(message)

    async def _lost(self, exc: psycopg.Error) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except psycopg.Error:
                pass
        self._failed(f"lost the connection to {self.label}: {dsns.redact(first_line(exc))}")

    async def _run(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        async with self._lock:
            return await self._run_alone(work)

    async def _run_alone(self, work: Callable[[psycopg.AsyncConnection], Awaitable[T]]) -> T:
        conn = await self._connection()
        try:
            return await work(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if conn.closed or conn.broken:
                await self._lost(exc)
            raise DatabaseUnavailable(f"{self.label}: {exc}") from None
        except psycopg.Error as exc:
            raise JobsupError(f"database error: {dsns.redact(first_line(exc))}") from None

    async def refresh(self, match: str | None = None) -> fig.Figures:
        """Every figure of the screen; `match` narrows the dead jobs and groups to a kind or queue."""
        listing = self.list_workflows
        statements = _statements(match or None, self.minutes, listing)

        async def work(conn: psycopg.AsyncConnection) -> fig.Figures:
            cursors = []
            async with conn.pipeline(), conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                for name, params in statements:
                    cur = conn.cursor(row_factory=dict_row)
                    await cur.execute(SQL[name], params)
                    cursors.append(cur)
            results = [await cur.fetchall() for cur in cursors]
            workflows = results.pop() if listing else None
            (
                (clock,),
                live,
                totals,
                (done_last_minute,),
                (dead_matching,),
                dead_jobs,
                dead_groups,
                supervisors,
                passes,
                per_minute,
                (health,),
                paused,
                latency,
                leases,
                attempts,
                limits,
                limit_keys,
                (workflows_live,),
            ) = results
            return fig.build(
                clock["now"],
                live=live,
                totals=totals,
                dead_jobs=dead_jobs,
                dead_groups=dead_groups,
                supervisors=supervisors,
                passes=passes,
                per_minute=per_minute,
                minutes=self.minutes,
                match=match or None,
                health=health_line(health, self.thresholds),
                paused=paused,
                latency=latency,
                leases=leases,
                attempts=attempts,
                done_last_minute=done_last_minute["count"],
                dead_matching=dead_matching["count"],
                limits=limits,
                limit_keys=limit_keys,
                workflows_live=workflows_live,
                workflows=workflows,
            )

        return await self._run(work)

    async def dead_ids(self, scope: fig.Scope) -> list[int]:
        """The ids of the dead jobs in `scope` now: what a confirmed bulk requeue will take."""

        async def work(conn: psycopg.AsyncConnection) -> list[int]:
            cur = await conn.execute(
                SQL["console_dead_ids"], {"kind": scope.kind, "error": scope.error, "by_error": scope.by_error}
            )
            return [row[0] for row in await cur.fetchall()]

        return await self._run(work)

    async def requeue(self, ids: Sequence[int], kind: str | None = None) -> list[int]:
        """Requeue these dead jobs (those still dead, and of `kind` if given); the ids requeued."""
        if self.read_only:
            raise ReadOnly("read-only console: requeueing is turned off (started with --read-only)")
        if not ids:
            return []

        async def work(conn: psycopg.AsyncConnection) -> list[int]:
            done = await arequeue_dead(conn, ids=list(ids), kind=kind)
            target = f"kind {kind}" if kind else ", ".join(f"job {i}" for i in list(ids)[:5])
            await _audit(conn, "requeue", target, done, f"requeued {len(done)} of {len(ids)}")
            return done

        return await self._run(work)

    async def cancel(self, job_id: int) -> JobAction:
        """Cancel one job (control: a running one's supervisor stops its worker); what was done."""
        if self.read_only:
            raise ReadOnly(f"read-only console: job {job_id} was not cancelled (started with --read-only)")

        async def work(conn: psycopg.AsyncConnection) -> JobAction:
            actions = await acancel(conn, ids=[job_id])
            changed = [a.id for a in actions if a.action != "unchanged"]
            await _audit(conn, "cancel", f"job {job_id}", changed, actions[0].action)
            return actions[0]

        return await self._run(work)

    async def queue_action(self, action: str, queue: str) -> str:
        """`pause` or `resume` a queue on every supervisor; what was done, in words."""
        if self.read_only:
            raise ReadOnly(f"read-only console: nothing was done to queue {queue} (started with --read-only)")

        async def work(conn: psycopg.AsyncConnection) -> str:
            done = "paused" if action == "pause" else "resumed"
            if await aset_paused(conn, queue, action == "pause"):
                said = f"{done} queue {queue}"
            else:
                said = f"queue {queue} was {'paused already' if action == 'pause' else 'not paused'}"
            await _audit(conn, action, f"queue {queue}", [], said)
            return said

        return await self._run(work)

    async def job(self, job_id: int) -> dict[str, Any] | None:
        """Every column of one job, for the job screen."""

        async def work(conn: psycopg.AsyncConnection) -> dict[str, Any] | None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(SQL["job"], {"id": job_id})
                return await cur.fetchone()

        return await self._run(work)

    async def next_throttled(self, kind: str, key: str | None = None) -> int | None:
        """The id of the first throttled job of a limited kind (of one key), in claim order; None if none."""

        async def work(conn: psycopg.AsyncConnection) -> int | None:
            cur = await conn.execute(SQL["console_limit_next_throttled"], {"kind": kind, "key": key})
            row = await cur.fetchone()
            return None if row is None else row[0]

        return await self._run(work)

    async def workflow(self, workflow_id: int) -> WorkflowView | None:
        """A workflow and every job of it with its parents, for its tree; None once it is gone."""

        async def work(conn: psycopg.AsyncConnection) -> WorkflowView | None:
            try:
                return await ashow(conn, workflow_id)
            except BadInput:  # deleted since (retention): the tree says so
                return None

        return await self._run(work)

    async def family(self, job_id: int) -> tuple[list[Parent], list[Child]]:
        """A job's parents and children (jobsup.parents and jobsup.children), for the job screen."""

        async def work(conn: psycopg.AsyncConnection) -> tuple[list[Parent], list[Child]]:
            return await aparents(conn, job_id), await achildren(conn, job_id)

        return await self._run(work)

    async def explain(self, job_id: int) -> str | None:
        """Why the job is where it is (jobsup explain), for the job screen; None once it is gone."""

        async def work(conn: psycopg.AsyncConnection) -> str | None:
            try:
                return await aexplain_text(conn, job_id)
            except BadInput:  # deleted since (retention): the job screen says so itself
                return None

        return await self._run(work)

    async def set_limits(self, kind: str, given: Mapping[str, Any]) -> kind_limits.Change:
        """An operator's limits for `kind` (jobsup.ops.limits.set_limits: the dimensions given, None
        removing one, over those in force); what changed."""
        if self.read_only:
            raise ReadOnly(f"read-only console: the limits of kind {kind} were not changed (started with --read-only)")
        return await self._write(lambda conn: _audited(kind_limits.set_limits(conn, kind, operator(), **given), conn))

    async def reset_limits(self, kind: str) -> kind_limits.Change:
        """Drop an operator's limits of `kind`: its app's declaration is in force again; what changed."""
        if self.read_only:
            raise ReadOnly(f"read-only console: the limits of kind {kind} were not reset (started with --read-only)")
        return await self._write(lambda conn: _audited(kind_limits.reset(conn, kind, operator()), conn, "limit reset"))

    async def _write(self, work: Callable[[psycopg.Connection], T]) -> T:
        """Run a synchronous operator's write on a connection of its own, in a thread: a change of limits
        may wait seconds for older writers (jobsup.ops.limits), and the console's loop must not."""
        return await dsns.in_thread(self.dsn, work, APPLICATION_NAME)

    async def schedules(self) -> list[schedule_ops.ScheduleState]:
        """Every schedule, for the schedules table."""
        return await self._run(schedule_ops.alist_schedules)

    async def schedule_action(self, action: str, name: str) -> str:
        """`run` (one job now), `pause` or `resume` a schedule; what was done, in words."""
        if self.read_only:
            raise ReadOnly(f"read-only console: nothing was done to schedule {name} (started with --read-only)")

        async def work(conn: psycopg.AsyncConnection) -> str:
            if action == "run":
                job_id = await schedule_ops.arun_now(conn, name)
                said = f"enqueued job {job_id} of schedule {name}"
                await _audit(conn, "schedule run", f"schedule {name}", [job_id], said)
                return said
            done = "paused" if action == "pause" else "resumed"
            changed = await schedule_ops.aset_paused(conn, name, action == "pause")
            said = f"{done} schedule {name}" if changed else f"schedule {name} was already {done}"
            await _audit(conn, f"schedule {action}", f"schedule {name}", [], said)
            return said

        return await self._run(work)

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and not conn.closed:
                await conn.close()
