"""Retention: finished jobs (and events) past their window are deleted in bounded batches.

One function prunes once, `aprune`; the supervisor's pruner duty calls it on a timer and `jobsup prune`
calls it from the command line. Each batch is a transaction of its own that first takes the pruning
turn (a transaction-scoped advisory lock), then deletes at most `BatchSize.size` rows found through
jobs_finished_idx: no statement holds locks for long, and two supervisors never delete the same rows.
"""

from __future__ import annotations

import asyncio
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
    """How long finished jobs are kept, in seconds; 0 keeps them forever."""

    keep_done: float = KEEP_DONE
    keep_dead: float = KEEP_DEAD  # dead and cancelled jobs
    keep_events: float = KEEP_EVENTS

    def targets(self) -> list[tuple[str, str, float]]:
        """(what, statement, window) for each kind of row that is pruned at all."""
        found = [
            ("done", "prune_done", self.keep_done),
            ("dead", "prune_dead", self.keep_dead),
            ("events", "prune_events", self.keep_events),
        ]
        return [target for target in found if target[2] > 0]


@dataclass
class Pruned:
    """Rows removed (or, for a dry run, that would be)."""

    done: int = 0
    dead: int = 0
    events: int = 0

    @property
    def total(self) -> int:
        return self.done + self.dead + self.events

    def to_json(self) -> dict[str, int]:
        return {"done": self.done, "dead": self.dead, "events": self.events}


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


async def _batch(
    conn: psycopg.AsyncConnection, statement: str, keep: float, batch: BatchSize, wait: bool
) -> int | None:
    """Delete one batch in its own transaction; None when another process has the turn."""
    async with conn.transaction():
        async with conn.cursor() as cur:
            await cur.execute(SQL["prune_turn_wait" if wait else "prune_turn"], {"key": PRUNE_LOCK})
            if not wait and not one_row(await cur.fetchone(), "prune_turn")[0]:
                return None
            await cur.execute(SQL["prune_timeout"], {"ms": int(batch.timeout * 1000)})
            await cur.execute(SQL[statement], {"keep": keep, "limit": batch.size})
            if cur.description is not None:  # prune_dead reports its count, the plain DELETEs a rowcount
                return one_row(await cur.fetchone(), statement)[0]
            return cur.rowcount


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
    for what, statement, keep in retention.targets():
        while True:
            limit = batch.size
            started = loop.time()
            try:
                removed = await _batch(conn, statement, keep, batch, wait)
            except psycopg.errors.QueryCanceled:
                if batch.size <= BATCH_MIN:
                    raise  # even the smallest batch does not finish: the server is in trouble
                batch.timed_out()
                continue
            if removed is None:
                return pruned
            batch.took(loop.time() - started)
            setattr(pruned, what, getattr(pruned, what) + removed)
            if removed < limit:
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
        done, dead, events = one_row(await cur.fetchone(), "prunable")
    return Pruned(done, dead, events)
