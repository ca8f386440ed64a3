"""Retention against a real PostgreSQL: what is pruned, what is kept, by whom, and what it leaves alone.

Rows are made "old" by moving their done_at back in the test's own database, never by waiting.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import psycopg
import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure
from jobsup.ops import control
from jobsup.ops.prune import BatchSize, Retention, aprunable, aprune

from .helpers import jobsup, wait_for
from .supervisor_helpers import status_counts

HOUR = 3600.0


def prune(dsn: str, retention: Retention, **kwargs) -> dict[str, int]:
    async def go():
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            return await aprune(conn, retention, **kwargs)
        finally:
            await conn.close()

    return asyncio.run(go()).to_json()


def add(conn: psycopg.Connection, status: str, age: float | None, count: int = 1, kind: str = "k") -> list[int]:
    """`count` rows of `status` that finished `age` seconds ago (None: not finished)."""
    rows = conn.execute(
        "INSERT INTO jobsup.jobs (kind, status, done_at, attempts) "
        "SELECT %s, %s, now() - make_interval(secs => %s::float8), 1 FROM generate_series(1, %s) "
        "RETURNING id",
        (kind, status, age, count),
    ).fetchall()
    return [r[0] for r in rows]


def ids(conn: psycopg.Connection) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM jobsup.jobs")}


def totals(conn: psycopg.Connection) -> dict[str, tuple[int, int, int]]:
    return {
        kind: (done, failed, dead)
        for kind, done, failed, dead in conn.execute(
            "SELECT kind, sum(done), sum(failed), sum(dead) FROM jobsup.kind_totals GROUP BY kind"
        )
    }


def test_prune_removes_exactly_the_jobs_past_their_window(dsn, conn):
    old_done = add(conn, "done", 2 * HOUR, 30)
    young_done = add(conn, "done", 0.5 * HOUR, 3)
    dead_past_done_window = add(conn, "dead", 2 * HOUR, 4)  # older than keep_done, younger than keep_dead
    old_dead = add(conn, "dead", 5 * HOUR, 25)
    live = add(conn, "queued", None, 3) + add(conn, "running", None, 2)
    conn.execute("UPDATE jobsup.jobs SET created_at = now() - interval '30 days' WHERE id = ANY(%s)", (live,))
    conn.execute(
        "INSERT INTO jobsup.events (at, action, count) VALUES (now() - interval '8 days', 'reaped', 1),"
        " (now() - interval '6 days', 'reaped', 2)"
    )

    # Batches of 7: every kind of row takes several, and the round goes on until none is left.
    removed = prune(dsn, Retention(keep_done=HOUR, keep_dead=4 * HOUR), batch=BatchSize(size=7, largest=7))

    assert removed == {"done": 30, "dead": 25, "events": 1, "workflows": 0}
    assert ids(conn) == set(young_done + dead_past_done_window + live)
    assert not ids(conn) & set(old_done + old_dead)
    assert [r[0] for r in conn.execute("SELECT count FROM jobsup.events")] == [2]
    assert prune(dsn, Retention(keep_done=HOUR, keep_dead=4 * HOUR)) == {
        "done": 0,
        "dead": 0,
        "events": 0,
        "workflows": 0,
    }


def test_zero_keeps_forever(dsn, conn):
    done = add(conn, "done", 1000 * HOUR, 5)
    add(conn, "dead", 1000 * HOUR, 5)
    assert prune(dsn, Retention(keep_done=0, keep_dead=HOUR)) == {"done": 0, "dead": 5, "events": 0, "workflows": 0}
    assert ids(conn) == set(done)
    dead = add(conn, "dead", 1000 * HOUR, 2)
    assert prune(dsn, Retention(keep_done=HOUR, keep_dead=0)) == {"done": 5, "dead": 0, "events": 0, "workflows": 0}
    assert prune(dsn, Retention(keep_done=0, keep_dead=0)) == {"done": 0, "dead": 0, "events": 0, "workflows": 0}
    assert ids(conn) == set(dead)


def finished_through_the_queue(conn: psycopg.Connection) -> None:
    """Jobs done, failed and dead through the supervisor's own statements, so the totals are real."""
    client.enqueue_many(
        conn, [{"kind": "a"}] * 6 + [{"kind": "b", "max_attempts": 1}] * 3 + [{"kind": "b", "max_attempts": 2}] * 2
    )
    jobs = lifecycle.claim(conn, ["default"], 100, "sup", 30)
    lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs if j.kind == "a"], "sup")
    lifecycle.fail(conn, [Failure(j.id, j.attempts, "boom") for j in jobs if j.kind == "b"], "sup", backoff_base=0)
    again = lifecycle.claim(conn, ["default"], 100, "sup", 30)  # the two with a second attempt
    lifecycle.complete(conn, [(j.id, j.attempts) for j in again], "sup")


def test_per_kind_totals_keep_every_job_ever_done_and_dead_means_dead_now(dsn, conn):
    finished_through_the_queue(conn)
    before = totals(conn)
    assert before == {"a": (6, 0, 0), "b": (2, 5, 3)}
    conn.execute("UPDATE jobsup.jobs SET done_at = now() - interval '30 days'")

    assert prune(dsn, Retention(keep_done=HOUR, keep_dead=HOUR)) == {"done": 8, "dead": 3, "events": 0, "workflows": 0}

    # done and failed count every job and attempt ever; dead is what one can still requeue.
    assert totals(conn) == {"a": (6, 0, 0), "b": (2, 5, 0)}
    assert status_counts(conn) == {}


def test_a_requeued_dead_job_keeps_its_id_and_history_and_is_not_pruned(dsn, conn):
    [job_id] = client.enqueue_many(conn, [{"kind": "b", "max_attempts": 1}])
    [job] = lifecycle.claim(conn, ["default"], 1, "sup", 30)
    lifecycle.fail(conn, [Failure(job.id, job.attempts, "boom", "Traceback ...")], "sup")
    conn.execute("UPDATE jobsup.jobs SET done_at = now() - interval '30 days'")
    assert control.requeue_dead(conn, ids=[job_id]) == [job_id]

    assert prune(dsn, Retention(keep_done=1, keep_dead=1)) == {"done": 0, "dead": 0, "events": 0, "workflows": 0}
    status, errors, last_error = conn.execute(
        "SELECT status, errors, last_error FROM jobsup.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert (status, last_error) == ("queued", "boom")
    assert [(e["attempt"], e["error"]) for e in errors] == [(1, "boom")]
    assert totals(conn)["b"] == (0, 1, 0)


def test_a_dead_job_locked_by_a_requeue_is_stepped_over_not_waited_for(dsn, conn):
    locked, *others = add(conn, "dead", 30 * 24 * HOUR, 4)
    with psycopg.connect(dsn) as requeuer:
        requeuer.execute("SELECT 1 FROM jobsup.jobs WHERE id = %s FOR UPDATE", (locked,))
        started = time.monotonic()
        assert prune(dsn, Retention(keep_dead=HOUR))["dead"] == 3
        assert time.monotonic() - started < 10  # it did not wait for the lock (which is held for good)
        requeuer.rollback()
    assert ids(conn) == {locked}


def logged(sups) -> tuple[int, int]:
    """Done and dead jobs the supervisors' `pruned` lines say they deleted, summed."""
    logs = [sup.log() for sup in sups]
    return (
        sum(int(n) for log in logs for n in re.findall(r"\bpruned\b.*? done=(\d+)", log)),
        sum(int(n) for log in logs for n in re.findall(r"\bpruned\b.*? dead=(\d+)", log)),
    )


def test_two_supervisors_prune_each_row_once_without_blocking_a_claim(dsn, conn, start):
    add(conn, "done", 30 * 24 * HOUR, 40_000)
    add(conn, "dead", 30 * 24 * HOUR, 4_000, kind="d")
    conn.execute("INSERT INTO jobsup.kind_totals (kind, slot, dead) VALUES ('d', 0, 4000)")
    # Ready jobs on a queue neither supervisor works: the probe claims them (and rolls back) meanwhile.
    client.enqueue_many(conn, [{"kind": "probe", "queue": "probe"}] * 200)
    claims: list[float] = []
    errors: list[str] = []
    stop = threading.Event()

    def probe() -> None:
        # A claim that waited for any lock held by the pruners for more than 10 ms would fail here.
        with psycopg.connect(dsn, options="-c lock_timeout=10ms") as c:
            while not stop.is_set():
                started = time.perf_counter()
                try:
                    got = lifecycle.claim(c, ["probe"], 100, "probe", 30)
                    assert len(got) == 100
                except Exception as exc:
                    errors.append(repr(exc))
                claims.append(time.perf_counter() - started)
                c.rollback()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        flags = ("--keep-done", "1h", "--keep-dead", "1h", "--prune-interval", "20ms")
        sups = [start(*flags), start(*flags)]
        # Both up before anything is judged: on a loaded machine one could prune it all while the other
        # still imports, and a SIGTERM then meets a process with no handler yet (it dies by the signal).
        for sup in sups:
            sup.wait_ready()
        wait_for(lambda: status_counts(conn) == {"queued": 200}, timeout=120, message="every old row pruned")
        # A round is logged when it ends, which may be a moment after its last batch.
        wait_for(lambda: logged(sups) == (40_000, 4_000), timeout=30, message="both rounds logged")
    finally:
        stop.set()
        prober.join()
    for sup in sups:
        assert sup.stop() == 0

    assert logged(sups) == (40_000, 4_000), [sup.log() for sup in sups]  # each row once
    assert totals(conn)["d"] == (0, 0, 0)  # lowered once per pruned dead job, never twice
    assert errors == []
    assert len(claims) > 10
    print(f"claims during pruning: {len(claims)}, slowest {max(claims) * 1000:.1f} ms")


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_prune_command_dry_run_changes_nothing_and_the_real_run_says_what_it_deleted(dsn, conn):
    finished_through_the_queue(conn)
    conn.execute("UPDATE jobsup.jobs SET done_at = now() - interval '3 days' WHERE kind = 'a'")
    conn.execute("UPDATE jobsup.jobs SET done_at = now() - interval '8 days' WHERE status = 'dead'")
    before = (ids(conn), totals(conn))

    result = jobsup("prune", "--dsn", dsn, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "would delete 6 done jobs, 3 dead jobs, 0 events, 0 workflows (kept: done 24h, dead 7d"
    )
    dry = json.loads(jobsup("prune", "--dsn", dsn, "--dry-run", "--json", "--keep-dead", "10d").stdout)
    assert (dry["dry_run"], dry["done"], dry["dead"], dry["keep_dead"]) == (True, 6, 0, 864000.0)
    assert (ids(conn), totals(conn)) == before

    result = jobsup("prune", "--dsn", dsn, "--keep-done", "0")
    assert result.stdout.startswith(
        "deleted 0 done jobs, 3 dead jobs, 0 events, 0 workflows (kept: done forever, dead 7d"
    )
    assert status_counts(conn) == {"done": 8}
    result = jobsup("prune", "--dsn", dsn, "--json")
    assert json.loads(result.stdout)["done"] == 6
    assert status_counts(conn) == {"done": 2}


@pytest.mark.parametrize(
    "args",
    [
        ("prune", "--keep-done", "-1"),
        ("prune", "--keep-dead", "5x"),
        ("prune", "--keep-done", "1 day"),
        ("start", "--app", "examples.misbehave:app", "--keep-dead", "-2h"),
        ("start", "--app", "examples.misbehave:app", "--prune-interval", "0"),
    ],
)
def test_bad_retention_input_is_one_line_and_exit_2(dsn, conn, args):
    add(conn, "done", 30 * 24 * HOUR, 3)
    result = jobsup(*args, "--dsn", dsn)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert status_counts(conn) == {"done": 3}


@pytest.mark.slow  # the CLI in a subprocess
def test_bad_retention_from_the_environment_is_refused_too(dsn):
    from .helpers import cli_env

    for command in (("prune",), ("start", "--app", "examples.misbehave:app")):
        result = jobsup(*command, "--dsn", dsn, env=cli_env(JOBSUP_KEEP_DONE="soon"))
        assert result.returncode == 2, result.stderr
        assert "not a duration: 'soon'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_dry_run_counts_what_a_prune_then_removes(dsn, conn):
    add(conn, "done", 2 * HOUR, 11)
    add(conn, "dead", 2 * HOUR, 5)
    retention = Retention(keep_done=HOUR, keep_dead=HOUR)

    async def count():
        conn_ = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            return (await aprunable(conn_, retention)).to_json()
        finally:
            await conn_.close()

    assert asyncio.run(count()) == {"done": 11, "dead": 5, "events": 0, "workflows": 0} == prune(dsn, retention)
