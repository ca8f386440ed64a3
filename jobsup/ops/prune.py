"""Retention: finished jobs (and events) past their window are deleted in bounded batches.

One function prunes once, `aprune`; the supervisor's pruner duty calls it on a timer and `jobsup prune`
calls it from the command line. Each batch is a transaction of its own that first takes the pruning
turn (a transaction-scoped advisory lock), then deletes at most `BatchSize.size` rows found through
jobs_finished_idx: no statement holds locks for long, and two supervisors never delete the same rows.

A workflow's jobs are not pruned one by one: a round first sweeps the open workflows and marks finished
those whose jobs have all finished, then deletes each finished workflow past its window (--keep-done
for a done one, --keep-dead for a failed one, counted from its last job's end) whole: jobs,
dependencies and row. The statements are in retention.sql.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row

# Default windows, in seconds; 0 keeps forever. River keeps completed jobs 24 h and discarded ones 7 d.
KEEP_DONE = 24 * 3600.0
KEEP_DEAD = 7 * 24 * 3600.0
# Events (reaper passes) are shown by the console for the last minutes; a week is plenty to look back.
KEEP_EVENTS = 7 * 24 * 3600.0
# Key of the advisory lock that is the pruning turn ("jobsuppr" as a 64-bit integer).
PRUNE_LOCK = 0x6A6F627375707072
# Rows per DELETE: a few milliseconds of work, large enough that one supervisor keeps up with tens of
# thousands of jobs a second.
BATCH = 5000
# After a batch runs into the timeout, the next ones take a quarter as many rows, down to this.
BATCH_MIN = 100
# A batch that runs this long is cancelled (and retried smaller): it would be holding its row locks and
# the pruning turn for too long.
BATCH_TIMEOUT = 5.0


@dataclass(frozen=True)
class Retention:
    """How long finished jobs are kept, in seconds; 0 keeps them forever. A workflow is kept as its
    jobs are: keep_done once all are done, keep_dead once one ended dead or cancelled."""

    keep_done: float = KEEP_DONE
    keep_dead: float = KEEP_DEAD  # dead and cancelled jobs
    keep_events: float = KEEP_EVENTS

    def steps(self) -> list[Step]:
        """What a round does, in order: the sweep, then a step per kind of row that is pruned at all."""
        found: list[tuple[float, Step]] = [
            (self.keep_done, _workflows(failed=False, keep=self.keep_done)),
            (self.keep_dead, _workflows(failed=True, keep=self.keep_dead)),
            (self.keep_done, _rows("done", "prune_done", self.keep_done)),
            (self.keep_dead, _rows("dead", "prune_dead", self.keep_dead)),
            (self.keep_events, _rows("events", "prune_events", self.keep_events)),
            # The web console's audit rows go with the events, by their window, and count among them.
            (self.keep_events, _rows("events", "prune_audit", self.keep_events)),
        ]
        return [_FinishWorkflows(), *(step for keep, step in found if keep > 0)]


@dataclass
class Pruned:
    """Rows removed (or, for a dry run, that would be): jobs by status (dead: dead and cancelled), those
    of the workflows removed included, events and workflows. `workflows_finished` is not a removal: the
    workflows the sweep marked finished (in no dry run's count)."""

    done: int = 0
    dead: int = 0
    events: int = 0
    workflows: int = 0
    workflows_finished: int = 0

    @property
    def total(self) -> int:
        return self.done + self.dead + self.events + self.workflows

    def add(self, other: Pruned) -> None:
        self.done += other.done
        self.dead += other.dead
        self.events += other.events
        self.workflows += other.workflows
        self.workflows_finished += other.workflows_finished

    def to_json(self) -> dict[str, int]:
        return {"done": self.done, "dead": self.dead, "events": self.events, "workflows": self.workflows}


# One batch of a step, in the batch's transaction once it has the turn: (what it removed, whether a
# batch after it may find more). Its argument is the batch's size.
Step = Callable[[psycopg.AsyncCursor, int], Awaitable[tuple[Pruned, bool]]]


def _rows(what: str, statement: str, keep: float) -> Step:
    """Deletes one batch of finished jobs (not a workflow's) or of events, counted as `what`."""

    async def step(cur: psycopg.AsyncCursor, limit: int) -> tuple[Pruned, bool]:
        await cur.execute(SQL[statement], {"keep": keep, "limit": limit})
        if cur.description is not None:  # the jobs' statements report their count, prune_events a rowcount
            removed = one_row(await cur.fetchone(), statement)[0]
        else:
            removed = cur.rowcount
        return Pruned(**{what: removed}), removed >= limit

    return step


def _workflows(*, failed: bool, keep: float) -> Step:
    """Deletes the jobs of finished workflows past their window, then the workflows left without a job."""

    async def step(cur: psycopg.AsyncCursor, limit: int) -> tuple[Pruned, bool]:
        await cur.execute(SQL["prune_workflow_jobs"], {"failed": failed, "keep": keep, "limit": limit})
        done, dead, due = one_row(await cur.fetchone(), "prune_workflow_jobs")
        await cur.execute(SQL["prune_workflow_rows"], {"ids": due})
        pruned = Pruned(done=done, dead=dead, workflows=cur.rowcount)
        # More may be due past a full batch of jobs, or of workflows; a batch that removed nothing (its
        # workflows' jobs all kept as parents of unfinished jobs) would find the same ones again.
        more = done + dead >= limit or (len(due) >= limit and pruned.total > 0)
        return pruned, more

    return step


class _FinishWorkflows:
    """The sweep: open workflows in id order, a batch of them at a time, each one whose jobs have all
    finished marked finished (finish_workflows in retention.sql)."""

    def __init__(self) -> None:
        self.after = 0  # the last id the batch before saw

    async def __call__(self, cur: psycopg.AsyncCursor, limit: int) -> tuple[Pruned, bool]:
        await cur.execute(SQL["finish_workflows"], {"after": self.after, "limit": limit})
        last, seen, finished = one_row(await cur.fetchone(), "finish_workflows")
        if last is not None:
            self.after = last
        return Pruned(workflows_finished=finished), seen >= limit


@dataclass
class BatchSize:
    """Rows per batch: shrinks after a timeout, grows back while batches are quick, as River's cleaner.

    >>> b = BatchSize()
    >>> b.timed_out(); b.timed_out(); b.size
    312
    >>> b.took(0.01); b.size
    624
    """

    size: int = BATCH
    largest: int = BATCH
    timeout: float = BATCH_TIMEOUT

    def timed_out(self) -> None:
        self.size = max(BATCH_MIN, self.size // 4)

    def took(self, seconds: float) -> None:
        if seconds < self.timeout / 10:
            self.size = min(self.largest, self.size * 2)


async def _batch(conn: psycopg.AsyncConnection, step: Step, batch: BatchSize, wait: bool) -> tuple[Pruned, bool] | None:
    """One batch of `step` in its own transaction; None when another process has the turn."""
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(SQL["prune_turn_wait" if wait else "prune_turn"], {"key": PRUNE_LOCK})
            if not wait and not one_row(await cur.fetchone(), "prune_turn")[0]:
                return None
            await cur.execute(SQL["prune_timeout"], {"ms": int(batch.timeout * 1000)})
            return await step(cur, batch.size)


async def aprune(
    conn: psycopg.AsyncConnection,
    retention: Retention,
    *,
    batch: BatchSize | None = None,
    pause: float = 0.0,
    wait: bool = False,
    pruned: Pruned | None = None,
) -> Pruned:
    """Delete everything past its window, batch after batch, until none is left; what was removed.

    `conn` is an autocommit connection. Without `wait`, the round ends at the first batch whose turn
    another process holds (it is pruning the same rows); with it, each batch waits for the turn.
    `pause` seconds between batches leave the server to the hot path. Counts go into `pruned` if given,
    batch by batch, so a round cut short (a shutdown) still says what it removed.
    """
    batch = batch or BatchSize()
    pruned = Pruned() if pruned is None else pruned
    loop = asyncio.get_running_loop()
    for step in retention.steps():
        while True:
            started = loop.time()
            try:
                done = await _batch(conn, step, batch, wait)
            except psycopg.errors.QueryCanceled:
                if batch.size <= BATCH_MIN:
                    raise  # even the smallest batch does not finish: the server is in trouble
                batch.timed_out()
                continue
            if done is None:
                return pruned
            batch.took(loop.time() - started)
            removed, more = done
            pruned.add(removed)
            if not more:
                break
            await asyncio.sleep(pause)
    return pruned


async def aprunable(conn: psycopg.AsyncConnection, retention: Retention) -> Pruned:
    """What `aprune` would remove now, counted without removing anything."""

    def window(seconds: float) -> float | None:
        return seconds if seconds > 0 else None

    async with conn.cursor() as cur:
        await cur.execute(
            SQL["prunable"],
            {
                "keep_done": window(retention.keep_done),
                "keep_dead": window(retention.keep_dead),
                "keep_events": retention.keep_events,
            },
        )
        done, dead, events, workflows = one_row(await cur.fetchone(), "prunable")
    return Pruned(done, dead, events, workflows)
