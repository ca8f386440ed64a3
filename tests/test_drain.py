"""Draining a deep backlog: a claim starts where the last one ended, and loses nothing by it.

The claim's `after` keys skip the dead index entries at the head of each queue. These tests check that
priorities, earlier jobs and fairness between queues survive the skipping, on a real server.
"""

from __future__ import annotations

from datetime import timedelta

from jobsup import client
from jobsup.db import lifecycle
from jobsup.supervisor.handout import HANDOUT_MAX

from .helpers import wait_for
from .supervisor_helpers import make_calls_table


def load(conn, count: int, queues: list[str], kind: str = "record") -> None:
    """`count` jobs of priority 0 in one statement, spread round-robin over `queues` in id order."""
    conn.execute(
        "INSERT INTO jobsup.jobs (queue, kind) SELECT (%s::text[])[1 + i %% %s], %s "
        "FROM generate_series(0, %s - 1) AS i",
        (queues, len(queues), kind, count),
    )


def done_by_queue(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT queue, count(*) FROM jobsup.jobs WHERE status = 'done' GROUP BY queue"))


def server_clock(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def test_claim_from_keys_skips_the_level_before_them_and_reads_the_levels_around_it(conn):
    low = client.enqueue_many(conn, [{"kind": "k"}] * 6)
    first = lifecycle.claim(conn, ["default"], 3, "sup-a", 30)
    assert [j.id for j in first] == low[:3]
    keys = lifecycle.claim_keys(first)
    # A job put back before the key (here: one claimed, then released) is skipped while the key holds...
    lifecycle.release(conn, [(first[0].id, first[0].attempts)], "sup-a")
    high = client.enqueue(conn, "k", priority=5)
    lower = client.enqueue(conn, "k", priority=-1)
    jobs = lifecycle.claim(conn, ["default"], 3, "sup-a", 30, after=keys)
    # ...the level above is read from its head, the key's level from the key on.
    assert [j.id for j in jobs] == [high, low[3], low[4]]
    jobs = lifecycle.claim(conn, ["default"], 3, "sup-a", 30, after=lifecycle.claim_keys(jobs))
    assert [j.id for j in jobs] == [low[5], lower]  # the level ran out: the levels below follow
    # Without keys the claim starts at the head again and finds what was put back.
    assert [j.id for j in lifecycle.claim(conn, ["default"], 3, "sup-a", 30)] == [low[0]]


def test_a_high_priority_job_mid_drain_is_taken_by_the_next_claim_and_both_queues_progress(conn, start):
    make_calls_table(conn)
    load(conn, 10_000, ["a", "b"])
    # A prefetch of 500 beyond the workers: the urgent job is claimed behind hundreds of prefetched ones.
    start("--queues", "a,b", "--prefetch", "500", procs=2)
    wait_for(lambda: sum(done_by_queue(conn).values()) >= 1_000, timeout=120, message="the drain under way")
    before = done_by_queue(conn)
    urgent = client.enqueue(conn, "record", queue="a", priority=10)
    committed = server_clock(conn)  # after the enqueue's commit: any claim that began later sees the job
    wait_for(
        lambda: conn.execute("SELECT status = 'done' FROM jobsup.jobs WHERE id = %s", (urgent,)).fetchone()[0],
        timeout=60,
        message="the urgent job done",
    )
    claimed = conn.execute("SELECT started_at FROM jobsup.jobs WHERE id = %s", (urgent,)).fetchone()[0]
    ran = conn.execute("SELECT at FROM calls WHERE job_id = %s", (urgent,)).fetchone()[0]
    # Taken by the first claim that began after its commit: no other claim began in between.
    between = conn.execute(
        "SELECT count(*) FROM jobsup.jobs WHERE started_at > %s AND started_at < %s", (committed, claimed)
    ).fetchone()[0]
    assert between == 0
    # It then waited only for what the workers had been handed when the supervisor took it (HANDOUT_MAX
    # each): it goes before every job of a lower priority prefetched (up to two claims, 500 here). Its
    # started_at is its claim's transaction start, not that moment: while the claim's round trip lasts,
    # a worker may finish its hand-out and be given one more, so each worker may run two hand-outs in
    # the window measured. Appended behind the prefetch instead, it waited for ~300.
    ahead = conn.execute(
        "SELECT count(*) FROM calls WHERE at > %s AND at < %s AND job_id <> %s", (claimed, ran, urgent)
    ).fetchone()[0]
    assert ahead <= 2 * 2 * HANDOUT_MAX, ahead
    # Both queues go on draining, side by side, to the end.
    wait_for(
        lambda: all(done_by_queue(conn).get(q, 0) >= before.get(q, 0) + 500 for q in ("a", "b")),
        timeout=120,
        message="both queues progressing",
    )
    wait_for(lambda: sum(done_by_queue(conn).values()) == 10_001, timeout=300, message="the drain's end")
    assert done_by_queue(conn) == {"a": 5_001, "b": 5_000}
    assert conn.execute("SELECT count(*) FROM calls").fetchone()[0] == 10_001  # each ran once


def test_a_job_that_sorts_before_the_keys_is_not_left_until_the_backlog_drains(conn, start):
    load(conn, 30_000, ["default"], kind="ok")
    start("--poll-interval", "60s", procs=2)  # keys then live for the whole drain unless let go
    wait_for(lambda: sum(done_by_queue(conn).values()) >= 2_000, timeout=120, message="the drain under way")
    # Due an hour ago: it sorts before every key, as a released or reaped job does at its old place.
    early = client.enqueue(conn, "ok", run_at=server_clock(conn) - timedelta(hours=1))
    wait_for(lambda: sum(done_by_queue(conn).values()) == 30_001, timeout=300, message="the drain's end")
    claimed = conn.execute("SELECT started_at FROM jobsup.jobs WHERE id = %s", (early,)).fetchone()[0]
    later = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE started_at > %s", (claimed,)).fetchone()[0]
    # Its NOTIFY let the keys go within a claim or two; had they held, it would have waited for the
    # short claim at the very end.
    assert later >= 1_000
