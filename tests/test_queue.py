"""The queue core against a real PostgreSQL: enqueue, claim, outcomes, leases, reaping, requeueing."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import queue as std_queue
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure
from jobsup.db.notify import JobsQueued, decode
from jobsup.errors import BadInput, PayloadTooLarge
from jobsup.job import EncodedPayload, JobSpec
from jobsup.ops import control
from jobsup.ops.snapshot import rows, snapshot

from .helpers import notifications_before_marker, wait_for

# --- helpers -------------------------------------------------------------------------------------


def job_row(conn: psycopg.Connection, job_id: int) -> dict:
    [row] = rows(conn, "job", id=job_id)
    return row


def count(conn: psycopg.Connection, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) FROM jobsup.jobs WHERE {where}").fetchone()[0]


def db_clock(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def totals(conn: psycopg.Connection) -> dict[str, tuple[int, int, int]]:
    return {r["kind"]: (r["done"], r["failed"], r["dead"]) for r in rows(conn, "kind_totals")}


def claim_one(conn: psycopg.Connection, locked_by: str = "sup-a", lease: float = 30, queues=("default",)):
    [job] = lifecycle.claim(conn, list(queues), 1, locked_by, lease)
    return job


def bury(conn: psycopg.Connection, jobs: list[tuple[str, str]], locked_by: str = "sup-a") -> list[int]:
    """Make one dead job per (kind, error); their ids in input order."""
    ids = client.enqueue_many(
        conn, [{"kind": kind, "payload": {"n": n}, "max_attempts": 1} for n, (kind, _) in enumerate(jobs)]
    )
    claimed = {j.id: j for j in lifecycle.claim(conn, ["default"], len(jobs), locked_by, 30)}
    assert sorted(claimed) == sorted(ids)
    failures = [Failure(job_id, claimed[job_id].attempts, error) for job_id, (_, error) in zip(ids, jobs, strict=True)]
    outcomes = lifecycle.fail(conn, failures, locked_by)
    assert {o.status for o in outcomes} == {"dead"}
    return ids


@pytest.fixture
def listener(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("LISTEN jobsup")
        yield connection


# --- enqueue -------------------------------------------------------------------------------------


def test_enqueue_defaults(conn):
    job_id = client.enqueue(conn, "email", {"to": "a@example.com"})
    row = job_row(conn, job_id)
    assert row["kind"] == "email" and row["payload"] == {"to": "a@example.com"}
    assert (row["queue"], row["status"], row["priority"], row["attempts"], row["max_attempts"]) == (
        "default",
        "queued",
        0,
        0,
        3,
    )
    assert row["run_at"] == row["created_at"]
    assert row["errors"] == [] and row["last_error"] is None and row["locked_by"] is None
    assert job_row(conn, client.enqueue(conn, "ping"))["payload"] == {}


def test_enqueue_options(conn):
    job_id = client.enqueue(conn, "report", {"ids": [1, 2]}, queue="slow", priority=-7, delay=1.5, max_attempts=9)
    row = job_row(conn, job_id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["payload"]) == ("slow", -7, 9, {"ids": [1, 2]})
    assert row["run_at"] - row["created_at"] == timedelta(seconds=1.5)

    when = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    row = job_row(conn, client.enqueue(conn, "report", run_at=when))
    assert row["run_at"] == when
    # delay counts from run_at when both are given
    row = job_row(conn, client.enqueue(conn, "report", run_at=when, delay=60))
    assert row["run_at"] == when + timedelta(seconds=60)

    spec = JobSpec("report", {"a": 1}, queue="q2", priority=3, unique_key="r-1")
    row = job_row(conn, client.enqueue(conn, spec))
    assert (row["queue"], row["priority"], row["unique_key"], row["payload"]) == ("q2", 3, "r-1", {"a": 1})


BAD_INPUTS = [
    (("",), {}),
    (("   ",), {}),
    ((None,), {}),
    (("k",), {"priority": "1"}),
    (("k",), {"priority": 1.5}),
    (("k",), {"priority": True}),
    (("k",), {"priority": 2**31}),
    (("k",), {"delay": -1}),
    (("k",), {"delay": float("nan")}),
    (("k",), {"delay": "5s"}),
    (("k",), {"max_attempts": 0}),
    (("k",), {"max_attempts": -1}),
    (("k",), {"max_attempts": 2.5}),
    (("k",), {"run_at": datetime(2030, 1, 1)}),  # naive
    (("k",), {"run_at": "2030-01-01T00:00:00+00:00"}),
    (("k", object()), {}),
    (("k", {"x": float("nan")}), {}),
    (("k", {1, 2}), {}),
    (("k", {"nul": "a\x00b"}), {}),  # JSON, but jsonb cannot store U+0000
    (("k",), {"queue": ""}),
    (("k",), {"unique_key": ""}),
    (("k",), {"no_such_option": 1}),
]


def test_enqueue_refuses_bad_input(conn):
    # one database for all the cases: each must be refused before anything reaches it
    for args, opts in BAD_INPUTS:
        with pytest.raises(BadInput):
            client.enqueue(conn, *args, **opts)
            pytest.fail(f"enqueue{args!r} with {opts!r} was accepted")
        bad = {"kind": args[0], "payload": args[1] if len(args) > 1 else None, **opts}
        with pytest.raises(BadInput):
            client.enqueue_many(conn, [{"kind": "fine"}, bad])
            pytest.fail(f"enqueue_many with {bad!r} was accepted")
    assert count(conn) == 0
    # the NUL check is not fooled by an escaped backslash followed by "u0000"
    assert client.enqueue(conn, "k", {"text": "a\\u0000b"}) is not None


def test_payload_size_limit(conn):
    limit = 1_000_000  # MAX_PAYLOAD_BYTES, compact JSON bytes
    at_limit = {"x": "x" * (limit - 8)}  # {"x":"…"} around it makes it exactly the limit
    assert client.enqueue(conn, "big", at_limit) is not None
    with pytest.raises(PayloadTooLarge, match="JOBSUP_MAX_PAYLOAD"):
        client.enqueue(conn, "big", {"x": at_limit["x"] + "x"})
    # the limit is in bytes, not characters
    with pytest.raises(PayloadTooLarge):
        client.enqueue(conn, "big", {"x": "é" * (limit // 2)})
    # A payload the CLI encoded already is stored as that JSON, and still held to the limit.
    assert client.enqueue(conn, "pre", EncodedPayload('{"a":[1,"b"]}')) is not None
    assert client.enqueue(conn, "pre", EncodedPayload('{"s":"x"}')) is not None  # stored as given, not re-encoded
    with pytest.raises(PayloadTooLarge):
        client.enqueue(conn, "pre", EncodedPayload(json.dumps({"x": at_limit["x"] + "x"})))
    assert [r[0] for r in conn.execute("SELECT payload FROM jobsup.jobs WHERE kind = 'pre' ORDER BY id")] == [
        {"a": [1, "b"]},
        {"s": "x"},
    ]
    assert count(conn) == 3


def test_enqueue_many_maps_ids_to_inputs(conn):
    live = client.enqueue(conn, "k", {"n": "live"}, unique_key="live")
    inputs = [
        {"kind": "k", "payload": {"n": 0}, "unique_key": "x"},
        {"kind": "k", "payload": {"n": 1}},
        {"kind": "k", "payload": {"n": 2}, "unique_key": "x"},  # duplicate earlier in the batch
        {"kind": "k", "payload": {"n": 3}, "unique_key": "y"},
        {"kind": "k", "payload": {"n": 4}, "unique_key": "live"},  # a queued job has it
        {"kind": "k", "payload": {"n": 5}},
        JobSpec("k", {"n": 6}, unique_key="y"),
        JobSpec("k", {"n": 7}, unique_key="z"),
    ]
    ids = client.enqueue_many(conn, inputs)
    assert len(ids) == len(inputs)
    assert [i is None for i in ids] == [False, False, True, False, True, False, True, False]
    for n, job_id in enumerate(ids):
        if job_id is not None:
            assert job_row(conn, job_id)["payload"] == {"n": n}
    assert count(conn) == 1 + 5
    assert job_row(conn, live)["payload"] == {"n": "live"}
    assert client.enqueue_many(conn, []) == []


def test_unique_key_dedup_and_reuse(conn):
    first = client.enqueue(conn, "k", {"v": 1}, unique_key="K")
    assert first is not None
    assert client.enqueue(conn, "k", {"v": 2}, unique_key="K") is None
    job = claim_one(conn)
    assert client.enqueue(conn, "k", {"v": 3}, unique_key="K") is None  # running still holds the key
    assert lifecycle.complete(conn, [(job.id, job.attempts)], "sup-a") == [first]
    second = client.enqueue(conn, "k", {"v": 4}, unique_key="K")  # a done job's key is free again
    assert second is not None and second != first
    assert client.enqueue_many(conn, [{"kind": "k", "unique_key": "K"}]) == [None]
    assert count(conn, "unique_key = 'K'") == 2


def test_transactional_enqueue(dsn, conn, listener):
    with psycopg.connect(dsn) as tx:  # not autocommit: enqueue joins the caller's transaction
        client.enqueue(tx, "email", {"n": 1})
        client.enqueue_many(tx, [{"kind": "email"}, {"kind": "email"}])
        assert notifications_before_marker(listener, conn) == []
        assert count(conn) == 0
        tx.rollback()
        assert notifications_before_marker(listener, conn) == []
        assert count(conn) == 0

        job_id = client.enqueue(tx, "email", {"n": 2})
        assert count(conn) == 0
        assert notifications_before_marker(listener, conn) == []  # not before commit
        tx.commit()
        [note] = notifications_before_marker(listener, conn)
        assert decode(note.payload).queues == ("default",)
        assert count(conn) == 1 and job_row(conn, job_id)["payload"] == {"n": 2}


@pytest.mark.slow  # 30,000 jobs enqueued
def test_one_notify_per_insert_statement(conn, listener):
    ids = client.enqueue_many(conn, [{"kind": "bulk", "payload": {"n": n}} for n in range(10_000)])
    assert len(ids) == 10_000 and None not in ids and ids == sorted(ids)
    [note] = notifications_before_marker(listener, conn)
    assert len(note.payload.encode()) < 8000
    earliest = conn.execute("SELECT extract(epoch FROM min(run_at))::float8 FROM jobsup.jobs").fetchone()[0]
    assert decode(note.payload) == JobsQueued(("default",), earliest)

    # a few queues are named; many queues (or long names) become [] ("look at every queue")
    client.enqueue_many(conn, [{"kind": "bulk", "queue": f"q{n % 3}"} for n in range(10_000)])
    [note] = notifications_before_marker(listener, conn)
    assert decode(note.payload).queues == ("q0", "q1", "q2")
    client.enqueue_many(conn, [{"kind": "bulk", "queue": f"queue-{n % 500}" * 20} for n in range(10_000)])
    [note] = notifications_before_marker(listener, conn)
    assert len(note.payload.encode()) < 8000 and decode(note.payload).queues == ()

    # a statement that inserts nothing (every key live already) sends nothing
    client.enqueue(conn, "k", unique_key="u")
    assert len(notifications_before_marker(listener, conn)) == 1
    assert client.enqueue_many(conn, [{"kind": "k", "unique_key": "u"}] * 3) == [None] * 3
    assert notifications_before_marker(listener, conn) == []


def test_async_forms(dsn):
    asyncio.run(_async_forms(dsn))


async def _async_forms(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        job_id = await client.aenqueue(aconn, "a", {"x": 1})
        assert await client.aenqueue_many(
            aconn, [{"kind": "a"}, {"kind": "a", "unique_key": "k"}, {"kind": "a", "unique_key": "k"}]
        ) == [job_id + 1, job_id + 2, None]
        jobs = await lifecycle.aclaim(aconn, ["default"], 10, "sup-a", 30)
        assert [j.id for j in jobs] == [job_id, job_id + 1, job_id + 2]
        assert await lifecycle.acomplete(aconn, [(jobs[0].id, 1)], "sup-a") == [job_id]
        [outcome] = await lifecycle.afail(aconn, [Failure(jobs[1].id, 1, "e")], "sup-a")
        assert outcome.status == "queued"
        assert await lifecycle.aextend(aconn, [(jobs[2].id, 1)], "sup-a", 60) == [jobs[2].id]
        assert await lifecycle.arelease(aconn, [(jobs[2].id, 1)], "sup-a") == [jobs[2].id]
        assert await lifecycle.areap(aconn, "reaper") == []
        assert await control.arequeue_dead(aconn) == []


# --- claim ---------------------------------------------------------------------------------------


def test_claim_order_filter_and_limit(conn):
    base = db_clock(conn) - timedelta(minutes=1)
    c = client.enqueue(conn, "k", {"n": "c"}, priority=5, run_at=base + timedelta(seconds=5))
    a = client.enqueue(conn, "k", {"n": "a"}, priority=0, run_at=base + timedelta(seconds=10))
    b = client.enqueue(conn, "k", {"n": "b"}, priority=5, run_at=base + timedelta(seconds=9))
    d = client.enqueue(conn, "k", {"n": "d"}, priority=5, run_at=base + timedelta(seconds=5))  # ties c: id
    e = client.enqueue(conn, "k", {"n": "e"}, priority=0, run_at=base)
    f = client.enqueue(conn, "k", {"n": "f"}, priority=-1, run_at=base - timedelta(seconds=30))
    later = client.enqueue(conn, "k", {"n": "later"}, priority=100, delay=3600)
    other = client.enqueue(conn, "k", {"n": "other"}, priority=100, queue="other")

    assert lifecycle.claim(conn, ["default"], 0, "sup-a", 30) == []
    two = lifecycle.claim(conn, ["default"], 2, "sup-a", 30)
    assert [j.id for j in two] == [c, d]
    order = [claim_one(conn).id for _ in range(4)]
    assert order == [b, e, a, f]
    assert lifecycle.claim(conn, ["default"], 10, "sup-a", 30) == []  # `later` is in the future
    assert lifecycle.claim(conn, ["nope"], 10, "sup-a", 30) == []
    [job] = lifecycle.claim(conn, ["nope", "other"], 10, "sup-b", 30)
    assert job.id == other and job.queue == "other"
    assert job_row(conn, later)["status"] == "queued"


def test_upcoming_lists_future_run_ats_of_every_priority_soonest_first(conn):
    now = db_clock(conn)
    at = {n: now + timedelta(seconds=n * 60) for n in range(1, 6)}
    client.enqueue(conn, "k", run_at=at[3], priority=7)
    client.enqueue(conn, "k", run_at=at[1], priority=-2)
    client.enqueue(conn, "k", run_at=at[4], priority=0)
    client.enqueue(conn, "k", run_at=at[2], priority=0, queue="other")
    client.enqueue(conn, "k", run_at=at[5], priority=7, queue="elsewhere")  # a queue not asked about
    client.enqueue(conn, "k", priority=9)  # ready now: not upcoming
    running = client.enqueue(conn, "k", run_at=now + timedelta(hours=1))
    conn.execute("UPDATE jobsup.jobs SET status = 'running' WHERE id = %s", [running])

    epochs = [at[n].timestamp() for n in (1, 2, 3, 4)]
    assert lifecycle.upcoming(conn, ["default", "other"]) == pytest.approx(epochs)
    assert lifecycle.upcoming(conn, ["default", "other"], limit=2) == pytest.approx(epochs[:2])
    assert lifecycle.upcoming(conn, ["nope"]) == []


def test_a_claim_as_text_gives_the_json_columns_as_postgresql_wrote_them_on_any_connection(conn):
    """The supervisor's claims (lifecycle.claim_text, claim_limited_text) hand the JSON columns to its
    workers as text, on a connection that decodes JSON (this one) as on one that does not; the same
    claim through lifecycle.claim decodes them."""
    from jobsup.job import Claimed
    from jobsup.limits import Limits
    from jobsup.ops.limits import declare

    declare(conn, {"lim": Limits(concurrency=1)}, ["lim"], "sup-a")
    plain = client.enqueue(conn, "k", {"p": [1, "é"]}, meta={"t": "x"})
    limited = client.enqueue(conn, "lim", {"q": 2})
    [job] = lifecycle.claim_text(conn, ["default"], 5, "sup-a", 30)
    assert type(job) is Claimed and job.id == plain
    assert (job.payload, job.errors, job.meta) == ('{"p": [1, "é"]}', None, '{"t": "x"}')
    assert lifecycle.fail(conn, [Failure(job.id, 1, "boom")], "sup-a", backoff_base=0, jitter=0)
    [again] = lifecycle.claim(conn, ["default"], 5, "sup-a", 30)
    assert (again.payload, again.meta, [e["error"] for e in again.errors]) == ({"p": [1, "é"]}, {"t": "x"}, ["boom"])
    [held], _ = lifecycle.claim_limited_text(conn, ["lim"], ["default"], 5, "sup-a", 30)
    assert type(held) is Claimed and (held.id, held.payload, held.meta) == (limited, '{"q": 2}', None)
    assert conn.execute("""SELECT '{"a": 1}'::jsonb""").fetchone() == ({"a": 1},)  # the connection's own loaders


def test_claim_sets_lease_and_counts_attempts(conn):
    job_id = client.enqueue(conn, "k", {"p": 1}, priority=2, max_attempts=4)
    before = db_clock(conn)
    job = claim_one(conn, "sup-a", lease=45)
    after = db_clock(conn)
    assert (job.id, job.kind, job.queue, job.payload, job.priority, job.attempts, job.max_attempts) == (
        job_id,
        "k",
        "default",
        {"p": 1},
        2,
        1,
        4,
    )
    row = job_row(conn, job_id)
    assert row["status"] == "running" and row["locked_by"] == "sup-a" and row["attempts"] == 1
    assert before <= row["started_at"] <= after
    assert before + timedelta(seconds=45) <= row["locked_until"] <= after + timedelta(seconds=45)

    lifecycle.fail(conn, [Failure(job_id, 1, "boom")], "sup-a", backoff_base=0.001, jitter=0)
    job = wait_for(lambda: lifecycle.claim(conn, ["default"], 1, "sup-b", 30), message="the retry")[0]
    assert job.attempts == 2 and job_row(conn, job_id)["locked_by"] == "sup-b"


def _claimer(dsn: str, barrier, results, batch: int) -> None:
    """A child process: claim in batches and complete until nothing is left; report what it handled."""
    name = f"claimer-{multiprocessing.current_process().pid}"
    handled: list[int] = []
    completed: list[int] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait(timeout=60)
            first = True
            while True:
                jobs = lifecycle.claim(conn, ["default"], batch, name, 60)
                if first:
                    # Every claimer holds its first batch before any goes on, so each takes part
                    # whichever the scheduler runs first (on a loaded machine one could drain it all).
                    barrier.wait(timeout=60)
                    first = False
                if not jobs:
                    break
                handled.extend(j.id for j in jobs)
                completed.extend(lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs], name))
    except BaseException as exc:  # reported to the test, which fails with it at once
        results.put((name, f"{type(exc).__name__}: {exc}", []))
        raise
    results.put((name, handled, completed))


@pytest.mark.slow  # claimer processes
def test_concurrent_claimers_handle_every_job_once(dsn, conn):
    ids = client.enqueue_many(conn, [{"kind": "work", "payload": {"n": n}} for n in range(1000)])
    ctx = multiprocessing.get_context("spawn")
    procs = 8
    barrier = ctx.Barrier(procs)
    results = ctx.Queue()
    children = [ctx.Process(target=_claimer, args=(dsn, barrier, results, 3 + i * 2)) for i in range(procs)]
    for child in children:
        child.start()
    try:
        reports = []
        for _ in children:
            try:
                reports.append(results.get(timeout=60))
            except std_queue.Empty:
                raise AssertionError(f"only {len(reports)} of {procs} claimers reported") from None
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    assert [got for _, got, _ in reports if isinstance(got, str)] == []  # no claimer failed
    assert [child.exitcode for child in children] == [0] * procs
    handled = [job_id for _, got, _ in reports for job_id in got]
    assert len(handled) == 1000 and sorted(handled) == sorted(ids)  # every id exactly once
    for _, got, completed in reports:
        assert sorted(got) == sorted(completed)  # no claim was taken from under its claimer
    assert sum(1 for _, got, _ in reports if got) == procs  # each took part
    assert count(conn, "status = 'done' AND attempts = 1") == 1000
    assert totals(conn)["work"] == (1000, 0, 0)


# --- fail ----------------------------------------------------------------------------------------


def test_fail_backoff_history_and_burial(conn):
    job_id = client.enqueue(conn, "flaky", max_attempts=4)
    base, cap = 0.02, 0.05
    expected = [0.02, 0.04, 0.05]  # base * 2^(attempt-1), capped
    for attempt in range(1, 5):
        job = wait_for(lambda: lifecycle.claim(conn, ["default"], 1, "sup-a", 30), message=f"attempt {attempt}")[0]
        assert (job.id, job.attempts) == (job_id, attempt)
        before = db_clock(conn)
        [outcome] = lifecycle.fail(
            conn,
            [Failure(job_id, attempt, f"error {attempt}", f"Traceback {attempt}")],
            "sup-a",
            backoff_base=base,
            backoff_cap=cap,
            jitter=0,
        )
        after = db_clock(conn)
        row = job_row(conn, job_id)
        assert row["last_error"] == f"error {attempt}" and row["attempts"] == attempt
        assert len(row["errors"]) == attempt
        entry = row["errors"][-1]
        assert (entry["attempt"], entry["error"], entry["traceback"], entry["by"]) == (
            attempt,
            f"error {attempt}",
            f"Traceback {attempt}",
            "sup-a",
        )
        if attempt < 4:
            delay = timedelta(seconds=expected[attempt - 1])
            assert outcome.status == "queued" and row["status"] == "queued"
            assert row["locked_by"] is None and row["locked_until"] is None and row["done_at"] is None
            slack = timedelta(milliseconds=1)
            assert before + delay - slack <= row["run_at"] <= after + delay + slack
            assert outcome.run_at == row["run_at"]
        else:
            assert outcome.status == "dead" and row["status"] == "dead"
            assert before <= row["done_at"] <= after
            assert row["last_error"] == "error 4"
    assert [e["attempt"] for e in job_row(conn, job_id)["errors"]] == [1, 2, 3, 4]
    assert lifecycle.claim(conn, ["default"], 10, "sup-a", 30) == []
    assert totals(conn)["flaky"] == (0, 4, 1)


def test_fail_default_backoff_and_jitter(conn):
    ids = client.enqueue_many(conn, [{"kind": "k"} for _ in range(20)])
    jobs = lifecycle.claim(conn, ["default"], 20, "sup-a", 30)
    before = db_clock(conn)
    outcomes = lifecycle.fail(conn, [Failure(j.id, 1, "e") for j in jobs[:10]], "sup-a", backoff_base=100, jitter=0.5)
    outcomes += lifecycle.fail(conn, [Failure(j.id, 1, "e") for j in jobs[10:]], "sup-a")  # 1s less up to 10%
    after = db_clock(conn)
    assert sorted(o.id for o in outcomes) == sorted(ids)
    for o in outcomes[:10]:
        assert before + timedelta(seconds=50) <= o.run_at <= after + timedelta(seconds=100)
    for o in outcomes[10:]:
        assert before + timedelta(seconds=0.9) <= o.run_at <= after + timedelta(seconds=1)
    assert job_row(conn, ids[0])["errors"][0]["traceback"] is None
    # the cap holds however many attempts were made, with no overflow
    job_id = client.enqueue(conn, "k", max_attempts=1000)
    conn.execute("UPDATE jobsup.jobs SET attempts = 500 WHERE id = %s", (job_id,))
    job = claim_one(conn)
    before = db_clock(conn)
    [o] = lifecycle.fail(conn, [Failure(job_id, job.attempts, "e")], "sup-a", backoff_cap=7, jitter=0)
    assert before + timedelta(seconds=7) <= o.run_at <= db_clock(conn) + timedelta(seconds=7)


# --- reap, extend, release -----------------------------------------------------------------------


def test_reap_expired_lease(conn):
    a = client.enqueue(conn, "k", max_attempts=3)
    b = client.enqueue(conn, "other-kind", max_attempts=1)
    jobs = lifecycle.claim(conn, ["default"], 2, "sup-dead", 0.05)
    assert {j.id for j in jobs} == {a, b}
    reaped = wait_for(lambda: lifecycle.reap(conn, "reaper-1"), message="expired leases")
    assert [(o.id, o.status) for o in reaped] == [(a, "queued"), (b, "dead")]
    ra, rb = job_row(conn, a), job_row(conn, b)
    assert (ra["status"], ra["attempts"], ra["locked_by"], ra["locked_until"]) == ("queued", 1, None, None)
    assert "lease expired" in ra["last_error"] and "sup-dead" in ra["last_error"]
    assert [(e["attempt"], e["by"]) for e in ra["errors"]] == [(1, "reaper-1")]
    assert ra["errors"][0]["error"] == ra["last_error"]
    assert rb["status"] == "dead" and rb["done_at"] is not None and "lease expired" in rb["last_error"]
    [event] = rows(conn, "recent_events", limit=10)
    assert (event["action"], event["supervisor"], event["count"], event["job_ids"]) == ("reaped", "reaper-1", 2, [a, b])
    assert event["detail"] == {"from": ["sup-dead"], "dead": 1}
    assert totals(conn) == {"k": (0, 1, 0), "other-kind": (0, 1, 1)}
    # the returned job runs again, its lost attempt counted
    assert claim_one(conn).attempts == 2
    assert lifecycle.reap(conn, "reaper-1") == []
    assert len(rows(conn, "recent_events", limit=10)) == 1  # a pass that returned nothing records nothing


def test_extend_keeps_a_lease_alive(conn):
    a = client.enqueue(conn, "k")
    b = client.enqueue(conn, "k")
    lifecycle.claim(conn, ["default"], 2, "sup-a", 0.5)
    before = db_clock(conn)
    assert lifecycle.extend(conn, [(a, 1)], "sup-a", 60) == [a]
    assert job_row(conn, a)["locked_until"] >= before + timedelta(seconds=60)
    reaped = wait_for(lambda: lifecycle.reap(conn, "reaper"), message="b's lease to expire")
    assert [o.id for o in reaped] == [b]
    assert job_row(conn, a)["status"] == "running"
    # extend returns only the ids still held
    assert lifecycle.extend(conn, [(a, 1), (b, 1)], "sup-a", 60) == [a]
    assert lifecycle.complete(conn, [(a, 1)], "sup-a") == [a]
    assert lifecycle.extend(conn, [(a, 1), (b, 1)], "sup-a", 60) == []


def test_release_gives_the_attempt_back(conn):
    a = client.enqueue(conn, "k")
    b = client.enqueue(conn, "k")
    lifecycle.claim(conn, ["default"], 2, "sup-a", 30)
    assert lifecycle.release(conn, [(a, 1)], "sup-a") == [a]
    row = job_row(conn, a)
    assert (row["status"], row["attempts"], row["locked_by"], row["locked_until"], row["started_at"]) == (
        "queued",
        0,
        None,
        None,
        None,
    )
    assert row["errors"] == [] and row["last_error"] is None
    assert lifecycle.release(conn, [(b, 1)], "sup-a", ["interrupted by shutdown"]) == [b]
    row = job_row(conn, b)
    assert (row["status"], row["attempts"], row["last_error"]) == ("queued", 0, "interrupted by shutdown")
    assert [(e["attempt"], e["error"], e["by"]) for e in row["errors"]] == [(1, "interrupted by shutdown", "sup-a")]
    jobs = lifecycle.claim(conn, ["default"], 2, "sup-b", 30)
    assert [(j.id, j.attempts) for j in jobs] == [(a, 1), (b, 1)]
    assert totals(conn) == {}  # a release is not a failure


def test_release_notifies(conn, listener):
    client.enqueue_many(conn, [{"kind": "k", "queue": "q1"}, {"kind": "k", "queue": "q1"}])
    notifications_before_marker(listener, conn)
    jobs = lifecycle.claim(conn, ["q1"], 2, "sup-a", 30)
    assert len(lifecycle.release(conn, [(j.id, j.attempts) for j in jobs], "sup-a")) == 2
    [note] = notifications_before_marker(listener, conn)  # identical notifications fold into one
    assert decode(note.payload) == JobsQueued(("q1",))


# --- fencing -------------------------------------------------------------------------------------


def test_stale_writes_change_nothing(conn):
    job_id = client.enqueue(conn, "k", max_attempts=5)
    lifecycle.claim(conn, ["default"], 1, "sup-a", -1)  # a lease already expired
    assert [o.id for o in lifecycle.reap(conn, "reaper")] == [job_id]
    job = claim_one(conn, "sup-a", 30)  # reclaimed by the same supervisor: attempt 2
    assert job.attempts == 2
    before = job_row(conn, job_id)
    totals_before = totals(conn)

    def stale_writes(held: list[tuple[int, int]], by: str) -> None:
        assert lifecycle.complete(conn, held, by) == []
        assert lifecycle.fail(conn, [Failure(i, n, "late") for i, n in held], by) == []
        assert lifecycle.release(conn, held, by) == []
        assert lifecycle.release(conn, held, by, ["late"] * len(held)) == []
        assert lifecycle.extend(conn, held, by, 600) == []
        assert job_row(conn, job_id) == before
        assert totals(conn) == totals_before

    stale_writes([(job_id, 1)], "sup-a")  # the attempt the reaper took back
    stale_writes([(job_id, 2)], "sup-b")  # someone else's job
    stale_writes([(job_id, 3)], "sup-a")  # an attempt that never was
    assert lifecycle.complete(conn, [(job_id, 2)], "sup-a") == [job_id]
    done = job_row(conn, job_id)
    assert done["status"] == "done" and done["done_at"] is not None
    before = done
    totals_before = totals(conn)
    stale_writes([(job_id, 2)], "sup-a")  # a job that is done already
    assert totals_before["k"] == (1, 1, 0)


# --- requeue_dead and totals ---------------------------------------------------------------------


def test_requeue_dead(conn):
    ids = bury(
        conn,
        [
            ("mail", "smtp down"),
            ("mail", "bad address"),
            ("mail", "smtp down"),
            ("sms", "smtp down"),
            ("sms", "no credit"),
            ("push", "gone"),
        ],
    )
    assert totals(conn) == {"mail": (0, 3, 3), "sms": (0, 2, 2), "push": (0, 1, 1)}

    assert control.requeue_dead(conn, ids=[ids[1], 999_999]) == [ids[1]]
    row = job_row(conn, ids[1])
    assert (row["status"], row["attempts"], row["done_at"], row["locked_by"]) == ("queued", 0, None, None)
    assert [e["error"] for e in row["errors"]] == ["bad address"] and row["last_error"] == "bad address"
    assert totals(conn)["mail"] == (0, 3, 2)

    assert control.requeue_dead(conn, kind="mail", error="smtp down") == [ids[0], ids[2]]
    assert control.requeue_dead(conn, error="smtp down") == [ids[3]]
    assert control.requeue_dead(conn, kind="sms") == [ids[4]]
    assert totals(conn) == {"mail": (0, 3, 0), "sms": (0, 2, 0), "push": (0, 1, 1)}
    assert control.requeue_dead(conn) == [ids[5]]
    assert control.requeue_dead(conn) == []
    assert totals(conn)["push"] == (0, 1, 0)
    assert count(conn, "status = 'queued' AND attempts = 0 AND jsonb_array_length(errors) = 1") == 6

    # a requeued job has its full attempts again
    job = claim_one(conn, queues=["default"])
    assert job.attempts == 1 and job.max_attempts == 1


def test_requeue_dead_never_duplicates_a_unique_key(conn):
    for n in range(3):  # the same key dies three times
        job_id = client.enqueue(conn, "k", {"n": n}, unique_key="K", max_attempts=1)
        assert job_id is not None
        job = claim_one(conn)
        lifecycle.fail(conn, [Failure(job.id, 1, "boom")], "sup-a")
    other = bury(conn, [("k", "boom")])[0]
    requeued = control.requeue_dead(conn)
    assert len(requeued) == 2 and other in requeued  # one of the three, and the keyless job
    assert count(conn, "unique_key = 'K' AND status = 'queued'") == 1
    assert count(conn, "unique_key = 'K' AND status = 'dead'") == 2
    assert totals(conn)["k"] == (0, 4, 2)
    # while the key is live, the others stay dead
    assert control.requeue_dead(conn, kind="k") == []
    job = claim_one(conn)
    assert control.requeue_dead(conn) == []
    lifecycle.complete(conn, [(job.id, job.attempts)], "sup-a")
    assert len(control.requeue_dead(conn)) == 1


def test_kind_totals_sum_across_slots(dsn, conn):
    # Writers spread over slots by backend pid; open connections until two land in different slots.
    conns, slots = [], set()
    try:
        while len(slots) < 2:
            c = psycopg.connect(dsn, autocommit=True)
            slot = c.execute("SELECT mod(pg_backend_pid(), 16)").fetchone()[0]
            if slot in slots:
                c.close()
                continue
            slots.add(slot)
            conns.append(c)
        client.enqueue_many(conn, [{"kind": "a"} for _ in range(7)] + [{"kind": "b"} for _ in range(3)])
        for n, c in enumerate(conns):
            jobs = lifecycle.claim(c, ["default"], 5, f"sup-{n}", 30)
            assert lifecycle.complete(c, [(j.id, j.attempts) for j in jobs], f"sup-{n}")
        assert conn.execute("SELECT count(DISTINCT slot) FROM jobsup.kind_totals").fetchone()[0] == 2
    finally:
        for c in conns:
            c.close()
    assert totals(conn) == {"a": (7, 0, 0), "b": (3, 0, 0)}
    snap = snapshot(conn)
    assert [(k.kind, k.done, k.ready) for k in snap.kinds] == [("a", 7, 0), ("b", 3, 0)]
    assert snap.total.done == 10


def test_app_enqueue_uses_handler_defaults(conn):
    from jobsup import App

    app = App()

    @app.handler("email", max_attempts=5, queue="mail", priority=2)
    def send(job):  # pragma: no cover - never run here
        return None

    a = app.enqueue(conn, "email", {"to": "a"})
    b = app.enqueue(conn, "email", {"to": "b"}, queue="urgent", max_attempts=1)
    [c] = app.enqueue_many(conn, [{"kind": "email"}])
    d = client.enqueue(conn, "other")  # a kind the app has no handler for: the module-level enqueue
    got = {i: job_row(conn, i) for i in (a, b, c, d)}
    assert [(got[i]["queue"], got[i]["priority"], got[i]["max_attempts"]) for i in (a, b, c, d)] == [
        ("mail", 2, 5),
        ("urgent", 2, 1),
        ("mail", 2, 5),
        ("default", 0, 3),
    ]
    with pytest.raises(BadInput):
        app.enqueue(conn, "email", nonsense=1)
    with pytest.raises(BadInput):
        app.handler("email")


def test_expiring_leases_and_the_attempts_histogram(conn):
    from jobsup.ops.snapshot import rows

    client.enqueue_many(conn, [{"kind": "a"}, {"kind": "b"}, {"kind": "c"}])
    [first] = lifecycle.claim(conn, ["default"], 1, "sup-a", 5)
    [second] = lifecycle.claim(conn, ["default"], 1, "sup-b", 60)
    leases = rows(conn, "expiring_leases", limit=10)
    assert [r["id"] for r in leases] == [first.id, second.id]  # soonest first
    assert [r["locked_by"] for r in leases] == ["sup-a", "sup-b"]
    assert 0 < leases[0]["remaining"] <= 5 < leases[1]["remaining"] <= 60
    lifecycle.fail(conn, [lifecycle.Failure(first.id, 1, "boom")], "sup-a")
    histogram = {(r["status"], r["attempts"]): r["count"] for r in rows(conn, "attempts_histogram")}
    assert histogram == {("queued", 0): 1, ("queued", 1): 1, ("running", 1): 1}
