"""Middleware (jobsup.middleware): enqueue middleware that store meta with a job, through every way an
app enqueues; run middleware around sync and async handlers, in order, and what their failures do; the
meta of a job claimed by claim_limited; and all of it under a real `jobsup start`."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

import jobsup
from jobsup import App, JobSpec, Queue, Workflow, client
from jobsup.db import lifecycle
from jobsup.errors import BadInput
from jobsup.job import MAX_META_BYTES
from jobsup.ops import limits
from jobsup.testing import drain

from .apps.traced import SEEN, TENANT, tenants
from .helpers import wait_for


@pytest.fixture(autouse=True)
def acme():
    """The enqueuing code's tenant, which the enqueue middleware of `tenants` store with each job."""
    SEEN.clear()
    token = TENANT.set("acme")
    yield
    TENANT.reset(token)


def meta_of(conn: psycopg.Connection, job_id: int | None) -> dict | None:
    return conn.execute("SELECT meta FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()[0]


def row(conn: psycopg.Connection, job_id: int) -> tuple:
    return conn.execute(
        "SELECT status, last_error, errors, return_value FROM jobsup.jobs WHERE id = %s", [job_id]
    ).fetchone()


ACME = {"tenant": "acme", "seen": ["tenant"]}  # `stamped_after`, registered second, saw what `tenant` wrote


# --- enqueue middleware -------------------------------------------------------------------------------


def test_enqueue_middleware_meta_is_in_the_row_and_is_the_handlers_job_meta(conn):
    job_id = tenants.enqueue(conn, "whose", {})
    assert meta_of(conn, job_id) == ACME
    [ran] = drain(tenants, conn)
    assert ran.outcome == "done"
    # The run middleware set the tenant of the meta around the handler, as the enqueuing code had it.
    assert ran.return_value == {"tenant": "acme", "meta": ACME}


def test_every_way_an_app_enqueues_runs_its_enqueue_middleware(conn):
    one = tenants.enqueue(conn, "whose")
    many = tenants.enqueue_many(conn, [{"kind": "whose"}, JobSpec("whose", meta={"given": 1})])
    with Queue(conn.info.dsn, app=tenants) as queue:
        queued = queue.enqueue("whose")
    after = tenants.enqueue(conn, "whose", after=[one])
    workflow = tenants.workflow("flow")
    first = workflow.add("whose")
    workflow.add("whose", after=first)
    workflow.enqueue(conn)
    extending = Workflow.extending(workflow.refs[0].id, app=tenants)
    extra = extending.add("whose")
    extending.enqueue(conn)
    ids = [one, *many, queued, after, *(r.id for r in workflow.refs), extra.id]
    metas = [meta_of(conn, i) for i in ids]
    assert metas[2] == {"given": 1, "tenant": "acme", "seen": ["given", "tenant"]}  # added to what was given
    assert [m for i, m in enumerate(metas) if i != 2] == [ACME] * (len(ids) - 1)


def test_the_asyncio_forms_run_them_too(conn):
    async def enqueue() -> list[int | None]:
        async with await psycopg.AsyncConnection.connect(conn.info.dsn, autocommit=True) as aconn:
            one = await tenants.aenqueue(aconn, "whose")
            [two] = await tenants.aenqueue_many(aconn, [{"kind": "whose"}])
            workflow = tenants.workflow()
            ref = workflow.add("whose")
            await workflow.aenqueue(aconn)
            return [one, two, ref.id]

    ids = asyncio.run(enqueue())
    assert [meta_of(conn, i) for i in ids] == [ACME] * 3


def test_without_an_app_no_middleware_runs_and_meta_is_what_the_call_gives(conn):
    bare = client.enqueue(conn, "whose")
    given = jobsup.enqueue(conn, "whose", meta={"request": "r-1"})
    [none, many] = client.enqueue_many(conn, [{"kind": "whose"}, {"kind": "whose", "meta": {"b": 2}}])
    assert [meta_of(conn, i) for i in (bare, given, none, many)] == [None, {"request": "r-1"}, None, {"b": 2}]


def test_an_empty_meta_is_stored_as_none(conn):
    app = App()
    app.handler("k")(lambda job: None)
    app.enqueue_middleware(lambda spec, meta: None)
    assert meta_of(conn, app.enqueue(conn, "k", meta={})) is None


def test_meta_over_the_limit_or_not_json_is_refused_naming_the_kind_and_nothing_is_written(conn):
    app = App()
    app.handler("report")(lambda job: None)

    @app.enqueue_middleware
    def bulky(spec: JobSpec, meta: dict) -> None:
        meta["blob"] = "x" * MAX_META_BYTES

    with pytest.raises(BadInput, match=r"meta of a 'report' job is \d+ bytes, over the limit of 8192"):
        app.enqueue(conn, "report")
    with pytest.raises(BadInput, match="meta of a 'report' job is not JSON"):
        jobsup.enqueue(conn, "report", meta={"when": object()})
    with pytest.raises(BadInput, match="meta of a 'report' job must be a dict, not list"):
        jobsup.enqueue(conn, "report", meta=["a"])  # type: ignore[typeddict-item]
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0


def test_an_enqueue_middleware_that_raises_fails_the_enqueue(conn):
    app = App()
    app.handler("k")(lambda job: None)

    @app.enqueue_middleware
    def strict(spec: JobSpec, meta: dict) -> None:
        raise LookupError("no request id")

    with pytest.raises(LookupError, match="no request id"):
        app.enqueue_many(conn, [{"kind": "k"}, {"kind": "k"}])
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0


def test_a_run_middleware_must_be_a_generator_function():
    app = App()
    with pytest.raises(BadInput, match="run middleware plain must be a generator function"):

        @app.run_middleware
        def plain(job):
            return None


# --- run middleware -----------------------------------------------------------------------------------


def test_run_middleware_wrap_in_registration_order_the_first_outermost(conn):
    job_id = tenants.enqueue(conn, "whose")
    drain(tenants, conn)
    value = {"tenant": "acme", "meta": ACME}
    assert SEEN == [
        ("outer", "before", job_id),
        ("inner", "before", job_id),
        ("handler", job_id),
        ("inner", "after", job_id, "done", "NoneType", value),
        ("outer", "after", job_id, "done", "NoneType", value),
    ]


def test_async_handlers_are_wrapped_and_see_the_context_middleware_set(conn):
    job_id = tenants.enqueue(conn, "awhose")
    [ran] = drain(tenants, conn)
    assert ran.return_value == {"tenant": "acme", "meta": ACME}
    assert [s[:2] for s in SEEN] == [("outer", "before"), ("inner", "before"), ("handler", job_id)] + [
        ("inner", "after"),
        ("outer", "after"),
    ]


def test_a_run_middleware_that_raises_before_the_handler_fails_the_attempt_naming_it(conn):
    token = TENANT.set(None)
    job_id = tenants.enqueue(conn, "whose", max_attempts=1)  # no tenant in its meta
    TENANT.reset(token)
    [ran] = drain(tenants, conn)
    assert (ran.outcome, ran.error) == ("dead", "middleware tenant_context: KeyError: 'tenant'")
    status, last_error, errors, _ = row(conn, job_id)
    assert (status, last_error) == ("dead", "middleware tenant_context: KeyError: 'tenant'")
    assert "KeyError: 'tenant'" in errors[0]["traceback"]
    assert SEEN == []  # neither the middleware inside it nor the handler ran


def test_the_middleware_outside_one_that_raises_see_its_failure(conn):
    job_id = tenants.enqueue(conn, "whose", {"inner_fails": "before"}, max_attempts=1)
    [ran] = drain(tenants, conn)
    assert ran.error == "middleware inner: LookupError: inner, before"
    assert SEEN == [
        ("outer", "before", job_id),
        ("inner", "before", job_id),
        ("outer", "after", job_id, "failed", "LookupError", None),
    ]


def test_a_run_middleware_that_raises_after_a_done_handler_fails_the_attempt(conn):
    job_id = tenants.enqueue(conn, "whose", {"inner_fails": "after"}, max_attempts=2)
    runs = drain(tenants, conn, with_scheduled=True, backoff_base=0.001)
    assert [(r.outcome, r.error) for r in runs] == [("failed", "middleware inner: ValueError: inner, after")] + [
        ("dead", "middleware inner: ValueError: inner, after")
    ]
    assert SEEN[-1] == ("outer", "after", job_id, "failed", "ValueError", None)
    assert row(conn, job_id)[3] is None  # no return value: the attempt did not end done


def test_a_handlers_failure_stays_the_error_and_a_middlewares_after_it_is_told_in_the_traceback(conn):
    job_id = tenants.enqueue(conn, "whose", {"fail": True, "inner_fails": "after"}, max_attempts=1)
    [ran] = drain(tenants, conn)
    assert ran.error == "RuntimeError: the handler fails"
    traceback = row(conn, job_id)[2][0]["traceback"]
    assert "RuntimeError: the handler fails" in traceback
    assert "Then middleware inner: ValueError: inner, after" in traceback
    assert traceback.index("the handler fails") < traceback.index("Then middleware inner")


def test_a_middleware_may_snooze_as_a_handler_does(conn):
    job_id = tenants.enqueue(conn, "whose", {"inner_snoozes": True})
    [ran] = drain(tenants, conn)
    assert ran.outcome == "snoozed"
    assert conn.execute("SELECT status, snoozes FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone() == ("queued", 1)
    assert SEEN == [
        ("outer", "before", job_id),
        ("inner", "before", job_id),
        ("outer", "after", job_id, "snoozed", "Snooze", None),
    ]


def test_a_middleware_that_does_not_yield_or_yields_twice_fails_the_attempt(conn):
    app = App()
    app.handler("k")(lambda job: "ran")

    @app.run_middleware
    def twice(job):
        yield
        yield

    @app.run_middleware
    def never(job):
        if job.payload.get("never"):
            return
        yield

    app.enqueue(conn, "k", {"never": True}, max_attempts=1)
    app.enqueue(conn, "k", max_attempts=1)
    assert [r.error for r in drain(app, conn)] == [
        "middleware never: RuntimeError: run middleware never returned without yielding",
        "middleware twice: RuntimeError: run middleware twice yielded more than once",
    ]


# --- claim_limited -------------------------------------------------------------------------------------


def test_a_limited_claim_returns_the_meta_of_a_job_committed_while_it_waited(conn, dsn):
    """claim_limited waits for its kinds' rows: a job committed meanwhile is claimed, and its meta
    comes back with it (read after the function, not with the statement's older snapshot)."""
    limits.set_limits(conn, "k", "test", concurrency=5)
    early = jobsup.enqueue(conn, "k", meta={"n": "early"})
    claimed: list = []
    with psycopg.connect(dsn) as holder:  # a transaction holding the kind's row, as a claim does
        holder.execute("SELECT 1 FROM jobsup.limits WHERE kind = 'k' FOR UPDATE")

        def claim() -> None:
            with psycopg.connect(dsn, autocommit=True) as claimer:
                claimed.extend(lifecycle.claim_limited(claimer, ["k"], ["default"], 5, "sup", 30)[0])

        thread = threading.Thread(target=claim)
        thread.start()
        wait_for(
            lambda: conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%claim_limited%'"
            ).fetchone(),
            message="the claim to wait for the kind's row",
        )
        late = jobsup.enqueue(conn, "k", meta={"n": "late"})
        holder.commit()
    thread.join(10)
    assert {job.id: job.meta for job in claimed} == {early: {"n": "early"}, late: {"n": "late"}}


# --- under a real supervisor ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_supervisor_runs_the_middleware_around_sync_and_async_handlers(conn, start):
    sync_id = tenants.enqueue(conn, "whose")
    async_id = tenants.enqueue(conn, "awhose")
    token = TENANT.set(None)
    orphan = tenants.enqueue(conn, "whose", max_attempts=1)
    TENANT.reset(token)
    start(app="tests.apps.traced:tenants")
    wait_for(
        lambda: conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status IN ('done', 'dead')").fetchone()[0] == 3,
        30,
        message="the jobs to finish",
    )
    for job_id in (sync_id, async_id):
        assert row(conn, job_id)[0] == "done"
        assert row(conn, job_id)[3] == {"tenant": "acme", "meta": ACME}
    assert row(conn, orphan)[:2] == ("dead", "middleware tenant_context: KeyError: 'tenant'")


def test_the_consoles_job_screen_shows_the_meta_and_its_trace(conn):
    from datetime import UTC, datetime

    from psycopg.rows import dict_row
    from rich.console import Console

    from jobsup.db.sql import STATEMENTS
    from jobsup.monitor.screens import job_details

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    job_id = client.enqueue(conn, "email", meta={"tenant": "acme", "traceparent": parent})
    with conn.cursor(row_factory=dict_row) as cur:
        job = cur.execute(STATEMENTS["job"], {"id": job_id}).fetchone()
    console = Console(width=120, record=True)
    console.print(job_details(job, datetime.now(UTC)))
    text = console.export_text()
    [trace] = [line for line in text.splitlines() if line.startswith("trace")]
    assert trace.split() == ["trace", "4bf92f3577b34da6a3ce929d0e0e4736"]
    assert '"tenant": "acme"' in text
